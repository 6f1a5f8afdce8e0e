#!/usr/bin/python3
"""Training parity on the GPU (tests/gpu/check.sh runs it there, after prepare.py built the plans here).

For every case of cases.py: run.sh trains the CUDA stage programs (ranks sharing the one GPU) and saves
the trained model.  Checked:
  * per-step losses within 1e-5 relative of the CPU target's (prepare.py, n = 1) and of PyTorch on the
    same GPU in fp32 with TF32 off, same weights and batches.  For the BatchNorm ResNet, whose rounding
    grows through training (docs/zoo.md), the bar against PyTorch is PyTorch's own spread between its
    CPU and GPU runs of the same steps (at least 1e-5);
  * the trained weights bit-identical across n = 1, 2, 4 and the schedules, per model.
Plus the memory plan's cases (gpt and resnet at n = 2 limited to half their busiest arena): the same
bits as the unlimited plan, the step time beside the unlimited one and the plan's prediction.

  parity.py PLANS_DIR DATA_DIR META_JSON OUT_DIR
Writes OUT_DIR/parity.txt (one line per check, then the tally) and OUT_DIR/parity.json."""
import csv
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import cases  # noqa: E402

PLANS, DATA, META, OUT = sys.argv[1:5]
lines, results = [], {"cases": {}, "checks": []}
passed = failed = 0


def say(s):
    print(s, flush=True)
    lines.append(s)


def check(ok, what):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    say(f"{'ok' if ok else 'not ok'} - {what}")
    results["checks"].append([bool(ok), what])
    return ok



ex = cases.load_module(os.path.join(ROOT, "onnx_models", "export.py"), "export")
par = cases.load_module(os.path.join(ROOT, "tests", "test_parity.py"), "parity")


def fp32_exact():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def micro_train(model, batches, lr, mb_of, loss_of, dev):
    """SGD steps, each the sum of its micro-batches' losses (pipecc's rule): returns per-step losses."""
    model.to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    for step in batches:
        opt.zero_grad()
        total = 0.0
        for x, y in step:
            loss = loss_of(model(x.to(dev)), y.to(dev)) * mb_of
            loss.backward()
            total += loss.item()
        opt.step()
        out.append(total)
    return out


def torch_losses(model_name, dev):
    path, kind, B, M, lr, steps = cases.MODELS[model_name]
    om = onnx.load(os.path.join(ROOT, path))
    torch.manual_seed(0)
    if kind == "mnist":
        model = {"mlp": ex.MLP, "lenet": ex.LeNet5}[model_name]()
        _, imgs = par.read_idx(os.path.join(DATA, "mnist", "train-images-idx3-ubyte"))
        _, labels = par.read_idx(os.path.join(DATA, "mnist", "train-labels-idx1-ubyte"))
        x = torch.from_numpy(imgs.astype(np.float32) / np.float32(255.0)).reshape(-1, 1, 28, 28)
        y = torch.from_numpy(labels.astype(np.int64))
        xent = lambda o, t: F.cross_entropy(o, t)  # noqa: E731
    elif kind == "cifar":
        model = ex.SmallResNet()
        raw = np.fromfile(os.path.join(DATA, "cifar", "data_batch_1.bin"), dtype=np.uint8).reshape(-1, 3073)[:B * steps]
        x = torch.from_numpy(raw[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0)
        y = torch.from_numpy(raw[:, 0].astype(np.int64))
        xent = lambda o, t: F.cross_entropy(o, t)  # noqa: E731
    else:
        model = ex.GPT()
        tok = np.fromfile(os.path.join(DATA, "tokens.bin"), dtype=np.uint16).astype(np.int64)
        T = 32
        xs, ys = [], []
        nb = (len(tok) - 1) // (B * T)
        for s in range(steps):
            start = (s % nb) * B * T
            xs.append(torch.from_numpy(tok[start:start + B * T].reshape(B, T)))
            ys.append(torch.from_numpy(tok[start + 1:start + 1 + B * T].reshape(B, T)))
        x, y = torch.cat(xs), torch.cat(ys)
        xent = lambda o, t: F.cross_entropy(o.reshape(-1, o.shape[-1]), t.reshape(-1))  # noqa: E731
    par.load_weights_from_onnx(model, om)
    mb = B // M
    batches = [[(x[s * B + k * mb:s * B + (k + 1) * mb], y[s * B + k * mb:s * B + (k + 1) * mb]) for k in range(M)] for s in range(steps)]
    return micro_train(model, batches, lr, mb / B, xent, dev)


def rel(a, b):
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(p - q) / max(abs(q), 1e-30) for p, q in zip(a, b))


