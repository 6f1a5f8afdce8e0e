"""The run trace: `run.sh --trace FILE.json` on a 4-rank LeNet writes Chrome
trace event JSON with exactly one span per executed action (steps x the sum
of the ranks' list lengths in plan.json), each action's span on its rank's
track with its step, micro-batch, kind and slot, "wait" spans inside the run,
and a thread_name per rank; the ranks' spans on one clock (a forward ends after
its sender's, a backward after its sender's); for gpipe, 1f1b and zb1.  The run's summary
never shows a negative comm+other column.  Run with /usr/bin/python3."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
STEPS = 3
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


def check(cond, what):
    tally.count(cond)
    print(("ok - " if cond else "not ok - ") + what)
    return cond


def sh(cmd, timeout=300):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def check_trace(tag, path, plan):
    try:
        doc = json.load(open(path))
    except (OSError, ValueError) as e:
        return check(False, f"{tag}: the trace is not valid JSON ({e})")
    ev = doc.get("traceEvents", [])
    check(doc.get("displayTimeUnit") == "ms", f"{tag}: displayTimeUnit is ms")
    lists = {s["stage"]: s["actions"] for s in plan["stage_plans"]}
    spans = [e for e in ev if e.get("ph") == "X" and e.get("cat") != "wait"]
    want = STEPS * sum(len(a) for a in lists.values())
    check(len(spans) == want, f"{tag}: {len(spans)} action spans, expected {want} ({STEPS} steps x the ranks' list lengths)")
    # Per rank and step, the spans are the list itself, in order.
    ok = True
    for rank, acts in lists.items():
        for step in range(STEPS):
            got = [e["name"] for e in spans if e["tid"] == rank and e["args"]["step"] == step]
            ok &= got == [a["op"] for a in acts]
    check(ok, f"{tag}: every rank's spans follow its action list, step by step")
    fields = all(e["pid"] == 0 and e["dur"] >= 0 and e["ts"] >= 0 and e["cat"] == e["args"]["kind"] and
                 {"step", "mb", "kind", "slot"} <= set(e["args"]) for e in spans)
    check(fields, f"{tag}: spans carry pid, ts, dur and args step/mb/kind/slot")
    names = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
    check(names == {k: f"rank {k} (stage {k})" for k in lists}, f"{tag}: thread names {names}")
    waits = [e for e in ev if e.get("cat") == "wait"]
    check(all(e["ph"] == "X" and e["dur"] >= 0 for e in waits), f"{tag}: {len(waits)} wait spans are well formed")
    # The ranks' spans are on one clock: a forward ends after the forward of the rank before, which sent it its
    # input (same step and micro-batch), and a backward (B, or I of zb1) after the one of the rank after.  Each
    # rank once counted from its own start, and with MPI_Wtime (which Open MPI counts from each process's start):
    # a receiving forward then ended up to 2.8 ms before the one it received from.
    end = {(e["tid"], e["args"]["step"], e["args"]["mb"], "F" if e["cat"] == "F" else "B"): e["ts"] + e["dur"]
           for e in spans if e["cat"] in ("F", "B", "I")}
    bad = []
    for (rank, step, mb, kind), t in end.items():
        sender = (rank - 1 if kind == "F" else rank + 1, step, mb, kind)
        if sender in end and end[sender] > t:
            bad.append(((rank, step, mb, kind), round(end[sender] - t)))
    check(not bad and len(end) == STEPS * 2 * len(lists) * plan["microbatches"],
          f"{tag}: every forward ends after its sender's, every backward after its sender's (one clock; {len(end)} spans; "
          f"out of order (rank, step, mb, kind), us: {bad[:4]})")


def main():
    tmp = tempfile.mkdtemp(prefix="pipecc-trace.")
    os.environ["PIPECC_CACHE"] = os.path.join(tmp, "machine.txt")
    data = os.path.join(tmp, "mnist")
    if not check(sh([DATAGEN, "mnist", data, "--n", "640", "--seed", "1"]).returncode == 0, "synthetic MNIST written"):
        return tally.finish()
    for sched in ("gpipe", "1f1b", "zb1"):
        tag = f"lenet -n 4 {sched}"
        out = os.path.join(tmp, sched + ".pipe")
        r = sh([PIPECC, os.path.join(ROOT, "onnx_models", "lenet.onnx"), "-n", "4", "--batch", "64", "--microbatches", "8",
                "--schedule", sched, "--devices", DEVICES, "-o", out])
        if not check(r.returncode == 0, f"{tag}: compiled ({r.stderr.strip()})"):
            continue
        r = sh(["make", "-s", "-C", out], timeout=600)
        if not check(r.returncode == 0, f"{tag}: built ({r.stderr.strip()[-300:]})"):
            continue
        trace = os.path.join(tmp, sched + ".json")
        r = sh([os.path.join(out, "run.sh"), "--data", data, "--steps", str(STEPS), "--trace", trace])
        if not check(r.returncode == 0, f"{tag}: {STEPS} steps with --trace ({r.stderr.strip()[-300:]})"):
            continue
        plan = json.load(open(os.path.join(out, "plan.json")))
        check_trace(tag, trace, plan)
        rows = r.stdout.split("comm+other_s")[-1].split("\n")[1:5]
        other = [float(row.split()[3]) for row in rows if row.strip()]
        check(len(other) == 4 and min(other) >= 0, f"{tag}: comm+other column {other} is never negative")
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
