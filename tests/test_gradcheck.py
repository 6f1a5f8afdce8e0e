#!/usr/bin/python3
"""Gradient check of every trainable operator: pipecc's backward kernels
against torch.autograd and central finite differences, both in float64.

Each case is a tiny ONNX model (opset 17 unless the op needs another):

    x [4,1,28,28] -> Flatten -> Gemm(W0, b0) -> Reshape [4, ...]   (the "stem":
        continuous, O(1) values with no ties, whatever shape the op needs)
    -> the op under test, its other differentiable inputs float initializers
    -> Flatten -> Gemm(Wh, bh) -> logits [4, 3]                    (the "head")

(some cases end in the op itself, or use another shape).  pipecc appends
softmax cross-entropy (mean over the batch) and trains every float
initializer with more than one element.  One plain-SGD step at lr 1 on
MNIST-format IDX data written here gives pipecc's gradient of each
initializer as (initial - trained) / lr.

References: a float64 torch re-implementation of every ONNX op used (the
interpreter below, run on the model file itself, on the same pixels/255 and
labels) gives (a) d loss / d initializer by torch.autograd, and (b) central
differences (eps 1e-6) of the same float64 forward for the largest and three
random elements of each initializer.  (a) and (b) must agree (to 1e-5), which
validates the re-implementation; pipecc's step-1 loss must match the float64
loss (rel 1e-4), which checks that both sides compute the same model.

Error measure, per element: |got - ref| / max(|ref|, 1e-2 * scale, 1e3 * r),
where scale is the largest |autograd gradient| of that initializer and r the
float32 rounding of the update (2^-23 * max(|initial|, |trained|)); a case
passes when the largest is <= 1e-3 against both references, i.e. rtol 1e-3,
atol 1e-5 x scale.  Initializers pipecc must not train must come back
unchanged; BatchNorm running statistics must hold PyTorch's update.

A case pipecc refuses with a 'pipecc: error:' message FAILS, unless it is
pinned in EXPECTED_REFUSALS (case -> a text the error message must contain,
which says why): a pinned refusal with that text is printed as 'refused (pinned) - ...'
and counted on its own line, not as passed; a pinned case refused for another
reason, or one that now compiles ("expected refusal no longer refused: unpin
it"), fails.

  /usr/bin/python3 tests/test_gradcheck.py [--case SUBSTR]... [--keep] [--list]

PIPECC overrides the pipecc binary.  Ends with "N passed, M failed, K skipped, R refused" (tests/tally.py); exit 1
on any failure.
"""
import argparse
import concurrent.futures
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")

B = 4            # batch (one micro-batch)
C = 3            # classes
LR = 1.0
FD_EPS = 1e-6
TOL = 1e-3       # pipecc vs references (see the error measure above)
REF_TOL = 1e-5   # autograd vs finite differences
LOSS_RTOL = 1e-4
FD_RANDOM = 3    # random elements per initializer, besides the largest
TIMEOUT = {"pipecc": 60, "make": 180, "run": 90}

torch.set_default_dtype(torch.float64)

# Cases pipecc is expected to refuse at compile time: "op case name" -> a text
# the 'pipecc: error:' line must contain (the reason).  Every case compiles
# today, so the list is empty; a refusal of any case is a failure.
EXPECTED_REFUSALS = {
}

# Trainable ops (pipecc --list-ops) whose gradient another test checks: op -> where.
# Every other trainable op must have a case here.
CHECKED_ELSEWHERE = {
    "Concat": "tests/test_split_concat.py (Concat of K = 2..16 inputs trained against PyTorch)",
}

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


# Cases run two at a time (main): their counters and lines go through this lock.
LOCK = threading.Lock()


def result(status, what, detail=""):
    """status: "ok", "not ok", or "refused" (a pinned refusal, detail its reason: counted as refused, never passed)."""
    with LOCK:
        if status == "refused":
            tally.refused(what, detail)
        else:
            tally.check(status == "ok", what, detail)


def note(text):
    with LOCK:
        for line in str(text).rstrip("\n").splitlines():
            print("#   " + line)
        sys.stdout.flush()


# --------------------------------------------------------------------------
# A float64 torch interpreter for the ONNX ops under test
# --------------------------------------------------------------------------

def node_attrs(n):
    out = {}
    for a in n.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def ints_of(t):
    return [int(v) for v in t.reshape(-1).tolist()]


def window_pads(x, a, kernel):
    """A Conv / pool node's ONNX pads [begin..., end...] for input x: its pads,
    or what auto_pad means (the ONNX spec: the output is ceil(in / stride),
    the total padding is what that needs, and the odd one goes at the end for
    SAME_UPPER, at the beginning for SAME_LOWER)."""
    nsp = x.dim() - 2
    auto = a.get("auto_pad", "NOTSET")
    if auto == "NOTSET":
        return list(a.get("pads", [0] * 2 * nsp))
    if auto == "VALID":
        return [0] * 2 * nsp
    strides, dil = a.get("strides", [1] * nsp), a.get("dilations", [1] * nsp)
    begin, end = [], []
    for size, k, s, d in zip(x.shape[2:], kernel, strides, dil):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
        begin.append(lo)
        end.append(total - lo)
    return begin + end


def torch_pad_arg(begin, end):
    """F.pad's argument (last axis first) for per-spatial-axis begin / end pads."""
    arg = []
    for b, e in zip(reversed(begin), reversed(end)):
        arg += [b, e]
    return tuple(arg)


def pool(x, a, kind):
    """MaxPool / AveragePool (1-D, 2-D, 3-D), ONNX semantics: the input padded
    explicitly (with -inf or 0, plus what ceil_mode's last window needs), then
    torch's pooling with no padding of its own."""
    nsp = x.dim() - 2
    k = list(a["kernel_shape"])
    s, d = list(a.get("strides", [1] * nsp)), list(a.get("dilations", [1] * nsp))
    pads = window_pads(x, a, k)
    p0, p1 = pads[:nsp], pads[nsp:]
    ceil = a.get("ceil_mode", 0)
    outs, extra = [], []
    for i, size in enumerate(x.shape[2:]):
        span = size + p0[i] + p1[i] - d[i] * (k[i] - 1) - 1
        o = (-(-span // s[i]) if ceil else span // s[i]) + 1
        if ceil and (o - 1) * s[i] >= size + p0[i]:
            o -= 1
        outs.append(o)
        extra.append(max(0, (o - 1) * s[i] + d[i] * (k[i] - 1) + 1 - (size + p0[i] + p1[i])))
    fill = float("-inf") if kind == "max" else 0.0
    xp = F.pad(x, torch_pad_arg(p0, [e + ex for e, ex in zip(p1, extra)]), value=fill)
    if kind == "max":
        y = getattr(F, f"max_pool{nsp}d")(xp, k, s, 0, d)
        assert list(y.shape[2:]) == outs
        return y
    assert d == [1] * nsp, "AveragePool has no dilations before opset 19"
    window_sum = lambda t: getattr(F, f"avg_pool{nsp}d")(t, k, s, 0) * float(np.prod(k))
    # Divisor: valid elements (count_include_pad=0) or elements inside input + pads (=1).
    inside = torch.zeros(1, 1, *xp.shape[2:])
    if a.get("count_include_pad", 0):
        inside[(..., *[slice(0, n + b + e) for n, b, e in zip(x.shape[2:], p0, p1)])] = 1
    else:
        inside[(..., *[slice(b, b + n) for n, b in zip(x.shape[2:], p0)])] = 1
    y = window_sum(xp) / window_sum(inside)
    assert list(y.shape[2:]) == outs
    return y


def run_node(op, ins, a, opset):
    x = ins[0]
    if op == "Gemm":
        A = x.t() if a.get("transA", 0) else x
        Bm = ins[1].t() if a.get("transB", 0) else ins[1]
        y = a.get("alpha", 1.0) * (A @ Bm)
        if len(ins) > 2 and ins[2] is not None:
            y = y + a.get("beta", 1.0) * ins[2]
        return [y]
    if op == "MatMul":
        return [torch.matmul(x, ins[1])]
    if op == "Conv":
        nsp = x.dim() - 2
        pads = window_pads(x, a, ins[1].shape[2:])
        xp = F.pad(x, torch_pad_arg(pads[:nsp], pads[nsp:]))
        bias = ins[2] if len(ins) > 2 else None
        return [getattr(F, f"conv{nsp}d")(xp, ins[1], bias, stride=tuple(a.get("strides", [1] * nsp)),
                                          dilation=tuple(a.get("dilations", [1] * nsp)), groups=a.get("group", 1))]
    if op == "MaxPool":
        return [pool(x, a, "max")]
    if op == "AveragePool":
        return [pool(x, a, "avg")]
    if op == "GlobalAveragePool":
        return [x.mean(dim=tuple(range(2, x.dim())), keepdim=True)]
    if op == "Pad":
        assert a.get("mode", "constant") == "constant"
        pads = ints_of(ins[1])
        value = float(ins[2].item()) if len(ins) > 2 and ins[2] is not None else 0.0
        r = x.dim()
        arg = []
        for i in reversed(range(r)):
            arg += [pads[i], pads[r + i]]
        return [F.pad(x, tuple(arg), value=value)]
    if op == "BatchNormalization":
        scale, bias, rm, rv = ins[1:5]
        eps, mom = a.get("epsilon", 1e-5), a.get("momentum", 0.9)
        training = a.get("training_mode", 0) if opset >= 14 else 1
        if not training:
            return [F.batch_norm(x, rm, rv, scale, bias, training=False, eps=eps)]
        dims = [0] + list(range(2, x.dim()))
        mean = x.mean(dim=dims)
        var_u = x.var(dim=dims, unbiased=True)
        y = F.batch_norm(x, None, None, scale, bias, training=True, eps=eps)
        return [y, rm * mom + mean * (1 - mom), rv * mom + var_u * (1 - mom)]
    if op == "LayerNormalization":
        axis = a.get("axis", -1) % x.dim()
        bias = ins[2] if len(ins) > 2 else None
        return [F.layer_norm(x, tuple(x.shape[axis:]), ins[1], bias, a.get("epsilon", 1e-5))]
    if op == "Gather":
        assert a.get("axis", 0) == 0
        return [x[ins[1]]]
    if op in ("Softmax", "LogSoftmax"):
        axis = a.get("axis", -1 if opset >= 13 else 1)
        fn = torch.softmax if op == "Softmax" else torch.log_softmax
        return [fn(x, dim=axis)]
    if op == "Where":
        return [torch.where(x.bool(), ins[1], ins[2])]
    if op == "Split":
        axis = a.get("axis", 0) % x.dim()
        if len(ins) > 1 and ins[1] is not None:
            sizes = ints_of(ins[1])
        elif "split" in a:
            sizes = list(a["split"])
        else:
            sizes = None
        return [x, sizes, axis]   # resolved by the caller (needs the output count)
    if op == "Transpose":
        perm = a.get("perm", list(reversed(range(x.dim()))))
        return [x.permute(*perm)]
    if op in ("ReduceMean", "ReduceSum"):
        if op == "ReduceSum" and opset >= 13 or op == "ReduceMean" and opset >= 18:
            axes = ints_of(ins[1]) if len(ins) > 1 and ins[1] is not None else []
        else:
            axes = list(a.get("axes", []))
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.dim()))
        keep = bool(a.get("keepdims", 1))
        fn = torch.mean if op == "ReduceMean" else torch.sum
        return [fn(x, dim=tuple(v % x.dim() for v in axes), keepdim=keep)]
    if op in ("Add", "Sub", "Mul", "Div", "Pow"):
        fn = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div, "Pow": torch.pow}[op]
        return [fn(x, ins[1])]
    if op in ("Sqrt", "Erf", "Relu", "Tanh", "Sigmoid"):
        fn = {"Sqrt": torch.sqrt, "Erf": torch.erf, "Relu": torch.relu, "Tanh": torch.tanh,
              "Sigmoid": torch.sigmoid}[op]
        return [fn(x)]
    if op == "Gelu":
        return [F.gelu(x, approximate=a.get("approximate", "none"))]
    if op == "LeakyRelu":
        return [F.leaky_relu(x, a.get("alpha", 0.01))]
    if op in ("Neg", "Exp", "Log", "Abs", "Reciprocal"):
        return [{"Neg": torch.neg, "Exp": torch.exp, "Log": torch.log, "Abs": torch.abs,
                 "Reciprocal": torch.reciprocal}[op](x)]
    if op == "Clip":   # attributes before opset 11 (default the float32 range), optional scalar inputs after
        if opset < 11:
            f32 = np.finfo(np.float32)
            lo, hi = a.get("min", float(f32.min)), a.get("max", float(f32.max))
        else:
            lo = ins[1].item() if len(ins) > 1 and ins[1] is not None else None
            hi = ins[2].item() if len(ins) > 2 and ins[2] is not None else None
        return [torch.clamp(x, lo, hi)]
    if op == "HardSigmoid":
        return [torch.clamp(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0.0, 1.0)]
    if op == "HardSwish":
        return [F.hardswish(x)]
    if op in ("Max", "Min"):   # variadic: chained as torch.maximum(torch.maximum(a, b), c)
        fn = torch.maximum if op == "Max" else torch.minimum
        y = ins[0]
        for v in ins[1:]:
            y = fn(y, v)
        return [y]
    if op in ("Equal", "Less", "Greater"):
        return [{"Equal": torch.eq, "Less": torch.lt, "Greater": torch.gt}[op](x, ins[1])]
    if op == "Not":
        return [torch.logical_not(x)]
    if op == "ReduceMax":
        axes = ints_of(ins[1]) if opset >= 18 and len(ins) > 1 else list(a.get("axes", range(x.dim())))
        return [torch.amax(x, dim=tuple(v % x.dim() for v in axes), keepdim=bool(a.get("keepdims", 1)))]
    if op == "ArgMax":
        axis, keep = a.get("axis", 0) % x.dim(), bool(a.get("keepdims", 1))
        if a.get("select_last_index", 0):
            return [x.shape[axis] - 1 - torch.argmax(x.flip(axis), dim=axis, keepdim=keep)]
        return [torch.argmax(x, dim=axis, keepdim=keep)]
    if op == "Reshape":
        shape = ints_of(ins[1])
        if not a.get("allowzero", 0):
            shape = [x.shape[i] if v == 0 else v for i, v in enumerate(shape)]
        return [x.reshape(shape)]
    if op == "Flatten":
        axis = a.get("axis", 1)
        axis = axis + x.dim() if axis < 0 else axis
        lead = int(np.prod(x.shape[:axis])) if axis else 1
        return [x.reshape(lead, -1)]
    if op == "Squeeze":
        axes = ints_of(ins[1]) if len(ins) > 1 else list(a.get("axes", []))
        axes = sorted(v % x.dim() for v in axes)
        for v in reversed(axes):
            x = x.squeeze(v)
        return [x]
    if op == "Unsqueeze":
        axes = ints_of(ins[1]) if len(ins) > 1 else list(a.get("axes", []))
        r = x.dim() + len(axes)
        for v in sorted(v % r for v in axes):
            x = x.unsqueeze(v)
        return [x]
    if op == "Identity":
        return [x]
    if op == "Slice":
        return [onnx_slice(x, ins, a, opset)]
    if op == "Expand":
        return [torch.broadcast_to(x, torch.broadcast_shapes(x.shape, tuple(ints_of(ins[1]))))]
    if op == "Tile":
        return [x.repeat(*ints_of(ins[1]))]
    if op == "Cast":
        to = a["to"]
        assert to in (TensorProto.FLOAT, TensorProto.INT64), to
        return [x.long() if to == TensorProto.INT64 else x.to(torch.float64)]   # float64 stands for float here
    if op in ("LSTM", "GRU"):
        return onnx_rnn(op, ins, a)
    raise NotImplementedError(op)


