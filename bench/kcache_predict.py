#!/usr/bin/python3
"""The kernel-time cache against the clock (docs/cost.md): for lenet, gpt and resnet, fill a fresh
kernel cache with `pipecc-probe --kernels MODEL` (a --profile build at n = this machine's cores,
6 steps of synthetic data), then plan n = 1 and 2 (1f1b) WITHOUT --costs, so the cache prices the
nodes; build, train REPEATS times and compare the predicted step (plan.json) with the measured one
(the median step after warm-up, the median over the runs).  Beside it: the FLOP model's prediction
of the same plan (PIPECC_KERNEL_CACHE=off).  Writes bench/kcache_predict.md.

  KCACHE_MODELS=lenet,gpt  KCACHE_REPEATS=2  /usr/bin/python3 bench/kcache_predict.py
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as b  # noqa: E402

# (model, batch, micro-batches, data kind, steps): bench/predict.py's sizes
MODELS = [("lenet", 256, 8, "mnist", 30), ("gpt", 32, 8, "tokens", 30), ("resnet", 32, 8, "cifar", 14)]
if os.environ.get("KCACHE_MODELS"):
    MODELS = [c for c in MODELS if c[0] in os.environ["KCACHE_MODELS"].split(",")]
NS = [1, 2]
REPEATS = max(1, int(os.environ.get("KCACHE_REPEATS", "2")))
PROBE = os.path.join(b.ROOT, "bin", "pipecc-probe")


def loadavg():
    return open("/proc/loadavg").read().split()[0]


def main():
    work = os.path.join(b.WORK, "kcache")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cache = os.path.join(work, "kernels.txt")
    os.environ["PIPECC_KERNEL_CACHE"] = cache
    data = b.make_data()
    rows, load0 = [], loadavg()
    for model, B, m, kind, steps in MODELS:
        t0 = time.time()
        r = subprocess.run([PROBE, "--kernels", os.path.join(b.ROOT, "onnx_models", f"{model}.onnx"), "--batch", str(B),
                            "--microbatches", str(m), "--lr", str(b.LR[model])], capture_output=True, text=True)
        b.log(f"kcache: {model}: probe {time.time() - t0:.1f} s: {(r.stdout or r.stderr).strip()}")
        if r.returncode:
            rows.append(f"| {model} | probe failed: {r.stderr.strip()[-200:]} | | | | | |")
            continue
        for n in NS:
            d = os.path.join(work, f"{model}_n{n}.pipe")
            plan = b.compile_plan(model, n, B, m, "1f1b", d)
            flop = os.path.join(work, f"{model}_n{n}_flops.pipe")
            os.environ["PIPECC_KERNEL_CACHE"] = "off"
            plan_f = b.compile_plan(model, n, B, m, "1f1b", flop, ["--plan-only"])
            os.environ["PIPECC_KERNEL_CACHE"] = cache
            b.run_cmd(["make", "-s", "-j2", "-C", d], b.TIMEOUT_BUILD)
            kc = plan["machine"].get("kernel_cache", {})
            runs = [b.attempt(b.run_pipe, d, plan, data[kind], steps) for _ in range(REPEATS)]
            ok = [x for x in runs if isinstance(x, dict)]
            if not ok:
                rows.append(f"| {model} | {n} | run failed: {runs[0]} | | | | |")
                continue
            meas = statistics.median(x["median_s"] for x in ok)
            pred, predf = plan["predicted_step_time_s"], plan_f["predicted_step_time_s"]
            spread = max(x["median_s"] for x in ok) / min(x["median_s"] for x in ok) - 1
            rows.append(f"| {model} | {n} | {kc.get('nodes_from_cache', 0)} of {plan['compute_nodes']} | {pred * 1e3:.2f} | "
                        f"{meas * 1e3:.2f} | {pred / meas:.2f} | {predf / meas:.2f} | {spread * 100:.0f}% |")
            b.log(f"kcache: {rows[-1]}")
    head = ("| model | n | nodes from the cache | predicted ms/step (cache) | measured ms/step | predicted / measured "
            "(cache) | (FLOP model) | spread of the runs |\n|---|---|---|---|---|---|---|---|\n")
    text = (f"# Kernel-cache predictions (bench/kcache_predict.py)\n\n1f1b; batch and micro-batches as bench/predict.py; "
            f"{REPEATS} runs per plan; load average {load0} at the start, {loadavg()} at the end (2-core VM, shared).\n\n"
            + head + "\n".join(rows) + "\n")
    open(os.path.join(b.HERE, "kcache_predict.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