def run_case(tag, model):
    path, kind, B, M, lr, steps = cases.MODELS[model]
    d = os.path.join(PLANS, tag)
    data = os.path.join(DATA, {"mnist": "mnist", "cifar": "cifar", "tokens": "tokens.bin"}[kind])
    log, saved = os.path.join(OUT, f"{tag}.csv"), os.path.join("/tmp", f"{tag}.onnx")
    t0 = time.time()
    r = subprocess.run([os.path.join(d, "run.sh"), "--data", data, "--steps", str(steps), "--quiet", "--log", log, "--save", saved],
                       capture_output=True, text=True, timeout=300)
    wall = time.time() - t0
    if not check(r.returncode == 0, f"{tag}: trains on the GPU ({wall:.1f} s){'' if r.returncode == 0 else ': ' + (r.stdout + r.stderr).strip()[-1500:]}"):
        return None
    rows = list(csv.DictReader(open(log)))
    losses = [float(x["loss"]) for x in rows]
    step_s = float(np.median([B / float(x["samples_per_s"]) for x in rows[2:]])) if len(rows) > 2 else None
    w = {t.name: numpy_helper.to_array(t) for t in onnx.load(saved).graph.initializer}
    results["cases"][tag] = {"losses": losses, "wall_s": wall, "step_s": step_s}
    return losses, w


def main():
    os.makedirs(OUT, exist_ok=True)
    fp32_exact()
    meta = json.load(open(META))
    say(f"# GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    refs = {}
    for m in cases.MODELS:
        g = torch_losses(m, "cuda")
        c = torch_losses(m, "cpu")
        refs[m] = (g, c)
        say(f"# {m}: PyTorch GPU {g[0]:.6f} .. {g[-1]:.6f}; PyTorch's own CPU-GPU spread {rel(c, g):.2e}")
    results["torch"] = {m: {"gpu": g, "cpu": c} for m, (g, c) in refs.items()}
    weights = {}
    for tag, m, n, s, flags in cases.parity_cases():
        if not os.path.isdir(os.path.join(PLANS, tag)):
            check(False, f"{tag}: no plan was prepared")
            continue
        got = run_case(tag, m)
        if got is None:
            continue
        losses, w = got
        cpu = meta["cpu_losses"][m]
        g, c = refs[m]
        # BatchNorm on small micro-batches amplifies rounding: PyTorch's own two devices part by rel(c, g).
        bar = max(1e-5, 2 * rel(c, g)) if m == "resnet" else 1e-5
        check(rel(losses, cpu) <= bar, f"{tag}: losses within {bar:.1e} of the CPU target's (max rel {rel(losses, cpu):.2e})")
        check(rel(losses, g) <= bar, f"{tag}: losses within {bar:.1e} of PyTorch on the GPU (max rel {rel(losses, g):.2e})")
        weights.setdefault(m, []).append((tag, w))
    for m, runs in weights.items():
        base_tag, base = runs[0]
        odd = [t for t, w in runs[1:] if set(w) != set(base) or any(not np.array_equal(w[k].view(np.uint32), base[k].view(np.uint32)) for k in base)]
        check(len(runs) >= 2 and not odd, f"{m}: trained weights bit-identical across {len(runs)} runs (n = 1, 2, 4; gpipe, 1f1b, zb1; interleaved and zbv at n = 2)"
              + (f"; differ: {odd}" if odd else ""))
    for o in meta.get("offload", []):
        tag, m = o["tag"], o["model"]
        got = run_case(tag, m)
        free = results["cases"].get(f"{m}_1f1b_n2")
        if got is None or free is None:
            continue
        base = dict(weights.get(m, []))[f"{m}_1f1b_n2"]
        same = all(np.array_equal(got[1][k].view(np.uint32), base[k].view(np.uint32)) for k in base)
        plan = json.load(open(os.path.join(PLANS, tag, "plan.json")))
        check(same, f"{tag}: limited to {o['limit']} bytes ({o['limit_is']}; busiest unlimited arena {max(o['arenas_unlimited'])}): the same bits as the unlimited plan; "
              f"step {results['cases'][tag]['step_s'] * 1e3:.2f} ms vs {free['step_s'] * 1e3:.2f} ms unlimited (median of steps 3..); predicted step "
              f"{plan['predicted_step_time_s']:.4g} s; memory plans {[s.get('memory_plan') for s in plan['stage_plans']]}")
    say(f"total: {passed} passed, {failed} failed")
    with open(os.path.join(OUT, "parity.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(OUT, "parity.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