def onnx_rnn(op, ins, a):
    """LSTM / GRU (one layer; forward, reverse or bidirectional) from the ONNX
    spec's equations, step by step (not torch.nn.LSTM / GRU): gates [i, o, f, c]
    and [z, r, h], W, R, B packed as ONNX packs them, layout 0 (X [T,B,I]) or 1
    (X [B,T,I])."""
    assert "clip" not in a
    ins = ins + [None] * (7 - len(ins))
    x, w, r, b, seq, h0, c0 = ins[:7]
    assert seq is None
    layout = a.get("layout", 0)
    if layout:
        x = x.transpose(0, 1)
        h0 = h0.transpose(0, 1) if h0 is not None else None
        c0 = c0.transpose(0, 1) if c0 is not None else None
    direction = a.get("direction", "forward")
    dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    outs = [rnn_direction(op, x, w[d], r[d], b[d] if b is not None else None, h0[d] if h0 is not None else None,
                          c0[d] if c0 is not None else None, rev, a) for d, rev in enumerate(dirs)]
    y = torch.stack([o[0] for o in outs], 1)          # [T,D,B,H]
    yh = torch.stack([o[1] for o in outs])            # [D,B,H]
    yc = torch.stack([o[2] for o in outs])
    if layout:
        y, yh, yc = y.permute(2, 0, 1, 3), yh.transpose(0, 1), yc.transpose(0, 1)
    return [y, yh, yc] if op == "LSTM" else [y, yh]


def rnn_direction(op, x, w, r, b, h0, c0, rev, a):
    """One direction: Y [T,B,H] (h at each time), the last h and c [B,H]."""
    T, Bn = x.shape[0], x.shape[1]
    H = r.shape[-1]
    G = 4 if op == "LSTM" else 3
    wb, rb = (b[:G * H], b[G * H:]) if b is not None else (torch.zeros(G * H), torch.zeros(G * H))
    h = h0 if h0 is not None else torch.zeros(Bn, H)
    c = c0 if c0 is not None else torch.zeros(Bn, H)
    ys = [None] * T
    for t in (reversed(range(T)) if rev else range(T)):
        if op == "LSTM":
            gi, go, gf, gc = (x[t] @ w.t() + wb + h @ r.t() + rb).split(H, dim=1)
            c = torch.sigmoid(gf) * c + torch.sigmoid(gi) * torch.tanh(gc)
            h = torch.sigmoid(go) * torch.tanh(c)
        else:
            xz, xr, xh = (x[t] @ w.t() + wb).split(H, dim=1)
            (rz, rr, rh), (bz, br, bh) = r.split(H, dim=0), rb.split(H)
            z = torch.sigmoid(xz + h @ rz.t() + bz)
            rg = torch.sigmoid(xr + h @ rr.t() + br)
            if a.get("linear_before_reset", 0):
                hh = torch.tanh(xh + rg * (h @ rh.t() + bh))
            else:
                hh = torch.tanh(xh + (rg * h) @ rh.t() + bh)
            h = (1 - z) * hh + z * h
        ys[t] = h
    return torch.stack(ys), h, c


def dropout(index, ins, a, opset):
    """Dropout as pipecc trains it in this test's one step (step 0, --seed 1):
    the mask is Philox's for node `index` (tests/test_dropout.py computes it as
    runtime/kernels.h does), applied as PyTorch applies its own: x * (mask / (1 - p))."""
    from test_dropout import philox_mask
    x = ins[0]
    if opset < 12:   # the ratio attribute: the op drops in a training program
        ratio, drops = a.get("ratio", 0.5), True
    else:            # training_mode false when absent
        ratio = float(ins[1]) if len(ins) > 1 and ins[1] is not None else 0.5
        drops = len(ins) > 2 and ins[2] is not None and bool(ins[2])
    if not drops or ratio == 0:
        return [x, torch.ones(x.shape, dtype=torch.bool)]
    keep = torch.from_numpy(philox_mask(0, index, x.numel(), ratio).reshape(tuple(x.shape)))
    return [x * (keep.to(x.dtype) / (1 - ratio)), keep]


