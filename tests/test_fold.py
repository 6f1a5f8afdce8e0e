"""Constant folding removes what PyTorch exports for shape arithmetic and masks.

A small attention model written the way people write it - x.size() in
views, torch.arange positions, a causal mask built with torch.tril in
forward, masked_fill - is exported from Debian's torch (dynamic batch).
pipecc must fold every Shape/Gather/Unsqueeze/Concat/Range/Trilu/Equal/
Where/Cast/Slice/... node that depends only on shapes, keep the real compute,
and infer the shapes onnx infers.  A model whose batch is baked into a
constant must work at its own batch and fail at another with the node named.
Run with /usr/bin/python3."""
import json
import os
import subprocess
import sys
import tempfile
import warnings

import onnx
import torch
import torch.nn as nn

warnings.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


check = tally.check


class Attn(nn.Module):
    def __init__(self, vocab=32, d=16, heads=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(64, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, vocab)
        self.heads = heads

    def forward(self, idx):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.emb(idx) + self.pos(pos)
        q, k, v = self.qkv(x).split(x.size(-1), dim=2)
        hd = x.size(-1) // self.heads
        q = q.view(B, T, self.heads, hd).transpose(1, 2)
        k = k.view(B, T, self.heads, hd).transpose(1, 2)
        v = v.view(B, T, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / hd ** 0.5)
        mask = torch.tril(torch.ones(T, T, device=idx.device)).view(1, 1, T, T)
        att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, x.size(-1))
        return self.proj(y)


