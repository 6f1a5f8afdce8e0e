#!/usr/bin/python3
"""PyTorch reference timings for bench/bench.py (run as a child process, prints one JSON line).

  torch_bench.py eager --model lenet --batch 64 --steps 100 --warmup 10 [--threads 1]
  torch_bench.py pipe  --model gpt --batch 32 --chunks 8 --split 3 --steps 40 --warmup 5 [--threads 2]

eager: forward + cross-entropy + backward + SGD step per step, torch.set_num_threads(threads).
pipe:  the same step through torch.distributed.pipeline.sync.Pipe (GPipe, chunks micro-batches,
       checkpoint='never' because pipecc does not recompute), the model cut into two
       nn.Sequential partitions at layer index --split of the flat layer list (layers_of()).
The models are the torch classes of onnx_models/export.py; weights come from torch.manual_seed(0).
The step time is the median over the steps after --warmup.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "onnx_models"))
from export import GPT, MLP, LeNet5, SmallResNet  # noqa: E402


class Embed(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.wte, self.wpe, self.T = gpt.wte, gpt.wpe, gpt.block_size

    def forward(self, tokens):
        pos = torch.arange(self.T, dtype=torch.long, device=tokens.device)
        return self.wte(tokens) + self.wpe(pos)


class Head(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.ln_f, self.lm_head = gpt.ln_f, gpt.lm_head

    def forward(self, x):
        return self.lm_head(self.ln_f(x))


def build(name):
    torch.manual_seed(0)
    return {"mlp": MLP, "lenet": LeNet5, "resnet": SmallResNet, "gpt": GPT}[name]()


def layers_of(name, model):
    """The model as a flat list of layers, in the order of its ONNX nodes (mlp, lenet: one
    layer per ONNX node; gpt: embedding, the blocks, the head)."""
    if name == "mlp":
        m = model
        return [m.flatten, m.fc1, nn.ReLU(), m.fc2, nn.ReLU(), m.fc3, nn.ReLU(), m.fc4, nn.ReLU(), m.fc5]
    if name == "lenet":
        m = model
        return [m.conv1, nn.ReLU(), nn.MaxPool2d(2), m.conv2, nn.ReLU(), nn.MaxPool2d(2), m.flatten,
                m.fc1, nn.ReLU(), m.fc2, nn.ReLU(), m.fc3]
    if name == "gpt":
        return [Embed(model)] + list(model.blocks) + [Head(model)]
    raise SystemExit(f"torch_bench: no layer list for {name}")


def batch_of(name, B):
    g = torch.Generator().manual_seed(1)
    if name == "gpt":
        return torch.randint(0, 64, (B, 32), generator=g), torch.randint(0, 64, (B, 32), generator=g)
    if name == "resnet":
        return torch.randn(B, 3, 32, 32, generator=g), torch.randint(0, 10, (B,), generator=g)
    return torch.randn(B, 1, 28, 28, generator=g), torch.randint(0, 10, (B,), generator=g)


def loss_of(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def time_steps(step, steps, warmup):
    ts = []
    for _ in range(warmup + steps):
        t = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts[warmup:]), ts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["eager", "pipe"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--split", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.01)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = build(a.model)
    model.train()
    x, y = batch_of(a.model, a.batch)
    info = {"mode": a.mode, "model": a.model, "batch": a.batch, "threads": torch.get_num_threads()}
    if a.mode == "eager":
        opt = torch.optim.SGD(model.parameters(), lr=a.lr)

        def step():
            opt.zero_grad(set_to_none=True)
            loss_of(model(x), y).backward()
            opt.step()
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        import torch.distributed.rpc as rpc
        from torch.distributed.pipeline.sync import Pipe
        rpc.init_rpc("worker", rank=0, world_size=1)
        layers = layers_of(a.model, model)
        if not 0 < a.split < len(layers):
            raise SystemExit(f"torch_bench: --split {a.split} outside 1..{len(layers) - 1}")
        seq = nn.Sequential(nn.Sequential(*layers[:a.split]), nn.Sequential(*layers[a.split:]))
        pipe = Pipe(seq, chunks=a.chunks, checkpoint="never")
        opt = torch.optim.SGD(pipe.parameters(), lr=a.lr)
        info.update(chunks=a.chunks, split=a.split, layers=len(layers), partitions=len(pipe.partitions))

        def step():
            opt.zero_grad(set_to_none=True)
            loss_of(pipe(x).local_value(), y).backward()
            opt.step()
    med, ts = time_steps(step, a.steps, a.warmup)
    info.update(step_s=med, samples_per_s=a.batch / med, steps=a.steps, warmup=a.warmup,
                mean_s=statistics.mean(ts[a.warmup:]))
    if a.mode == "pipe":
        rpc.shutdown()
    print(json.dumps(info), flush=True)


if __name__ == "__main__":
    main()
