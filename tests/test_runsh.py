"""run.sh answers by itself (issue 38): each of its messages word for word, with its exit status.

One plan (the sample MLP at -n 2), compiled once:
  - unbuilt: run.sh names the command that builds the directory (exit 2), and --help works there too;
  - stale: a stage program older than its stage_K.c is named, with the same command (exit 2);
  - --help and -h: the usage on stdout, exit 0; every flag runtime/args.c's parse_args takes (but the
    three run.sh gives the stages itself) and every flag run.sh reads itself is in it;
  - usage errors (an unknown flag, a bad number, a missing --data, a flag without its value, a newline
    in a value, --profile on stages without timing marks): exactly one line on stderr, nothing on
    stdout, exit 2.
  Until here mpirun is a stand-in that leaves a mark (PATH): none of these may start it.
  - a rank that fails (a missing --data, which stage 0 reports and stage 1 repeats; a --log in a
    missing directory, which stage 1 reports and stage 0 repeats; a NaN, which stops both stages, each
    with its own line, through MPI_Abort): that rank's own line is the first line of stderr, the other
    stage's and mpirun's report follow, the exit status is the rank's (2, 3);
  - a run that works: its progress on stdout, nothing on stderr, exit 0.
About 20 s.  Run with /usr/bin/python3."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
MODEL = os.path.join(ROOT, "onnx_models", "mlp.onnx")
# parse_args' flags that run.sh gives the stages itself: not the user's, not in --help.
INTERNAL = {"--blas-kernels", "--freeze-dir", "--resume-freeze"}


def sh(cmd, env=None, timeout=120):
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def exactly(r, what, rc, err, out=""):
    """r exited rc with exactly err on stderr and out on stdout."""
    ok = r.returncode == rc and r.stderr == err and r.stdout == out
    return tally.check(ok, what, "" if ok else f"exit {r.returncode} (want {rc}), stderr {r.stderr[-600:]!r} (want {err!r}), "
                                               f"stdout {r.stdout[-300:]!r}")


def fake_mpirun(tmp):
    """A PATH whose mpirun only leaves a mark: a case that must answer before mpirun shows it did not start it."""
    bindir, mark = os.path.join(tmp, "fakebin"), os.path.join(tmp, "mpirun-started")
    os.makedirs(bindir)
    with open(os.path.join(bindir, "mpirun"), "w") as f:
        f.write(f"#!/bin/sh\ntouch '{mark}'\nexit 99\n")
    os.chmod(os.path.join(bindir, "mpirun"), 0o755)
    return dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"]), mark


def test_unbuilt(pipe, run, data, env, mark):
    want = f"run.sh: error: {pipe} is not built (no program stage_0): run make -C {pipe}\n"
    exactly(sh([run, "--data", data, "--steps", "2"], env), "unbuilt: run.sh names the command that builds it, exit 2", 2, want)
    r = sh([run, "--help"], env)
    tally.check(r.returncode == 0 and r.stdout.startswith("usage: run.sh --data PATH --steps N") and not r.stderr,
                "unbuilt: --help still answers, exit 0", f"exit {r.returncode}, {r.stderr.strip()[-300:]!r}" if r.returncode else "")
    tally.check(not os.path.exists(mark), "unbuilt: mpirun was not started")


def test_stale(pipe, run, data, env):
    src, prog = os.path.join(pipe, "stage_1.c"), os.path.join(pipe, "stage_1")
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, os.stat(prog).st_mtime_ns + 5 * 10**9))
    try:
        want = f"run.sh: error: {pipe}/stage_1 is older than stage_1.c: run make -C {pipe}\n"
        exactly(sh([run, "--data", data, "--steps", "2"], env), "stale: a stage program older than its source is named, exit 2", 2, want)
    finally:
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_help(run, env):
    r = sh([run, "--help"], env)
    head = f"usage: run.sh --data PATH --steps N [FLAG...]\nTrains the 2 stages of {MODEL} under mpirun, one rank per stage.\n"
    ok = r.returncode == 0 and r.stdout.startswith(head) and r.stderr == ""
    tally.check(ok, "--help: the usage on stdout, exit 0",
                "" if ok else f"exit {r.returncode}, stdout {r.stdout[:200]!r}, stderr {r.stderr[-300:]!r}")
    h = sh([run, "--data", "x", "-h"], env)
    tally.check(h.returncode == 0 and h.stdout == r.stdout and h.stderr == "", "-h, after other flags: the same usage, exit 0")
    flags = set(re.findall(r'!strcmp\(f, "(--[\w-]+)"\)', open(os.path.join(ROOT, "runtime", "args.c")).read()))
    if tally.nonempty(flags, "parse_args' flags read from runtime/args.c"):
        missing = sorted(f for f in flags - INTERNAL if not re.search(r"(?<![\w-])" + re.escape(f) + r"(?![\w-])", r.stdout))
        tally.check(not missing, f"--help names each of parse_args' {len(flags - INTERNAL)} flags",
                    f"missing: {missing}" if missing else "")
    own = set()
    for labels in re.findall(r"^\s+((?:-[\w-]+\|?)+)\)", open(run).read(), re.M):
        own.update(labels.split("|"))
    if tally.nonempty(own, "the flags run.sh reads itself (its case labels)"):
        missing = sorted(f for f in own if not re.search(r"(?<![\w-])" + re.escape(f) + r"(?![\w-])", r.stdout))
        tally.check(not missing, f"--help names each of the {len(own)} flags run.sh reads itself (mpirun's among them)",
                    f"missing: {missing}" if missing else "")


def test_usage_errors(pipe, run, data, env, mark):
    cases = (
        (["--data", data, "--steps", "2", "--bogus"], "unknown flag '--bogus'"),
        (["--data", data, "--steps", "x"], "--steps 'x': expected a whole number from 1 to 1099511627776"),
        (["--steps", "2"], "--data PATH is required"),
        (["--data", data, "--steps", "2", "--lr"], "flag '--lr' needs a value"),
        (["--data", data, "--steps", "2", "--mca", "btl"], "--mca needs 2 values"),
        (["--data", data, "--steps", "2\n3"], "--steps '2\\n3': expected a whole number from 1 to 1099511627776"),
        (["--data", data, "--steps", "2", "--profile", os.path.join(pipe, "p.txt")],
         "--profile: these stages have no timing marks; compile them with pipecc --profile"),
    )
    for args, msg in cases:
        exactly(sh([run, *args], env), f"run.sh {' '.join(args)!r}: one line, exit 2", 2, f"run.sh: error: {msg}\n")
    tally.check(not os.path.exists(mark), "none of the answers before mpirun started it (unbuilt, stale, --help, -h, usage errors)")


def ranks_first(r):
    """stderr's lines, and whether they hold mpirun's report (a box between lines of dashes, or its [host:pid]
    lines) with every rank's line before it."""
    lines = r.stderr.splitlines()
    at = next((i for i, ln in enumerate(lines) if re.fullmatch(r"-{20,}", ln) or re.match(r"\[[^]]+:[0-9]+\] ", ln)), None)
    return lines, at is not None and all(not ln.startswith("piperun: ") for ln in lines[at:])