def onnx_slice(x, ins, a, opset):
    """ONNX Slice by Python's own slice clamping (slice.indices), which is the
    spec's: starts/ends/axes/steps from inputs (opset 10+) or attributes."""
    if opset >= 10:
        starts, ends = ints_of(ins[1]), ints_of(ins[2])
        axes = ints_of(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
        steps = ints_of(ins[4]) if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    else:
        starts, ends = list(a["starts"]), list(a["ends"])
        axes, steps = list(a.get("axes", range(len(starts)))), [1] * len(starts)
    for s0, e0, ax, st in zip(starts, ends, axes, steps):
        ax %= x.dim()
        idx = list(range(*slice(s0, e0, st).indices(x.shape[ax])))
        x = torch.index_select(x, ax, torch.tensor(idx, dtype=torch.int64))
    return x


def run_graph(model, env):
    """Evaluates model's nodes over env (name -> tensor); returns env."""
    opset = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    env = dict(env)
    for index, n in enumerate(model.graph.node):
        ins = [env[i] if i else None for i in n.input]
        while ins and ins[-1] is None:
            ins.pop()
        if n.op_type == "Dropout":   # its mask depends on where the node is
            outs = dropout(index, ins, node_attrs(n), opset)
        else:
            outs = run_node(n.op_type, ins, node_attrs(n), opset)
        if n.op_type == "Split":
            xx, sizes, axis = outs
            if sizes is None:
                k = len(n.output)
                sizes = [xx.shape[axis] // k] * k
            outs = list(torch.split(xx, sizes, dim=axis))
        for name, v in zip(n.output, outs):
            if name:
                env[name] = v
    return env


def to_torch(arr):
    if arr.dtype == np.float32 or arr.dtype == np.float64:
        return torch.from_numpy(np.array(arr, dtype=np.float64))
    if arr.dtype == np.bool_:
        return torch.from_numpy(np.array(arr, dtype=np.bool_))
    return torch.from_numpy(np.array(arr, dtype=np.int64))


def bn_stat_names(model):
    out = set()
    for n in model.graph.node:
        if n.op_type == "BatchNormalization":
            out.update(n.input[3:5])
    return out


def trainable(model, inits):
    """The initializers pipecc trains: float, more than one element, not BN running stats."""
    stats = bn_stat_names(model)
    return [k for k, v in inits.items() if v.dtype == np.float32 and v.size > 1 and k not in stats]


# --------------------------------------------------------------------------
# Model builder
# --------------------------------------------------------------------------

class Net:
    def __init__(self, seed, opset=17):
        self.opset = opset
        self.nodes = []
        self.inits = {}          # name -> numpy array (insertion-ordered)
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def name(self, prefix):
        self.count += 1
        return f"{prefix}{self.count}"

    def init(self, arr, prefix="w"):
        arr = np.asarray(arr)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        nm = self.name(prefix)
        self.inits[nm] = arr
        return nm

    def rand(self, shape, scale=1.0, offset=0.0, prefix="w"):
        return self.init(offset + scale * self.rng.standard_normal(shape), prefix)

    def uniform(self, shape, lo, hi, prefix="w"):
        return self.init(self.rng.uniform(lo, hi, shape), prefix)

    def ints(self, vals):
        return self.init(np.array(vals, dtype=np.int64), "c")

    def node(self, op, inputs, nout=1, out=None, **attrs):
        outs = [out] if out else [self.name("t") for _ in range(nout)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=f"{op}_{len(self.nodes)}", **attrs))
        return outs[0] if nout == 1 else outs

    def model(self):
        g = helper.make_graph(
            self.nodes, "gradcheck",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, 1, 28, 28])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [B, C])],
            [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 9 if self.opset >= 19 else 8   # opset 19..20 came with IR version 9
        return m

    def shape(self, t):
        """Shape of tensor t, by running the graph so far on zeros."""
        env = {k: to_torch(v) for k, v in self.inits.items()}
        env["x"] = torch.zeros(B, 1, 28, 28)
        with torch.no_grad():
            return tuple(run_graph(self.model_so_far(), env)[t].shape)

    def model_so_far(self):
        m = onnx.ModelProto()
        m.opset_import.add().version = self.opset
        m.graph.node.extend(self.nodes)
        return m

    def stem(self, shape, offset=0.0, wscale=0.06):
        """x -> Flatten -> Gemm -> Reshape: [B, *shape] of continuous values,
        about offset +- 1 (offset 2, wscale 0.015: within [1, 3])."""
        k = int(np.prod(shape))
        f = self.node("Flatten", ["x"], axis=1)
        h = self.node("Gemm", [f, self.rand([784, k], wscale, prefix="W0_"),
                               self.rand([k], 0.1, offset, prefix="b0_")])
        if len(shape) == 1:
            return h
        return self.node("Reshape", [h, self.ints([-1] + list(shape))])

    def head(self, y):
        """y -> Flatten -> Gemm -> logits [B, C]."""
        f = self.node("Flatten", [y], axis=1) if len(self.shape(y)) != 2 else y
        feat = self.shape(f)[1]
        return self.node("Gemm", [f, self.rand([feat, C], 1.0 / np.sqrt(feat), prefix="Wh"),
                                  self.rand([C], 0.1, prefix="bh")], out="logits")


# --------------------------------------------------------------------------
# Cases: (op, case name, builder(net)) -- the builder must end at "logits"
# --------------------------------------------------------------------------

CASES = []


def case(op, name, opset=17):
    def deco(fn):
        CASES.append((op, name, opset, fn))
        return fn
    return deco


# Gemm
@case("Gemm", "bias[N]")
def _(g):
    g.head(g.node("Gemm", [g.stem([6]), g.rand([6, 5], 0.5), g.rand([5], 0.5)]))


@case("Gemm", "transB=1 alpha=0.7 beta=1.3")
def _(g):
    g.head(g.node("Gemm", [g.stem([6]), g.rand([5, 6], 0.5), g.rand([5], 0.5)], transB=1, alpha=0.7, beta=1.3))


@case("Gemm", "transA=1 (A = Transpose(x))")
def _(g):
    a = g.node("Transpose", [g.stem([6])], perm=[1, 0])
    g.head(g.node("Gemm", [a, g.rand([6, 5], 0.5), g.rand([5], 0.5)], transA=1))


@case("Gemm", "transA=1 transB=1 alpha=0.5 beta=2 bias[1,N]")
def _(g):
    a = g.node("Transpose", [g.stem([6])], perm=[1, 0])
    g.head(g.node("Gemm", [a, g.rand([5, 6], 0.5), g.rand([1, 5], 0.5)], transA=1, transB=1, alpha=0.5, beta=2.0))


@case("Gemm", "no bias, weight as A: W[5,6] x h^T (transB=1)")
def _(g):
    y = g.node("Gemm", [g.rand([5, 6], 0.5), g.stem([6])], transB=1)      # [5, B]
    g.head(g.node("Transpose", [y], perm=[1, 0]))


# MatMul
@case("MatMul", "2-D [B,6]x[6,5]")
def _(g):
    g.head(g.node("MatMul", [g.stem([6]), g.rand([6, 5], 0.5)]))


@case("MatMul", "3-D x 2-D [B,4,6]x[6,5]")
def _(g):
    g.head(g.node("MatMul", [g.stem([4, 6]), g.rand([6, 5], 0.5)]))


@case("MatMul", "3-D x 3-D, both activations (h @ (h Wk)^T)")
def _(g):
    h = g.stem([4, 6])
    k = g.node("MatMul", [h, g.rand([6, 6], 0.4)])
    g.head(g.node("MatMul", [h, g.node("Transpose", [k], perm=[0, 2, 1])]))


@case("MatMul", "4-D x 3-D broadcast [B,2,4,6]x[2,6,5]")
def _(g):
    g.head(g.node("MatMul", [g.stem([2, 4, 6]), g.rand([2, 6, 5], 0.5)]))


@case("MatMul", "4-D broadcast A [B,1,4,6]x[3,6,5]")
def _(g):
    g.head(g.node("MatMul", [g.stem([1, 4, 6]), g.rand([3, 6, 5], 0.5)]))


@case("MatMul", "2-D x 3-D, weight on the left [3,4]x[B,4,6]")
def _(g):
    g.head(g.node("MatMul", [g.rand([3, 4], 0.5), g.stem([4, 6])]))


# Conv (input [B,4,7,7])
@case("Conv", "3x3 pads=1 bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 7, 7]), g.rand([6, 4, 3, 3], 0.3), g.rand([6], 0.3)],
                  kernel_shape=[3, 3], pads=[1, 1, 1, 1]))


@case("Conv", "3x3 stride=2 pads=[0,1,1,0] no bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 7, 7]), g.rand([6, 4, 3, 3], 0.3)],
                  kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 1, 0]))


@case("Conv", "3x3 dilation=2 pads=2 bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 7, 7]), g.rand([5, 4, 3, 3], 0.3), g.rand([5], 0.3)],
                  kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]))


@case("Conv", "group=2 3x3 pads=1 bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 7, 7]), g.rand([6, 2, 3, 3], 0.3), g.rand([6], 0.3)],
                  kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2))


@case("Conv", "depthwise group=4 stride=2 pads=1 bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 7, 7]), g.rand([4, 1, 3, 3], 0.3), g.rand([4], 0.3)],
                  kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], group=4))


@case("Conv", "2x3 kernel strides=[1,2] pads=[1,0,0,2] dilations=[2,1] bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 7, 7]), g.rand([3, 4, 2, 3], 0.3), g.rand([3], 0.3)],
                  kernel_shape=[2, 3], strides=[1, 2], pads=[1, 0, 0, 2], dilations=[2, 1]))


@case("Conv", "on the image itself 5x5 stride=3 bias")
def _(g):
    g.head(g.node("Conv", ["x", g.rand([4, 1, 5, 5], 0.2), g.rand([4], 0.3)], kernel_shape=[5, 5], strides=[3, 3]))


# Conv of one point (input and output 1x1: a GEMM over the one tap that lands on the point,
# runtime/kernels.h k_conv_point; ResNet-18's last stage at 32x32)
@case("Conv", "one point 3x3 pads=1 bias")
def _(g):
    g.head(g.node("Conv", [g.stem([6, 1, 1]), g.rand([5, 6, 3, 3], 0.3), g.rand([5], 0.3)],
                  kernel_shape=[3, 3], pads=[1, 1, 1, 1]))


@case("Conv", "one point group=2 3x2 pads=[2,0,0,1] dilations=[1,1] no bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 1, 1]), g.rand([6, 2, 3, 2], 0.3)],
                  kernel_shape=[3, 2], pads=[2, 0, 0, 1], group=2))


@case("Conv", "one point 3x3 dilation=2 pads=[3,1,1,3]: no tap lands, bias only")
def _(g):
    # Its weight's gradient is zero, and so is the stem's; its bias's comes from the head.
    g.head(g.node("Conv", [g.stem([4, 1, 1]), g.rand([3, 4, 3, 3], 0.3), g.rand([3], 0.3)],
                  kernel_shape=[3, 3], pads=[3, 1, 1, 3], dilations=[2, 2]))


@case("Conv", "one point 1-D k=1 stride=2 bias")
def _(g):
    g.head(g.node("Conv", [g.stem([5, 1]), g.rand([4, 5, 1], 0.3), g.rand([4], 0.3)], kernel_shape=[1], strides=[2]))


# Conv 1-D (input [B,4,12]) and 3-D (input [B,2,5,6,6]), as torch.nn.Conv1d / Conv3d export them
@case("Conv", "1-D k=3 stride=2 pads=1 bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 12]), g.rand([5, 4, 3], 0.3), g.rand([5], 0.3)],
                  kernel_shape=[3], strides=[2], pads=[1, 1], dilations=[1], group=1))


@case("Conv", "1-D k=3 dilation=2 group=2 pads=[2,1] no bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 12]), g.rand([6, 2, 3], 0.3)],
                  kernel_shape=[3], dilations=[2], pads=[2, 1], group=2))


@case("Conv", "3-D 3x3x3 strides=[1,2,2] pads=1 bias")
def _(g):
    g.head(g.node("Conv", [g.stem([2, 5, 6, 6]), g.rand([4, 2, 3, 3, 3], 0.2), g.rand([4], 0.3)],
                  kernel_shape=[3, 3, 3], strides=[1, 2, 2], pads=[1, 1, 1, 1, 1, 1]))


@case("Conv", "3-D 2x3x2 group=2 dilations=[2,1,1] pads=[1,0,1,0,2,0] no bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 5, 5, 5]), g.rand([4, 2, 2, 3, 2], 0.3)],
                  kernel_shape=[2, 3, 2], group=2, dilations=[2, 1, 1], pads=[1, 0, 1, 0, 2, 0]))


# Conv auto_pad: the pads are resolved at compile time from the static shapes
@case("Conv", "auto_pad=SAME_UPPER 3x3 stride=2 (odd total padding) bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 6, 6]), g.rand([5, 4, 3, 3], 0.3), g.rand([5], 0.3)],
                  kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"))


@case("Conv", "auto_pad=SAME_LOWER 2x4 strides=[2,1] no bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 7, 6]), g.rand([5, 4, 2, 4], 0.3)],
                  kernel_shape=[2, 4], strides=[2, 1], auto_pad="SAME_LOWER"))


@case("Conv", "auto_pad=VALID 3x3 stride=2 bias")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 7, 7]), g.rand([5, 4, 3, 3], 0.3), g.rand([5], 0.3)],
                  kernel_shape=[3, 3], strides=[2, 2], auto_pad="VALID"))


@case("Conv", "1-D auto_pad=SAME_LOWER k=4 dilation=2")
def _(g):
    g.head(g.node("Conv", [g.stem([4, 11]), g.rand([5, 4, 4], 0.3), g.rand([5], 0.3)],
                  kernel_shape=[4], dilations=[2], auto_pad="SAME_LOWER"))


