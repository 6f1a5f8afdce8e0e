#!/usr/bin/python3
"""zb1 and zbv: where a micro-batch's values wait for its W (--split-layout, docs/schedules.md, zb1).

Under a split backward each stage lays out its arena two ways and keeps the smaller: `hold` keeps the
micro-batch's forward ring copy until W; `late` frees it after I and keeps only what W reads (late values,
a copy per wslot; output gradients, a copy per gslot; a value at a cut W reads, copied during I).  For each
case, pipecc plans the model with --split-layout auto, late and hold, and trains -n 1 (1f1b), late and hold.
Checks:

  * the three plans cut the model alike, and each stage's (with chunks, each rank's) arena under auto is the
    smaller of late's and hold's, and plan.json names that stage's layout;
  * on the cases marked so, the late layout is the smaller on some stage (it is exercised, not only planned);
  * late and hold train to -n 1's saved model byte for byte, with -n 1's logged losses;
  * late's generated programs reach the late values through wslot, and the actions' wslots in plan.json
    name only micro-batches' copies the ring has (0 .. nwslots - 1);
  * --split-layout with a schedule that does not split the backward, or an unknown value, is refused.

  /usr/bin/python3 tests/test_late.py [--ci]
  make test-late     # every case below

--ci (make test): lenet at n = 2 under zb1.  Ends with "N passed, M failed, K skipped, R refused" (tests/tally.py).
"""
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402
from test_chunks import DATA, PIPECC, ROOT, make_data, sh, tail  # noqa: E402

SIZES = {"mlp": (32, 8), "lenet": (32, 8), "gpt": (16, 8), "resnet": (16, 8)}
STEPS = 3
# (model, n, schedule, whether the late layout must win on some stage)
CASES = [("lenet", 2, "zb1", True), ("gpt", 2, "zb1", True), ("gpt", 4, "zb1", True), ("gpt", 2, "zbv", True),
         ("resnet", 4, "zb1", True), ("mlp", 4, "zb1", False), ("lenet", 4, "zbv", False)]
CI = [("lenet", 2, "zb1", True)]


def plan(work, model, n, sched, layout, plan_only=True):
    """pipecc's plan with --split-layout LAYOUT: (out dir, plan.json) or None after counting a failure."""
    batch, mbs = SIZES[model]
    out = os.path.join(work, f"{model}_n{n}_{sched}_{layout}.pipe")
    cmd = [PIPECC, os.path.join(ROOT, "onnx_models", model + ".onnx"), "-n", str(n), "--batch", str(batch), "--microbatches", str(mbs),
           "--schedule", sched, "--lr", "0.05", "-o", out]
    if layout:
        cmd += ["--split-layout", layout]
    if plan_only:
        cmd += ["--plan-only"]
    rc, text = sh(cmd)
    if rc:
        tally.check(False, f"{model} n={n} {sched} --split-layout {layout}: plans", tail(text))
        return None
    return out, json.load(open(os.path.join(out, "plan.json")))


def arenas(pj):
    """Each rank's arena (a rank of chunks: its joined program's)."""
    if pj.get("ranks"):
        return [r["arena_bytes"] for r in pj["ranks"]]
    return [s["memory"]["total"] for s in pj["stage_plans"]]


def train(work, data, out, what):
    """make and run.sh: (saved bytes, losses) or None after counting a failure."""
    rc, text = sh(["make", "-s", "-j2", "-C", out])
    if rc:
        tally.check(False, f"{what}: builds", tail(text))
        return None
    log, saved = out + ".csv", out + ".onnx"
    rc, text = sh([os.path.join(out, "run.sh"), "--data", data, "--steps", str(STEPS), "--seed", "1", "--log", log, "--save", saved,
                   "--timeout", "240", "--quiet"])
    if rc or not os.path.exists(saved):
        tally.check(False, f"{what}: trains", tail(text))
        return None
    losses = [l.split(",")[1] for l in open(log).read().splitlines()[1:] if l.count(",") >= 1]
    return open(saved, "rb").read(), losses


