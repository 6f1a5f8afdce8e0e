#!/usr/bin/python3
"""PyTorch reference timings for bench/bench.py (run as a child process, prints one JSON line).

  torch_bench.py eager --model lenet --batch 64 --steps 100 --warmup 10 [--threads 1]
  torch_bench.py pipe  --model gpt --batch 32 --chunks 8 --split 3 --steps 40 --warmup 5 [--threads 2]
  torch_bench.py ckpt  --model gpt|resnet --batch 32 --segments K --steps 20 --warmup 5 [--threads 1]

eager: forward + cross-entropy + backward + SGD step per step, torch.set_num_threads(threads).
pipe:  the same step through torch.distributed.pipeline.sync.Pipe (GPipe, chunks micro-batches,
       checkpoint='never' because pipecc does not recompute), the model cut into two
       nn.Sequential partitions at layer index --split of the flat layer list (layers_of()).
ckpt:  the eager step with activation checkpointing over the flat layer list (layers_of()):
       --segments 0 runs the model plainly; K >= 1 cuts the layers as torch.utils.checkpoint.
       checkpoint_sequential does (K segments of len // K layers, the last one takes the rest and
       is not checkpointed, so K = 1 checkpoints nothing) and checkpoints every segment but the last
       with use_reentrant=False.  Besides the step time it reports memory: RssAnon of
       /proc/self/status before the model is built (rss_baseline_bytes) and its peak over the run,
       sampled after every forward and every backward (rss_peak_bytes); and, from one more step
       (not timed) under torch.profiler's memory tracking, the peak of live tensor bytes above the
       step's start (tensor_step_peak_bytes) plus the weights (tensor_peak_bytes), which unlike
       RssAnon does not include what glibc keeps of freed memory.
The models are the torch classes of onnx_models/export.py (and, for eager, bench/bench_models.py's resnet18 and
gpt2blk); weights come from torch.manual_seed(0), as in their ONNX exports.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_models  # noqa: E402  (resnet18, gpt2blk: the bench-only models)


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
    if name in bench_models.MODELS:
        return bench_models.build(name)
    return {"mlp": MLP, "lenet": LeNet5, "resnet": SmallResNet, "gpt": GPT}[name]()


def layers_of(name, model):
    """The model as a flat list of layers, in the order of its ONNX nodes (mlp, lenet: one
    layer per ONNX node; gpt: embedding, the blocks, the head; resnet: the stem (conv, bn, relu),
    the six BasicBlocks, the head (avgpool, flatten, fc)).  Applied in order they compute exactly
    model(x)."""
    if name == "mlp":
        m = model
        return [m.flatten, m.fc1, nn.ReLU(), m.fc2, nn.ReLU(), m.fc3, nn.ReLU(), m.fc4, nn.ReLU(), m.fc5]
    if name == "lenet":
        m = model
        return [m.conv1, nn.ReLU(), nn.MaxPool2d(2), m.conv2, nn.ReLU(), nn.MaxPool2d(2), m.flatten,
                m.fc1, nn.ReLU(), m.fc2, nn.ReLU(), m.fc3]
    if name == "gpt":
        return [Embed(model)] + list(model.blocks) + [Head(model)]
    if name == "resnet":
        m = model
        blocks = [b for layer in (m.layer1, m.layer2, m.layer3) for b in layer]
        return ([nn.Sequential(m.conv1, m.bn1, nn.ReLU())] + blocks
                + [nn.Sequential(m.avgpool, m.flatten, m.fc)])
    raise SystemExit(f"torch_bench: no layer list for {name}")


def batch_of(name, B):
    g = torch.Generator().manual_seed(1)
    if name in bench_models.MODELS:
        _, kind, shape, _ = bench_models.MODELS[name]
        if kind == "tokens":
            V, T = shape
            return torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)
        return torch.randn(B, *shape, generator=g), torch.randint(0, 10, (B,), generator=g)
    if name == "gpt":
        return torch.randint(0, 64, (B, 32), generator=g), torch.randint(0, 64, (B, 32), generator=g)
    if name == "resnet":
        return torch.randn(B, 3, 32, 32, generator=g), torch.randint(0, 10, (B,), generator=g)
    return torch.randn(B, 1, 28, 28, generator=g), torch.randint(0, 10, (B,), generator=g)


def loss_of(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def rss_anon():
    """The process's anonymous resident memory (RssAnon of /proc/self/status), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return None


