"""Every failure safe, nothing lost (issue 9, items 7-9), on a 2-stage MLP:

  checkpoints: a stage killed (SIGKILL) at every write, sync, rename and
    removal point of a checkpoint leaves the last committed checkpoint, which
    resumes to weights bit-identical to an uninterrupted run; flipped bytes in
    a stage file, an edited step and a checkpoint of another plan are refused
    naming the file or what differs;
  fail early, never hang: --save into a missing directory and --checkpoint
    under a missing parent fail before step 1; a data file truncated during
    the run stops it with a message naming the file (not SIGBUS); a stopped
    stage (kill -STOP) ends the job after --timeout naming the stage;
  NaN: a NaN bias before a ReLU stops the run naming NaN (it used to become 0
    and exit 0), and --save / checkpoints refuse weights that are not finite;
  issue 34: a FIFO as --data, --val, --log (or LOG.val.csv) or --trace is
    refused, not waited on; run.sh's non-finite and non-integer numbers, flags
    without a value, --resume past --steps, a NaN weight at load and a damaged
    weights/manifest.txt are refused before step 1, naming what; a stage arena
    over 2 GiB (LeNet at -n 1 --batch 16384) builds and starts.

The crash points come from the runtime's testing hook PIPERUN_CRASH_AT=R:K
(rank R kills itself with SIGKILL at its K-th checkpoint point).  Run with
/usr/bin/python3; prints ok / not ok lines and "N passed, M failed, K skipped, R refused" (tests/tally.py)."""
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.path.join(ROOT, "bin", "pipecc")
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


def check(cond, what):
    tally.count(cond)
    print(("ok - " if cond else "not ok - ") + what, flush=True)
    return cond


