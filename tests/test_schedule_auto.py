"""pipecc --schedule auto (compiler/driver.c, choose_schedule): gpipe, 1f1b, zb1, interleaved (2, 3 and 4
chunks per rank) and zbv (two) each planned in full, the fastest predicted step kept (within 0.5% of it, the one with the
smallest busiest arena).

  * Each candidate's figures in plan.json's "schedule_auto" and in the listing are those the same
    flags give with --schedule KIND: predicted step, bubble, busiest arena (mlp, lenet, gpt at n = 2
    and 4, and under a --mem-limit that makes the schedules differ in what they must move).
  * The kept one follows the rule, and its directory is the one --schedule KIND writes: the same
    stage programs and weights, the same plan.json but for "schedule_auto".
  * At one stage, where every figure ties, 1f1b (the default) is kept.
  * A limit no schedule fits is refused naming each one's reason; --schedule auto under --dump-shapes
    and bad spellings behave.

  PIPECC=bin/pipecc-asan /usr/bin/python3 tests/test_schedule_auto.py
"""
import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402
from tally import check  # noqa: E402

SAME_STEP = 1.005


def plan(T, model, n, sched, *extra, plan_only=True):
    out = os.path.join(T, f"{model}-{n}-{sched.replace(' ', '')}-{len(extra)}" + ("" if plan_only else "-full") + ".pipe")
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([PIPECC, os.path.join(ROOT, "onnx_models", model + ".onnx"), "-n", str(n), "--batch", "32", "--microbatches", "8",
                        "--schedule", *flags_of(sched), "--devices", DEVICES, *extra, *(["--plan-only"] if plan_only else []), "-o", out],
                       capture_output=True, text=True, timeout=300)
    if r.returncode:
        return None, r.stderr.strip()
    with open(os.path.join(out, "plan.json")) as f:
        return (json.load(f), out), ""


# The candidates in the order auto plans them, and the flags that plan each alone.
KINDS = ["1f1b", "gpipe", "zb1", "interleaved x2", "interleaved x3", "interleaved x4", "zbv x2"]


def flags_of(kind):
    name, _, v = kind.partition(" x")
    return (name, "--chunks", v) if v else (name,)


def cand_name(c):
    return c["schedule"] + (f" x{c['chunks']}" if c.get("chunks", 1) > 1 else "")


def busiest(pj):
    """The busiest rank's arena: a stage's, or with chunks the rank's (its stages joined)."""
    if "ranks" in pj:
        return max(r["arena_bytes"] for r in pj["ranks"])
    return max(s["arena_bytes"] for s in pj["stage_plans"])


def compare(T, model, n, *extra):
    tag = f"{model} n={n}{' ' + ' '.join(extra) if extra else ''}"
    got, err = plan(T, model, n, "auto", *extra)
    if not check(got is not None, f"{tag}: --schedule auto plans", err[-300:]):
        return
    pj, out = got
    cands = {cand_name(c): c for c in pj.get("schedule_auto", [])}
    if not check(list(cands) == KINDS, f"{tag}: plan.json lists {', '.join(KINDS)}", str(list(cands))):
        return
    listing = open(os.path.join(out, "schedule.txt")).read()
    fits = {}
    for kind in KINDS:
        ref, why = plan(T, model, n, kind, *extra)
        c = cands[kind]
        if ref is None:
            check(not c["plans"] and c["why"] and c["why"] in why, f"{tag}: {kind} does not plan, and auto says why: {c.get('why', '')[:120]}")
            continue
        rp = ref[0]
        same = c["plans"] and c["predicted_step_time_s"] == rp["predicted_step_time_s"] and c["bubble"] == rp["bubble"] and \
            c["busiest_arena_bytes"] == busiest(rp)
        check(same, f"{tag}: {kind}'s figures are --schedule {kind}'s (step {rp['predicted_step_time_s']:.6g} s, bubble {rp['bubble']:.3f}, "
                    f"busiest arena {busiest(rp)})", json.dumps(c))
        check(re.search(rf"^ +{kind} +.* per step", listing, re.M) is not None, f"{tag}: the listing shows {kind}'s line")
        fits[kind] = c
    if not fits:
        return
    fastest = min(c["predicted_step_time_s"] for c in fits.values())
    near = [k for k, c in fits.items() if c["predicted_step_time_s"] <= fastest * SAME_STEP]
    # ties (one stage: every figure the same) keep the first listed, 1f1b, the default
    want = min(near, key=lambda k: (fits[k]["busiest_arena_bytes"], fits[k]["predicted_step_time_s"], list(cands).index(k)))
    kept = [k for k, c in cands.items() if c.get("kept")]
    chosen = pj["schedule"] + (f" x{pj['chunks']}" if pj.get("chunks", 1) > 1 else "")
    check(chosen == want and kept == [want], f"{tag}: auto keeps {want} (the fastest within 0.5%, the leanest of those)",
          f"kept {chosen}, flags {kept}")


