"""The run trace: `run.sh --trace FILE.json` on a 4-rank LeNet writes Chrome
trace event JSON with exactly one span per executed action (steps x the sum
of the ranks' list lengths in plan.json), each action's span on its rank's
track with its step, micro-batch, kind and slot, "wait" spans inside the run,
and a thread_name per rank; the ranks' spans on one clock (a forward ends after
its sender's, a backward after its sender's); for gpipe, 1f1b and zb1.  The run's summary
never shows a negative comm+other column.  The file says its format, version 2, and each span its
chunk and stage: with --chunks 2 (lenet, n = 2, interleaved) each rank's spans carry chunks 0 and 1
and their stages as plan.json's "ranks" has them, its UPDATE the whole rank's (chunk -1), its track
is named by its stages, and pipecc-trace draws it and says which stages each rank ran.  Run with
/usr/bin/python3."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
TRACE = os.path.join(ROOT, "bin", "pipecc-trace")
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


def check_chunks(tag, ev, plan):
    """Each rank's spans carry its chunks and their stages (plan.json's "ranks"); UPDATE is the whole rank's."""
    stages = {r["rank"]: r["stages"] for r in plan["ranks"]}
    spans = [e for e in ev if e.get("ph") == "X"]
    got = {r: sorted({e["args"]["chunk"] for e in spans if e["tid"] == r and e["cat"] not in ("UPDATE", "wait")}) for r in stages}
    check(got == {r: [0, 1] for r in stages}, f"{tag}: each rank's spans carry chunks 0 and 1 ({got})")
    ok = all(e["args"]["stage"] == (stages[e["tid"]][e["args"]["chunk"]] if e["args"]["chunk"] >= 0 else -1) for e in spans)
    check(ok, f"{tag}: every span's stage is its chunk's, as plan.json's ranks have them")
    check(all(e["args"]["chunk"] == -1 for e in spans if e["cat"] == "UPDATE"), f"{tag}: UPDATE is the whole rank's (chunk -1)")
    names = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
    check(names == {r: f"rank {r} (stages {s[0]} and {s[1]})" for r, s in stages.items()}, f"{tag}: thread names {names}")


def check_trace(tag, path, plan):
    try:
        doc = json.load(open(path))
    except (OSError, ValueError) as e:
        return check(False, f"{tag}: the trace is not valid JSON ({e})")
    ev = doc.get("traceEvents", [])
    check(doc.get("displayTimeUnit") == "ms", f"{tag}: displayTimeUnit is ms")
    check(doc.get("otherData", {}).get("pipecc_trace_version") == 2, f"{tag}: the trace says its format, version 2")
    chunked = "ranks" in plan
    # Each rank runs one list: with chunks plan.json's "ranks" has it whole (a stage's is its chunk's part).
    lists = {r["rank"]: r["actions"] for r in plan["ranks"]} if chunked else {s["stage"]: s["actions"] for s in plan["stage_plans"]}
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
                 {"step", "mb", "kind", "slot", "chunk", "stage"} <= set(e["args"]) for e in spans)
    check(fields, f"{tag}: spans carry pid, ts, dur and args step/mb/kind/slot/chunk/stage")
    if chunked:
        check_chunks(tag, ev, plan)
    else:
        names = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
        check(names == {k: f"rank {k} (stage {k})" for k in lists}, f"{tag}: thread names {names}")
        check(all(e["args"]["stage"] == (e["tid"] if e["args"]["chunk"] == 0 else -1) for e in spans),
              f"{tag}: every span's stage is its rank's (chunk 0), UPDATE's none")
    waits = [e for e in ev if e.get("cat") == "wait"]
    check(all(e["ph"] == "X" and e["dur"] >= 0 for e in waits), f"{tag}: {len(waits)} wait spans are well formed")
    # The ranks' spans are on one clock: a forward ends after the forward of the stage before, which sent it its
    # input (same step and micro-batch), and a backward (B, or I of zb1) after the one of the stage after.  Each
    # rank once counted from its own start, and with MPI_Wtime (which Open MPI counts from each process's start):
    # a receiving forward then ended up to 2.8 ms before the one it received from.
    end = {(e["args"]["stage"], e["args"]["step"], e["args"]["mb"], "F" if e["cat"] == "F" else "B"): e["ts"] + e["dur"]
           for e in spans if e["cat"] in ("F", "B", "I")}
    bad = []
    for (stage, step, mb, kind), t in end.items():
        sender = (stage - 1 if kind == "F" else stage + 1, step, mb, kind)
        if sender in end and end[sender] > t:
            bad.append(((stage, step, mb, kind), round(end[sender] - t)))
    check(not bad and len(end) == STEPS * 2 * len(plan["stage_plans"]) * plan["microbatches"],
          f"{tag}: every forward ends after its sender's, every backward after its sender's (one clock; {len(end)} spans; "
          f"out of order (stage, step, mb, kind), us: {bad[:4]})")


def main():
    tmp = tempfile.mkdtemp(prefix="pipecc-trace.")
    os.environ["PIPECC_CACHE"] = os.path.join(tmp, "machine.txt")
    data = os.path.join(tmp, "mnist")
    if not check(sh([DATAGEN, "mnist", data, "--n", "640", "--seed", "1"]).returncode == 0, "synthetic MNIST written"):
        return tally.finish()
    runs = [(sched, 4, []) for sched in ("gpipe", "1f1b", "zb1")] + [("interleaved", 2, ["--chunks", "2"])]
    for sched, n, extra in runs:
        tag = f"lenet -n {n} {sched} {' '.join(extra)}".strip()
        out = os.path.join(tmp, sched + ".pipe")
        r = sh([PIPECC, os.path.join(ROOT, "onnx_models", "lenet.onnx"), "-n", str(n), "--batch", "64", "--microbatches", "8",
                "--schedule", sched, "--devices", DEVICES, "-o", out, *extra])
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
        rows = r.stdout.split("comm+other_s")[-1].split("\n")[1:1 + n]
        other = [float(row.split()[3]) for row in rows if row.strip()]
        check(len(other) == n and min(other) >= 0, f"{tag}: comm+other column {other} is never negative")
        if extra:
            # pipecc-trace draws it, each rank's row with its chunks, and says which stages each rank ran.
            r = sh([TRACE, trace, "-o", os.path.join(tmp, sched + ".svg")])
            svg = open(os.path.join(tmp, sched + ".svg")).read() if r.returncode == 0 else ""
            check(r.returncode == 0 and "2 chunks a rank: rank 0 runs stages 0 and 2; rank 1 runs stages 1 and 3" in r.stdout
                  and 'data-chunk="1" data-stage="2"' in svg and 'data-chunk="1" data-stage="3"' in svg,
                  f"{tag}: pipecc-trace draws each rank's chunks and says their stages ({r.stdout.strip()} {r.stderr.strip()})")
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