@case("Conv", "3-D auto_pad=SAME_UPPER 2x2x3 stride=2")
def _(g):
    g.head(g.node("Conv", [g.stem([2, 5, 5, 6]), g.rand([3, 2, 2, 2, 3], 0.3), g.rand([3], 0.3)],
                  kernel_shape=[2, 2, 3], strides=[2, 2, 2], auto_pad="SAME_UPPER"))


# MaxPool
@case("MaxPool", "2x2 stride=2")
def _(g):
    g.head(g.node("MaxPool", [g.stem([3, 6, 6])], kernel_shape=[2, 2], strides=[2, 2]))


@case("MaxPool", "3x3 stride=2 pads=1")
def _(g):
    g.head(g.node("MaxPool", [g.stem([2, 7, 7])], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))


@case("MaxPool", "3x3 stride=1 (overlapping windows)")
def _(g):
    g.head(g.node("MaxPool", [g.stem([2, 5, 5])], kernel_shape=[3, 3]))


@case("MaxPool", "2x2 dilation=2 pads=[1,0,0,1]")
def _(g):
    g.head(g.node("MaxPool", [g.stem([2, 6, 6])], kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 0, 0, 1]))


@case("MaxPool", "3x3 stride=2 ceil_mode=1")
def _(g):
    g.head(g.node("MaxPool", [g.stem([2, 6, 6])], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1))


@case("MaxPool", "1-D k=3 stride=2 pads=1")
def _(g):
    g.head(g.node("MaxPool", [g.stem([3, 12])], kernel_shape=[3], strides=[2], pads=[1, 1]))


@case("MaxPool", "1-D k=2 dilation=2 stride=2 ceil_mode=1")
def _(g):
    g.head(g.node("MaxPool", [g.stem([3, 12])], kernel_shape=[2], dilations=[2], strides=[2], ceil_mode=1))


@case("MaxPool", "3-D 2x2x2 stride=2")
def _(g):
    g.head(g.node("MaxPool", [g.stem([2, 4, 6, 6])], kernel_shape=[2, 2, 2], strides=[2, 2, 2]))


@case("MaxPool", "3-D 3x2x3 strides=[2,1,2] pads=[1,0,1,1,1,0] ceil_mode=1")
def _(g):
    g.head(g.node("MaxPool", [g.stem([2, 5, 4, 6])], kernel_shape=[3, 2, 3], strides=[2, 1, 2],
                  pads=[1, 0, 1, 1, 1, 0], ceil_mode=1))


