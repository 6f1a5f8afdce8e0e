#!/usr/bin/python3
"""Section 8 of `make bench`: the asynchronous schedule against 1F1B and ZB-H1 (issue 13).

For LeNet and the GPT at n = 2 and 4, with m = p and m = 2p micro-batches: the same model, batch, data
and learning rate planned as 1F1B, as ZB-H1 and as `--schedule async --staleness 1`, each trained S
steps, alternating the three, REPEATS rounds (best round kept).  Reported:

  * throughput: samples/s over the run after a warm-up (the log's elapsed time, so async's fill and
    drain are paid), and async's ratio to 1F1B and to ZB-H1 (the issue's target: >= 1.3x 1F1B at m = p);
  * time to 1F1B's loss: the loss 1F1B reaches after S steps (a 5-step moving average), and the wall
    time each schedule takes to reach it (async's steps are stale, so it may need more of them);
  * a plot of that moving-average loss against wall time for the three schedules, per model at n = 4,
    m = p (bench/async_<model>.svg);
  * exposed communication per stage (the runtime summary's exposed_s: time waiting for a message its
    sender had already sent), per step, with `--progress wait` (the default) and `--progress poll`, for
    1F1B and async at n = 4, m = 2p.
"""
import csv
import json
import os
import re
import statistics

import memcurve as mc
import svgplot

HERE = os.path.dirname(os.path.abspath(__file__))
SEC = "8_async"
MODELS = [("lenet", 256, "mnist", 60), ("gpt", 32, "tokens", 40)]   # model, batch, data, steps
SCHEDS = [("1f1b", []), ("zb1", []), ("async", ["--staleness", "1"])]


LR = {"inception": 0.02, "densenet": 0.02}   # the branchy models (bench.py's LR has the others)


def compile_plan(b, model, n, B, m, sched, extra, out):
    if os.path.isdir(out):
        import shutil
        shutil.rmtree(out)
    cmd = [b.PIPECC, os.path.join(b.ROOT, "onnx_models", f"{model}.onnx"), "-n", str(n), "--batch", str(B), "--microbatches", str(m),
           "--schedule", sched, "--lr", str(b.LR.get(model, LR.get(model, 0.02))), "-o", out] + extra
    b.run_cmd(cmd, b.TIMEOUT_COMPILE)