class Pinned(nn.Module):
    """Reshape to a constant that includes the batch (as a careless export does)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 4)

    def forward(self, x):
        return self.fc(x.reshape(2, 12))


def check_tile_fold(tmp):
    """Tile folds its constants: Tile([2, 4], [2]) = [2, 4, 2, 4] (torch.Tensor.repeat) becomes
    the Reshape target, so x [B, 64] must come out [B, 2, 4, 2, 4] (a wrong tiling order would
    give [B, 2, 2, 4, 4])."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np
    want = torch.tensor([2, 4]).repeat(2).tolist()
    ints = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)
    g = helper.make_graph(
        [helper.make_node("Tile", ["c", "reps"], ["tiled"], name="tile_c"),
         helper.make_node("Concat", ["m1", "tiled"], ["shape"], name="cat", axis=0),
         helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        "tile_fold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [ints("c", [2, 4]), ints("reps", [2]), ints("m1", [-1])])
    path = os.path.join(tmp, "tile_fold.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    r = pipecc(path, "--batch", "3", "--microbatches", "1", "--dump-shapes")
    rows = {l.split("\t")[0]: l.split("\t") for l in r.stdout.splitlines()}
    ok = r.returncode == 0 and rows.get("tiled", [""] * 4)[3] == "const" and rows.get("y", [""] * 4)[2] == ",".join(
        map(str, [3] + want))
    check(ok, f"Tile folds [2, 4] by [2] to {want}: y is [3,{','.join(map(str, want))}] ({r.stderr.strip()}"
              f"{rows.get('tiled')}, {rows.get('y')})")


def check_half_fold(tmp):
    """float16 folds to its values (issue 34, item 2; it folded to zeros): Cast(float16 initializer -> float32) read by a
    MatMul, and a float32 constant cast to float16 and back (each float rounded to the nearest half, ties to even,
    overflow to infinity) read by an Add.  The folded constants are in the stage's weights file, at the offsets the
    stage program names; numpy's astype is the reference (ONNX's Cast is defined as it)."""
    import re
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    bits = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3555, 0x7C00, 0xFC00, 0x7E00], np.uint16)
    w16 = np.concatenate([bits.view(np.float16), (rng.standard_normal(68) * 4).astype(np.float16)]).reshape(8, 10)
    c32 = np.array([1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 65519, 65520, -1e6, 2.0 ** -25, 3e-8, -2.5e-5, 0.1, 1 / 3], np.float32)
    g = helper.make_graph(
        [helper.make_node("Cast", ["w16"], ["w_fold"], name="w_to_f32", to=TensorProto.FLOAT),
         helper.make_node("MatMul", ["x", "w_fold"], ["h"], name="mm"),
         helper.make_node("Constant", [], ["c32"], name="c", value=numpy_helper.from_array(c32, "c32")),
         helper.make_node("Cast", ["c32"], ["c16"], name="c_to_f16", to=TensorProto.FLOAT16),
         helper.make_node("Cast", ["c16"], ["b_fold"], name="c_to_f32", to=TensorProto.FLOAT),
         helper.make_node("Add", ["h", "b_fold"], ["y"], name="add")],
        "half_fold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], [numpy_helper.from_array(w16, "w16")])
    path, out = os.path.join(tmp, "half_fold.onnx"), os.path.join(tmp, "half_fold.pipe")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    r = pipecc(path, "--batch", "4", "--microbatches", "1", "-o", out)
    if not check(r.returncode == 0, f"a model folding float16 compiles ({r.stderr.strip()})"):
        return
    src = open(os.path.join(out, "stage_0.c")).read()
    weights = np.fromfile(os.path.join(out, "weights", "stage_0.bin"), np.float32)

    def folded(name, n):
        m = re.search(r"#define OFF_C_%s (\d+)LL" % name, src)
        return weights[int(m.group(1)) // 4:int(m.group(1)) // 4 + n] if m else np.zeros(0, np.float32)

    def same(a, b):  # the same bits, any NaN equal to any NaN
        return a.shape == b.shape and bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))

    want = w16.astype(np.float32).ravel()
    got = folded("w_fold", want.size)
    check(same(got, want), "Cast(float16 initializer -> float32) folds to numpy's values: zeros of both signs, subnormals, "
                           f"65504, infinities, NaN ({got[:12]} against {want[:12]})")
    want = c32.astype(np.float16).astype(np.float32)
    got = folded("b_fold", want.size)
    check(same(got, want), f"float32 -> float16 -> float32 folds with numpy's rounding: ties to even, 65520 to inf, "
                           f"subnormals ({got} against {want})")
    inits = {i["name"]: i for i in json.load(open(os.path.join(out, "plan.json"))).get("initializers", [])}
    w = inits.get("w16", {})
    check(w.get("trained") is False and "float16" in (w.get("why") or ""), f"plan.json lists w16 as a float16 constant ({w})")


def pipecc(*args):
    return subprocess.run([PIPECC, *args], capture_output=True, text=True)


def main():
    tmp = tempfile.mkdtemp(prefix="pipecc-fold.")
    os.environ["PIPECC_CACHE"] = os.path.join(tmp, "machine.txt")
    torch.manual_seed(0)
    path = os.path.join(tmp, "attn.onnx")
    torch.onnx.export(Attn(), torch.zeros(2, 8, dtype=torch.long), path, input_names=["tokens"], output_names=["logits"],
                      dynamic_axes={"tokens": {0: "batch"}, "logits": {0: "batch"}}, opset_version=14)
    model = onnx.load(path)
    ops = [n.op_type for n in model.graph.node]
    shape_ops = {"Shape", "Gather", "Unsqueeze", "Concat", "Range", "Trilu", "Equal", "Where", "Cast", "Slice",
                 "ConstantOfShape", "Constant", "Div", "Mul", "Squeeze", "Identity", "Reshape", "Expand", "Sqrt"}
    print("exported ops:", sorted(set(ops)))
    r = pipecc(path, "--batch", "4", "--microbatches", "1", "--dump-shapes")
    if not check(r.returncode == 0, f"pipecc reads the exported attention model ({r.stderr.strip()})"):
        return tally.finish()
    kinds = {}
    for line in r.stdout.splitlines():
        name, dtype, dims, kind = line.split("\t")
        kinds[name] = (dtype, dims, kind)
    # Which nodes survive: their outputs are computed at run time.
    live = [n for n in model.graph.node if any(kinds.get(o, ("", "", "const"))[2] == "run" for o in n.output)]
    live_ops = sorted({n.op_type for n in live})
    print("run-time ops after folding:", live_ops)
    for op in ("Shape", "Range", "Trilu", "Equal", "ConstantOfShape", "Constant", "Unsqueeze", "Concat", "Cast"):
        if op in ops:
            check(op not in live_ops, f"every {op} node is folded away ({ops.count(op)} in the export)")
    mask_where = [n for n in model.graph.node if n.op_type == "Where"]
    if tally.nonempty(mask_where, "the export has a Where for the causal mask"):
        check(all(kinds[n.input[0]][2] == "const" for n in mask_where), "the causal mask reaching Where is a compile-time constant")
    gathers = [n for n in live if n.op_type == "Gather"]
    # The token lookup reads run-time ids; the position lookup reads the folded arange, but
    # stays a run-time node because its table is a trained weight (folding it would freeze it).
    idx_kinds = sorted(kinds[n.input[1]][2] for n in gathers)
    check(idx_kinds == ["const", "run"], f"two embedding Gathers run, positions from a folded arange ({idx_kinds})")
    live_reshapes = [n for n in live if n.op_type == "Reshape"]
    if tally.nonempty(live_reshapes, "Reshape nodes are left at run time"):
        check(all(kinds[n.input[1]][2] == "const" for n in live_reshapes), "every Reshape's target shape is folded")
    check(set(live_ops) <= {"Gather", "Add", "MatMul", "Split", "Reshape", "Transpose", "Mul", "Where", "Softmax", "Div"},
          f"nothing but compute and data movement is left: {live_ops}")
    # Shapes agree with onnx's own inference (with data propagation, which resolves x.size()).
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    bad = 0
    count = 0
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.name not in kinds or not vi.type.tensor_type.HasField("shape"):
            continue  # onnx could not infer it (Reshape to a computed shape without data propagation)
        dims = [d.dim_value if d.HasField("dim_value") else (4 if d.dim_param == "batch" else None)
                for d in vi.type.tensor_type.shape.dim]
        got = [int(x) for x in kinds[vi.name][1].split(",")] if kinds[vi.name][1] else []
        count += 1
        if len(dims) != len(got) or any(a is not None and a != b for a, b in zip(dims, got)):
            bad += 1
            print(f"    {vi.name}: onnx {dims} pipecc {got}")
    check(bad == 0 and count > 20, f"{count} tensor shapes agree with onnx.shape_inference at batch 4")
    for b in (1, 3, 16):
        r = pipecc(path, "--batch", str(b), "--microbatches", "1", "--dump-shapes")
        ok = r.returncode == 0 and any(l.startswith("logits\tfloat32\t%d,8,32\t" % b) for l in r.stdout.splitlines())
        check(ok, f"re-inferred at batch {b}: logits [{b},8,32]")

    # A batch baked into a constant: fine at its own size, a clear error at another.
    pinned = os.path.join(tmp, "pinned.onnx")
    torch.onnx.export(Pinned(), torch.zeros(2, 3, 4), pinned, input_names=["x"], output_names=["y"], opset_version=13)
    r = pipecc(pinned, "--batch", "2", "--microbatches", "1", "--dump-shapes")
    check(r.returncode == 0, "a model with its batch baked in works at that batch")
    r = pipecc(pinned, "--batch", "4", "--microbatches", "1", "--dump-shapes")
    reshape = [n.name for n in onnx.load(pinned).graph.node if n.op_type == "Reshape"][0]
    check(r.returncode == 2 and reshape in r.stderr and "pins the batch" in r.stderr,
          f"at another batch the error names the node that pins it ({r.stderr.strip()})")
    check_tile_fold(tmp)
    check_half_fold(tmp)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