def test_rank_fails(tmp, run, data):
    """Each case: its flags, the exit status, the lines one of which must come first, the line's that must follow it."""
    missing = os.path.join(tmp, "no-such-data")
    nodir = os.path.join(tmp, "no-such-dir", "log.csv")
    nan = "piperun: stage {}: error: step 2: the gradient of 'fc{}.weight' is NaN at element 0; stopping (lower --lr?)"
    cases = (
        (["--data", missing, "--steps", "2"], 2, [f"piperun: stage 0: error: data {missing}: missing: No such file or directory"],
         "piperun: stage 1: error: (reported by another stage) "),
        (["--data", data, "--steps", "2", "--log", nodir], 2,
         [f"piperun: stage 1: error: --log {nodir}: directory {os.path.dirname(nodir)} does not exist"],
         "piperun: stage 0: error: (reported by another stage) "),
        # Both stages stop (die: MPI_Abort, exit 3), each with its own line: either may be first.
        (["--data", data, "--steps", "3", "--lr", "1e30", "--quiet"], 3, [nan.format(0, 1), nan.format(1, 2)], "piperun: stage "),
    )
    for args, rc, own, then in cases:
        for attempt in range(3):  # the order must not depend on which line reached mpirun first
            r = sh([run, *args])
            lines, before_box = ranks_first(r)
            ok = r.returncode == rc and lines[:1] and lines[0] in own and len(lines) > 1 and lines[1].startswith(then) and before_box
            if not ok or attempt == 2:
                tally.check(ok, f"run.sh {' '.join(args)}: the failed rank's own line first, then the other stage's, then mpirun's "
                                f"report; exit {rc} ({attempt + 1} runs)",
                            "" if ok else f"exit {r.returncode}, want first line {own}; stderr {r.stderr[-900:]!r}")
            if not ok:
                break


