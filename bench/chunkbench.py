#!/usr/bin/python3
"""`make bench-chunks`: virtual stages (--chunks) against 1F1B and ZB-H1, measured beside the plan.

For each case of CASES (model, batch, steps) at n = 2 and m = 4 and 8: 1f1b, zb1, interleaved (--chunks 2) and
zbv (--chunks 2) compiled from one kernel cache (made afresh for the case and filled by `pipecc-probe --kernels` at
the case's batch and micro-batches, as bench-auto's "kernels" planning does), built, and trained in rounds
interleaved in time (A B C D A B C D ..., BENCH_REPEATS rounds, default 7), so that other jobs on the machine hit
every schedule alike (each round first waits, up to BENCH_QUIET_WAIT seconds, default 45, for an idle second).
Per schedule the median over the rounds of: each run's median step after warm-up
(samples/s = batch / that), and the runtime summary's measured bubble, beside plan.json's predicted_step_time_s
and bubble and the closed forms.  Each run also records how many cores other jobs took while it ran (/proc/stat
less this process tree's CPU time); the rounds in which that stayed under QUIET for every schedule are summarised
again on their own.  `--schedule auto` is planned from the same cache; its kept schedule is run in the same rounds
if it is not one of the four, and compared with the fastest measured schedule.  The same four schedules are also
planned on docs/schedules/gen.py's model of equal layers, for the bubbles the lists give on their own.

Targets (the chunks issue), reported, never asserted:
  * zbv's measured bubble at most a third of 1f1b's (same case, same rounds);
  * interleaved's measured bubble within 15% of the prediction (n-1)/(V m + n-1) (relative to that prediction).

Writes bench/chunks.md (with bench/chunks_notes.md, the hand-written reading of the committed run, at its end) and
bench/chunks.svg; the measurements go to bench/work/chunks/results.json, from which `chunkbench.py --report`
writes the two again.  Environment: BENCH_REPEATS, BENCH_QUICK=1 (fewer steps, 2 rounds)."""
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench as b  # noqa: E402  (paths, runners, data)
import svgplot  # noqa: E402

CASES = [("lenet", 256, 80, "mnist"), ("gpt", 32, 60, "tokens")]
MS = (4, 8)
N = 2
V = 2
# (label, --schedule, extra flags)
SCHEDS = [("1f1b", "1f1b", []), ("zb1", "zb1", []), ("interleaved", "interleaved", ["--chunks", str(V)]),
          ("zbv", "zbv", ["--chunks", str(V)])]