@case("MaxPool", "auto_pad=SAME_UPPER 3x3 stride=2")
def _(g):
    g.head(g.node("MaxPool", [g.stem([2, 6, 6])], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"))


@case("MaxPool", "auto_pad=SAME_LOWER 2x2 stride=1")
def _(g):
    g.head(g.node("MaxPool", [g.stem([2, 5, 5])], kernel_shape=[2, 2], auto_pad="SAME_LOWER"))


@case("MaxPool", "auto_pad=VALID 3x2 strides=[2,2]")
def _(g):
    g.head(g.node("MaxPool", [g.stem([2, 7, 6])], kernel_shape=[3, 2], strides=[2, 2], auto_pad="VALID"))


@case("MaxPool", "3-D auto_pad=SAME_LOWER 2x3x2 stride=2")
def _(g):
    g.head(g.node("MaxPool", [g.stem([2, 4, 5, 5])], kernel_shape=[2, 3, 2], strides=[2, 2, 2], auto_pad="SAME_LOWER"))


# AveragePool
@case("AveragePool", "2x2 stride=2")
def _(g):
    g.head(g.node("AveragePool", [g.stem([3, 6, 6])], kernel_shape=[2, 2], strides=[2, 2]))


@case("AveragePool", "3x3 stride=2 pads=1 count_include_pad=0")
def _(g):
    g.head(g.node("AveragePool", [g.stem([2, 7, 7])], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                  count_include_pad=0))


@case("AveragePool", "3x3 stride=2 pads=1 count_include_pad=1")
def _(g):
    g.head(g.node("AveragePool", [g.stem([2, 7, 7])], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                  count_include_pad=1))


@case("AveragePool", "2x3 pads=[0,1,1,0] count_include_pad=0")
def _(g):
    g.head(g.node("AveragePool", [g.stem([2, 5, 5])], kernel_shape=[2, 3], pads=[0, 1, 1, 0], count_include_pad=0))


@case("AveragePool", "2x3 pads=[0,1,1,0] count_include_pad=1")
def _(g):
    g.head(g.node("AveragePool", [g.stem([2, 5, 5])], kernel_shape=[2, 3], pads=[0, 1, 1, 0], count_include_pad=1))


@case("AveragePool", "1-D k=3 stride=2 pads=1 count_include_pad=0")
def _(g):
    g.head(g.node("AveragePool", [g.stem([3, 12])], kernel_shape=[3], strides=[2], pads=[1, 1], count_include_pad=0))


@case("AveragePool", "1-D k=4 stride=2 pads=[2,1] count_include_pad=1")
def _(g):
    g.head(g.node("AveragePool", [g.stem([3, 11])], kernel_shape=[4], strides=[2], pads=[2, 1], count_include_pad=1))


@case("AveragePool", "1-D k=3 stride=2 ceil_mode=1")
def _(g):
    g.head(g.node("AveragePool", [g.stem([3, 12])], kernel_shape=[3], strides=[2], ceil_mode=1))


@case("AveragePool", "1-D k=3 stride=2 pads=1 ceil_mode=1 count_include_pad=1 (last window past the end pad)")
def _(g):
    g.head(g.node("AveragePool", [g.stem([3, 6])], kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1,
                  count_include_pad=1))


@case("AveragePool", "2x3 strides=[2,2] pads=[1,0,0,1] ceil_mode=1 count_include_pad=1")
def _(g):
    g.head(g.node("AveragePool", [g.stem([2, 6, 6])], kernel_shape=[2, 3], strides=[2, 2], pads=[1, 0, 0, 1], ceil_mode=1,
                  count_include_pad=1))


@case("AveragePool", "3-D 2x2x2 stride=2")
def _(g):
    g.head(g.node("AveragePool", [g.stem([2, 4, 6, 6])], kernel_shape=[2, 2, 2], strides=[2, 2, 2]))


@case("AveragePool", "3-D 3x3x2 stride=2 pads=[1,1,0,1,0,1] count_include_pad=0")
def _(g):
    g.head(g.node("AveragePool", [g.stem([2, 5, 5, 4])], kernel_shape=[3, 3, 2], strides=[2, 2, 2],
                  pads=[1, 1, 0, 1, 0, 1], count_include_pad=0))


@case("AveragePool", "3-D 3x3x2 stride=2 pads=[1,1,0,1,0,1] count_include_pad=1")
def _(g):
    g.head(g.node("AveragePool", [g.stem([2, 5, 5, 4])], kernel_shape=[3, 3, 2], strides=[2, 2, 2],
                  pads=[1, 1, 0, 1, 0, 1], count_include_pad=1))


@case("AveragePool", "auto_pad=SAME_UPPER 3x3 stride=2")
def _(g):
    g.head(g.node("AveragePool", [g.stem([2, 6, 6])], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"))


@case("AveragePool", "auto_pad=SAME_LOWER 3x2 stride=2 count_include_pad=1")
def _(g):
    g.head(g.node("AveragePool", [g.stem([2, 6, 5])], kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_LOWER",
                  count_include_pad=1))


@case("AveragePool", "auto_pad=VALID 2x3 stride=2")
def _(g):
    g.head(g.node("AveragePool", [g.stem([2, 7, 7])], kernel_shape=[2, 3], strides=[2, 2], auto_pad="VALID"))


@case("AveragePool", "1-D auto_pad=SAME_UPPER k=4 stride=3")
def _(g):
    g.head(g.node("AveragePool", [g.stem([3, 13])], kernel_shape=[4], strides=[3], auto_pad="SAME_UPPER"))


# GlobalAveragePool
@case("GlobalAveragePool", "[B,4,3,5]")
def _(g):
    g.head(g.node("GlobalAveragePool", [g.stem([4, 3, 5])]))


@case("GlobalAveragePool", "1-D [B,4,9]")
def _(g):
    g.head(g.node("GlobalAveragePool", [g.stem([4, 9])]))


@case("GlobalAveragePool", "3-D [B,3,2,3,4]")
def _(g):
    g.head(g.node("GlobalAveragePool", [g.stem([3, 2, 3, 4])]))


# Pad
@case("Pad", "constant 0.5 pads=[0,0,1,2,0,0,2,1] then Conv")
def _(g):
    p = g.node("Pad", [g.stem([2, 4, 4]), g.ints([0, 0, 1, 2, 0, 0, 2, 1]), g.init(np.array(0.5, np.float32), "v")])
    g.head(g.node("Conv", [p, g.rand([3, 2, 3, 3], 0.3), g.rand([3], 0.3)], kernel_shape=[3, 3]))


@case("Pad", "constant default value, 2-D [B,6] pads=[0,2,0,1]")
def _(g):
    g.head(g.node("Pad", [g.stem([6]), g.ints([0, 2, 0, 1])]))


# BatchNormalization
def bn_inputs(g, ch):
    return [g.uniform([ch], 0.5, 1.5), g.rand([ch], 0.3), g.rand([ch], 0.2, prefix="rm"),
            g.uniform([ch], 0.5, 1.5, prefix="rv")]


@case("BatchNormalization", "training_mode=1 [B,4,3,3] opset 15", opset=15)
def _(g):
    y = g.node("BatchNormalization", [g.stem([4, 3, 3])] + bn_inputs(g, 4), nout=3, training_mode=1, momentum=0.9)
    g.head(y[0])


@case("BatchNormalization", "training_mode=1 [B,5] epsilon=1e-3 momentum=0.8 opset 17")
def _(g):
    # Tanh first: straight after the stem's bias, BN would make that bias's gradient exactly 0.
    t = g.node("Tanh", [g.stem([5])])
    y = g.node("BatchNormalization", [t] + bn_inputs(g, 5), nout=3, training_mode=1, epsilon=1e-3, momentum=0.8)
    g.head(g.node("Tanh", [y[0]]))


@case("BatchNormalization", "training_mode=1 Y only, after Conv")
def _(g):
    c = g.node("Conv", [g.stem([2, 5, 5]), g.rand([4, 2, 3, 3], 0.3)], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    y = g.node("BatchNormalization", [c] + bn_inputs(g, 4), training_mode=1)
    g.head(g.node("Relu", [y]))


# BatchNormalization then a Relu that alone reads it run as one call (compiler/fuse.c): in both modes.
@case("BatchNormalization", "training_mode=0 then Relu (fused)")
def _(g):
    y = g.node("BatchNormalization", [g.stem([4, 3, 3])] + bn_inputs(g, 4), training_mode=0)
    g.head(g.node("Relu", [y]))


# LayerNormalization
@case("LayerNormalization", "axis=-1 [B,4,6] scale+bias")
def _(g):
    g.head(g.node("LayerNormalization", [g.stem([4, 6]), g.uniform([6], 0.5, 1.5), g.rand([6], 0.3)], axis=-1))


@case("LayerNormalization", "axis=1 [B,4,6] scale+bias [4,6] epsilon=1e-3")
def _(g):
    g.head(g.node("LayerNormalization", [g.stem([4, 6]), g.uniform([4, 6], 0.5, 1.5), g.rand([4, 6], 0.3)],
                  axis=1, epsilon=1e-3))


@case("LayerNormalization", "axis=-1 [B,8] no bias")
def _(g):
    g.head(g.node("LayerNormalization", [g.stem([8]), g.uniform([8], 0.5, 1.5)]))


# Decomposed LayerNormalization and GELU, as torch.onnx writes them below opset 17 / 20: compiler/fuse.c
# makes each exact chain one LayerNormalization or Gelu node (FUSED says how many nodes it absorbs, checked
# against plan.json's fused_nodes); the near misses must stay as they are, and all must train right.
FUSED = {
    "training_mode=0 then Relu (fused)": 1,
    "training_mode=1 Y only, after Conv": 1,
}


def decomposed_ln(g, x, axes, scale, bias, eps=1e-5, exponent=2.0):
    m = g.node("ReduceMean", [x], axes=axes)
    d = g.node("Sub", [x, m])
    v = g.node("ReduceMean", [g.node("Pow", [d, g.init(np.array(exponent, np.float32), "c")])], axes=axes)
    s = g.node("Sqrt", [g.node("Add", [v, g.init(np.array(eps, np.float32), "c")])])
    return g.node("Add", [g.node("Mul", [g.node("Div", [d, s]), scale]), bias]), d


def decomposed_gelu(g, x, half=0.5):
    e = g.node("Erf", [g.node("Div", [x, g.init(np.array(np.sqrt(2.0), np.float32), "c")])])
    a = g.node("Add", [e, g.init(np.array(1.0, np.float32), "c")])
    return g.node("Mul", [g.node("Mul", [x, a]), g.init(np.array(half, np.float32), "c")]), e


def fused_case(name, nodes):
    FUSED[name] = nodes
    return name


@case("LayerNormalization", fused_case("decomposed, axes=[-1] [B,4,6] (fused)", 8))
def _(g):
    g.head(decomposed_ln(g, g.stem([4, 6]), [-1], g.uniform([6], 0.5, 1.5), g.rand([6], 0.3))[0])


@case("LayerNormalization", fused_case("decomposed, axes=[1,2] [B,4,6] epsilon=1e-3 (fused)", 8))
def _(g):
    g.head(decomposed_ln(g, g.stem([4, 6]), [1, 2], g.uniform([4, 6], 0.5, 1.5), g.rand([4, 6], 0.3), eps=1e-3)[0])


@case("LayerNormalization", fused_case("decomposed, the centred value read again (not fused)", 0))
def _(g):
    y, d = decomposed_ln(g, g.stem([4, 6]), [-1], g.uniform([6], 0.5, 1.5), g.rand([6], 0.3))
    g.head(g.node("Add", [y, d]))


@case("LayerNormalization", fused_case("decomposed, Pow 4 (not fused)", 0))
def _(g):
    g.head(decomposed_ln(g, g.stem([4, 6]), [-1], g.uniform([6], 0.5, 1.5), g.rand([6], 0.3), exponent=4.0)[0])


@case("LayerNormalization", fused_case("decomposed, no scale, then Add of a bias (not fused)", 0))
def _(g):
    x = g.stem([4, 6])
    m = g.node("ReduceMean", [x], axes=[-1])
    d = g.node("Sub", [x, m])
    v = g.node("ReduceMean", [g.node("Pow", [d, g.init(np.array(2.0, np.float32), "c")])], axes=[-1])
    s = g.node("Sqrt", [g.node("Add", [v, g.init(np.array(1e-5, np.float32), "c")])])
    g.head(g.node("Add", [g.node("Div", [d, s]), g.rand([6], 0.3)]))


@case("LayerNormalization", fused_case("decomposed, axes=[1] of [B,4,6] (not fused)", 0))
def _(g):
    g.head(decomposed_ln(g, g.stem([4, 6]), [1], g.uniform([6], 0.5, 1.5), g.rand([6], 0.3))[0])


@case("Gelu", fused_case("decomposed x * (erf(x / sqrt 2) + 1) * 0.5 [B,12] (fused)", 4))
def _(g):
    g.head(decomposed_gelu(g, g.stem([12]))[0])


@case("Gelu", fused_case("decomposed, times 0.6 (not fused)", 0))
def _(g):
    g.head(decomposed_gelu(g, g.stem([12]), half=0.6)[0])


@case("Gelu", fused_case("decomposed, erf read again (not fused)", 0))
def _(g):
    y, e = decomposed_gelu(g, g.stem([12]))
    g.head(g.node("Add", [y, e]))


# MatMul then the Add of a bias [N] (every nn.Linear on a 3-D input exports so): one Gemm (fuse.c).
@case("MatMul", fused_case("[B,4,6]x[6,5] then Add bias [5] (fused)", 1))
def _(g):
    g.head(g.node("Add", [g.node("MatMul", [g.stem([4, 6]), g.rand([6, 5], 0.5)]), g.rand([5], 0.5)]))


@case("MatMul", fused_case("[B,6]x[6,5], Add(bias [5], it) (fused)", 1))
def _(g):
    g.head(g.node("Add", [g.rand([5], 0.5), g.node("MatMul", [g.stem([6]), g.rand([6, 5], 0.5)])]))


@case("MatMul", fused_case("[B,4,6]x[6,5] then Add [4,5] (not fused)", 0))
def _(g):
    g.head(g.node("Add", [g.node("MatMul", [g.stem([4, 6]), g.rand([6, 5], 0.5)]), g.rand([4, 5], 0.5)]))


@case("MatMul", fused_case("[B,4,6]x[6,5] read twice, one Add of bias [5] (not fused)", 0))
def _(g):
    y = g.node("MatMul", [g.stem([4, 6]), g.rand([6, 5], 0.5)])
    g.head(g.node("Mul", [g.node("Add", [y, g.rand([5], 0.5)]), y]))


# Add of two values of one shape then a Relu that alone reads the sum (a residual block's end): two calls
# (docs/kernels.md says why Add+Relu is not fused).
@case("Add", fused_case("[B,4,6] + [B,4,6] then Relu (not fused)", 0))
def _(g):
    x = g.stem([4, 6])
    g.head(g.node("Relu", [g.node("Add", [x, g.node("Tanh", [x])])]))


@case("Add", fused_case("[B,4,6] + weight [4,6] then Relu (not fused: a broadcast)", 0))
def _(g):
    g.head(g.node("Relu", [g.node("Add", [g.stem([4, 6]), g.rand([4, 6], 0.5)])]))


# Gather
@case("Gather", "embedding [10,6], indices [5] with repeats, + x")
def _(g):
    e = g.node("Gather", [g.rand([10, 6], 0.5), g.ints([1, 3, 1, 7, 3])])
    g.head(g.node("Add", [g.stem([5, 6]), e]))


@case("Gather", "embedding [7,4], indices [2,3], * x")
def _(g):
    e = g.node("Gather", [g.rand([7, 4], 0.7), g.ints([[0, 6, 2], [2, 2, 5]])])
    g.head(g.node("Mul", [g.stem([2, 3, 4]), e]))


# Softmax / LogSoftmax
@case("Softmax", "last axis [B,4,6]")
def _(g):
    g.head(g.node("Softmax", [g.node("Mul", [g.stem([4, 6]), g.init(np.float32(2.0), "s")])], axis=-1))


@case("Softmax", "axis=2 [B,3,4], * W[3,4], ReduceSum to the logits")
def _(g):
    s = g.node("Softmax", [g.stem([3, 4])], axis=2)
    m = g.node("Mul", [s, g.rand([3, 4], 2.0)])
    g.node("ReduceSum", [m, g.ints([2])], keepdims=0, out="logits")


@case("Softmax", "as the logits [B,3]")
def _(g):
    g.node("Softmax", [g.stem([3])], out="logits")


@case("LogSoftmax", "last axis [B,4,6]")
def _(g):
    g.head(g.node("LogSoftmax", [g.stem([4, 6])], axis=-1))


@case("LogSoftmax", "as the logits [B,3]")
def _(g):
    g.node("LogSoftmax", [g.node("Gemm", [g.stem([5]), g.rand([5, 3], 0.5)])], axis=1, out="logits")


# Where
@case("Where", "cond[4,6] ? x : W[4,6]")
def _(g):
    cond = g.init(g.rng.random((4, 6)) < 0.5, "cond")
    g.head(g.node("Where", [cond, g.stem([4, 6]), g.rand([4, 6], 0.5)]))


@case("Where", "cond[4,1] ? W[6] : x (broadcast)")
def _(g):
    cond = g.init(np.array([[True], [False], [True], [True]]), "cond")
    g.head(g.node("Where", [cond, g.rand([6], 0.5), g.stem([4, 6])]))


# Split
@case("Split", "[B,10] axis=1 split=[4,6], both outputs to heads")
def _(g):
    a, b = g.node("Split", [g.stem([10]), g.ints([4, 6])], nout=2, axis=1)
    ya = g.node("Gemm", [g.node("Tanh", [a]), g.rand([4, C], 0.5)])
    yb = g.node("Gemm", [b, g.rand([6, C], 0.5), g.rand([C], 0.1)])
    g.node("Add", [ya, yb], out="logits")


@case("Split", "[B,4,6] axis=-1 equal halves, multiplied")
def _(g):
    a, b = g.node("Split", [g.stem([4, 6])], nout=2, axis=-1)
    g.head(g.node("Mul", [a, b]))


# Transpose
@case("Transpose", "[B,4,6] perm=[0,2,1] then MatMul")
def _(g):
    t = g.node("Transpose", [g.stem([4, 6])], perm=[0, 2, 1])
    g.head(g.node("MatMul", [t, g.rand([4, 3], 0.5)]))


@case("Transpose", "[B,2,3,4] perm=[0,3,1,2] then * W[2,1]")
def _(g):
    t = g.node("Transpose", [g.stem([2, 3, 4])], perm=[0, 3, 1, 2])     # [B,4,2,3]
    g.head(g.node("Mul", [t, g.rand([2, 1], 1.0)]))


# ReduceMean / ReduceSum
@case("ReduceMean", "axes=[2,3] keepdims=0 [B,4,3,3]")
def _(g):
    g.head(g.node("ReduceMean", [g.stem([4, 3, 3])], axes=[2, 3], keepdims=0))


@case("ReduceMean", "axes=[1] keepdims=1 [B,4,6]")
def _(g):
    g.head(g.node("ReduceMean", [g.stem([4, 6])], axes=[1], keepdims=1))


@case("ReduceMean", "axes=[-1] keepdims=0 as the logits [B,3,5]")
def _(g):
    g.node("ReduceMean", [g.stem([3, 5])], axes=[-1], keepdims=0, out="logits")


@case("ReduceSum", "axes=[-1] keepdims=0 [B,4,6]")
def _(g):
    g.head(g.node("ReduceSum", [g.stem([4, 6]), g.ints([-1])], keepdims=0))


@case("ReduceSum", "axes=[1,3] keepdims=1 [B,2,3,4]")
def _(g):
    g.head(g.node("ReduceSum", [g.stem([2, 3, 4]), g.ints([1, 3])], keepdims=1))


# Binary ops with broadcasting: a [B,4,6] (the stem), b an initializer
def bin_b6(op, pos=False):
    def build(g):
        a = g.stem([4, 6], offset=2.0, wscale=0.015) if pos else g.stem([4, 6])
        b = g.uniform([6], 0.5, 2.0) if op in ("Div", "Pow") else g.rand([6], 0.7)
        g.head(g.node(op, [a, b]))
    return build


def bin_b41(op, pos=False):
    def build(g):
        a = g.stem([4, 6], offset=2.0, wscale=0.015) if pos else g.stem([4, 6])
        b = g.uniform([4, 1], 0.5, 1.5) if op == "Pow" else g.rand([4, 1], 0.7)
        g.head(g.node(op, [b, a]))
    return build


for _op in ("Add", "Sub", "Mul", "Div", "Pow"):
    case(_op, "a[B,4,6] op b[6]")(bin_b6(_op, pos=_op == "Pow"))
    case(_op, "b[4,1] op a[B,4,6]")(bin_b41(_op, pos=_op in ("Div", "Pow")))


@case("Mul", "a * a (same tensor twice)")
def _(g):
    a = g.stem([4, 6])
    g.head(g.node("Mul", [a, a]))


@case("Add", "a[B,4,6] + W[4,4,6] (batch-sized initializer)")
def _(g):
    g.head(g.node("Add", [g.stem([4, 6]), g.rand([B, 4, 6], 0.5)]))


@case("Pow", "a ^ 2 (scalar constant exponent)")
def _(g):
    g.head(g.node("Pow", [g.stem([4, 6]), g.init(np.float32(2.0), "e")]))


@case("Div", "a[B,4,6] / b[B,1,1] (both activations)")
def _(g):
    a = g.stem([4, 6])
    d = g.node("ReduceMean", [g.stem([4, 6], offset=2.0, wscale=0.015)], axes=[1, 2], keepdims=1)
    g.head(g.node("Div", [a, d]))


# Unary
@case("Sqrt", "[B,4,6] positive")
def _(g):
    g.head(g.node("Sqrt", [g.stem([4, 6], offset=2.0, wscale=0.015)]))


for _op in ("Erf", "Relu", "Tanh", "Sigmoid"):
    case(_op, "[B,4,6]")(lambda g, _op=_op: g.head(g.node(_op, [g.stem([4, 6])])))


# Gelu (opset 20) and LeakyRelu: run-time kernels k_gelu / k_leakyrelu
@case("Gelu", "approximate=none [B,4,6] opset 20", opset=20)
def _(g):
    g.head(g.node("Gelu", [g.node("Mul", [g.stem([4, 6]), g.init(np.float32(2.0), "s")])]))


@case("Gelu", "approximate=tanh [B,4,6] opset 20", opset=20)
def _(g):
    g.head(g.node("Gelu", [g.node("Mul", [g.stem([4, 6]), g.init(np.float32(2.0), "s")])], approximate="tanh"))


@case("LeakyRelu", "alpha=0.01 (default) [B,4,6]")
def _(g):
    g.head(g.node("LeakyRelu", [g.stem([4, 6])]))


@case("LeakyRelu", "alpha=0.2 [B,4,6], then * W[4,6]")
def _(g):
    g.head(g.node("Mul", [g.node("LeakyRelu", [g.stem([4, 6])], alpha=0.2), g.rand([4, 6], 1.0)]))


# LSTM / GRU: stem [B,T,I] -> (Transpose to [T,B,I] for layout 0) -> the op -> heads on Y and the last states
def rnn_case(g, op, T, I, H, layout=0, bias=True, state=False, outs=(0, 1, 2), **attrs):
    G = 4 if op == "LSTM" else 3
    D = 2 if attrs.get("direction") == "bidirectional" else 1
    x = g.stem([T, I])
    if not layout:
        x = g.node("Transpose", [x], perm=[1, 0, 2])
    s = 1 / np.sqrt(H)
    ins = [x, g.rand([D, G * H, I], s), g.rand([D, G * H, H], s), g.rand([D, 2 * G * H], s) if bias else ""]
    if state:   # initial states as weights (trained): [D,B,H] (layout 0) or [B,D,H]
        shp = [B, D, H] if layout else [D, B, H]
        ins += ["", g.rand(shp, 0.5)] + ([g.rand(shp, 0.5)] if op == "LSTM" else [])
    nout = 3 if op == "LSTM" else 2
    res = g.node(op, ins, nout=nout, hidden_size=H, layout=layout, **attrs) if layout else \
        g.node(op, ins, nout=nout, hidden_size=H, **attrs)
    heads = []
    for k in outs:
        v = res[k]
        if k == 0:   # Y [T,1,B,H] or [B,T,1,H]: batch first, then flatten
            v = g.node("Transpose", [v], perm=[2, 0, 1, 3]) if not layout else v
        elif not layout:   # Y_h, Y_c [1,B,H]
            v = g.node("Transpose", [v], perm=[1, 0, 2])
        f = g.node("Flatten", [v], axis=1)
        feat = g.shape(f)[1]
        heads.append(g.node("Gemm", [f, g.rand([feat, C], 1.0 / np.sqrt(feat))]))
    while len(heads) > 1:
        heads = [g.node("Add", heads[:2])] + heads[2:]
    g.node("Identity", [heads[0]], out="logits")


@case("LSTM", "layout=0 [T=5,B,I=3] H=4, Y, Y_h and Y_c to heads", opset=14)
def _(g):
    rnn_case(g, "LSTM", 5, 3, 4)


@case("LSTM", "layout=1 [B,T=4,I=6] H=5, initial_h/initial_c weights, Y_h only", opset=14)
def _(g):
    rnn_case(g, "LSTM", 4, 6, 5, layout=1, state=True, outs=(1,))


@case("LSTM", "layout=0 no bias, Y omitted: Y_c only", opset=14)
def _(g):
    rnn_case(g, "LSTM", 3, 4, 3, bias=False, outs=(2,))


@case("LSTM", "bidirectional layout=0, Y, Y_h and Y_c to heads", opset=14)
def _(g):
    rnn_case(g, "LSTM", 4, 3, 3, direction="bidirectional")


@case("LSTM", "reverse layout=1, initial_h/initial_c weights, Y and Y_c", opset=14)
def _(g):
    rnn_case(g, "LSTM", 4, 3, 3, layout=1, state=True, outs=(0, 2), direction="reverse")


@case("GRU", "bidirectional layout=1 linear_before_reset=1, initial_h weight, Y and Y_h", opset=14)
def _(g):
    rnn_case(g, "GRU", 4, 3, 3, layout=1, state=True, outs=(0, 1), linear_before_reset=1, direction="bidirectional")


@case("GRU", "reverse layout=0 linear_before_reset=0, Y and Y_h", opset=14)
def _(g):
    rnn_case(g, "GRU", 4, 3, 3, outs=(0, 1), direction="reverse")


@case("GRU", "layout=0 [T=5,B,I=3] H=4 linear_before_reset=1 (torch's form), Y and Y_h", opset=14)
def _(g):
    rnn_case(g, "GRU", 5, 3, 4, outs=(0, 1), linear_before_reset=1)


@case("GRU", "layout=0 linear_before_reset=0 (ONNX's default), Y and Y_h", opset=14)
def _(g):
    rnn_case(g, "GRU", 5, 3, 4, outs=(0, 1))


@case("GRU", "layout=1 [B,T=4,I=6] H=5 linear_before_reset=0, initial_h weight, Y only", opset=14)
def _(g):
    rnn_case(g, "GRU", 4, 6, 5, layout=1, state=True, outs=(0,))


@case("GRU", "layout=1 linear_before_reset=1, no bias, initial_h weight, Y_h only", opset=14)
def _(g):
    rnn_case(g, "GRU", 4, 6, 5, layout=1, bias=False, state=True, outs=(1,), linear_before_reset=1)


# Dropout: the mask is known (Philox, step 0, seed 1), so the gradient is checked where it drops too
@case("Dropout", "ratio 0 training_mode=1 [B,4,6] (the identity)")
def _(g):
    g.head(g.node("Dropout", [g.stem([4, 6]), g.init(np.float32(0.0), "r"), g.init(np.array(True), "t")]))


@case("Dropout", "ratio 0.4 training_mode=1 [B,4,6], then * W[4,6]")
def _(g):
    d = g.node("Dropout", [g.stem([4, 6]), g.init(np.float32(0.4), "r"), g.init(np.array(True), "t")])
    g.head(g.node("Mul", [d, g.rand([4, 6], 1.0)]))


@case("Dropout", "ratio attribute 0.25, opset 11 [B,4,6]", opset=11)
def _(g):
    g.head(g.node("Dropout", [g.stem([4, 6])], ratio=0.25))
# Unary maths (k_unary): Neg, Exp, Log, Abs, Reciprocal; Log and Reciprocal on positive values
for _op in ("Neg", "Exp", "Abs"):
    case(_op, "[B,4,6]")(lambda g, _op=_op: g.head(g.node(_op, [g.stem([4, 6])])))
for _op in ("Log", "Reciprocal"):
    case(_op, "[B,4,6] positive")(lambda g, _op=_op: g.head(g.node(_op, [g.stem([4, 6], offset=2.0, wscale=0.015)])))


@case("Exp", "as the logits [B,3] (gradient from the stashed output)")
def _(g):
    g.node("Exp", [g.node("Gemm", [g.stem([5]), g.rand([5, 3], 0.5)])], out="logits")


# Clip: bounds as constant scalar inputs (opset 11+) or attributes (opset 6..10)
@case("Clip", "min=-0.5 max=0.4 inputs [B,4,6]")
def _(g):
    lo, hi = g.init(np.float32(-0.5), "lo"), g.init(np.float32(0.4), "hi")
    g.head(g.node("Clip", [g.stem([4, 6]), lo, hi]))


@case("Clip", "max only (min absent) [B,4,6], * W")
def _(g):
    g.head(g.node("Mul", [g.node("Clip", [g.stem([4, 6]), "", g.init(np.float32(0.3), "hi")]), g.rand([4, 6], 1.0)]))


@case("Clip", "min only [B,4,6]")
def _(g):
    g.head(g.node("Clip", [g.stem([4, 6]), g.init(np.float32(-0.2), "lo")]))


@case("Clip", "attributes min=-0.3 max=0.6 opset 9", opset=9)
def _(g):
    g.head(g.node("Clip", [g.stem([4, 6])], min=-0.3, max=0.6))


# HardSigmoid, HardSwish: inputs spread over the saturated and the linear parts
@case("HardSigmoid", "default alpha=0.2 beta=0.5, x * 4")
def _(g):
    g.head(g.node("HardSigmoid", [g.node("Mul", [g.stem([4, 6]), g.init(np.float32(4.0), "s")])]))


@case("HardSigmoid", "alpha=0.5 beta=0.4, * W")
def _(g):
    y = g.node("HardSigmoid", [g.node("Mul", [g.stem([4, 6]), g.init(np.float32(2.0), "s")])], alpha=0.5, beta=0.4)
    g.head(g.node("Mul", [y, g.rand([4, 6], 1.0)]))


@case("HardSwish", "x * 5 [B,4,6] opset 14", opset=14)
def _(g):
    g.head(g.node("HardSwish", [g.node("Mul", [g.stem([4, 6]), g.init(np.float32(5.0), "s")])]))


# Max, Min (broadcasting k_binary; ties split the gradient in halves as torch.maximum)
@case("Max", "a[B,4,6] max b[6]")
def _(g):
    g.head(g.node("Max", [g.stem([4, 6]), g.rand([6], 0.7)]))


@case("Max", "b[4,1] max a[B,4,6]")
def _(g):
    g.head(g.node("Max", [g.rand([4, 1], 0.7), g.stem([4, 6])]))


@case("Max", "a max a * W, W = 1: a tie everywhere, split in halves")
def _(g):
    a = g.stem([4, 6])
    g.head(g.node("Max", [a, g.node("Mul", [a, g.init(np.ones([4, 6], np.float32))])]))


@case("Max", "one input (a copy)")
def _(g):
    g.head(g.node("Mul", [g.node("Max", [g.stem([4, 6])]), g.rand([4, 6], 1.0)]))


@case("Max", "3 inputs: a[B,4,6], W[6], V[4,1] (chained, partials recomputed)")
def _(g):
    g.head(g.node("Max", [g.stem([4, 6]), g.rand([6], 0.7), g.rand([4, 1], 0.7)]))


@case("Min", "4 inputs: W[4,1], a[B,4,6], b[B,4,6], V[6]")
def _(g):
    a, b = g.stem([4, 6]), g.stem([4, 6])
    g.head(g.node("Min", [g.rand([4, 1], 0.7), a, b, g.rand([6], 0.7)]))


@case("Min", "a[B,4,6] min b[6]")
def _(g):
    g.head(g.node("Min", [g.stem([4, 6]), g.rand([6], 0.7)]))


@case("Min", "b[4,1] min a[B,4,6]")
def _(g):
    g.head(g.node("Min", [g.rand([4, 1], 0.7), g.stem([4, 6])]))


@case("Min", "a min a * W, W = 1: a tie everywhere, split in halves")
def _(g):
    a = g.stem([4, 6])
    g.head(g.node("Min", [a, g.node("Mul", [a, g.init(np.ones([4, 6], np.float32))])]))


# Comparisons computed at run time feeding Where (Where's gradient flows; the comparison has none)
@case("Where", "Less(a, W[6]) ? a : V[4,6] (condition computed at run time)")
def _(g):
    a = g.stem([4, 6])
    g.head(g.node("Where", [g.node("Less", [a, g.rand([6], 0.5)]), a, g.rand([4, 6], 0.5)]))


@case("Where", "Not(Greater(a, W[4,1])) ? W2[6] : a (run-time condition, broadcast)")
def _(g):
    a = g.stem([4, 6])
    c = g.node("Not", [g.node("Greater", [a, g.rand([4, 1], 0.5)])])
    g.head(g.node("Where", [c, g.rand([6], 0.5), a]))


@case("Where", "Equal(Relu(a), 0) ? W[4,6] : a (run-time condition)")
def _(g):
    a = g.stem([4, 6])
    c = g.node("Equal", [g.node("Relu", [a]), g.init(np.float32(0.0), "z")])
    g.head(g.node("Where", [c, g.rand([4, 6], 0.5), a]))


# ReduceMax (gradient to the max element, as torch.amax) and ArgMax (run-time indices into Gather)
@case("ReduceMax", "axes=[1] keepdims=1 [B,4,6]")
def _(g):
    g.head(g.node("ReduceMax", [g.stem([4, 6])], axes=[1], keepdims=1))


@case("ReduceMax", "axes=[2,3] keepdims=0 [B,4,3,3]")
def _(g):
    g.head(g.node("ReduceMax", [g.stem([4, 3, 3])], axes=[2, 3], keepdims=0))


@case("ReduceMax", "all axes, keepdims=1, * W, then + a")
def _(g):
    a = g.stem([4, 6])
    m = g.node("ReduceMax", [g.node("Mul", [a, g.rand([4, 6], 1.0)])], keepdims=1)
    g.head(g.node("Add", [a, m]))


@case("ArgMax", "Gather(W[6,5], ArgMax(a[B,6], axis=1, keepdims=0)) + b")
def _(g):
    i = g.node("ArgMax", [g.stem([6], wscale=0.2)], axis=1, keepdims=0)
    g.head(g.node("Add", [g.node("Gather", [g.rand([6, 5], 0.7), i]), g.stem([5])]))


@case("ArgMax", "select_last_index=1 axis=-1 keepdims=1 [B,2,6] into Gather")
def _(g):
    i = g.node("ArgMax", [g.stem([2, 6], wscale=0.2)], axis=-1, keepdims=1, select_last_index=1)
    g.head(g.node("Gather", [g.rand([6, 3], 0.7), i]))


# Reshapes
@case("Reshape/Unsqueeze/Squeeze/Identity/Flatten", "chain with a Mul in between")
def _(g):
    h = g.node("Reshape", [g.stem([24]), g.ints([0, 4, 6])])
    u = g.node("Unsqueeze", [h, g.ints([1])])                     # [B,1,4,6]
    m = g.node("Mul", [u, g.rand([4, 6], 1.0)])
    s = g.node("Squeeze", [m, g.ints([1])])                       # [B,4,6]
    i = g.node("Identity", [s])
    r = g.node("Reshape", [i, g.ints([-1, 6, 4])])                # [B,6,4]
    g.head(g.node("Flatten", [g.node("Tanh", [r])], axis=1))


@case("Flatten", "axis=2 [B,1,4,6] -> [B,24], Unsqueeze axes=[-1], * W[24,1]")
def _(g):
    f = g.node("Flatten", [g.stem([1, 4, 6])], axis=2)
    u = g.node("Unsqueeze", [f, g.ints([-1])])
    g.head(g.node("Mul", [u, g.rand([24, 1], 1.0)]))


# Strided views (k_view / k_view_grad) and Cast
INT64_MIN = -(2 ** 63)


@case("Slice", "axes=[1,2] starts=[1,-1] ends=[4,INT64_MIN] steps=[2,-2] [B,5,6]")
def _(g):
    g.head(g.node("Slice", [g.stem([5, 6]), g.ints([1, -1]), g.ints([4, INT64_MIN]), g.ints([1, 2]), g.ints([2, -2])]))


@case("Slice", "x[:, 1::2] + x[:, ::-3] of one activation (acc), out-of-range ends clamp")
def _(g):
    h = g.stem([7, 4])
    a = g.node("Slice", [h, g.ints([1]), g.ints([100]), g.ints([1]), g.ints([2])])            # rows 1,3,5
    b = g.node("Slice", [h, g.ints([-1]), g.ints([-100]), g.ints([-2]), g.ints([-3])])        # rows 6,3,0
    g.head(g.node("Add", [a, b]))


@case("Slice", "of a weight W[6,8][2:5, ::3] * h, default axes and steps", )
def _(g):
    w = g.node("Slice", [g.rand([6, 8], 1.0), g.ints([2, 0]), g.ints([5, 8]), g.ints([0, 1]), g.ints([1, 3])])  # [3,3]
    g.head(g.node("Mul", [g.stem([3, 3]), w]))


@case("Slice", "opset 9 attributes starts=[0,2] ends=[-1,1000] axes=[2,1] [B,4,6]", opset=9)
def _(g):
    g.head(g.node("Slice", [g.stem([4, 6])], starts=[0, 2], ends=[-1, 1000], axes=[2, 1]))


@case("Expand", "[B,1,6] to [1,3,1] (rank kept, 1 keeps the axis)")
def _(g):
    g.head(g.node("Expand", [g.stem([1, 6]), g.ints([1, 3, 1])]))


@case("Expand", "[B,6] to [2,B,6] (a new leading axis), then Transpose")
def _(g):
    e = g.node("Expand", [g.stem([6]), g.ints([2, B, 6])])
    g.head(g.node("Transpose", [e], perm=[1, 0, 2]))


@case("Expand", "of a weight W[1,6] to [4,6], * h[B,4,6]")
def _(g):
    g.head(g.node("Mul", [g.stem([4, 6]), g.node("Expand", [g.rand([1, 6], 1.0), g.ints([4, 6])])]))


@case("Tile", "[B,2,3] by [1,2,3]")
def _(g):
    g.head(g.node("Tile", [g.stem([2, 3]), g.ints([1, 2, 3])]))


@case("Tile", "of a weight W[2,3] by [2,2], * h[B,4,6]")
def _(g):
    g.head(g.node("Mul", [g.stem([4, 6]), g.node("Tile", [g.rand([2, 3], 1.0), g.ints([2, 2])])]))


@case("Cast", "float -> float passes the gradient, float -> int64 -> float does not: h * float(long(3 h))")
def _(g):
    h = g.node("Cast", [g.stem([4, 6])], to=TensorProto.FLOAT)
    k = g.node("Cast", [g.node("Mul", [h, g.init(np.float32(3.0), "s")])], to=TensorProto.INT64)
    g.head(g.node("Mul", [h, g.node("Cast", [k], to=TensorProto.FLOAT)]))


# --------------------------------------------------------------------------
# Running pipecc
# --------------------------------------------------------------------------

class StepFailed(Exception):
    pass


def tail(text, lines=25):
    ls = (text or "").rstrip("\n").splitlines()
    if len(ls) > lines:
        ls = [f"... ({len(ls) - lines} lines cut)"] + ls[-lines:]
    return "\n".join(ls)


def run_cmd(what, cmd, timeout, env=None):
    """Runs cmd in its own process group; a timeout kills the group."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = err = ""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                out, err = p.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        raise StepFailed(f"{what} timed out after {timeout} s", tail(err) or tail(out))
    return p.returncode, out, err


def write_idx(path, arr, magic):
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(np.array([magic, *arr.shape], dtype=">i4").tobytes())
        f.write(arr.tobytes())


class Runtime:
    """Compiles, builds and runs one step; reuses the first build's libpiperun objects."""

    def __init__(self, work, datadir):
        self.work, self.datadir, self.rt_obj = work, datadir, None

    def train(self, model_path, casedir):
        out = os.path.join(casedir, "out.pipe")
        rc, so, se = run_cmd("pipecc", [PIPECC, model_path, "-n", "1", "--batch", str(B), "--microbatches", "1",
                                        "--optimizer", "sgd", "--lr", repr(LR), "--devices", DEVICES, "-o", out],
                             TIMEOUT["pipecc"])
        if rc != 0:
            msg = (se.strip().splitlines() or [""])[0]
            if rc == 2 and msg.startswith("pipecc: error:"):
                return None, msg
            raise StepFailed(f"pipecc exited {rc}", tail(se) or tail(so))
        cmd = ["make", "-s", "-C", out]
        if self.rt_obj:
            cmd.append("RT_OBJ=" + " ".join(self.rt_obj))
        rc, so, se = run_cmd("make", cmd, TIMEOUT["make"])
        if rc != 0:
            raise StepFailed(f"make exited {rc}", tail(se) or tail(so))
        if not self.rt_obj:
            objs = sorted(glob.glob(os.path.join(out, "build", "*.o")))
            if objs:
                keep = os.path.join(self.work, "rt_obj")
                os.makedirs(keep, exist_ok=True)
                for o in objs:
                    shutil.copy2(o, keep)
                self.rt_obj = [os.path.join(keep, os.path.basename(o)) for o in objs]
        saved, log = os.path.join(casedir, "trained.onnx"), os.path.join(casedir, "log.csv")
        rc, so, se = run_cmd("run.sh", [os.path.join(out, "run.sh"), "--data", self.datadir, "--steps", "1",
                                        "--no-shuffle", "--quiet", "--save", saved, "--lr", repr(LR), "--log", log],
                             TIMEOUT["run"])
        if rc != 0:
            raise StepFailed(f"run.sh exited {rc}", tail(se) or tail(so))
        with open(log) as f:
            rows = [l.strip().split(",") for l in f if l.strip()]
        if len(rows) != 2 or rows[0][:2] != ["step", "loss"] or rows[1][0] != "1":
            raise StepFailed(f"{log}: unexpected content {rows}", "")
        trained = {t.name: numpy_helper.to_array(t) for t in onnx.load(saved).graph.initializer}
        return (float(rows[1][1]), trained), None


# --------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------

def references(model, inits, x, labels, params, rng):
    """float64 loss, autograd gradients, finite differences at sampled elements,
    and the interpreter's other outputs (env)."""
    base = {k: to_torch(v) for k, v in inits.items()}
    leaf = {k: base[k].clone().requires_grad_(True) for k in params}

    def loss_of(vals):
        env = run_graph(model, dict(vals, x=x))
        return F.cross_entropy(env["logits"], labels), env

    loss, env = loss_of(dict(base, **leaf))
    grads = torch.autograd.grad(loss, [leaf[k] for k in params], allow_unused=True)
    ag = {k: (np.zeros(inits[k].shape) if gr is None else gr.detach().numpy()) for k, gr in zip(params, grads)}
    fd = {}
    with torch.no_grad():
        for k in params:
            flat = np.abs(ag[k]).reshape(-1)
            picks = [int(np.argmax(flat))] + [int(i) for i in rng.choice(flat.size, min(FD_RANDOM, flat.size),
                                                                           replace=False)]
            vals = {}
            for i in dict.fromkeys(picks):
                idx = np.unravel_index(i, inits[k].shape)
                t = base[k].clone()
                t[idx] += FD_EPS
                lp = loss_of(dict(base, **{k: t}))[0].item()
                t[idx] -= 2 * FD_EPS
                lm = loss_of(dict(base, **{k: t}))[0].item()
                vals[idx] = (lp - lm) / (2 * FD_EPS)
            fd[k] = vals
    return loss.item(), ag, fd, env


def rel_errors(got, ref, scale, rnd):
    denom = np.maximum(np.maximum(np.abs(ref), 1e-2 * scale), 1e3 * rnd)
    return np.abs(got - ref) / np.maximum(denom, 1e-300)


def check_case(op, cname, opset, build, rt, work, imgs, labels, keep, index):
    tag = f"{op} {cname}"
    g = Net(seed=zlib_seed(tag), opset=opset)
    build(g)
    model = g.model()
    # Debian's onnx may predate the opset (Gelu is opset 20; python3-onnx 1.12 knows 17):
    # its checker has no schema for such ops, so the model is built by hand and not checked.
    if opset <= onnx.defs.onnx_opset_version():
        onnx.checker.check_model(model)
    inits = g.inits
    params = trainable(model, inits)
    casedir = os.path.join(work, f"case{index:03d}")
    os.makedirs(casedir)
    mpath = os.path.join(casedir, "model.onnx")
    onnx.save(model, mpath)

    x = torch.from_numpy((imgs.astype(np.float32) / np.float32(255.0)).astype(np.float64)).reshape(B, 1, 28, 28)
    y = torch.from_numpy(labels.astype(np.int64))
    loss64, ag, fd, env = references(model, inits, x, y, params, np.random.default_rng(zlib_seed(tag) + 1))

    try:
        got, skip = rt.train(mpath, casedir)
    except StepFailed as e:
        result("not ok", tag, e.args[0])
        if len(e.args) > 1 and e.args[1]:
            note(e.args[1])
        return
    pinned = EXPECTED_REFUSALS.get(tag)
    if skip:
        if pinned is None:
            result("not ok", tag, f"refused at compile time: {skip} (pin it in EXPECTED_REFUSALS with its reason "
                                  "if the refusal is intended)")
        elif pinned not in skip:
            result("not ok", tag, f"refused for another reason than the pinned one ({pinned!r}): {skip}")
        else:
            result("refused", tag, skip)
        return
    if pinned is not None:
        result("not ok", tag, f"expected refusal no longer refused: unpin it (pinned reason: {pinned!r})")
        return
    loss32, trained = got
    opset = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    fused_want = FUSED.get(cname)
    if fused_want is not None:
        with open(os.path.join(casedir, "out.pipe", "plan.json")) as f:
            fused_got = json.load(f)["fused_nodes"]
        if fused_got != fused_want:
            result("not ok", tag, f"plan.json fused_nodes {fused_got}, expected {fused_want} (compiler/fuse.c)")
            return

    problems, worst_ag, worst_fd, worst_ref = [], 0.0, 0.0, 0.0
    if set(trained) != set(inits):
        problems.append(f"trained model's initializers {sorted(trained)} != {sorted(inits)}")
    loss_err = abs(loss32 - loss64) / max(abs(loss64), 1e-12)
    if not loss_err <= LOSS_RTOL:
        problems.append(f"step-1 loss: pipecc {loss32!r}, float64 reference {loss64!r} (rel err {loss_err:.2e})")
    for k in params:
        if k not in trained:
            continue
        init = inits[k].astype(np.float64)
        new = trained[k].astype(np.float64)
        gp = (init - new) / LR
        rnd = np.maximum(np.abs(init), np.abs(new)) * 2.0 ** -23 / LR
        ref = ag[k]
        scale = float(np.abs(ref).max())
        e = rel_errors(gp, ref, scale, rnd)
        worst_ag = max(worst_ag, float(e.max()))
        if not e.max() <= TOL:
            i = np.unravel_index(int(np.argmax(e)), e.shape)
            bad = int((e > TOL).sum())
            problems.append(f"{k} {list(init.shape)}: {bad}/{e.size} elements off autograd; worst at {list(i)}: "
                            f"pipecc {gp[i]:.7g}, autograd {ref[i]:.7g} (rel err {e[i]:.2e}; scale {scale:.3g})")
        for idx, v in fd[k].items():
            ef = rel_errors(gp[idx], v, scale, rnd[idx])
            er = abs(ref[idx] - v) / max(abs(v), 1e-2 * scale, 1e-300)
            worst_fd, worst_ref = max(worst_fd, float(ef)), max(worst_ref, float(er))
            if not ef <= TOL:
                problems.append(f"{k}{list(idx)}: pipecc {gp[idx]:.7g}, finite differences {v:.7g} (rel err {ef:.2e})")
            if not er <= REF_TOL:
                problems.append(f"reference check {k}{list(idx)}: autograd {ref[idx]:.9g} vs finite differences "
                                f"{v:.9g} (rel err {er:.2e})")
    # What pipecc must not train: unchanged; BN running statistics: PyTorch's update.
    stats = {}
    for n in model.graph.node:
        if n.op_type == "BatchNormalization" and node_attrs(n).get("training_mode", 0):
            with torch.no_grad():
                outs = run_node(n.op_type, [env[i] for i in n.input], node_attrs(n), opset)
            stats[n.input[3]], stats[n.input[4]] = outs[1], outs[2]
    for k, v in inits.items():
        if k in params or k not in trained:
            continue
        if k in stats:
            want = stats[k].detach().numpy()
            err = float(np.abs(trained[k] - want).max() / max(np.abs(want).max(), 1e-12))
            if not err <= 1e-5:
                problems.append(f"running statistic {k}: pipecc {trained[k].tolist()}, expected "
                                f"{np.round(want, 6).tolist()} (rel err {err:.2e})")
        elif k not in bn_stat_names(model) and not np.array_equal(trained[k], v):
            problems.append(f"{k} (not trainable) changed: {v.reshape(-1)[:6]} -> {trained[k].reshape(-1)[:6]}")
    detail = (f"max rel err vs autograd {worst_ag:.1e}, vs finite differences {worst_fd:.1e} "
              f"(autograd vs finite differences {worst_ref:.1e}, loss {loss_err:.1e})")
    result("not ok" if problems else "ok", tag, detail)
    for p in problems:
        note(p)
    if not keep and not problems:
        shutil.rmtree(casedir, ignore_errors=True)
        os.makedirs(casedir)   # keep the numbering


def zlib_seed(s):
    return zlib.crc32(s.encode())


def check_coverage():
    """Every op pipecc's table calls trainable has a case (or is pinned in CHECKED_ELSEWHERE)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    os.environ["PIPECC"] = PIPECC
    import optable
    have = {op for c in CASES for op in c[0].split("/")}
    missing = [op for op in optable.trainable_ops() if op not in have and op not in CHECKED_ELSEWHERE]
    if missing:
        result("not ok", "coverage", f"trainable per pipecc --list-ops but no case here: {', '.join(missing)}")
    else:
        result("ok", "coverage: every trainable op of pipecc --list-ops has a case or is checked elsewhere")
    for op in CHECKED_ELSEWHERE:
        if op in have:
            result("not ok", "coverage", f"{op} has a case here: remove it from CHECKED_ELSEWHERE")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", default=[], help="only cases whose 'op name' contains this")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (its path is printed)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args()
    cases = [c for c in CASES if not args.case or any(s.lower() in f"{c[0]} {c[1]}".lower() for s in args.case)]
    if args.list:
        for op, name, opset, _ in cases:
            print(f"{op} {name}" + (f" (opset {opset})" if opset != 17 else ""))
        return 0
    for path in (PIPECC, DEVICES):
        if not os.path.exists(path):
            tally.fail("setup", f"{path} is missing (make first)")
            return tally.finish()
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="pipecc_gradcheck_")
    runs = os.path.join(work, "cases")
    os.makedirs(runs)
    rng = np.random.default_rng(2024)
    imgs = rng.integers(0, 256, size=(B, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, C, size=B).astype(np.uint8)
    datadir = os.path.join(work, "data")
    os.makedirs(datadir)
    write_idx(os.path.join(datadir, "train-images-idx3-ubyte"), imgs, 2051)
    write_idx(os.path.join(datadir, "train-labels-idx1-ubyte"), labels, 2049)
    rt = Runtime(work, datadir)
    def one(i):
        op, name, opset, build = cases[i]
        try:
            check_case(op, name, opset, build, rt, runs, imgs, labels, args.keep, i)
        except Exception as e:   # a bug in this script or the model: fail the case, go on
            result("not ok", f"{op} {name}", f"{type(e).__name__}: {e}")

    try:
        # The first case alone (its build leaves the runtime objects the others link), then two at a
        # time: each is mostly pipecc, clang and a run in subprocesses, which overlap on 2 cores.
        if cases:
            one(0)
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(one, range(1, len(cases))))
    finally:
        if args.keep or tally.failed:
            print(f"# work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if not args.case:
        check_coverage()
    stale = [k for k in EXPECTED_REFUSALS if k not in {f"{c[0]} {c[1]}" for c in CASES}]
    for k in stale:
        result("not ok", k, "pinned in EXPECTED_REFUSALS but no such case: unpin it")
    print(f"# {len(cases)} cases in {time.time() - t0:.0f} s")
    print(f"# pinned refusals: {tally.refused_pinned} of {len(EXPECTED_REFUSALS)} pinned cases refused as expected (not counted as passed)")
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