def test_rank_crashes(pipe, run, data):
    """A rank that crashes (SIGSEGV) writes no line of its own: mpirun's report of the crash comes before
    the other stage's "stopped by signal" line, which only follows from it."""
    p = subprocess.Popen([run, "--data", data, "--steps", "1000000", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = []
    for _ in range(200):
        victim = subprocess.run(["pgrep", "-f", os.path.join(pipe, "stage_1")], capture_output=True, text=True).stdout.split()
        if victim:
            break
        time.sleep(0.05)
    time.sleep(0.5)
    if victim:
        os.kill(int(victim[0]), signal.SIGSEGV)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    lines = err.splitlines()
    stopped = [i for i, ln in enumerate(lines) if "stopped by signal" in ln]
    report = next((i for i, ln in enumerate(lines) if re.fullmatch(r"-{20,}", ln) or re.match(r"\[[^]]+:[0-9]+\] ", ln)), None)
    ok = victim and p.returncode != 0 and report is not None and all(i > report for i in stopped) and \
        not (lines and "stopped by signal" in lines[0])
    tally.check(ok, "a rank killed by SIGSEGV (no line of its own): mpirun's report first, the other stage's \"stopped by signal\" "
                    f"after it (exit {p.returncode})", "" if ok else f"victim {victim}; stderr {err[-900:]!r}")


def main():
    tmp = tempfile.mkdtemp(prefix="pipecc-runsh.")
    os.environ.setdefault("PIPECC_CACHE", os.path.join(tmp, "machine.txt"))
    try:
        pipe, data = os.path.join(tmp, "mlp.pipe"), os.path.join(tmp, "mnist")
        run = os.path.join(pipe, "run.sh")
        r = sh([PIPECC, MODEL, "-n", "2", "--batch", "32", "--microbatches", "4", "--devices", DEVICES, "-o", pipe])
        d = sh([DATAGEN, "mnist", data, "--n", "256", "--seed", "1"])
        ok = r.returncode == 0 and d.returncode == 0 and re.fullmatch(r"[\w/.-]+", pipe)  # the messages' paths, unquoted
        if not tally.check(ok, "the MLP planned for 2 stages, and MNIST-shaped data", "" if ok else (r.stderr + d.stderr).strip()[-300:]):
            return tally.finish()
        env, mark = fake_mpirun(tmp)
        test_unbuilt(pipe, run, data, env, mark)
        b = sh(["make", "-s", "-j2", "-C", pipe], timeout=600)
        if not tally.check(b.returncode == 0, "the stages build", b.stderr.strip()[-300:]):
            return tally.finish()
        test_stale(pipe, run, data, env)
        test_help(run, env)
        test_usage_errors(pipe, run, data, env, mark)
        test_rank_fails(tmp, run, data)
        test_rank_crashes(pipe, run, data)
        r = sh([run, "--data", data, "--steps", "2"])
        ok = r.returncode == 0 and r.stdout.startswith("step 1/2  loss ") and "step 2/2" in r.stdout and r.stderr == ""
        tally.check(ok, "a run that works: progress on stdout, nothing on stderr, exit 0",
                    "" if ok else f"exit {r.returncode}, {r.stderr[-300:]!r}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
