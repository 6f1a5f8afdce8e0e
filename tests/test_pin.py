"""Ranks pinned to cores when there are more ranks than cores (compiler/schedule.c, schedule_pin;
runtime/host.c, pin_rank; docs/cost.md, "Ranks that share cores").

LeNet at n = 2 x this machine's CPUs (at most 4 of them; otherwise n = 4 on 2 cores, plan only: the
run checks are counted as skipped, with that reason), with
--devices naming those cores (`host cores=C`):
  - plan.json's machine.pinned_core gives each rank a core below C, and every core holds ranks;
  - the listing names the cores and their ranks; each stage program's PIN_CORE is its rank's core;
  - the run prints "ranks pinned to CPUs ..." with each rank on the CPU its core names (the C-th
    allowed CPU), and run.sh --no-pin prints no such line and gives the same losses, bit for bit;
  - mpirun binding the ranks itself (run.sh --bind-to core:overload-allowed) leaves them as bound;
  - a plan with a core per rank (no host line) pins nothing: pinned_core null, PIN_CORES 0, no line.
About 20 s.  Run with /usr/bin/python3."""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)
import test_trace as tt  # noqa: E402  (its paths, check() with the tally, and sh())

ROOT, PIPECC, DATAGEN, DEVICES = tt.ROOT, tt.PIPECC, tt.DATAGEN, tt.DEVICES
check, sh = tt.check, tt.sh
STEPS = 4


def losses(path):
    """The loss column of a run.sh --log CSV, as written (text: bit-for-bit comparison)."""
    rows = [ln.strip().split(",") for ln in open(path) if ln.strip()]
    col = rows[0].index("loss")
    return [r[col] for r in rows[1:]]


def plan(tmp, tag, n, devices):
    out = os.path.join(tmp, f"{tag}.pipe")
    r = sh([PIPECC, os.path.join(ROOT, "onnx_models", "lenet.onnx"), "-n", str(n), "--batch", "64", "--microbatches", "8",
            "--schedule", "1f1b", "--devices", devices, "-o", out])
    if not check(r.returncode == 0, f"{tag}: lenet -n {n} compiled ({r.stderr.strip()[-300:]})"):
        return None, None
    return out, json.load(open(os.path.join(out, "plan.json")))


def run(tag, out, data, *extra):
    log = os.path.join(out, f"log{len(extra)}.csv")
    r = sh([os.path.join(out, "run.sh"), "--data", data, "--steps", str(STEPS), "--log", log, *extra])
    ok = check(r.returncode == 0, f"{tag} {' '.join(extra)}: {STEPS} steps ({r.stderr.strip()[-300:]})")
    return (r.stdout, losses(log)) if ok else (None, None)


def main():
    tmp = tempfile.mkdtemp(prefix="pipecc-pin.")
    os.environ["PIPECC_CACHE"] = os.path.join(tmp, "machine.txt")
    cpus = sorted(os.sched_getaffinity(0))
    runs = len(cpus) <= 4
    cores = len(cpus) if runs else 2
    n = 2 * cores
    base = open(DEVICES).read()
    shared = os.path.join(tmp, "devices_shared.txt")
    with open(shared, "w") as f:
        f.write(base + f"host cores={cores}\n")
    data = os.path.join(tmp, "mnist")
    if not check(sh([DATAGEN, "mnist", data, "--n", "640", "--seed", "1"]).returncode == 0, "synthetic MNIST written"):
        return tally.finish()
    no_run = f"this machine has {len(cpus)} CPUs: the runs need n = 2 x CPUs ranks, run only on at most 4 CPUs (plan only)"

    tag = f"{n} ranks on {cores} cores"
    out, pj = plan(tmp, "shared", n, shared)
    if out:
        pin = pj["machine"].get("pinned_core")
        ok = check(isinstance(pin, list) and len(pin) == n and all(isinstance(c, int) and 0 <= c < cores for c in pin)
                   and set(pin) == set(range(cores)), f"{tag}: plan.json pins every rank to one of the cores, each core used ({pin})")
        listing = open(os.path.join(out, "schedule.txt")).read()
        if ok:
            named = all(re.search(rf"core {c}: rank {', '.join(str(s) for s in range(n) if pin[s] == c)}(;|\n)", listing)
                        for c in range(cores))
            check(f"{n} ranks share {cores} cores, each rank pinned to one" in listing and named,
                  f"{tag}: the listing names each core's ranks")
            for s in range(n):
                src = open(os.path.join(out, f"stage_{s}.c")).read()
                check(f"enum {{ PIN_CORE = {pin[s]}, PIN_CORES = {cores} }};" in src, f"{tag}: stage_{s}.c runs on core {pin[s]}")
        if not runs:
            tally.skip(f"{tag}: the pinned run, run.sh --no-pin and mpirun's binding", no_run)
        if runs and ok:
            r = sh(["make", "-s", "-C", out], timeout=600)
            if check(r.returncode == 0, f"{tag}: built ({r.stderr.strip()[-300:]})"):
                o1, l1 = run(tag, out, data)
                if o1 is not None:
                    m = re.search(r"^ranks pinned to CPUs ([\d ]+) \(", o1, re.M)
                    want = [cpus[c] for c in pin]
                    check(m and [int(x) for x in m.group(1).split()] == want,
                          f"{tag}: each rank pinned to its core's CPU ({m.group(1) if m else 'no line'} vs {want})")
                o2, l2 = run(tag, out, data, "--no-pin")
                if o2 is not None:
                    check("ranks pinned" not in o2, f"{tag}: run.sh --no-pin pins nothing")
                    check(l1 is not None and l1 == l2 and len(l1) == STEPS, f"{tag}: pinned and --no-pin give the same losses ({l1} / {l2})")
                o3, l3 = run(tag, out, data, "--bind-to", "core:overload-allowed")
                if o3 is not None:
                    check("ranks pinned" not in o3, f"{tag}: ranks mpirun bound itself are left as bound")
                    check(l3 == l1, f"{tag}: and give the same losses")

    tag = f"{n} ranks, a core each"
    out, pj = plan(tmp, "own", n, DEVICES)
    if out:
        check(pj["machine"].get("pinned_core", "missing") is None, f"{tag}: plan.json pins nothing ({pj['machine'].get('pinned_core', 'missing')})")
        check("enum { PIN_CORE = 0, PIN_CORES = 0 };" in open(os.path.join(out, "stage_0.c")).read(), f"{tag}: PIN_CORES 0")
        if not runs:
            tally.skip(f"{tag}: the run pins nothing", no_run)
        if runs:
            r = sh(["make", "-s", "-C", out], timeout=600)
            if check(r.returncode == 0, f"{tag}: built"):
                o, _ = run(tag, out, data)
                if o is not None:
                    check("ranks pinned" not in o, f"{tag}: the run pins nothing")
    return tally.finish()   # the one tally: what the imported suite's helpers counted is in it


if __name__ == "__main__":
    sys.exit(main())