def layouts_checked(model, n, sched, must_win, plans):
    what = f"{model} n={n} {sched}"
    cuts = {k: [s["node_begin"] for s in pj["stage_plans"]] for k, (_, pj) in plans.items()}
    tally.check(cuts["auto"] == cuts["late"] == cuts["hold"], f"{what}: auto, late and hold cut the model alike", str(cuts))
    a, l, h = (arenas(plans[k][1]) for k in ("auto", "late", "hold"))
    names = [s.get("split_layout") for s in plans["auto"][1]["stage_plans"]]
    if plans["auto"][1].get("ranks"):
        # A rank of chunks joins stages that chose each its own layout: at most the smaller of either everywhere.
        tally.check(all(x <= min(y, z) for x, y, z in zip(a, l, h)), f"{what}: each rank's arena under auto is at most the "
                    "smaller of late's and hold's", f"auto {a}, late {l}, hold {h}")
    else:
        tally.check(a == [min(x, y) for x, y in zip(l, h)], f"{what}: each arena under auto is the smaller of late's and hold's",
                    f"auto {a}, late {l}, hold {h}")
        ok = [nm == ("late" if x < y else "hold" if y < x else nm) for nm, x, y in zip(names, l, h)]
        tally.check(all(ok), f"{what}: plan.json names each stage's layout, the smaller one where they differ", f"{names}, late {l}, hold {h}")
    tally.check(all(x == "hold" for x in (s.get("split_layout") for s in plans["hold"][1]["stage_plans"])) and
                all(x == "late" for x in (s.get("split_layout") for s in plans["late"][1]["stage_plans"])),
                f"{what}: --split-layout late and hold each lay out every stage so")
    if must_win:
        tally.check(any(x < y for x, y in zip(l, h)), f"{what}: the late layout is the smaller on some stage (late {l}, hold {h})")
    print(f"# {what}: busiest arena auto {max(a)}, late {max(l)}, hold {max(h)} bytes", flush=True)


def wslots_checked(out, pj, what):
    """The late programs reach their late values through wslot; every action's late slot is one the ring has."""
    srcs = [open(os.path.join(out, f)).read() for f in sorted(os.listdir(out)) if re.fullmatch(r"stage_\d+\.c", f)]
    tally.check(any("(wslot)" in s for s in srcs), f"{what}: the late programs reach late values through wslot")
    bad = []
    for st in pj["stage_plans"]:
        nw = st.get("nwslots", 0)
        for a in st.get("actions", []):
            if "late_slot" in a and not 0 <= a["late_slot"] < nw:
                bad.append((st["stage"], a["op"], a["late_slot"], nw))
    tally.check(not bad, f"{what}: every action's late slot is a copy its stage's late ring has", str(bad[:5]))


def case(work, data, model, n, sched, must_win, ref):
    what = f"{model} n={n} {sched}"
    plans = {}
    for layout in ("auto", "late", "hold"):
        got = plan(work, model, n, sched, layout, plan_only=layout == "auto")
        if not got:
            return
        plans[layout] = got
    layouts_checked(model, n, sched, must_win, plans)
    wslots_checked(plans["late"][0], plans["late"][1], f"{what} late")
    for layout in ("late", "hold"):
        got = train(work, data[DATA[model]], plans[layout][0], f"{what} --split-layout {layout}")
        if got and ref:
            tally.check(got[0] == ref[0], f"{what} --split-layout {layout}: the trained model is -n 1's, byte for byte")
            tally.check(got[1] == ref[1], f"{what} --split-layout {layout}: the losses are -n 1's", f"{got[1]} vs {ref[1]}")


def refusals(work):
    out = os.path.join(work, "refused.pipe")
    for args, want in ((["--schedule", "1f1b", "--split-layout", "late"], "only zb1 and zbv split the backward"),
                       (["--schedule", "zb1", "--split-layout", "sideways"], "expected auto, late or hold")):
        rc, text = sh([PIPECC, os.path.join(ROOT, "onnx_models", "lenet.onnx"), "-n", "2", *args, "-o", out])
        tally.check(rc == 2 and want in text and not os.path.exists(out), f"refused: {' '.join(args)} (rc {rc}: {text.strip()[:160]})")


def main():
    ci = "--ci" in sys.argv
    work = tempfile.mkdtemp(prefix="pipecc-late-")
    try:
        data = make_data(work)
        refs = {}
        for model, n, sched, must_win in CI if ci else CASES:
            if model not in refs:
                got = plan(work, model, 1, "1f1b", None, plan_only=False)
                refs[model] = got and train(work, data[DATA[model]], got[0], f"{model} n=1 1f1b")
            case(work, data, model, n, sched, must_win, refs[model])
        refusals(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
