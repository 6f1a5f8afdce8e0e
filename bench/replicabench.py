#!/usr/bin/python3
"""Section 10 of `make bench` (and `make bench-replicas` alone): how 4 ranks are best spent, as stages or replicas.

For LeNet (B = 64) and the GPT (B = 16, T = 32), each with plain SGD, on 4 ranks:
  * pipecc at (S, R) = (4, 1), (2, 2), (1, 4) under 1f1b (default micro-batches): the median step of the
    measured steps (the first quarter warms up) against the step the plan predicted;
  * torch's DistributedDataParallel (gloo, 4 processes, one intra-op thread each, the same global batch);
  * the layout `pipecc --ranks 4` (1f1b) chose, and where it ranked among the three measured.
Each configuration runs BENCH_REPLICAS_REPEATS times (default 2) in alternating order; the best median is kept.
Ratios against DDP in the same run are the result, not absolute times: the ranks share this machine's cores.

    /usr/bin/python3 bench/replicabench.py            # writes bench/replicas.md
"""
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PIPECC = os.path.join(ROOT, "bin", "pipecc")
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
LAYOUTS = [(4, 1), (2, 2), (1, 4)]
MODELS = {"lenet": ("lenet.onnx", "LeNet5", "mnist", 64, 40), "gpt": ("gpt.onnx", "GPT", "tokens", 16, 30)}
REPEATS = max(1, int(os.environ.get("BENCH_REPLICAS_REPEATS", "2")))
T = 32

DDP = r'''
import os, sys, time, importlib.util, numpy as np, torch, torch.nn.functional as F
import torch.distributed as dist
rank, world = int(sys.argv[1]), int(sys.argv[2])
T = 32
kind, cls, B, steps, data = sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[8])
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=rank, world_size=world)
spec = importlib.util.spec_from_file_location("ex", sys.argv[9]); ex = importlib.util.module_from_spec(spec); spec.loader.exec_module(ex)
torch.manual_seed(0)
net = getattr(ex, cls)()
# gloo broadcasts no bool tensors: the GPT's causal mask (a constant buffer) stays out of DDP's start-up sync.
torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
    net, [k for k, b in net.named_buffers() if not b.is_floating_point()])
model = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
share = B // world
if kind == "tokens":
    tok = np.fromfile(data, dtype=np.uint16).astype(np.int64)
else:
    raw = np.fromfile(os.path.join(data, "train-images-idx3-ubyte"), dtype=np.uint8)[16:].reshape(-1, 1, 28, 28)
    lab = np.fromfile(os.path.join(data, "train-labels-idx1-ubyte"), dtype=np.uint8)[8:].astype(np.int64)
times = []
for s in range(steps):
    if kind == "tokens":
        lo = (s * B + rank * share) * T
        x = torch.from_numpy(tok[lo:lo + share * T].reshape(share, T)); y = torch.from_numpy(tok[lo + 1:lo + 1 + share * T].reshape(share, T))
    else:
        lo = (s * B + rank * share) % (len(lab) - share)
        x = torch.from_numpy(raw[lo:lo + share].astype(np.float32) / 255); y = torch.from_numpy(lab[lo:lo + share])
    dist.barrier()
    t0 = time.perf_counter()
    opt.zero_grad()
    out = model(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    opt.step()
    dist.barrier()
    times.append(time.perf_counter() - t0)
if rank == 0:
    print("median", sorted(times[steps // 4:])[len(times[steps // 4:]) // 2])
dist.destroy_process_group()
'''


def log(msg):
    print(msg, flush=True)


def run(cmd, timeout=900, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd[:3])}...: {(r.stdout + r.stderr)[-500:]}")
    return r.stdout + r.stderr


def make_data(tmp):
    mn, tok = os.path.join(tmp, "mnist"), os.path.join(tmp, "tokens.bin")
    run([DATAGEN, "mnist", mn, "--n", "6000"])
    run([DATAGEN, "tokens", tok, "--n", "200000", "--vocab", "64"])
    return {"mnist": mn, "tokens": tok}