ZBV_TARGET = 1 / 3          # zbv's measured bubble <= a third of 1f1b's
INTERLEAVED_TOL = 0.15      # interleaved's measured bubble within 15% of (n-1)/(V m + n - 1)
AUTO_TOL = 0.05             # bench-auto's target for auto's choice: the best or within 5%
QUIET = 0.25                # a round is quiet when other jobs took under this many cores during each of its runs
QUIET_WAIT = float(os.environ.get("BENCH_QUIET_WAIT", "45"))   # seconds a round waits, at most, for the machine to be idle
REPEATS = max(1, int(os.environ.get("BENCH_REPEATS", "2" if b.QUICK else "7")))
if b.QUICK:
    CASES = [(m, B, max(20, s // 4), d) for m, B, s, d in CASES]


def log(msg):
    print(f"[chunks {time.time() - b.T0:6.1f}s] {msg}", flush=True)


def closed_form(label, m):
    """The balanced-pipeline bubble of the schedule's kind: 1F1B's (p-1)/(m+p-1) with p = n ranks for 1f1b and zb1
    (zb1 is shorter: its unit-time step is 3m + n - 1 against 1F1B's 3(m + n - 1)); (n-1)/(V m + n - 1) for
    interleaved; for zbv, whose unit-time step is within 3 units of 6m + n - 1 (compiler/schedchunk.c, with 6m units of
    work per rank), the approximate (n-1)/(6m+n-1)."""
    if label in ("1f1b", "gpipe"):
        return (N - 1) / (m + N - 1)
    if label == "zb1":
        return (N - 1) / (3 * m + N - 1)   # the idle share of a 3m + n - 1 unit step with 3m units of work per rank
    if label == "interleaved":
        return (N - 1) / (V * m + N - 1)
    if label == "zbv":
        return (N - 1) / (6 * m + N - 1)
    return None


def cpu_snapshot():
    """(machine busy seconds, steal seconds, this process's and its reaped children's CPU seconds, wall)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / hz          # user nice system irq softirq
    steal = (v[7] if len(v) > 7 else 0) / hz
    own = sum(getattr(resource.getrusage(w), k) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for k in ("ru_utime", "ru_stime"))
    return busy, steal, own, time.time()


def wait_quiet():
    """Before a round: wait, up to QUIET_WAIT seconds, until a 1-second window in which other jobs (all CPU time less
    this process tree's) used under QUIET cores.  Returns the seconds waited.  Other jobs come and go in bursts (builds
    of other checkouts), so this makes quiet rounds likelier, and every schedule of the round still meets alike what
    comes during it."""
    t0 = time.time()
    while True:
        a = cpu_snapshot()
        time.sleep(1)
        z = cpu_snapshot()
        if ((z[0] - a[0]) - (z[2] - a[2])) / max(z[3] - a[3], 1e-9) < QUIET or time.time() - t0 >= QUIET_WAIT:
            return time.time() - t0


def run_measured(d, plan, data, steps):
    """b.run_pipe, plus how many cores the rest of the machine used meanwhile: (all CPU time - this benchmark's and
    its run's) / wall, and the hypervisor's steal time / wall."""
    a = cpu_snapshot()
    r = b.run_pipe(d, plan, data, steps)
    z = cpu_snapshot()
    wall = max(z[3] - a[3], 1e-9)
    r["others_cores"] = max(0.0, ((z[0] - a[0]) - (z[2] - a[2])) / wall)
    r["steal_cores"] = (z[1] - a[1]) / wall
    return r


def per_step(res, steps, key):
    """A summary column (seconds over the whole run), summed over the ranks, per step."""
    return sum(st[key] for st in res["stages"].values()) / steps


def measure(model, B, m, steps, data):
    work = os.path.join(b.WORK, "chunks")
    os.makedirs(work, exist_ok=True)
    kcache = os.path.join(work, f"kernels-{model}-m{m}.txt")
    for f in (kcache, kcache + ".lock"):
        if os.path.exists(f):
            os.remove(f)
    os.environ["PIPECC_KERNEL_CACHE"] = kcache
    log(f"{model} m={m}: pipecc-probe --kernels")
    b.probe_kernels(model, N, B, m, data)
    # --schedule auto, planned from the same cache.
    auto = b.compile_plan(model, N, B, m, "auto", os.path.join(work, f"{model}_m{m}_auto.pipe"), ["--plan-only"])
    kept = auto["schedule"]
    kept_label = kept + (f" --chunks {auto['chunks']}" if auto.get("chunks", 1) > 1 else "")
    scheds = list(SCHEDS)
    if kept_label not in [s[0] for s in scheds]:
        scheds.append((kept_label, kept, ["--chunks", str(auto["chunks"])] if auto.get("chunks", 1) > 1 else []))
    dirs = {}
    for label, sched, extra in scheds:
        d = os.path.join(work, f"{model}_m{m}_{label.replace(' ', '').replace('--', '_')}.pipe")
        plan = b.compile_plan(model, N, B, m, sched, d, extra)
        b.run_cmd(["make", "-s", "-j2", "-C", d], b.TIMEOUT_BUILD)
        dirs[label] = (d, plan)
    runs = {label: [] for label, _, _ in scheds}
    loads, waits = [os.getloadavg()[0]], []
    for r in range(REPEATS):
        waits.append(wait_quiet())
        for label, _, _ in scheds:
            d, plan = dirs[label]
            try:
                # run_pipe reads one summary row (and one stage_K program) per rank: a chunked plan has fewer ranks than stages.
                x = run_measured(d, dict(plan, stages=len(plan["ranks"])) if plan.get("ranks") else plan, data, steps)
            except b.CmdError as e:
                log(f"  {label} round {r + 1}: ERROR {e}")
                continue
            runs[label].append({"round": r, "median_s": x["median_s"], "bubble": x["bubble"], "others_cores": x["others_cores"],
                                "steal_cores": x["steal_cores"], **{k: per_step(x, steps, k) for k in ("compute_s", "wait_s", "other_s")}})
        loads.append(os.getloadavg()[0])
        log(f"{model} m={m} round {r + 1}/{REPEATS}: " + ", ".join(
            f"{label} {1e3 * runs[label][-1]['median_s']:.2f} ms / {100 * runs[label][-1]['bubble']:.1f}% "
            f"(others {runs[label][-1]['others_cores']:.2f})" for label, _, _ in scheds if runs[label]))
    raw = {}
    for label, sched, extra in scheds:
        d, plan = dirs[label]
        raw[label] = {"schedule": sched, "extra": extra, "stages": plan["stages"], "runs": runs[label],
                      "pred_step_s": plan["predicted_step_time_s"], "pred_bubble": plan["bubble"],
                      "plan_ideal_bubble": plan.get("ideal_bubble"),
                      "cuts": [(sp["node_begin"], sp["node_end"]) for sp in plan["stage_plans"]],
                      "compute_pred_s": m * sum(sp["fwd_time_s"] + sp["bwd_time_s"] for sp in plan["stage_plans"])}
    cands = {c["schedule"]: c for c in auto.get("schedule_auto", [])}
    return {"model": model, "m": m, "batch": B, "steps": steps, "raw": raw, "auto": {"kept": kept_label, "candidates": cands},
            "loads": loads, "waits": waits}


def aggregate(case, quiet_only=False):
    """Per schedule: medians over the rounds (quiet_only: over the rounds in which every schedule's run saw other jobs
    take under QUIET cores), beside the plan's figures.  None for a schedule with no run."""
    raw, m, B = case["raw"], case["m"], case["batch"]
    rounds = None
    if quiet_only:
        by_round = {}
        for v in raw.values():
            for r in v["runs"]:
                by_round.setdefault(r["round"], []).append(r["others_cores"])
        rounds = {k for k, xs in by_round.items() if len(xs) == len(raw) and max(xs) < QUIET}
    res = {}
    for label, v in raw.items():
        rs = [r for r in v["runs"] if rounds is None or r["round"] in rounds]
        if not rs:
            res[label] = None
            continue
        med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
        step = med("median_s")
        res[label] = dict({k: v[k] for k in ("schedule", "extra", "stages", "pred_step_s", "pred_bubble", "plan_ideal_bubble", "cuts",
                                             "compute_pred_s")},
                          rounds=len(rs), step_s=step, step_lo=min(r["median_s"] for r in rs), step_hi=max(r["median_s"] for r in rs),
                          samples_s=B / step, bubble=med("bubble"), bubble_lo=min(r["bubble"] for r in rs),
                          bubble_hi=max(r["bubble"] for r in rs), closed_form=closed_form(label, m), compute_s=med("compute_s"),
                          wait_s=med("wait_s"), other_s=med("other_s"), others_cores=med("others_cores"),
                          steal_cores=med("steal_cores"))
    return res


def unit_plans():
    """The same four schedules planned (--plan-only) on docs/schedules/gen.py's model of 16 equal layers and
    described machine (F = I = W per stage, messages free), at n = N, batch 64 m: what the lists give without
    imbalance, message cost or core sharing.  Returns {m: {label: bubble}}."""
    import importlib.util
    import tempfile
    spec = importlib.util.spec_from_file_location("schedgen", os.path.join(b.ROOT, "docs", "schedules", "gen.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        model, mach = os.path.join(tmp, "chain16.onnx"), os.path.join(tmp, "machine.txt")
        gen.chain_model(model)
        with open(mach, "w") as f:
            f.write(f"# chunkbench\n# blas kernels: {b.blas_kernels()}\nrank * flops=50G\nlink * bandwidth=1000G latency=0us\n"
                    "memcpy bandwidth=1000G\nhost cores=8\n")
        env = dict(os.environ, PIPECC_CACHE=mach, PIPECC_KERNEL_CACHE="off")
        for m in MS:
            out[m] = {}
            for label, sched, extra in SCHEDS:
                d = os.path.join(tmp, f"{label}{m}.pipe")
                b.run_cmd([b.PIPECC, model, "-n", str(N), "--batch", str(64 * m), "--microbatches", str(m), "--schedule", sched,
                           "-o", d, "--plan-only"] + extra, b.TIMEOUT_COMPILE, env=env)
                with open(os.path.join(d, "plan.json")) as f:
                    out[m][label] = json.load(f)["bubble"]
    return out


def unit_table(u):
    lines = ["| m | " + " | ".join(f"{label} plan (closed form)" for label, _, _ in SCHEDS) + " | zbv / 1f1b | interleaved / (n-1)/(Vm+n-1) |",
             "|---|" + "---|" * (len(SCHEDS) + 2)]
    for m, r in u.items():
        lines.append(f"| {m} | " + " | ".join(f"{pct(r[label])} ({'~' if label == 'zbv' else ''}{pct(closed_form(label, m))})"
                                             for label, _, _ in SCHEDS)
                     + f" | {r['zbv'] / r['1f1b']:.2f} | {r['interleaved'] / closed_form('interleaved', m):.2f} |")
    return "\n".join(lines)


def pct(x, spec=".1f"):
    return "n/a" if x is None else f"{100 * x:{spec}}%"


def ms(x):
    return "n/a" if x is None else f"{1e3 * x:.2f}"


def main_table(rows):
    lines = ["| model | m | schedule | stages | samples/s (median) | step ms: measured median (min-max) | predicted step ms | "
             "pred / meas | bubble measured median (min-max) | plan's bubble | closed form |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, m, res, auto, _ in rows:
        for label, r in res.items():
            if r is None:
                lines.append(f"| {model} | {m} | {label} | ERROR | | | | | | | |")
                continue
            lines.append(f"| {model} | {m} | {label} | {r['stages']} | {r['samples_s']:.0f} | {ms(r['step_s'])} ({ms(r['step_lo'])}-"
                         f"{ms(r['step_hi'])}) | {ms(r['pred_step_s'])} | {r['pred_step_s'] / r['step_s']:.2f} | {pct(r['bubble'])} "
                         f"({pct(r['bubble_lo'])}-{pct(r['bubble_hi'])}) | {pct(r['pred_bubble'])} | {'~' if label == 'zbv' else ''}{pct(r['closed_form'])} |")
    return "\n".join(lines)


def ratio_table(rows):
    lines = ["| model | m | samples/s / 1f1b's: zb1 | interleaved | zbv | zbv bubble / 1f1b bubble (target <= 0.33) | met? | "
             "interleaved bubble: measured / (n-1)/(Vm+n-1) = ratio (target 0.85-1.15) | met? | interleaved measured / plan's bubble | "
             "the plans' own: zbv / 1f1b bubble | interleaved plan / (n-1)/(Vm+n-1) | smallest bubbles of the rounds: zbv / 1f1b | "
             "interleaved / (n-1)/(Vm+n-1) | other jobs' cores (median of the case's runs) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    targets = []

    def r2(x):
        return "n/a" if x is None else f"{x:.2f}"

    for model, m, res, auto, _ in rows:
        base, z, il = res.get("1f1b"), res.get("zbv"), res.get("interleaved")
        if not (base and z and il):
            lines.append(f"| {model} | {m} | " + " | ".join(["n/a"] * 13) + " |")
            continue
        thr = [r2(res[s]["samples_s"] / base["samples_s"]) if res.get(s) else "n/a" for s in ("zb1", "interleaved", "zbv")]
        cf = closed_form("interleaved", m)
        zr = z["bubble"] / base["bubble"] if base["bubble"] > 0 else None
        zok = None if zr is None else zr <= ZBV_TARGET
        ir = il["bubble"] / cf
        iok = abs(ir - 1) <= INTERLEAVED_TOL
        ip = il["bubble"] / il["pred_bubble"] if il["pred_bubble"] > 0 else None
        zlo = z["bubble_lo"] / base["bubble_lo"] if base["bubble_lo"] > 0 else None
        others = statistics.median(r["others_cores"] for r in res.values() if r)
        targets.append((model, m, zr, zok, ir, iok))
        cells = thr + [r2(zr), b.yes(zok), f"{pct(il['bubble'])} / {pct(cf)} = {r2(ir)}", b.yes(iok), r2(ip),
                       r2(z["pred_bubble"] / base["pred_bubble"]), r2(il["pred_bubble"] / cf), r2(zlo), r2(il["bubble_lo"] / cf),
                       f"{others:.2f}"]
        lines.append(f"| {model} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines), targets


def cost_table(rows):
    lines = ["| model | m | schedule | compute s/step (both ranks) | wait s/step | comm+other s/step | compute / 1f1b's | "
             "predicted compute s/step | measured / predicted compute | other jobs' cores during the runs (steal) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model, m, res, auto, _ in rows:
        base = res.get("1f1b")
        for label, r in res.items():
            if r is None:
                continue
            if not base:
                continue
            lines.append(f"| {model} | {m} | {label} | {ms(r['compute_s'])} ms | {ms(r['wait_s'])} ms | {ms(r['other_s'])} ms | "
                         f"{r['compute_s'] / base['compute_s']:.2f} | {ms(r['compute_pred_s'])} ms | {r['compute_s'] / r['compute_pred_s']:.2f} | "
                         f"{r['others_cores']:.2f} ({r['steal_cores']:.2f}) |")
    return "\n".join(lines)


def auto_table(rows, quiet):
    """auto's kept schedule against the fastest by the median step over all rounds, and over the quiet rounds."""
    lines = ["| model | m | auto's candidates (predicted step ms) | auto keeps | fastest measured (all rounds) | auto's step / fastest's | "
             "within 5%? | fastest (quiet rounds) | auto's step / fastest's | within 5%? |", "|---|---|---|---|---|---|---|---|---|---|"]
    hits = qhits = 0
    qres = {(model, m): res for model, m, res, _, _ in quiet}

    def judge(res, kept):
        ok = {k: v for k, v in (res or {}).items() if v}
        if not ok or kept not in ok:
            return "n/a", None, False
        fastest = min(ok, key=lambda k: ok[k]["step_s"])
        gap = ok[kept]["step_s"] / ok[fastest]["step_s"]
        return fastest, gap, gap <= 1 + AUTO_TOL

    for model, m, res, auto, _ in rows:
        kept = auto["kept"]
        cands = ", ".join(f"{s} {ms(c['predicted_step_time_s'])}" if c.get("plans") else f"{s} (no plan)"
                          for s, c in auto["candidates"].items())
        f1, g1, h1 = judge(res, kept)
        f2, g2, h2 = judge(qres.get((model, m)), kept)
        hits, qhits = hits + h1, qhits + h2
        lines.append(f"| {model} | {m} | {cands} | {kept} | {f1} | {'n/a' if g1 is None else f'{g1:.3f}'} | {b.yes(h1 if g1 else None)} | "
                     f"{f2} | {'n/a' if g2 is None else f'{g2:.3f}'} | {b.yes(h2 if g2 else None)} |")
    return "\n".join(lines), hits, qhits


def plot(rows, quiet):
    """Measured bubble against the plan's: the quiet rounds' medians, and (small crosses of the same colour) all rounds'."""
    series = []
    for label, _, _ in SCHEDS:
        pts = [(100 * r[label]["pred_bubble"], 100 * r[label]["bubble"]) for _, _, r, _, _ in quiet if r.get(label)]
        series.append({"name": f"{label} (quiet rounds)", "points": pts, "line": False, "color": svgplot.COLORS[len(series)]})
    for i, (label, _, _) in enumerate(SCHEDS):
        pts = [(100 * r[label]["pred_bubble"], 100 * r[label]["bubble"]) for _, _, r, _, _ in rows if r.get(label)]
        series.append({"name": f"{label} (all rounds)", "points": pts, "line": False, "color": series[i]["color"],
                       "marker": "cross", "size": 3})
    hi = max([100.0] + [y for s in series for _, y in s["points"]])
    series.append({"name": "measured = plan", "points": [(0, 0), (hi, hi)], "marker": "plus", "size": 0.1, "dash": "4,3",
                   "color": "#7f7f7f"})
    path = os.path.join(HERE, "chunks.svg")
    svgplot.plot(path, series, title=f"n = {N}: measured bubble against plan.json's",
                 xlabel="plan.json bubble, %", ylabel="measured bubble (median over rounds), %", xlim=(0, hi), ylim=(0, hi),
                 notes=["one point per case and schedule: " + ", ".join(f"{model} m={m}" for model, m, _, _, _ in rows)
                        + f"; 2 ranks on the 2 cores of a shared VM; quiet rounds: other jobs under {QUIET} cores during every run"])
    return path


RESULTS = os.path.join(b.WORK, "chunks", "results.json")


def main():
    if sys.argv[1:] == ["--report"]:   # chunks.md and the plot again from the last run's measurements
        with open(RESULTS) as f:
            return report(json.load(f))
    info = dict(b.machine_info())
    data = b.make_data()
    try:
        unit = unit_table(unit_plans())
    except (b.CmdError, ImportError) as e:
        unit = f"ERROR: {e}"
    cases = []
    for model, B, steps, kind in CASES:
        for m in MS:
            try:
                cases.append(measure(model, B, m, steps, data[kind]))
            except b.CmdError as e:
                log(f"{model} m={m}: ERROR {e}")
    saved = {"info": info, "unit": unit, "repeats": REPEATS, "end_load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
             "config": "; ".join(f"{model} B={B} ({steps} steps)" for model, B, steps, _ in CASES), "cases": cases}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(saved, f, indent=1)
    return report(saved)


def report(saved):
    info, unit, repeats, end_load, cases = saved["info"], saved["unit"], saved["repeats"], saved["end_load"], saved["cases"]
    rows = [(c["model"], c["m"], aggregate(c), c["auto"], c["loads"]) for c in cases]
    quiet = [(c["model"], c["m"], aggregate(c, True), c["auto"], c["loads"]) for c in cases]
    quiet = [q for q in quiet if q[2] and all(v is not None for v in q[2].values())]
    rtab, targets = ratio_table(rows)
    qtab, qtargets = ratio_table(quiet) if quiet else ("(no quiet round)", [])
    atab, hits, qhits = auto_table(rows, quiet)
    zb_hits = sum(1 for t in targets if t[3])
    il_hits = sum(1 for t in targets if t[5])
    md = [
        "# Virtual stages: interleaved and ZB-V against 1F1B and ZB-H1 (make bench-chunks)", "",
        "`bench/chunkbench.py`.  n = 2 ranks; m = 4 and 8 micro-batches; " + saved["config"] + ".  interleaved and zbv run "
        f"`--chunks {V}` (S = {N * V} stages, 2 per rank); 1f1b and zb1 one stage per rank.  All plans of a case come from one "
        "kernel cache, made afresh for the case and filled by `pipecc-probe --kernels` at its batch and micro-batches "
        "(`bench/work/chunks/kernels-*.txt`); the FLOP model's cuts and predictions are not shown.  The schedules run in "
        f"{repeats} rounds interleaved in time (1f1b, zb1, interleaved, zbv, 1f1b, ...), so that other jobs on the machine "
        "hit all of them alike; every figure is the median over the rounds of one run's figure (a run's step: the median "
        "of its steps after warm-up; its bubble: the runtime summary's, 1 - busy / wall over the steps after the first, "
        "docs/cost.md).  Ratios are against 1f1b measured in the same rounds.  `python3 bench/chunkbench.py --report` "
        "writes this file again from the measurements (bench/work/chunks/results.json).",
        "",
        "**This machine has 2 cores, shared by the 2 ranks and by whatever else runs on it.**  Each rank has a core only "
        "while nothing else wants one; a rank that is descheduled makes its peer wait, and that wait counts as bubble.  "
        f"Each round first waits, up to {QUIET_WAIT:.0f} s, for a second in which other jobs use under {QUIET} cores "
        "(the waits per case are below).  "
        "Every run records how many cores other jobs took meanwhile (`other jobs' cores`, below); where that is near 1, "
        "the two ranks shared one core and the bubbles are far above what two dedicated cores would show.  The rounds "
        f"in which every schedule's run saw under {QUIET} cores taken by others are summarised on their own "
        "(\"Quiet rounds only\").",
        "",
        f"Machine: {json.dumps(info)}.  Load average at the end: {end_load}.  One-minute load average per case "
        "(before the first round, after each): " + "; ".join(f"{model} m={m}: " + " ".join(f"{x:.1f}" for x in loads)
                                                            for model, m, _, _, loads in rows) + ".  Seconds each round waited "
        "for an idle second: " + "; ".join(f"{c['model']} m={c['m']}: " + " ".join(f"{w:.0f}" for w in c.get("waits", []))
                                           for c in cases) + ".",
        "",
        "## Measured beside predicted", "",
        "`stages`: S, the stages the model is cut into.  `plan's bubble`: plan.json `bubble` (the simulation of the "
        "lists with each stage's predicted times: imbalance included).  `closed form`: a balanced pipeline's bubble for "
        "the schedule: 1f1b (n-1)/(m+n-1); zb1 (n-1)/(3m+n-1), the idle share of its 3m + n - 1 unit step "
        "(compiler/schedule.c); interleaved (n-1)/(V m + n-1); zbv ~(n-1)/(6m+n-1) (its unit-time step is within 3 units "
        "of 6m + n - 1, compiler/schedchunk.c, over 6m units of work per rank).  Note: plan.json's `ideal_bubble` is "
        "(p-1)/(m+p-1) with p = the plan's `stages`, so for a chunked plan it is computed over S = "
        f"{N * V} stages, not (n-1)/(V m + n - 1): "
        + ", ".join(f"{model} m={m} {pct(res['interleaved']['plan_ideal_bubble'])}" for model, m, res, _, _ in rows
                    if res.get("interleaved")) + ".",
        "",
        main_table(rows), "",
        "## Ratios and the issue's targets", "",
        rtab, "",
        f"- zbv's measured bubble at most a third of 1f1b's: met in {zb_hits} of {len(targets)} cases.",
        f"- interleaved's measured bubble within 15% of (n-1)/(V m + n - 1): met in {il_hits} of {len(targets)} cases.",
        "",
        "### Quiet rounds only", "",
        f"The same, over the rounds in which other jobs took under {QUIET} cores during every schedule's run (`rounds`: "
        "how many).",
        "",
        main_table(quiet) if quiet else "(no quiet round)", "",
        qtab, "",
        f"- zbv's measured bubble at most a third of 1f1b's: met in {sum(1 for t in qtargets if t[3])} of {len(qtargets)} cases.",
        f"- interleaved's within 15% of (n-1)/(V m + n - 1): met in {sum(1 for t in qtargets if t[5])} of {len(qtargets)} cases.",
        "",
        "## The same lists on equal stages (plans only)", "",
        f"The four schedules planned (`--plan-only`) at n = {N} on the model of docs/schedules/gen.py (16 equal Gemm layers, "
        "F = I = W per stage, messages free, no cores shared: docs/schedules.md): the bubble the lists themselves give, "
        "without stage imbalance, message cost or another job on the cores.",
        "",
        unit, "",
        "## Where the time goes", "",
        "The runtime summary's per-rank columns, summed over both ranks and divided by the steps (median over the "
        "rounds): compute (inside F, B, I, W and the update), wait (blocked on a message), and the rest (posting "
        "messages, local copies between two stages of one rank, the loader, the loss).  `predicted compute`: m times "
        "the stages' predicted forward + backward per micro-batch (plan.json `stage_plans`' `fwd_time_s` + `bwd_time_s`, "
        "from the kernel cache; the update left out).  `other jobs' cores`: while each run ran, the machine's CPU time "
        "(/proc/stat: user, nice, system, irq, softirq) less this benchmark's and its run's own (getrusage), over the wall "
        "time, i.e. how many of the 2 cores other jobs took on average; steal: the hypervisor's steal time the same way "
        "(median over the rounds).",
        "",
        cost_table(rows), "",
        "## --schedule auto", "",
        "Planned from the same kernel cache, `--plan-only`.  Its candidates are those plan.json `schedule_auto` lists; "
        "if its kept schedule is not one of the four, it was built and run in the same rounds.  Fastest: by the median "
        "step over all rounds, and over the quiet rounds.",
        "",
        atab, "",
        f"auto's choice was the fastest measured schedule or within 5% of it in {hits} of {len(rows)} cases (all rounds), "
        f"{qhits} of {len(quiet)} (quiet rounds).",
        "",
        "## Plot", "",
        "![measured bubble against the plan's](chunks.svg)", "",
        "## Reading the results", "",
        "NOTES_PLACEHOLDER", "",
    ]
    text = "\n".join(md)
    notes_file = os.path.join(HERE, "chunks_notes.md")
    if os.path.exists(notes_file):   # the hand-written reading of the committed run, kept beside the script's output
        with open(notes_file) as f:
            text = text.replace("NOTES_PLACEHOLDER", f.read().strip())
    else:
        text = text.replace("NOTES_PLACEHOLDER", "(no notes)")
    if rows:
        plot(rows, quiet)
    with open(os.path.join(HERE, "chunks.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
