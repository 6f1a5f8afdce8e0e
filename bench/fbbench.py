#!/usr/bin/python3
"""Section 7 of `make bench`: PipeFB against 1F1B and 1F1B with peer offload (issue 12).

For the GPT and the ResNet at n = 4 (B = 32, m = 8): the plain 1F1B plan; 1F1B with the first half
of the ranks limited to half of the plain busiest arena and their stashed activations offloaded to
the other half (BPipe's pairing: a devices file from this machine's probe with `mem=` on ranks 0-1;
75% if no plan fits 50%); and `--schedule pipefb`.  Every plan is made with the node times the
memory-curve section measured (`--costs`), when it left them.  For each: the step time and
throughput, every rank's arena and peak RSS (the runtime summary), and the bytes every rank sent
per step (messages, offloaded activations, stash, weights: the summary's sent_bytes).  Run
alternately, REPEATS rounds, best median kept.  Reports the ratios the thesis claims: the busiest
rank's memory under pipefb against 1F1B's, and pipefb's speed against 1F1B with offload.
"""
import os
import statistics

import memcurve as mc
import svgplot

HERE = os.path.dirname(os.path.abspath(__file__))
SEC = "7_pipefb"
MODELS = [("gpt", 32, 8, "tokens", 25), ("resnet", 32, 8, "cifar", 15)]


