"""The runtime's bubble accounting (docs/cost.md, "The bubble"): on LeNet, the summary's
"bubble X% measured" is 1 - the ranks' busy time / the ranks' wall time over the steps after
the first, busy being the wall time inside F, B, I, W, RECOMPUTE and UPDATE less the waits
inside them.  At n = 1 it is near 0 (and the plan's is 0); at n = 2, m = 2 under gpipe it is
clearly positive, and it matches the same figure recomputed from the run's --trace spans.
A few seconds.  Run with /usr/bin/python3."""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)
import test_trace as tt  # noqa: E402  (its paths, check() with the tally, and sh(): the same runs)

ROOT, PIPECC, DATAGEN, DEVICES = tt.ROOT, tt.PIPECC, tt.DATAGEN, tt.DEVICES
check, sh = tt.check, tt.sh
STEPS = 6
BUSY = {"F", "B", "I", "W", "RECOMPUTE", "UPDATE"}


def trace_bubble(path):
    """1 - sum(busy) / sum(wall) over the ranks and the steps after the first, from the spans."""
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    busy = wall = 0.0
    for rank in {e["tid"] for e in ev}:
        mine = [e for e in ev if e["tid"] == rank]
        acts = [e for e in mine if e["cat"] != "wait"]
        waits = [e for e in mine if e["cat"] == "wait"]
        for step in range(1, STEPS):
            spans = [e for e in acts if e["args"]["step"] == step]
            wall += max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans)
            for e in spans:
                if e["cat"] in BUSY:
                    inner = sum(w["dur"] for w in waits if w["ts"] >= e["ts"] - 0.002 and w["ts"] + w["dur"] <= e["ts"] + e["dur"] + 0.002)
                    busy += e["dur"] - inner
    return 1 - busy / wall


def main():
    tmp = tempfile.mkdtemp(prefix="pipecc-bubble.")
    os.environ["PIPECC_CACHE"] = os.path.join(tmp, "machine.txt")
    data = os.path.join(tmp, "mnist")
    if not check(sh([DATAGEN, "mnist", data, "--n", "640", "--seed", "1"]).returncode == 0, "synthetic MNIST written"):
        return tally.finish()
    for n in (1, 2):
        tag = f"lenet -n {n} gpipe m=2"
        out = os.path.join(tmp, f"n{n}.pipe")
        r = sh([PIPECC, os.path.join(ROOT, "onnx_models", "lenet.onnx"), "-n", str(n), "--batch", "64", "--microbatches", "2",
                "--schedule", "gpipe", "--devices", DEVICES, "-o", out])
        if not check(r.returncode == 0, f"{tag}: compiled ({r.stderr.strip()})"):
            continue
        r = sh(["make", "-s", "-C", out], timeout=600)
        if not check(r.returncode == 0, f"{tag}: built ({r.stderr.strip()[-300:]})"):
            continue
        trace = os.path.join(tmp, f"n{n}.json")
        r = sh([os.path.join(out, "run.sh"), "--data", data, "--steps", str(STEPS), "--trace", trace])
        if not check(r.returncode == 0, f"{tag}: {STEPS} steps with --trace ({r.stderr.strip()[-300:]})"):
            continue
        m = re.search(r"; bubble ([-\d.]+)% measured", r.stdout)
        if not check(m is not None, f"{tag}: the summary prints 'bubble X% measured'"):
            continue
        meas = float(m.group(1)) / 100
        plan = json.load(open(os.path.join(out, "plan.json")))
        from_trace = trace_bubble(trace)
        if n == 1:
            check(-0.001 <= meas < 0.05, f"{tag}: measured bubble {meas:.3f} is near 0")
            check(plan["bubble"] < 1e-6, f"{tag}: the plan's bubble {plan['bubble']:.4f} is 0")
        else:
            check(meas > 0.2, f"{tag}: measured bubble {meas:.3f} is clearly positive (ideal (p-1)/(m+p-1) = 0.333)")
            check(plan["bubble"] > 0.2, f"{tag}: the plan's bubble {plan['bubble']:.3f} too")
        check(abs(meas - from_trace) <= 0.03, f"{tag}: measured bubble {meas:.3f} matches the trace's spans ({from_trace:.3f})")
    return tally.finish()   # the one tally: what the imported suite's helpers counted is in it


if __name__ == "__main__":
    sys.exit(main())
