#!/usr/bin/python3
"""One GPU stage's training step against PyTorch eager on the same GPU, in the same run (check.sh runs it
there; prepare.py built the plans here).  For the sample GPT, the sample ResNet and a GPT-2-small-sized
model (124M parameters, sequence 1024), in fp32 (TF32 off), tf32 and bf16 (PyTorch: autocast; pipecc:
bf16 GEMM inputs, fp32 sums and storage): the step time of each, the ratio, tokens (or images) per second
and the model FLOPs utilisation (the plan's forward + backward FLOPs per step over the GPU's dense peak
for that precision).

  bench.py BENCH_DIR DATA_DIR OUT_DIR     writes OUT_DIR/bench.txt and bench.json"""
import csv
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import cases  # noqa: E402
BENCH, DATA, OUT = sys.argv[1:4]
# H100 SXM dense peaks (FLOP/s): fp32 on CUDA cores, TF32 and bf16 on tensor cores.
PEAK = {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12}
STEPS, WARM = 12, 2



ex = cases.load_module(os.path.join(ROOT, "onnx_models", "export.py"), "export")
lines, res = [], {}


def say(s):
    print(s, flush=True)
    lines.append(s)


def precision_mode(p):
    torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
    torch.backends.cudnn.allow_tf32 = p == "tf32"


def torch_step_time(name, cfg, prec):
    torch.manual_seed(0)
    if name == "resnet":
        model, B = ex.SmallResNet(), cfg["batch"]
        x = torch.rand(B, 3, 32, 32, device="cuda")
        y = torch.randint(0, 10, (B,), device="cuda")
        loss_of = lambda m: F.cross_entropy(m(x), y)  # noqa: E731
    else:
        model = ex.GPT() if name == "gpt" else ex.GPT(vocab_size=50257, block_size=1024, n_embd=768, n_head=12, n_layer=12)
        B, T, V = cfg["batch"], cfg["seq"], cfg["vocab"]
        x = torch.randint(0, V, (B, T), device="cuda")
        y = torch.randint(0, V, (B, T), device="cuda")
        loss_of = lambda m: F.cross_entropy(m(x).reshape(-1, V), y.reshape(-1))  # noqa: E731
    model.cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    precision_mode(prec)
    times = []
    for s in range(STEPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16"):
            loss = loss_of(model)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    del model, opt
    torch.cuda.empty_cache()
    return float(np.median(times[WARM:]))


def pipecc_step_time(tag, data):
    d = os.path.join(BENCH, tag)
    w = os.path.join(d, "weights", "stage_0.bin")
    want = json.load(open(os.path.join(d, "bench.json")))["weights_bytes"]
    if not os.path.exists(w) or os.path.getsize(w) != want:
        # Not carried (too large): small random weights, which time the same as trained ones.
        os.makedirs(os.path.dirname(w), exist_ok=True)
        (np.random.default_rng(0).standard_normal(want // 4, dtype=np.float32) * np.float32(0.02)).tofile(w)
    log = os.path.join(OUT, f"bench_{tag}.csv")
    r = subprocess.run([os.path.join(d, "run.sh"), "--data", data, "--steps", str(STEPS), "--lr", "1e-4", "--quiet", "--log", log],
                       capture_output=True, text=True, timeout=300)
    if r.returncode:
        say(f"# {tag}: the run failed: {(r.stdout + r.stderr).strip()[-800:]}")
        return None
    rows = list(csv.DictReader(open(log)))
    B = json.load(open(os.path.join(d, "bench.json")))["batch"]
    return float(np.median([B / float(x["samples_per_s"]) for x in rows[WARM:]]))


def main():
    os.makedirs(OUT, exist_ok=True)
    say(f"# {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA {torch.version.cuda}; median of steps {WARM + 1}..{STEPS}")
    say(f"{'model':12} {'prec':5} {'pipecc ms':>10} {'torch ms':>9} {'ratio':>6} {'pipecc items/s':>15} {'MFU':>6}")
    for tag in sorted(os.listdir(BENCH)):
        cfg = json.load(open(os.path.join(BENCH, tag, "bench.json")))
        name, prec = cfg["model"], cfg["precision"]
        data = os.path.join(DATA, cfg["data"])
        p = pipecc_step_time(tag, data)
        t = torch_step_time(name, cfg, prec)
        items = cfg["batch"] * cfg.get("seq", 1)
        mfu = cfg["flops_per_step"] / p / PEAK[prec] if p else None
        res[tag] = {"pipecc_s": p, "torch_s": t, "items_per_step": items, "mfu": mfu, **cfg}
        say(f"{name:12} {prec:5} {p * 1e3 if p else float('nan'):10.2f} {t * 1e3:9.2f} {(p / t) if p else float('nan'):6.2f} "
            f"{(items / p) if p else float('nan'):15.0f} {mfu if mfu else float('nan'):6.1%}")
    with open(os.path.join(OUT, "bench.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(OUT, "bench.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