def devices_file(b, path, limit, nlimited):
    """This machine's probe as a devices file, with mem=limit on ranks 0..nlimited-1."""
    cache = os.environ.get("PIPECC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "pipecc", "machine.txt")
    with open(cache) as f:
        text = f.read()
    flops = next(ln.split("flops=")[1].split()[0] for ln in text.splitlines() if ln.startswith("rank *"))
    extra = "".join(f"rank {r} flops={flops} mem={int(limit)}\n" for r in range(nlimited))
    with open(path, "w") as f:
        f.write(text + "\n# bench/fbbench.py: the first ranks limited\n" + extra)
    return path


def per_step(run, key, steps):
    return [st.get(key, 0) / steps for _, st in sorted(run["stages"].items())]


def bench_model(b, data, model, B, m, kind, steps, repeats):
    work = os.path.join(b.WORK, "fbbench")
    os.makedirs(work, exist_ok=True)
    prof = os.path.join(b.WORK, "memcurve", f"{model}.profile")
    costs = ["--costs", prof] if os.path.exists(prof) else []
    variants = {}
    d = os.path.join(work, f"{model}_1f1b.pipe")
    variants["1f1b"] = (d, mc.compile_variant(b, model, B, m, d, costs))
    plain_arena = mc.busiest(variants["1f1b"][1])[1]
    for pct in (50, 75):
        d = os.path.join(work, f"{model}_peer.pipe")
        dev = devices_file(b, os.path.join(work, f"{model}_devices_{pct}.txt"), plain_arena * pct / 100, mc.N // 2)
        try:
            variants["1f1b+peer"] = (d, mc.compile_variant(b, model, B, m, d, costs + ["--devices", dev, "--offload", "peer",
                                                                                           "--recompute", "none"]))
            variants["1f1b+peer"][1]["_limit_pct"] = pct
            break
        except mc.Infeasible as e:
            b.log(f"  {model}: peer offload at {pct}%: {e}")
    d = os.path.join(work, f"{model}_pipefb.pipe")
    variants["pipefb"] = (d, mc.compile_variant(b, model, B, m, d, costs + ["--schedule", "pipefb"]))
    first = None
    for name, (d, _) in variants.items():
        mc.build_dir(b, d, first)
        first = first or d
    runs = {k: [] for k in variants}
    order = list(variants)
    for rnd in range(repeats):
        for name in (order if rnd % 2 == 0 else order[::-1]):
            d, plan = variants[name]
            runs[name].append(b.attempt(mc.run_stages, b, d, plan, data[kind], steps))
    res = {}
    for name, (d, plan) in variants.items():
        ok = [r for r in runs[name] if isinstance(r, dict)]
        if not ok:
            res[name] = {"error": str(runs[name][0]) if runs[name] else "no run"}
            continue
        r = min(ok, key=lambda x: x["median_s"])
        st = r["stages"]
        res[name] = {"plan": plan, "step_s": r["median_s"], "samples_s": B / r["median_s"],
                     "arena": [s["arena_bytes"] for s in plan["stage_plans"]],
                     "roles": [s.get("role", "both") for s in plan["stage_plans"]],
                     "rss": [st[k].get("rss_peak_bytes") for k in sorted(st)],
                     "sent_per_step": sum(st[k].get("sent_bytes", 0) for k in st) / steps,
                     "limit_pct": plan.get("_limit_pct")}
    return res


def section_fb(b, data, repeats=None):
    repeats = repeats or max(1, int(os.environ.get("BENCH_FB_REPEATS", "1" if b.QUICK else "2")))
    mib = 2 ** 20
    body, series = [], []
    for model, B, m, kind, steps in MODELS:
        if b.QUICK:
            steps = max(10, steps // 2)
        b.log(f"pipefb: {model} -n {mc.N} B={B} m={m}")
        try:
            res = bench_model(b, data, model, B, m, kind, steps, repeats)
        except Exception as e:  # noqa: BLE001
            b.log(f"  error: {e}")
            b.add_row(SEC, model, "case", "ERROR", note=str(e))
            body += [f"**{model}**: ERROR: {e}", ""]
            continue
        body += [f"**{model}** (`-n {mc.N} --batch {B} --microbatches {m}`, {steps} steps, best median of {repeats} round(s))", "",
                 "| plan | step ms | samples/s | per rank: arena MiB (role) | per rank: peak RSS MiB | busiest arena MiB | "
                 "busiest peak RSS MiB | bytes sent per step, all ranks (MiB) |", "|---|---|---|---|---|---|---|---|"]
        pts = []
        for name in ("1f1b", "1f1b+peer", "pipefb"):
            r = res.get(name)
            label = name if name != "1f1b+peer" or not r or "error" in r else f"1f1b + peer offload (ranks 0-1 at {r['limit_pct']}%)"
            if not r:
                body.append(f"| {name} | infeasible |||||||")
                continue
            if "error" in r:
                body.append(f"| {label} | ERROR: {r['error'][:160]} |||||||")
                b.add_row(SEC, f"{model} {name}", "case", "ERROR", note=r["error"])
                continue
            arenas = ", ".join(f"{a / mib:.2f}" + (f" ({ro[0]})" if ro != "both" else "") for a, ro in zip(r["arena"], r["roles"]))
            rss = ", ".join(f"{x / mib:.1f}" if x else "?" for x in r["rss"])
            busy_a, busy_r = max(r["arena"]), max(x or 0 for x in r["rss"])
            body.append(f"| {label} | {r['step_s'] * 1e3:.1f} | {r['samples_s']:.0f} | {arenas} | {rss} | {busy_a / mib:.2f} | "
                        f"{busy_r / mib:.1f} | {r['sent_per_step'] / mib:.2f} |")
            b.add_row(SEC, f"{model} {name}", "step_time", r["step_s"] * 1e3, "ms")
            b.add_row(SEC, f"{model} {name}", "busiest_arena", busy_a, "bytes")
            b.add_row(SEC, f"{model} {name}", "busiest_rss_peak", busy_r, "bytes")
            b.add_row(SEC, f"{model} {name}", "bytes_sent_per_step", r["sent_per_step"], "bytes")
            pts.append((name, busy_a / mib, r["step_s"] * 1e3))
        p, base, peer = res.get("pipefb"), res.get("1f1b"), res.get("1f1b+peer")
        if p and base and "error" not in p and "error" not in base:
            mem_ratio = max(p["arena"]) / max(base["arena"])
            b.add_row(SEC, model, "pipefb_busiest_arena_over_1f1b", mem_ratio, "x", note="the thesis: far lower")
            line = f"pipefb's busiest arena is {mem_ratio:.2f}x 1F1B's"
            if peer and "error" not in peer:
                speed = p["step_s"] / peer["step_s"]
                b.add_row(SEC, model, "pipefb_step_over_1f1b_peer", speed, "x", note="the thesis: a small loss")
                line += f"; its step is {speed:.2f}x that of 1F1B with peer offload ({max(peer['arena']) / mib:.2f} MiB busiest)"
            line += f" and {p['step_s'] / base['step_s']:.2f}x plain 1F1B's."
            body += ["", line, ""]
        series += [{"name": f"{model} {n}", "points": [(x, y)], "line": False} for n, x, y in pts]
    svg = os.path.join(HERE, "pipefb.svg")
    try:
        svgplot.plot(svg, series, title=f"PipeFB vs 1F1B at n = {mc.N}: busiest arena against step time", xlabel="busiest rank's arena, MiB",
                     ylabel="step, ms", notes=["1f1b+peer: ranks 0-1 limited, their stash offloaded to ranks 2-3 (see the table)."])
        body.append("![busiest arena against step time](pipefb.svg)")
    except Exception as e:  # noqa: BLE001
        body.append(f"(plot failed: {e})")
    body += ["", "Arena = the stage program's static arena (plan.json); peak RSS = the runtime summary's rss_peak_bytes "
             "(peak anonymous RSS of the process, MPI and BLAS included); bytes sent = the summary's sent_bytes over "
             "all ranks (forward values, gradients, offloaded activations, stash, weights), per step."]
    b.md_sections.append(("7. PipeFB: forwards and backwards on different ranks, against 1F1B and 1F1B with peer offload",
                          "\n".join(body)))


if __name__ == "__main__":   # this section alone: /usr/bin/python3 bench/fbbench.py (writes bench/pipefb.md)
    import bench as b  # noqa: E402
    os.makedirs(b.WORK, exist_ok=True)
    section_fb(b, b.make_data())
    with open(os.path.join(HERE, "pipefb.md"), "w") as f:
        for title, text in b.md_sections:
            f.write(f"## {title}\n\n{text}\n")
