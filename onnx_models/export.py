#!/usr/bin/python3
"""Export the sample ONNX models used by pipecc's tests and examples.

Run with Debian's python3 (torch 1.13, onnx 1.12):

    /usr/bin/python3 onnx_models/export.py            # small, committed models
    /usr/bin/python3 onnx_models/export.py --large    # also resnet18 + GPT-2 small

Small models are written to --out (default: this directory). With --large,
resnet18.onnx and gpt2_small.onnx are additionally written to --large-out
(default: <out>/large/, which is git-ignored).

The export is deterministic: a fixed seed is set before each model is built
and before each dummy input is drawn, so re-running produces byte-identical
files (checked with sha256sum).

Export notes (torch 1.13, TorchScript exporter):
  * All models are exported with training=TrainingMode.TRAINING and
    do_constant_folding=True. Constant folding still runs in training mode;
    it folds e.g. Transpose(W) of a Linear applied to a 3-D tensor into a new
    initializer (named "onnx::MatMul_<n>") holding W^T, and Gather(wpe, arange)
    into an initializer holding the position table. Those folded initializers
    are the (re-laid-out) trainable parameters.
  * BatchNormalization in training mode: at opset <= 13 torch emits the
    BatchNormalization-9 form (no training_mode attribute, 5 outputs). At
    opset >= 14 it emits BatchNormalization-14 with training_mode=1 and 3
    outputs (Y, running_mean, running_var). We want the latter, so the ResNet
    models are exported at opset 14.
"""

import argparse
import collections
import hashlib
import io
import math
import os
import sys
import time
import warnings

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

# Constant folding in training mode is intentional (see module docstring).
warnings.filterwarnings("ignore", message="It is recommended that constant folding")
warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
warnings.filterwarnings("ignore", category=UserWarning, module="torch.onnx")


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------

class MLP(nn.Module):
    """784-256-128-128-64-10 with ReLU: ten nodes, so it splits over up to 8 stages."""

    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, 128)
        self.fc4 = nn.Linear(128, 64)
        self.fc5 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.flatten(x)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = F.relu(self.fc3(x))
        x = F.relu(self.fc4(x))
        return self.fc5(x)


