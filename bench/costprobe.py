#!/usr/bin/python3
"""Costs of never-profiled models from the op probe (docs/cost.md, "The op probe"; issue 35).

For the four sample models and three torchvision models (exported at 32x32 as tests/zoo does), plans
-n 1 with a fresh machine cache, no kernel cache and no profile, so that every node is costed from the
op probe's grid (the probe runs once, at the first plan: its time is reported); builds each plan, trains
it REPEATS times, the models in turn, and compares the predicted step (plan.json) with the measured one:
each run's median step after warm-up, then the quickest of the runs and their median.  This 2-core VM
runs the same program in spells of two speeds (one run's steps at 48 ms, the next at 72); the probe holds
its grid to the quick spells (tools/probe_ops.c), so the quickest run is the like-for-like figure and the
median of the runs shows the spells.  Beside it: the FLOP model's prediction of the same plan
(PIPECC_OPS_CACHE=off).  A measurement, never a timed test: writes bench/costprobe.md.

  COSTPROBE_MODELS=lenet,gpt  COSTPROBE_REPEATS=5  /usr/bin/python3 bench/costprobe.py
"""
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as b  # noqa: E402

# (model, batch, micro-batches, data kind, steps): bench/predict.py's sizes; torchvision's at 32x32
MODELS = [("mlp", 64, 8, "mnist", 60), ("lenet", 256, 8, "mnist", 24), ("resnet", 32, 8, "cifar", 14),
          ("gpt", 32, 8, "tokens", 24), ("resnet18", 32, 4, "cifar", 10), ("mobilenet_v2", 32, 4, "cifar", 10),
          ("squeezenet1_1", 32, 4, "cifar", 12)]
TORCHVISION = {"resnet18", "mobilenet_v2", "squeezenet1_1"}
if os.environ.get("COSTPROBE_MODELS"):
    MODELS = [c for c in MODELS if c[0] in os.environ["COSTPROBE_MODELS"].split(",")]
REPEATS = max(1, int(os.environ.get("COSTPROBE_REPEATS", "5")))
OUT_MD = os.environ.get("COSTPROBE_OUT") or os.path.join(b.HERE, "costprobe.md")


def loadavg():
    return open("/proc/loadavg").read().split()[0]


def model_file(model, work):
    if model not in TORCHVISION:
        return os.path.join(b.ROOT, "onnx_models", f"{model}.onnx")
    path = os.path.join(work, f"{model}.onnx")
    if not os.path.exists(path):
        code = ("import sys; sys.path.insert(0, 'tests/zoo'); import models; "
                f"models.export({model!r}, {path!r})")
        b.run_cmd([b.PY, "-c", code], 600)
    return path


def plan(model, path, B, m, out, extra=(), env=None):
    cmd = [b.PIPECC, path, "-n", "1", "--batch", str(B), "--microbatches", str(m), "--lr", "0.01", "-o", out] + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=b.ROOT)
    if r.returncode:
        raise b.CmdError(f"pipecc failed: {r.stderr[-400:]}")
    import json
    with open(os.path.join(out, "plan.json")) as f:
        return json.load(f), r.stderr


def main():
    work = os.path.join(b.WORK, "costprobe")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.environ["PIPECC_CACHE"] = os.path.join(work, "machine.txt")
    os.environ["PIPECC_KERNEL_CACHE"] = "off"
    os.environ["PIPECC_OPS_CACHE"] = os.path.join(work, "ops.txt")
    data = b.make_data()
    within_med = []
    rows, load0, probe_note, within, date = [], loadavg(), "", [], time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    built = []
    for model, B, m, kind, steps in MODELS:
        try:
            path = model_file(model, work)
        except Exception as e:  # noqa: BLE001
            rows.append(f"| {model} | export failed: {str(e)[-200:]} | | | | | | | |")
            continue
        d = os.path.join(work, f"{model}.pipe")
        t0 = time.time()
        p, err = plan(model, path, B, m, d)
        if "probed in" in err:
            probe_note = f"the op probe ran at the first plan ({model}): {err.strip().splitlines()[-1]}; that plan took {time.time() - t0:.1f} s"
        pf, _ = plan(model, path, B, m, d + ".flops", ["--plan-only"], dict(os.environ, PIPECC_OPS_CACHE="off"))
        b.run_cmd(["make", "-s", "-j2", "-C", d], b.TIMEOUT_BUILD)
        built.append((model, B, m, kind, steps, d, p, pf))
    runs = {c[0]: [] for c in built}
    for _ in range(REPEATS):  # the models in turn, so that a slow spell does not take one model's every run
        for model, B, m, kind, steps, d, p, pf in built:
            runs[model].append(b.attempt(b.run_pipe, d, p, data[kind], steps))
    for model, B, m, kind, steps, d, p, pf in built:
        ok = [x["median_s"] for x in runs[model] if isinstance(x, dict)]
        if not ok:
            rows.append(f"| {model} | {B}/{m} | run failed: {runs[model][0]} | | | | | | |")
            continue
        quick, med = min(ok), statistics.median(ok)
        pred, predf = p["predicted_step_time_s"], pf["predicted_step_time_s"]
        probe = p["machine"].get("op_probe", {}).get("nodes_from_probe", 0)
        if 0.85 <= pred / quick <= 1.15:
            within.append(model)
        if 0.85 <= pred / med <= 1.15:
            within_med.append(model)
        rows.append(f"| {model} | {B}/{m} | {probe} of {p['compute_nodes']} | {p.get('convolutions', '-')} | {pred * 1e3:.2f} | "
                    f"{quick * 1e3:.2f} | {med * 1e3:.2f} | **{pred / quick:.2f}** | {pred / med:.2f} | {predf / quick:.2f} | "
                    f"{' '.join(f'{x * 1e3:.1f}' for x in ok)} |")
        b.log(f"costprobe: {rows[-1]}")
    head = ("| model | batch/micro-batches | nodes from the op probe | convolutions | predicted ms/step | quickest run ms/step | "
            "median run ms/step | predicted / quickest | predicted / median | FLOP model's / quickest | the runs (ms/step) |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    text = (f"# Never-profiled models: the op probe's predictions (bench/costprobe.py)\n\n-n 1; no profile, no kernel cache; "
            f"{REPEATS} runs per plan, the models in turn; {probe_note}.  Load average {load0} at the start, {loadavg()} at the end "
            f"(2-core VM, shared); started {date}.\n\n" + head + "\n".join(rows) + "\n\n"
            f"Within 15% (0.85-1.15) of the quickest run: {len(within)} of {len(rows)} ({', '.join(within) or 'none'}); "
            f"of the median run: {len(within_med)} of {len(rows)} ({', '.join(within_med) or 'none'}).\n")
    with open(OUT_MD, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