def sh(cmd, timeout=120, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def build(model, out, batch=64, mb=4):
    r = sh([PIPECC, model, "-n", "2", "--batch", str(batch), "--microbatches", str(mb), "--devices", DEVICES, "-o", out],
           timeout=120)
    if r.returncode:
        return r.stderr
    r = sh(["make", "-s", "-j2", "-C", out], timeout=600)
    return r.stderr if r.returncode else ""


def weights(path):
    return {t.name: numpy_helper.to_array(t).tobytes() for t in onnx.load(path).graph.initializer}


def same_weights(a, b):
    wa, wb = weights(a), weights(b)
    return len(wa) > 0 and wa.keys() == wb.keys() and all(wa[k] == wb[k] for k in wa)


def errors(r):
    return " | ".join(l for l in r.stderr.splitlines() if "piperun" in l)[:400]


def manifest_step(ck):
    try:
        for line in open(os.path.join(ck, "MANIFEST")):
            if line.startswith("step "):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def stage_pids(pipe, k):
    return [int(p) for p in sh(["pgrep", "-f", "^" + os.path.join(pipe, f"stage_{k}")]).stdout.split()]


def kill_leftovers(pipe):
    for k in range(2):
        for pid in stage_pids(pipe, k):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass


def start_long(run, args, log):
    """A run of many steps, returned once it has logged a few."""
    p = subprocess.Popen([run, "--steps", "1000000", "--quiet", "--log", log, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(log) and sum(1 for _ in open(log)) >= 4:
            break
        time.sleep(0.1)
    return p


def finish(p, timeout):
    t0 = time.time()
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, err, time.time() - t0
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return None, err, time.time() - t0


# ---- models ----

def nan_bias_mlp(src, dst):
    """The sample MLP with fc2.bias[5] = NaN: the NaN enters right before a ReLU."""
    m = onnx.load(src)
    for t in m.graph.initializer:
        if t.name == "fc2.bias":
            b = numpy_helper.to_array(t).copy()
            b[5] = np.nan
            t.CopyFrom(numpy_helper.from_array(b, t.name))
    onnx.save(m, dst)


def hidden_nan_model(dst):
    """784 -> 32 -> ReLU -> 10, and a trainable 'hidden_nan' whose value Where never picks:
    its NaN reaches neither the loss nor a gradient, so training runs on and only the
    check before writing weights can see it."""
    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array((rng.standard_normal((32, 784)) * 0.05).astype(np.float32), "w1"),
            numpy_helper.from_array(np.zeros(32, np.float32), "b1"),
            numpy_helper.from_array(np.where(np.arange(32) == 7, np.nan, 0).astype(np.float32), "hidden_nan"),
            numpy_helper.from_array(np.ones(32, bool), "pick"),
            numpy_helper.from_array((rng.standard_normal((10, 32)) * 0.1).astype(np.float32), "w2"),
            numpy_helper.from_array(np.zeros(10, np.float32), "b2"),
            numpy_helper.from_array(np.array([-1, 784], np.int64), "shape")]
    nodes = [helper.make_node("Reshape", ["input", "shape"], ["x"]),
             helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
             helper.make_node("Add", ["h", "hidden_nan"], ["h2"]),
             helper.make_node("Where", ["pick", "h", "h2"], ["h3"]),
             helper.make_node("Relu", ["h3"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"], transB=1)]
    g = helper.make_graph(nodes, "hidden_nan", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], init)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), dst)


# ---- item 7: checkpoints ----

def test_crash_points(run, data, tmp, full):
    """Crash each rank at each checkpoint point of a run that resumes from step 2 and checkpoints
    at 4; the last committed checkpoint (2 or 4) must resume to the uninterrupted 6-step weights."""
    base = os.path.join(tmp, "ck-base")
    r = sh([run, "--data", data, "--steps", "2", "--quiet", "--checkpoint", base, "--checkpoint-every", "2"])
    if not check(r.returncode == 0 and manifest_step(base) == 2, f"a checkpoint at step 2 is committed ({errors(r)})"):
        return
    for rank in (0, 1):
        resumed, bad, points = [], [], 0
        for k in range(1, 40):
            ck = os.path.join(tmp, f"ck-crash-{rank}-{k}")
            shutil.copytree(base, ck)
            env = dict(os.environ, PIPERUN_CRASH_AT=f"{rank}:{k}")
            c = sh([run, "--data", data, "--steps", "4", "--quiet", "--resume", ck, "--checkpoint", ck, "--checkpoint-every", "2"],
                   env=env)
            if c.returncode == 0:
                break  # k is past the last point: the run finished
            points += 1
            out = os.path.join(tmp, f"crash-{rank}-{k}.onnx")
            step = manifest_step(ck)
            r = sh([run, "--data", data, "--steps", "6", "--quiet", "--resume", ck, "--save", out])
            if r.returncode == 0 and same_weights(full, out):
                resumed.append(step)
            else:
                bad.append(f"point {k}: step {step}, rc {r.returncode}: {errors(r)}")
            shutil.rmtree(ck, ignore_errors=True)
        # Stage 1's points all come before rank 0's commit; rank 0's span both sides of it.
        check(points >= 4 and not bad and set(resumed) == ({2, 4} if rank == 0 else {2}),
              f"stage {rank} killed at each of its {points} checkpoint points: the last committed checkpoint resumed every time "
              f"(from step 2 x{resumed.count(2)}, step 4 x{resumed.count(4)}) to weights bit-identical to 6 steps straight"
              + (f"; failures: {bad[:3]}" if bad else ""))


def test_refusals(run, data, tmp, pipe_other):
    ck = os.path.join(tmp, "ck-good")
    r = sh([run, "--data", data, "--steps", "4", "--quiet", "--checkpoint", ck, "--checkpoint-every", "2"])
    if not check(r.returncode == 0, f"a checkpoint at step 4 ({errors(r)})"):
        return

    def attempt(tag, edit):
        c = os.path.join(tmp, "ck-" + tag)
        shutil.copytree(ck, c)
        what = edit(c)
        r = sh([run, "--data", data, "--steps", "6", "--quiet", "--resume", c])
        return r, what

    def flip(c):
        f = glob.glob(os.path.join(c, "**", "stage_1.ckpt"), recursive=True)[0]
        b = bytearray(open(f, "rb").read())
        at = len(b) // 2 & ~3
        b[at:at + 16] = np.full(4, 0.25, np.float32).tobytes()  # finite garbage over weights, the size unchanged
        open(f, "wb").write(bytes(b))
        return f

    r, f = attempt("flip", flip)
    check(r.returncode != 0 and "stage_1.ckpt" in r.stderr and "corrupt" in r.stderr and "step 5/" not in r.stdout,
          f"flipped bytes in a stage file are refused naming it: {errors(r)}")

    def edit_step(c, fix_sum):
        p = os.path.join(c, "MANIFEST")
        if not os.path.exists(p):
            return None
        text = open(p).read().replace("step 4\n", "step 2\n")
        if fix_sum:  # a consistent manifest: the step in the stage files must still disagree
            body = text[:text.index("checksum ")]
            text = body + "checksum %016x\n" % fnv1a(body.encode())
        open(p, "w").write(text)
        return p

    r, p = attempt("step", lambda c: edit_step(c, False))
    check(p and r.returncode != 0 and "MANIFEST" in r.stderr and "step 3/" not in r.stdout,
          f"an edited step in the manifest is refused: {errors(r)}")
    r, p = attempt("step2", lambda c: edit_step(c, True))
    check(p and r.returncode != 0 and "step 4" in r.stderr and "step 2" in r.stderr,
          f"an edited step with the manifest's checksum redone is refused by the stage files' own step: {errors(r)}")

    other = os.path.join(pipe_other, "run.sh")
    r = sh([other, "--data", data, "--steps", "6", "--quiet", "--resume", ck])
    check(r.returncode != 0 and "another plan" in r.stderr and "batch" in r.stderr,
          f"a checkpoint of another plan (batch 64 in 4 micro-batches; this one 32 in 2, same buffers) is refused: {errors(r)}")


# ---- item 8: fail early, never hang ----

def test_fail_early(run, data, tmp):
    missing = os.path.join(tmp, "no-such-dir")
    r = sh([run, "--data", data, "--steps", "3", "--save", os.path.join(missing, "out.onnx")])
    check(r.returncode != 0 and "step 1/" not in r.stdout and "--save" in r.stderr and missing in r.stderr,
          f"--save into a missing directory fails before step 1: {errors(r)}")
    r = sh([run, "--data", data, "--steps", "3", "--checkpoint", os.path.join(missing, "ck"), "--checkpoint-every", "1"])
    check(r.returncode != 0 and "step 1/" not in r.stdout and "--checkpoint" in r.stderr and missing in r.stderr,
          f"--checkpoint under a missing parent fails before step 1: {errors(r)}")


def test_truncated_data(run, data, tmp):
    d = os.path.join(tmp, "mnist-trunc")
    shutil.copytree(data, d)
    p = start_long(run, ["--data", d], os.path.join(tmp, "trunc.csv"))
    images = os.path.join(d, "train-images-idx3-ubyte")
    os.truncate(images, 4096)
    rc, err, took = finish(p, 30)
    named = [l for l in err.splitlines() if "train-images-idx3-ubyte" in l]
    check(rc not in (None, 0, 135, -signal.SIGBUS) and named,
          f"a data file truncated during the run stops it (rc {rc}, {took:.1f} s) naming the file: {named[0][:300] if named else err[-300:]}")


def test_stopped_stage(run, data, tmp, pipe):
    p = start_long(run, ["--data", data, "--timeout", "3"], os.path.join(tmp, "stop.csv"))
    victim = stage_pids(pipe, 1)
    if not check(victim and p.poll() is None, "the run is going and stage 1's process is found"):
        p.kill()
        return
    os.kill(victim[0], signal.SIGSTOP)
    rc, err, took = finish(p, 40)
    kill_leftovers(pipe)
    lines = [l for l in err.splitlines() if "no progress" in l]
    check(rc not in (None, 0) and lines and "waiting for stage 1" in lines[0],
          f"a stopped stage (kill -STOP) ends the job in {took:.1f} s with --timeout 3, naming it: "
          f"{lines[0][:300] if lines else err[-300:]}")


# ---- item 9: NaN ----

def test_nan(data, tmp):
    src = os.path.join(ROOT, "onnx_models", "mlp.onnx")
    m = os.path.join(tmp, "mlp_nan.onnx")
    nan_bias_mlp(src, m)
    pipe = os.path.join(tmp, "mlp_nan.pipe")
    err = build(m, pipe)
    if check(not err, f"an MLP with a NaN in fc2.bias compiled ({err.strip()[-200:]})"):
        out = os.path.join(tmp, "nan.onnx")
        r = sh([os.path.join(pipe, "run.sh"), "--data", data, "--steps", "3", "--quiet", "--save", out])
        check(r.returncode != 0 and "NaN" in r.stderr and not os.path.exists(out),
              f"a NaN bias before a ReLU stops the run naming NaN, nothing saved: {errors(r)}")
    m = os.path.join(tmp, "hidden_nan.onnx")
    hidden_nan_model(m)
    pipe = os.path.join(tmp, "hidden_nan.pipe")
    err = build(m, pipe)
    if check(not err, f"a model with a NaN weight that never reaches the loss compiled ({err.strip()[-200:]})"):
        run = os.path.join(pipe, "run.sh")
        out = os.path.join(tmp, "hidden.onnx")
        r = sh([run, "--data", data, "--steps", "2", "--quiet", "--save", out])
        check(r.returncode != 0 and "hidden_nan" in r.stderr and "NaN" in r.stderr and not os.path.exists(out),
              f"--save refuses a NaN weight, naming the tensor: {errors(r)}")
        ck = os.path.join(tmp, "ck-nan")
        r = sh([run, "--data", data, "--steps", "2", "--quiet", "--checkpoint", ck, "--checkpoint-every", "1"])
        check(r.returncode != 0 and "hidden_nan" in r.stderr and not os.path.exists(os.path.join(ck, "MANIFEST"))
              and not glob.glob(os.path.join(ck, "**", "*.ckpt"), recursive=True),
              f"a checkpoint refuses a NaN weight, naming the tensor: {errors(r)}")


# ---- issue 34, items 9, 15, 16 and 18: no hang, clear refusals, large arenas ----

def sh_group(cmd, timeout):
    """cmd in its own session; past timeout the whole group (mpirun and its ranks) is killed: (rc or None, out, err)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err + f" [still running after {timeout} s: killed]"


def test_no_hang(run, data, tmp):
    """A FIFO as --data, --val, --log or --trace is refused before step 1; open() used to wait for the other end."""
    fifo = os.path.join(tmp, "a.fifo")
    os.mkfifo(fifo)
    base = ["--data", data, "--steps", "2", "--quiet"]
    for flag, args in (("--data", ["--data", fifo, "--steps", "2", "--quiet"]), ("--val", base + ["--val", fifo]),
                       ("--log", base + ["--log", fifo]), ("--trace", base + ["--trace", fifo])):
        rc, out, err = sh_group([run, *args], 30)
        check(rc not in (None, 0) and "a.fifo" in err and "not a regular file" in err and "step 1/" not in out,
              f"a FIFO as {flag} is refused at once (rc {rc}): {errors_of(err)}")
    log = os.path.join(tmp, "val.csv")
    os.mkfifo(log + ".val.csv")
    rc, out, err = sh_group([run, *base, "--val", data, "--log", log], 30)
    check(rc not in (None, 0) and "val.csv.val.csv" in err and "not a regular file" in err,
          f"a FIFO where --val writes beside --log (LOG.val.csv) is refused at once (rc {rc}): {errors_of(err)}")


def errors_of(err):
    return " | ".join(l for l in err.splitlines() if "piperun" in l or "run.sh" in l or "killed" in l)[:300]


def test_clear_refusals(run, data, tmp, pipe):
    """run.sh's numbers, --resume past --steps, run.sh's flags without a value, a NaN weight at load, a damaged manifest."""
    for args, words in ((["--lr", "inf"], ["--lr", "'inf'", "finite"]), (["--weight-decay", "inf"], ["--weight-decay", "'inf'"]),
                        (["--min-lr", "inf"], ["--min-lr", "'inf'"]), (["--steps", "inf"], ["--steps", "'inf'", "whole number"]),
                        (["--steps", "1.9"], ["--steps", "'1.9'", "whole number"])):
        r = sh([run, "--data", data, "--steps", "3", "--quiet", *args])
        check(r.returncode == 2 and all(w in r.stderr for w in words) and "step 1/" not in r.stdout and "lower --lr" not in r.stderr,
              f"run.sh {' '.join(args)} is refused at parse: {errors(r)}")
    ck = os.path.join(tmp, "ck-steps")
    r = sh([run, "--data", data, "--steps", "4", "--quiet", "--checkpoint", ck, "--checkpoint-every", "4"])
    if check(r.returncode == 0 and manifest_step(ck) == 4, f"a checkpoint at step 4 ({errors(r)})"):
        r = sh([run, "--data", data, "--steps", "2", "--resume", ck])
        check(r.returncode == 2 and "step 4" in r.stderr and "--steps 2" in r.stderr and "done:" not in r.stdout,
              f"--resume of step 4 with --steps 2 is refused (it printed 'done: -2 steps ... loss nan' and exited 0): {errors(r)}")
    for flag in ("--mca", "--hostfile", "--checkpoint", "--resume"):
        r = sh([run, "--data", data, "--steps", "2", flag])
        check(r.returncode == 2 and f"run.sh: error: {flag} needs" in r.stderr and "unbound" not in r.stderr,
              f"run.sh {flag} without its value says so: {r.stderr.strip()[:200]}")

    def copy_pipe(name):
        dst = os.path.join(tmp, name)
        shutil.copytree(pipe, dst, symlinks=True)
        return dst, [l.split() for l in open(os.path.join(dst, "weights", "manifest.txt")) if not l.startswith("#")]

    nanw, man = copy_pipe("nanw.pipe")
    stage, off, cnt, name = next(l for l in man if l[0] == "1")
    wfile = os.path.join(nanw, "weights", "stage_1.bin")
    b = bytearray(open(wfile, "rb").read())
    b[int(off) + 8:int(off) + 12] = np.float32(np.nan).tobytes()
    open(wfile, "wb").write(bytes(b))
    r = sh([os.path.join(nanw, "run.sh"), "--data", data, "--steps", "2", "--quiet"])
    check(r.returncode != 0 and f"weight '{name}' is NaN at element 2 at load" in r.stderr and "lower --lr" not in r.stderr
          and "step 1/" not in r.stdout, f"a NaN initial weight is named at load, not blamed on the learning rate: {errors(r)}")
    for what, edit, words in (("an offset past the stage's weights", lambda l: [l[0], "999999999", l[2], l[3]], ["outside stage"]),
                              ("a wrong count", lambda l: [l[0], l[1], str(int(l[2]) + 1), l[3]], ["the manifest says"]),
                              ("a line cut short", lambda l: l[:3], ["expected 'STAGE"]),
                              ("a line missing", lambda l: None, ["no data in model.onnx"])):
        bad, man = copy_pipe("man.pipe")
        lines = [edit(l) if l[3] == name else l for l in man]
        open(os.path.join(bad, "weights", "manifest.txt"), "w").write("".join(" ".join(l) + "\n" for l in lines if l))
        out = os.path.join(tmp, "man.onnx")
        r = sh([os.path.join(bad, "run.sh"), "--data", data, "--steps", "2", "--quiet", "--save", out])
        check(r.returncode == 2 and "manifest.txt" in r.stderr and all(w in r.stderr for w in words) and "step 1/" not in r.stdout
              and not os.path.exists(out) and "Segmentation" not in r.stderr,
              f"--save with {what} in weights/manifest.txt is refused before step 1 (it segfaulted or wrote malformed ONNX): {errors(r)}")
        shutil.rmtree(bad)


def test_large_arena(tmp):
    """A stage arena over 2 GiB builds and starts (it failed to link)."""
    out = os.path.join(tmp, "lenet-16k.pipe")
    r = sh([PIPECC, os.path.join(ROOT, "onnx_models", "lenet.onnx"), "-n", "1", "--batch", "16384", "--devices", DEVICES, "-o", out])
    arena = [l for l in open(os.path.join(out, "stage_0.c")) if l.startswith("#define ARENA_BYTES")] if r.returncode == 0 else []
    if not check(arena and int(arena[0].split()[2].rstrip("L")) > 2 << 30, f"LeNet at -n 1 --batch 16384 plans an arena over 2 GiB: "
                 f"{arena[0].strip() if arena else r.stderr.strip()[-200:]}"):
        return
    r = sh(["make", "-s", "-C", out], timeout=600)
    s = sh([os.path.join(out, "stage_0"), "--blas-core"]) if r.returncode == 0 else r
    check(r.returncode == 0 and s.returncode == 0 and s.stdout.strip(),
          f"its stage builds and starts (stage_0 --blas-core: {s.stdout.strip()}): {(r.stderr + s.stderr).strip()[-300:]}")


def main():
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="pipecc-safety.")
    os.environ.setdefault("PIPECC_CACHE", os.path.join(tmp, "machine.txt"))
    try:
        data = os.path.join(tmp, "mnist")
        r = sh([DATAGEN, "mnist", data, "--n", "1280", "--seed", "1"])
        if not check(r.returncode == 0, f"synthetic MNIST written ({r.stderr.strip()})"):
            return tally.finish()
        mlp = os.path.join(ROOT, "onnx_models", "mlp.onnx")
        pipe, other = os.path.join(tmp, "mlp.pipe"), os.path.join(tmp, "mlp-b32.pipe")
        err = build(mlp, pipe) or build(mlp, other, batch=32, mb=2)
        if not check(not err, f"the MLP compiled for 2 stages, batch 64 / 4 and batch 32 / 2 micro-batches ({err.strip()[-300:]})"):
            return tally.finish()
        run = os.path.join(pipe, "run.sh")
        full = os.path.join(tmp, "full.onnx")
        r = sh([run, "--data", data, "--steps", "6", "--quiet", "--save", full])
        if not check(r.returncode == 0, f"6 steps straight ({errors(r)})"):
            return tally.finish()
        for name, fn, args in (("crash points", test_crash_points, (run, data, tmp, full)),
                               ("refusals", test_refusals, (run, data, tmp, other)),
                               ("fail early", test_fail_early, (run, data, tmp)),
                               ("truncated data", test_truncated_data, (run, data, tmp)),
                               ("stopped stage", test_stopped_stage, (run, data, tmp, pipe)),
                               ("NaN", test_nan, (data, tmp)),
                               ("no hang", test_no_hang, (run, data, tmp)),
                               ("clear refusals", test_clear_refusals, (run, data, tmp, pipe)),
                               ("large arena", test_large_arena, (tmp,))):
            try:
                fn(*args)
            except Exception as e:  # one broken part must not hide the others' results
                check(False, f"{name}: the test itself failed: {type(e).__name__}: {e}")
    finally:
        for p in glob.glob(os.path.join(tmp, "*.pipe")):
            kill_leftovers(p)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {time.time() - t0:.0f} s")
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