def pipecc_step(tmp, model, S, R, data, steps):
    fname, _, kind, B, _ = MODELS[model]
    out = os.path.join(tmp, f"{model}-{S}x{R}.pipe")
    if not os.path.exists(os.path.join(out, "run.sh")):
        run([PIPECC, os.path.join(ROOT, "onnx_models", fname), "-n", str(S), "--replicas", str(R), "--batch", str(B), "--lr", "0.01",
             "-o", out])
        run(["make", "-s", "-C", out, "-j2"])
    logf = os.path.join(tmp, f"{model}-{S}x{R}.csv")
    text = run([os.path.join(out, "run.sh"), "--data", data[kind], "--steps", str(steps), "--quiet", "--log", logf])
    import json
    pred = json.load(open(os.path.join(out, "plan.json")))["predicted_step_time_s"]
    t = [float(r["time_s"]) for r in csv.DictReader(open(logf))]
    d = [b - a for a, b in zip(t, t[1:])][steps // 4:]
    return statistics.median(d), pred


def ddp_step(tmp, model, data, steps, port):
    _, cls, kind, B, _ = MODELS[model]
    script = os.path.join(tmp, "ddp.py")
    with open(script, "w") as f:
        f.write(DDP)
    procs = [subprocess.Popen(["/usr/bin/python3", script, str(r), "4", kind, cls, str(B), str(steps), data[kind], str(port),
                               os.path.join(ROOT, "onnx_models", "export.py")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(4)]
    outs = [p.communicate(timeout=900) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("DDP: " + " ".join(o[1][-300:] for o in outs))
    return float(re.search(r"median ([\d.e-]+)", outs[0][0]).group(1))


def ranks_choice(tmp, model):
    fname, _, _, B, _ = MODELS[model]
    out = os.path.join(tmp, f"{model}-ranks.pipe")
    run([PIPECC, os.path.join(ROOT, "onnx_models", fname), "--ranks", "4", "--batch", str(B), "--lr", "0.01", "--plan-only", "-o", out])
    import json
    pj = json.load(open(os.path.join(out, "plan.json")))
    return pj["stages"], pj.get("replicas", 1)


def bench_model(tmp, model, data, port):
    _, _, _, B, steps = MODELS[model]
    best = {}
    for rep in range(REPEATS):
        order = LAYOUTS + ["ddp"] if rep % 2 == 0 else ["ddp"] + LAYOUTS[::-1]
        for what in order:
            if what == "ddp":
                t = ddp_step(tmp, model, data, steps, port + rep)
                best["ddp"] = min(best.get("ddp", (t,))[0], t), None
            else:
                t, pred = pipecc_step(tmp, model, *what, data, steps)
                if what not in best or t < best[what][0]:
                    best[what] = (t, pred)
            log(f"  {model} {what}: {t * 1e3:.3f} ms")
    return best, B


def report(results, choices):
    lines = ["# Replicas: 4 ranks as stages or as replicas (bench/replicabench.py)", "",
             f"Measured {time.strftime('%Y-%m-%d')} on this machine ({os.cpu_count()} cores; the 4 ranks share them), "
             f"best of {REPEATS} medians per configuration, plain SGD, 1f1b, default micro-batches.  DDP: torch "
             "DistributedDataParallel over gloo, 4 processes of one intra-op thread, the same global batch.", ""]
    for model, (best, B) in results.items():
        ddp = best["ddp"][0]
        lines += [f"## {model} (global batch {B})", "", "| layout | measured step | samples/s | predicted step | predicted / measured | vs DDP (samples/s) |",
                  "|---|---|---|---|---|---|"]
        measured = sorted((best[l][0], l) for l in LAYOUTS)
        for l in LAYOUTS:
            t, pred = best[l]
            lines.append(f"| {l[0]} x {l[1]} | {t * 1e3:.3f} ms | {B / t:.0f} | {pred * 1e3:.3f} ms | {pred / t:.2f} | {ddp / t:.2f}x |")
        lines.append(f"| DDP (4 processes) | {ddp * 1e3:.3f} ms | {B / ddp:.0f} | | | 1.00x |")
        S, R = choices[model]
        rank = [l for _, l in measured].index((S, R)) + 1 if (S, R) in LAYOUTS else None
        lines += ["", f"`pipecc --ranks 4` chose {S} x {R}: measured rank {rank} of {len(LAYOUTS)} "
                      f"(fastest measured: {measured[0][1][0]} x {measured[0][1][1]}).", ""]
    return "\n".join(lines) + "\n"


def section_replicas(b):
    """Section 10 of bench.py: the run above; bench/replicas.md, and its rows and targets in results.md."""
    SEC = "10_replicas"
    results, choices = run_all()
    for model, (best, B) in results.items():
        ddp = best["ddp"][0]
        for l in LAYOUTS:
            t, pred = best[l]
            case = f"{model} B={B} {l[0]}x{l[1]}"
            b.add_row(SEC, case, "step", t * 1e3, "ms", note=f"predicted {pred * 1e3:.3f} ms ({pred / t:.2f}x)")
            b.add_row(SEC, case, "samples/s vs DDP", ddp / t, "x")
        b.add_row(SEC, f"{model} B={B} DDP", "step", ddp * 1e3, "ms")
        measured = [l for _, l in sorted((best[l][0], l) for l in LAYOUTS)]
        S, R = choices[model]
        rank = measured.index((S, R)) + 1 if (S, R) in measured else 0
        b.targets.append((f"replicas {model}: the layout --ranks 4 chose ({S} x {R}) measured fastest of the three or within 5%",
                          f"rank {rank}", "yes" if rank and best[(S, R)][0] <= best[measured[0]][0] * 1.05 else "no"))
    with open(os.path.join(HERE, "replicas.md"), "w") as f:
        f.write(report(results, choices))


def run_all():
    tmp = tempfile.mkdtemp(prefix="pipecc-replicabench.")
    os.environ["OMPI_ALLOW_RUN_AS_ROOT"] = os.environ["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    os.environ["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    data = make_data(tmp)
    results, choices = {}, {}
    for i, model in enumerate(MODELS):
        log(f"replicas bench: {model}")
        results[model] = bench_model(tmp, model, data, 29500 + 10 * i)
        choices[model] = ranks_choice(tmp, model)
    return results, choices


def main():
    results, choices = run_all()
    text = report(results, choices)
    with open(os.path.join(HERE, "replicas.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