class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)   # [B,6,14,14]
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)   # [B,16,5,5]
        x = self.flatten(x)                          # [B,400]
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                nn.BatchNorm2d(cout),
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class SmallResNet(nn.Module):
    """CIFAR-style ResNet-14: stem + 3 stages x 2 BasicBlocks (16/32/64 ch)."""

    def __init__(self, num_classes=10, blocks_per_stage=2):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers = []
        cin = 16
        for i, cout in enumerate((16, 32, 64)):
            blocks = []
            for b in range(blocks_per_stage):
                stride = 2 if (i > 0 and b == 0) else 1
                blocks.append(BasicBlock(cin, cout, stride))
                cin = cout
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.flatten(self.avgpool(x)))


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        assert n_embd % n_head == 0
        self.n_embd, self.n_head, self.block_size = n_embd, n_head, block_size
        self.head_dim = n_embd // n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        mask = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, block_size, block_size))

    def forward(self, x):
        # T and C are static (from the config); only the batch dim is dynamic,
        # so reshapes use -1 for batch and get constant shape tensors.
        T, C, nh, hd = self.block_size, self.n_embd, self.n_head, self.head_dim
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(-1, T, nh, hd).transpose(1, 2)    # [B,nh,T,hd]
        k = k.view(-1, T, nh, hd).transpose(1, 2)
        v = v.view(-1, T, nh, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v                                   # [B,nh,T,hd]
        y = y.transpose(1, 2).contiguous().view(-1, T, C)
        return self.c_proj(y)


class MLPBlock(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLPBlock(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab_size=64, block_size=32, n_embd=64, n_head=4, n_layer=4):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(
            [Block(n_embd, n_head, block_size) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)  # not tied

    def forward(self, tokens):
        pos = torch.arange(self.block_size, dtype=torch.long, device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)          # [B,T,C]
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln_f(x))             # [B,T,vocab]


# --------------------------------------------------------------------------
# Export helpers
# --------------------------------------------------------------------------

class InceptionBlock(nn.Module):
    """Four parallel branches of different cost, concatenated: 1x1; 1x1 -> 3x3;
    1x1 -> 5x5; 3x3 max pool -> 1x1 (GoogLeNet's block, without BatchNorm)."""

    def __init__(self, cin):
        super().__init__()
        self.b1 = nn.Conv2d(cin, 8, 1)
        self.b2a, self.b2b = nn.Conv2d(cin, 8, 1), nn.Conv2d(8, 16, 3, padding=1)
        self.b3a, self.b3b = nn.Conv2d(cin, 4, 1), nn.Conv2d(4, 8, 5, padding=2)
        self.b4 = nn.Conv2d(cin, 8, 1)

    def forward(self, x):
        y1 = F.relu(self.b1(x))
        y2 = F.relu(self.b2b(F.relu(self.b2a(x))))
        y3 = F.relu(self.b3b(F.relu(self.b3a(x))))
        y4 = F.relu(self.b4(F.max_pool2d(x, 3, stride=1, padding=1)))
        return torch.cat([y1, y2, y3, y4], 1)


class SmallInception(nn.Module):
    """A stem conv, three Inception blocks (40 channels out each, a 2x2 max pool
    after the first two), global average pool, Linear(40,10): a branchy graph
    for the partitioner over the DAG."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = nn.ModuleList([InceptionBlock(16), InceptionBlock(40), InceptionBlock(40)])
        self.fc = nn.Linear(40, 10)

    def forward(self, x):
        x = F.relu(self.stem(x))
        for i, b in enumerate(self.blocks):
            x = b(x)
            if i < 2:
                x = F.max_pool2d(x, 2)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SmallDenseNet(nn.Module):
    """DenseNet-style: in each of two dense blocks, every layer (ReLU, 3x3 conv,
    8 channels) reads the concatenation of the block's input and all earlier
    layers' outputs; a 1x1 conv + 2x2 average pool between the blocks; global
    average pool, Linear(.,10).  Every output is read by every later layer of
    its block: values that skip stages."""

    def __init__(self, growth=8, layers=(4, 3)):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        c = 16
        self.block1 = nn.ModuleList()
        for _ in range(layers[0]):
            self.block1.append(nn.Conv2d(c, growth, 3, padding=1))
            c += growth
        self.trans = nn.Conv2d(c, 16, 1)
        c = 16
        self.block2 = nn.ModuleList()
        for _ in range(layers[1]):
            self.block2.append(nn.Conv2d(c, growth, 3, padding=1))
            c += growth
        self.fc = nn.Linear(c, 10)

    @staticmethod
    def dense(x, convs):
        feats = [x]
        for conv in convs:
            feats.append(conv(F.relu(torch.cat(feats, 1))))
        return torch.cat(feats, 1)

    def forward(self, x):
        x = self.dense(self.stem(x), self.block1)
        x = F.avg_pool2d(self.trans(F.relu(x)), 2)
        x = F.relu(self.dense(x, self.block2))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def count_params(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _scope(node_name):
    """'/blocks.1/attn/c_attn/MatMul' -> 'blocks.1.attn.c_attn'."""
    parts = [x for x in node_name.split("/") if x]
    return ".".join(parts[:-1])


def rename_folded_initializers(m, model):
    """Give initializers created by constant folding (named 'onnx::Op_<n>' by
    torch) stable, meaningful names derived from the torch tensor they were
    computed from: '<param>' (identical value, e.g. wpe.weight after
    Gather(wpe, arange(T)) was folded), '<param>_T' (transposed Linear weight
    feeding a MatMul) or '<buffer>_not' (inverted bool mask buffer)."""
    import numpy as np
    from onnx import numpy_helper

    state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    consumers = collections.defaultdict(list)
    for n in m.graph.node:
        for i in n.input:
            consumers[i].append(n.name)
    taken = {t.name for t in m.graph.initializer}
    renames = {}
    for t in m.graph.initializer:
        if t.name in state:
            continue
        arr = numpy_helper.to_array(t)
        cands = []
        for k, v in state.items():
            if v.shape == arr.shape and v.dtype == arr.dtype and np.array_equal(v, arr):
                cands.append(k)
            elif (v.ndim == 2 and v.T.shape == arr.shape and v.dtype == arr.dtype
                  and np.array_equal(v.T, arr)):
                cands.append(k + "_T")
            elif (v.dtype == np.bool_ and arr.dtype == np.bool_
                  and v.shape == arr.shape and np.array_equal(~v, arr)):
                cands.append(k + "_not")
        scopes = [_scope(c) for c in consumers[t.name]]

        def affinity(cand):
            return max((len(os.path.commonprefix([cand, s])) for s in scopes), default=0)

        cands.sort(key=lambda c: (-affinity(c), c))
        new = None
        for c in cands:
            if c not in taken:
                new = c
                break
        if new is None:  # not derived from a single torch tensor: keep a scoped name
            base = (scopes[0] + "." if scopes and scopes[0] else "") + "const"
            new, i = base, 0
            while new in taken:
                i += 1
                new = f"{base}_{i}"
        taken.add(new)
        renames[t.name] = new
        t.name = new
    for n in m.graph.node:
        for j, i in enumerate(n.input):
            if i in renames:
                n.input[j] = renames[i]
    return renames


def shape_report(m):
    """Run ONNX shape inference (strict, no data propagation) from scratch and
    summarise how completely the node outputs are shaped."""
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    del m2.graph.value_info[:]
    try:
        im = onnx.shape_inference.infer_shapes(m2, check_type=True, strict_mode=True)
    except Exception as e:  # pragma: no cover
        return f"shape inference FAILED: {e}"
    vis = {v.name: v for v in list(im.graph.value_info) + list(im.graph.output)}
    total = full = 0
    partial = collections.Counter()
    for n in im.graph.node:
        for o in n.output:
            if not o:
                continue
            total += 1
            vi = vis.get(o)
            if vi is None or not vi.type.tensor_type.HasField("shape"):
                partial["no shape"] += 1
                continue
            odd = [d.dim_param or "?" for d in vi.type.tensor_type.shape.dim
                   if not d.HasField("dim_value") and d.dim_param != "batch"]
            if odd:
                partial["unnamed/unknown dim"] += 1
            else:
                full += 1
    s = f"{full}/{total} node outputs fully shaped (static dims + 'batch')"
    if partial:
        s += "; " + ", ".join(f"{v} with {k}" for k, v in sorted(partial.items()))
    return s


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def export(name, build, make_input, input_name, opset, out_dir):
    torch.manual_seed(0)
    model = build()
    model.train()  # BatchNorm (where present) must be in training mode
    torch.manual_seed(1)
    dummy = make_input()
    path = os.path.join(out_dir, name)

    t0 = time.time()
    buf = io.BytesIO()
    torch.onnx.export(
        model, (dummy,), buf,
        export_params=True,
        opset_version=opset,
        do_constant_folding=True,
        training=torch.onnx.TrainingMode.TRAINING,
        input_names=[input_name],
        output_names=["logits"],
        dynamic_axes={input_name: {0: "batch"}, "logits": {0: "batch"}},
    )
    m = onnx.load_from_string(buf.getvalue())
    renames = rename_folded_initializers(m, model)
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    dt = time.time() - t0

    m = onnx.load(path)
    onnx.checker.check_model(m)
    hist = collections.Counter(n.op_type for n in m.graph.node)
    opset_seen = {o.domain or "ai.onnx": o.version for o in m.opset_import}
    size = os.path.getsize(path)
    print(f"== {name}")
    print(f"   opset:      {opset_seen}")
    print(f"   params:     {count_params(model):,}")
    print(f"   nodes:      {len(m.graph.node)}")
    print(f"   renamed:    {len(renames)} folded initializers")
    print("   ops:        " + ", ".join(f"{k}={v}" for k, v in sorted(hist.items())))
    print(f"   size:       {size:,} bytes ({size / 2**20:.2f} MiB)")
    print(f"   export:     {dt:.1f} s")
    print(f"   shapes:     {shape_report(m)}")
    print(f"   sha256:     {sha256(path)}")
    sys.stdout.flush()
    return path


def rand_images(c, h, w, batch=2):
    return lambda: torch.randn(batch, c, h, w)


def rand_tokens(vocab, T, batch=2):
    return lambda: torch.randint(0, vocab, (batch, T), dtype=torch.long)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=HERE, help="output dir for small models")
    ap.add_argument("--large", action="store_true",
                    help="also export resnet18.onnx and gpt2_small.onnx")
    ap.add_argument("--large-out", default=None,
                    help="output dir for --large models (default: <out>/large)")
    ap.add_argument("--skip-small", action="store_true",
                    help="with --large: do not (re)export the small models")
    args = ap.parse_args()

    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))

    if not args.skip_small:
        os.makedirs(args.out, exist_ok=True)
        export("mlp.onnx", MLP, rand_images(1, 28, 28), "input", 13, args.out)
        export("lenet.onnx", LeNet5, rand_images(1, 28, 28), "input", 13, args.out)
        export("resnet.onnx", SmallResNet, rand_images(3, 32, 32), "input", 14, args.out)
        export("gpt.onnx", GPT, rand_tokens(64, 32), "tokens", 14, args.out)
        export("gpt_opset17.onnx", GPT, rand_tokens(64, 32), "tokens", 17, args.out)
        export("inception.onnx", SmallInception, rand_images(3, 32, 32), "input", 14, args.out)
        export("densenet.onnx", SmallDenseNet, rand_images(3, 32, 32), "input", 14, args.out)

    if args.large:
        large_out = args.large_out or os.path.join(args.out, "large")
        os.makedirs(large_out, exist_ok=True)
        import torchvision
        export("resnet18.onnx", lambda: torchvision.models.resnet18(num_classes=10),
               rand_images(3, 32, 32), "input", 14, large_out)
        export("gpt2_small.onnx",
               lambda: GPT(vocab_size=50257, block_size=1024, n_embd=768,
                           n_head=12, n_layer=12),
               rand_tokens(50257, 1024, batch=1), "tokens", 17, large_out)


if __name__ == "__main__":
    main()
