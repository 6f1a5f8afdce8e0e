#!/usr/bin/python3
"""The compiler at scale (issue 15): pipecc's time and peak memory on GPT-2-small-shaped models of three sizes
(the same d = 768, 12 heads, context 1024 and vocabulary 50257; 3, 6 and 12 blocks), for -n 8, with
--plan-only and with the stage programs written.  Both should grow linearly with the model.

  /usr/bin/python3 bench/compilescale.py [--layers 3,6,12] [--runs 3]

Exports into bench/work/compilescale/ (the 12-block model is onnx_models/large/gpt2_small.onnx when `make models`
made it), measures each run with GNU time (`%e %M`: wall seconds, peak RSS), keeps the median time and the
largest RSS, and writes bench/compilescale.md and bench/compilescale.svg (time and memory against the file
size, with the straight line through the smallest and largest points for comparison)."""
import argparse
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORK = os.path.join(HERE, "work", "compilescale")
PIPECC = os.path.join(ROOT, "bin", "pipecc")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "onnx_models"))
from svgplot import plot  # noqa: E402


def model_path(layers):
    big = os.path.join(ROOT, "onnx_models", "large", "gpt2_small.onnx")
    if layers == 12 and os.path.exists(big):
        return big
    path = os.path.join(WORK, f"gpt2_{layers}l.onnx")
    if not os.path.exists(path):
        import export as ex  # onnx_models/export.py
        ex.export(os.path.basename(path),
                  lambda: ex.GPT(vocab_size=50257, block_size=1024, n_embd=768, n_head=12, n_layer=layers),
                  ex.rand_tokens(50257, 1024, batch=1), "tokens", 17, WORK)
    return path


def measure(cmd, runs):
    times, rss = [], []
    for _ in range(runs):
        r = subprocess.run(["/usr/bin/time", "-f", "BENCHTIME %e %M"] + cmd, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()[-300:]}")
        m = re.search(r"BENCHTIME ([\d.]+) (\d+)", r.stderr)
        times.append(float(m.group(1)))
        rss.append(int(m.group(2)) * 1024)
    return statistics.median(times), max(rss), times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="3,6,12")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(WORK, exist_ok=True)
    rows = []
    for layers in [int(x) for x in a.layers.split(",")]:
        path = model_path(layers)
        size = os.path.getsize(path)
        out = os.path.join(WORK, f"gpt2_{layers}l.pipe")
        tp, mp, runs_p = measure([PIPECC, path, "-n", "8", "--plan-only", "-o", out], a.runs)
        shutil.rmtree(out, ignore_errors=True)
        tf, mf, runs_f = measure([PIPECC, path, "-n", "8", "-o", out], a.runs)
        shutil.rmtree(out, ignore_errors=True)
        rows.append(dict(layers=layers, size=size, tp=tp, mp=mp, tf=tf, mf=mf, runs_p=runs_p, runs_f=runs_f))
        print(rows[-1], flush=True)
    mib = 2 ** 20
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    md = [f"# The compiler at scale (bench/compilescale.py, {now}, load average {load})", "",
          "GPT-2-small-shaped models (d 768, 12 heads, context 1024, vocabulary 50257) with 3, 6 and 12 blocks, "
          f"`pipecc MODEL -n 8`; median of {a.runs} runs (GNU time), peak RSS the largest.", "",
          "| blocks | ONNX file MiB | --plan-only s | --plan-only peak MiB | peak / file | with programs s | with programs peak MiB | peak / file |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['layers']} | {r['size'] / mib:.0f} | {r['tp']:.2f} | {r['mp'] / mib:.0f} | {r['mp'] / r['size']:.2f} | "
                  f"{r['tf']:.2f} | {r['mf'] / mib:.0f} | {r['mf'] / r['size']:.2f} |")
    if len(rows) >= 3:
        lo, hi = rows[0], rows[-1]
        md += ["", "Linearity: the middle size against the straight line through the smallest and largest:"]
        mid = rows[len(rows) // 2]
        f = (mid["size"] - lo["size"]) / (hi["size"] - lo["size"])
        for key, name in (("tp", "--plan-only time"), ("mp", "--plan-only peak"), ("tf", "time with programs"), ("mf", "peak with programs")):
            line = lo[key] + f * (hi[key] - lo[key])
            md.append(f"- {name}: {mid[key] / line:.2f}x the line")
    text = "\n".join(md) + "\n"
    with open(os.path.join(HERE, "compilescale.md"), "w") as fh:
        fh.write(text)
    print(text)
    series = [
        {"name": "--plan-only time (s)", "points": [(r["size"] / mib, r["tp"]) for r in rows]},
        {"name": "with programs time (s)", "points": [(r["size"] / mib, r["tf"]) for r in rows]},
        {"name": "--plan-only peak (GiB)", "points": [(r["size"] / mib, r["mp"] / 2**30) for r in rows]},
        {"name": "with programs peak (GiB)", "points": [(r["size"] / mib, r["mf"] / 2**30) for r in rows]},
    ]
    plot(os.path.join(HERE, "compilescale.svg"), series, title="pipecc -n 8 on GPT-2-shaped models of 3, 6, 12 blocks",
         xlabel="ONNX file, MiB", ylabel="seconds / GiB",
         notes=[f"{now}, load average {load}; median of {a.runs} runs; peak RSS by GNU time"])


if __name__ == "__main__":
    sys.exit(main())