def train(b, d, n, B, data, steps):
    """One run: per-step (elapsed s, loss) from the log, the summary table."""
    logf = d.rstrip("/") + ".log.csv"
    if os.path.exists(logf):
        os.remove(logf)
    _, out, _, _ = b.run_cmd([os.path.join(d, "run.sh"), "--data", data, "--steps", str(steps), "--log", logf], b.TIMEOUT_RUN)
    with open(logf) as f:
        rows = [(float(r["time_s"]), float(r["loss"])) for r in csv.DictReader(f)]
    if len(rows) != steps:
        raise b.CmdError(f"log has {len(rows)} steps, expected {steps}")
    warm = max(3, steps // 6)
    t = rows[-1][0] - rows[warm - 1][0]
    return {"rows": rows, "samples_s": B * (steps - warm) / t if t > 0 else float("nan"), "stages": mc.parse_summary(out, n)}


def smooth(rows, k=5):
    """(elapsed, moving average of the last k losses) per step."""
    out = []
    for i in range(len(rows)):
        w = [l for _, l in rows[max(0, i - k + 1):i + 1]]
        out.append((rows[i][0], sum(w) / len(w)))
    return out


def time_to(rows, target):
    for t, l in smooth(rows):
        if l <= target:
            return t
    return None


def bench_case(b, data, model, B, kind, steps, n, m, repeats, variants):
    work = os.path.join(b.WORK, "asyncbench")
    os.makedirs(work, exist_ok=True)
    dirs, first = {}, None
    for name, sched, extra in variants:
        d = os.path.join(work, f"{model}_n{n}_m{m}_{name}.pipe")
        compile_plan(b, model, n, B, m, sched, extra, d)
        mc.build_dir(b, d, first)
        first = first or d
        dirs[name] = d
    runs = {name: [] for name in dirs}
    order = list(dirs)
    for rnd in range(repeats):
        for name in (order if rnd % 2 == 0 else order[::-1]):
            runs[name].append(b.attempt(train, b, dirs[name], n, B, data[kind], steps))
    res = {}
    for name in dirs:
        ok = [r for r in runs[name] if isinstance(r, dict)]
        res[name] = max(ok, key=lambda r: r["samples_s"]) if ok else {"error": str(runs[name][0]) if runs[name] else "no run"}
    return res


def section_async(b, data, repeats=None):
    repeats = repeats or max(1, int(os.environ.get("BENCH_ASYNC_REPEATS", "1" if b.QUICK else "2")))
    body = ["Each row: the same model, batch and learning rate; samples/s over the run after a warm-up (async's fill and "
            f"drain included); best of {repeats} alternating round(s).  Time to 1F1B's loss: the wall time until the 5-step "
            "moving average of the loss first reaches what 1F1B's reaches after all its steps.", "",
            "| model | n | m | 1F1B samples/s | ZB-H1 samples/s | async samples/s | async / 1F1B | async / ZB-H1 | "
            "time to 1F1B's loss: 1F1B s | ZB-H1 s | async s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    exposed = ["", "Exposed communication per step (ms; the summary's exposed_s over the steps), per stage, at n = 4, "
               "m = 2p; `--progress poll` lets MPI move messages between nodes:", "",
               "| model | schedule | progress | step ms | exposed ms per step, per stage | wait ms per step, per stage |",
               "|---|---|---|---|---|---|"]
    for model, B, kind, steps in MODELS:
        if b.QUICK:
            steps = max(15, steps // 2)
        for n in (2, 4):
            for m in (n, 2 * n):
                b.log(f"async: {model} -n {n} m={m}")
                variants = [(name, name, extra) for name, extra in SCHEDS]
                poll = n == 4 and m == 2 * n
                if poll:
                    variants += [("1f1b+poll", "1f1b", ["--progress", "poll"]), ("async+poll", "async", ["--staleness", "1", "--progress", "poll"])]
                try:
                    res = bench_case(b, data, model, B, kind, steps, n, m, repeats, variants)
                except Exception as e:  # noqa: BLE001
                    b.log(f"  error: {e}")
                    b.add_row(SEC, f"{model} n={n} m={m}", "case", "ERROR", note=str(e))
                    body.append(f"| {model} | {n} | {m} | ERROR: {str(e)[:160]} |||||||")
                    continue
                if any("error" in res[k] for k in ("1f1b", "zb1", "async")):
                    errs = "; ".join(f"{k}: {res[k]['error'][:120]}" for k in res if "error" in res[k])
                    body.append(f"| {model} | {n} | {m} | ERROR: {errs} |||||||")
                    b.add_row(SEC, f"{model} n={n} m={m}", "case", "ERROR", note=errs)
                    continue
                sp = {k: res[k]["samples_s"] for k in ("1f1b", "zb1", "async")}
                target = smooth(res["1f1b"]["rows"])[-1][1]
                tt = {k: time_to(res[k]["rows"], target) for k in ("1f1b", "zb1", "async")}
                r1, rz = sp["async"] / sp["1f1b"], sp["async"] / sp["zb1"]
                fmt_t = lambda x: f"{x:.2f}" if x is not None else f"not in {steps} steps"  # noqa: E731
                body.append(f"| {model} | {n} | {m} | {sp['1f1b']:.0f} | {sp['zb1']:.0f} | {sp['async']:.0f} | {r1:.2f} | {rz:.2f} | "
                            f"{fmt_t(tt['1f1b'])} | {fmt_t(tt['zb1'])} | {fmt_t(tt['async'])} |")
                case = f"{model} n={n} m={m}"
                for k in sp:
                    b.add_row(SEC, case, f"{k}_samples_per_s", sp[k], "samples/s")
                b.add_row(SEC, case, "async_over_1f1b", r1, "x", target=">= 1.3 at m = p" if m == n else "",
                          met=b.yes(r1 >= 1.3) if m == n else "")
                b.add_row(SEC, case, "async_over_zb1", rz, "x")
                for k in tt:
                    b.add_row(SEC, case, f"{k}_time_to_1f1b_loss", tt[k] if tt[k] is not None else "not reached", "s")
                if n == 4 and m == n:
                    series = [{"name": k, "points": smooth(res[k]["rows"])} for k in ("1f1b", "zb1", "async")]
                    svg = os.path.join(HERE, f"async_{model}.svg")
                    try:
                        svgplot.plot(svg, series, title=f"{model}, n = 4, m = 4: loss (5-step moving average) against wall time",
                                     xlabel="wall time, s", ylabel="loss", hlines=[(target, "1F1B's final loss")])
                        body.append(f"![{model} loss against time](async_{model}.svg)")
                    except Exception as e:  # noqa: BLE001
                        body.append(f"(plot failed: {e})")
                if poll:
                    for k, label, prog in (("1f1b", "1f1b", "wait"), ("1f1b+poll", "1f1b", "poll"), ("async", "async", "wait"),
                                           ("async+poll", "async", "poll")):
                        r = res.get(k, {})
                        if "error" in r or not r.get("stages"):
                            exposed.append(f"| {model} | {label} | {prog} | ERROR: {r.get('error', 'no summary')[:120]} |||")
                            continue
                        st = r["stages"]
                        ex = [st[s].get("exposed_s", float("nan")) / steps * 1e3 for s in sorted(st)]
                        wt = [st[s].get("wait_s", float("nan")) / steps * 1e3 for s in sorted(st)]
                        exposed.append(f"| {model} | {label} | {prog} | {B / r['samples_s'] * 1e3:.1f} | "
                                       f"{', '.join(f'{x:.2f}' for x in ex)} | {', '.join(f'{x:.2f}' for x in wt)} |")
                        b.add_row(SEC, f"{model} n=4 m=8 {label} {prog}", "exposed_ms_per_step_max_stage", max(ex), "ms")
    b.md_sections.append(("8. Async: a pipeline that never drains, against 1F1B and ZB-H1; exposed communication",
                          "\n".join(body + exposed + section_dag(b, data, repeats))))


# The planners on the branchy models: today's (--partition chain --route relay) and the new one
# (the downset DP, direct sends), predicted and measured step (1F1B, CIFAR-format data).
DAG_CASES = [("inception", 4, 16, 8), ("densenet", 4, 16, 8), ("densenet", 8, 16, 16)]
STEP_RE = re.compile(r"step time ([0-9.]+) ms measured, ([0-9.]+) ms predicted")


def section_dag(b, data, repeats):
    rows = ["", "The planners on the branchy models (1F1B): today's (`--partition chain --route relay`: ranges of the "
            "model's order, values relayed through every rank between) against the new one (`--partition dag`, direct sends). "
            f"Step times in ms, best of {repeats} alternating round(s); the predicted one is the plan's.", "",
            "| model | n | B | m | today's: predicted | measured | new: predicted | measured | new slowest stage / today's |",
            "|---|---|---|---|---|---|---|---|---|"]
    work = os.path.join(b.WORK, "asyncbench")
    os.makedirs(work, exist_ok=True)
    steps = 8 if b.QUICK else 20
    for model, n, B, m in DAG_CASES:
        b.log(f"planners: {model} -n {n}")
        try:
            dirs, plans, first = {}, {}, None
            for name, extra in (("old", ["--partition", "chain", "--route", "relay"]), ("new", [])):
                d = os.path.join(work, f"{model}_n{n}_{name}.pipe")
                compile_plan(b, model, n, B, m, "1f1b", extra, d)
                mc.build_dir(b, d, first)
                first = first or d
                dirs[name] = d
                with open(os.path.join(d, "plan.json")) as f:
                    plans[name] = json.load(f)
            best = {}
            for rnd in range(repeats):
                for name in (("old", "new") if rnd % 2 == 0 else ("new", "old")):
                    _, out, _, _ = b.run_cmd([os.path.join(dirs[name], "run.sh"), "--data", data["cifar"], "--steps", str(steps)],
                                             b.TIMEOUT_RUN)
                    mt = STEP_RE.search(out)
                    if mt:
                        cur = (float(mt.group(1)), float(mt.group(2)))
                        best[name] = min(best.get(name, cur), cur)
            slow = {k: plans[k]["max_stage_time_s"] for k in plans}
            o, nw = best.get("old"), best.get("new")
            if not o or not nw:
                raise b.CmdError("no summary line")
            rows.append(f"| {model} | {n} | {B} | {m} | {o[1]:.2f} | {o[0]:.2f} | {nw[1]:.2f} | {nw[0]:.2f} | "
                        f"{slow['new'] / slow['old']:.3f} |")
            b.add_row(SEC, f"{model} n={n} planners", "new_over_old_predicted_step", nw[1] / o[1], "x")
            b.add_row(SEC, f"{model} n={n} planners", "new_over_old_measured_step", nw[0] / o[0], "x")
        except Exception as e:  # noqa: BLE001
            rows.append(f"| {model} | {n} | {B} | {m} | ERROR: {str(e)[:160]} |||||")
            b.add_row(SEC, f"{model} n={n} planners", "case", "ERROR", note=str(e))
    return rows


if __name__ == "__main__":   # this section alone: /usr/bin/python3 bench/asyncbench.py [planners] (writes bench/async.md)
    import sys
    import bench as b  # noqa: E402
    os.makedirs(b.WORK, exist_ok=True)
    data = b.make_data()
    if sys.argv[1:] == ["planners"]:
        b.md_sections.append(("The planners on the branchy models", "\n".join(section_dag(b, data, 2))))
    else:
        section_async(b, data)
    with open(os.path.join(HERE, "async.md"), "w") as f:
        f.write(f"Written by bench/asyncbench.py {' '.join(sys.argv[1:])} on {b.machine_info()[0][1]}.\n\n")
        for title, text in b.md_sections:
            f.write(f"## {title}\n\n{text}\n")