def sequential_checkpointed(layers, segments):
    """torch.utils.checkpoint.checkpoint_sequential's segmentation with use_reentrant=False:
    torch 1.13's checkpoint_sequential always uses the reentrant checkpoint, which gives the
    first segment's weights no gradient when the input (token ids, images) does not require grad.
    K segments of len // K layers; the last one (with the rest) runs plainly."""
    from torch.utils.checkpoint import checkpoint

    def run(lo, hi):
        def f(x):
            for j in range(lo, hi):
                x = layers[j](x)
            return x
        return f

    size = len(layers) // segments if segments > 0 else 0
    cuts = [(lo, lo + size) for lo in range(0, size * (segments - 1), size)] if segments > 1 else []
    tail = cuts[-1][1] if cuts else 0

    def forward(x):
        for lo, hi in cuts:
            x = checkpoint(run(lo, hi), x, use_reentrant=False)
        return run(tail, len(layers))(x)
    return forward, cuts


def tensor_peak(step):
    """Run step() once under the profiler's memory tracking and return the peak, over the step,
    of the bytes its tensors hold (torch's CPU allocator: each allocation and free in order, the
    running sum's maximum) above what was allocated when it began."""
    from torch.profiler import profile
    with profile(profile_memory=True) as prof:
        step()
    mem = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                 key=lambda e: e.start_us())
    cur = peak = 0
    for e in mem:
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak, len(mem)


def time_steps(step, steps, warmup):
    ts = []
    for _ in range(warmup + steps):
        t = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts[warmup:]), ts


def make_opt(a, params):
    """torch.optim.SGD (plain) or AdamW (torch's defaults but the learning rate), as pipecc's --optimizer."""
    if a.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=a.lr)
    return torch.optim.SGD(params, lr=a.lr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["eager", "pipe", "ckpt"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--split", type=int, default=0)
    ap.add_argument("--segments", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rss0 = rss_anon()
    model = build(a.model)
    model.train()
    x, y = batch_of(a.model, a.batch)
    info = {"mode": a.mode, "model": a.model, "batch": a.batch, "threads": torch.get_num_threads()}
    if a.mode == "eager":
        opt = make_opt(a, model.parameters())

        def step():
            opt.zero_grad(set_to_none=True)
            loss_of(model(x), y).backward()
            opt.step()
    elif a.mode == "ckpt":
        if a.segments < 0:
            raise SystemExit("torch_bench: --segments must be >= 0")
        opt = make_opt(a, model.parameters())
        layers = layers_of(a.model, model)
        forward, cuts = sequential_checkpointed(layers, a.segments) if a.segments else (model, [])
        peak = {"rss": 0, "fwd": 0, "bwd": 0}
        losses = []
        sample_s = [0.0]

        def sample(where):
            t = time.perf_counter()
            r = rss_anon()
            peak[where] = max(peak[where], r)
            peak["rss"] = max(peak["rss"], r)
            sample_s[0] += time.perf_counter() - t

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_of(forward(x), y)
            sample("fwd")
            loss.backward()
            sample("bwd")
            opt.step()
            losses.append(loss.item())
        info.update(segments=a.segments, layers=len(layers), checkpointed_segments=len(cuts),
                    checkpointed_layers=sum(hi - lo for lo, hi in cuts))
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
    if a.mode == "ckpt":   # the /proc reads are not part of the step: take them out again
        def timed():
            s0 = sample_s[0]
            t = time.perf_counter()
            step()
            return time.perf_counter() - t - (sample_s[0] - s0)
        ts = [timed() for _ in range(a.warmup + a.steps)]
        med = statistics.median(ts[a.warmup:])
        # One more step, not timed, under the profiler: the peak of live tensor bytes, which does
        # not depend on what glibc keeps of freed memory (RssAnon does).
        tpeak, nev = tensor_peak(step)
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        # the optimizer's state (AdamW's moments) was allocated before the profiled step: count it
        state_bytes = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                          if torch.is_tensor(t))
        info.update(tensor_step_peak_bytes=tpeak, tensor_events=nev, param_bytes=param_bytes,
                    optimizer_state_bytes=state_bytes, optimizer=a.optimizer,
                    tensor_peak_bytes=param_bytes + state_bytes + tpeak)
        info.update(rss_baseline_bytes=rss0, rss_peak_bytes=peak["rss"], rss_peak_minus_baseline_bytes=peak["rss"] - rss0,
                    rss_after_forward_bytes=peak["fwd"], rss_after_backward_bytes=peak["bwd"],
                    loss_first=losses[0], loss_last=losses[-1])
    else:
        med, ts = time_steps(step, a.steps, a.warmup)
    info.update(step_s=med, samples_per_s=a.batch / med, steps=a.steps, warmup=a.warmup,
                mean_s=statistics.mean(ts[a.warmup:]))
    if a.mode == "pipe":
        rpc.shutdown()
    print(json.dumps(info), flush=True)


if __name__ == "__main__":
    main()