def same_directory(T, model, n):
    """The kept schedule's directory: auto writes what --schedule KIND writes."""
    got, err = plan(T, model, n, "auto", plan_only=False)
    if not check(got is not None, f"{model} n={n}: --schedule auto writes the stage programs", err[-300:]):
        return
    pj, out = got
    chosen = pj["schedule"] + (f" x{pj['chunks']}" if pj.get("chunks", 1) > 1 else "")
    ref, err = plan(T, model, n, chosen, plan_only=False)
    if not check(ref is not None, f"{model} n={n}: --schedule {chosen} writes them too", err[-300:]):
        return
    rdir = ref[1]
    files = sorted(f for f in os.listdir(rdir) if f.startswith("stage_") and f.endswith(".c")) + ["Makefile"]
    files += [os.path.join("weights", f) for f in sorted(os.listdir(os.path.join(rdir, "weights")))]
    diff = [f for f in files if not filecmp.cmp(os.path.join(out, f), os.path.join(rdir, f), shallow=False)]
    pa = dict(pj)
    pa.pop("schedule_auto", None)
    check(not diff and pa == ref[0], f"{model} n={n}: the stage programs, weights, Makefile and plan.json (but for schedule_auto) are "
                                     f"--schedule {chosen}'s, byte for byte ({len(files)} files)", f"differ: {diff}")


def main():
    T = tempfile.mkdtemp(prefix="pipecc-auto.")
    os.environ["PIPECC_CACHE"] = os.path.join(T, "machine.txt")
    try:
        for model, n in (("mlp", 1), ("mlp", 2), ("lenet", 2), ("lenet", 4), ("gpt", 2), ("gpt", 4)):
            compare(T, model, n)
        # A limit under which the schedules differ in what they must move: 60% of 1f1b's busiest plain arena.
        base, _ = plan(T, "gpt", 4, "1f1b")
        if check(base is not None, "gpt n=4 1f1b plans (for the limit below)"):
            lim = str(int(busiest(base[0]) * 0.6))
            compare(T, "gpt", 4, "--mem-limit", lim)
        same_directory(T, "lenet", 2)
        same_directory(T, "gpt", 4)
        r = subprocess.run([PIPECC, os.path.join(ROOT, "onnx_models", "lenet.onnx"), "-n", "2", "--schedule", "auto", "--mem-limit", "1000",
                            "--plan-only", "-o", os.path.join(T, "tiny.pipe")], capture_output=True, text=True, timeout=300)
        check(r.returncode == 2 and "--schedule auto: no schedule plans (1f1b: " in r.stderr and "; gpipe: " in r.stderr and "; zb1: " in r.stderr
              and "; interleaved x2: " in r.stderr and "; zbv: " in r.stderr
              and not os.path.exists(os.path.join(T, "tiny.pipe")), "a limit no schedule fits: refused naming each one's reason, nothing written",
              r.stderr.strip()[-300:])
        r = subprocess.run([PIPECC, os.path.join(ROOT, "onnx_models", "lenet.onnx"), "--schedule", "Auto"], capture_output=True, text=True)
        check(r.returncode == 2 and "expected gpipe, 1f1b, zb1, interleaved, zbv, pipefb, async or auto" in r.stderr, "--schedule Auto: refused, listing auto",
              r.stderr.strip())
    finally:
        shutil.rmtree(T, ignore_errors=True)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
