#!/usr/bin/python3
"""Compares pipecc's shape inference with ONNX's own on every tensor of the sample models.

For each model and batch configuration, `pipecc MODEL --batch B --microbatches M --dump-shapes`
is compared with onnx.shape_inference.infer_shapes(strict_mode=True, data_prop=True):

* symbolic pass: the model as shipped (batch axis = dim_param 'batch').  Every tensor onnx types
  (graph inputs, value_info, outputs, initializers) must be printed by pipecc with the same element
  type and rank; int dims must be equal, the 'batch' dim must equal the micro-batch size, and any
  other symbolic/unknown dim ('unk__N') is counted as unchecked.
* unk consistency: tensors that share an 'unk__N' symbol must get the same size from pipecc, and
  that size must be the same integer multiple of the micro-batch size in every configuration.
* concrete pass: the graph input's batch axis is fixed to the micro-batch size and onnx infers
  again; with a static input onnx resolves the -1 of the GPT reshapes, so the dims left unchecked
  by the symbolic pass are checked here exactly.

Run with /usr/bin/python3 (needs onnx); PIPECC selects the binary (default bin/pipecc).
Ends with a line `N passed, M failed, K skipped, R refused` (tests/tally.py; one check per model x configuration); exit 1 on failure."""
import copy
import os
import subprocess
import sys
import tempfile

import onnx
from onnx import TensorProto, shape_inference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
MODELS = ["mlp", "lenet", "resnet", "gpt", "gpt_opset17"]
# (batch, microbatches): micro-batch size is batch // microbatches.
CONFIGS = [(3, 1), (8, 1), (8, 4)]

DTYPE = {
    TensorProto.FLOAT: "float32", TensorProto.DOUBLE: "float64", TensorProto.FLOAT16: "float16",
    TensorProto.INT64: "int64", TensorProto.INT32: "int32", TensorProto.INT16: "int16",
    TensorProto.INT8: "int8", TensorProto.UINT8: "uint8", TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64", TensorProto.BOOL: "bool",
}
if hasattr(TensorProto, "BFLOAT16"):
    DTYPE[TensorProto.BFLOAT16] = "bfloat16"


def infer(model):
    try:
        return shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except TypeError:  # an onnx without data_prop
        return shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


def batch_param(model):
    """The dim_param on axis 0 of the graph's data inputs ('batch')."""
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_param"):
            return dims[0].dim_param
    return None


def fix_batch(model, size):
    """A copy whose data inputs have a static batch axis, without old value_info."""
    m = copy.deepcopy(model)
    inits = {t.name for t in m.graph.initializer}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_value = size
    del m.graph.value_info[:]
    for vi in m.graph.output:  # let onnx infer the outputs' shapes afresh
        vi.type.tensor_type.ClearField("shape")
    return m


def onnx_types(inferred):
    """name -> (dtype name, [int | str | None per dim]) for every tensor onnx knows."""
    out = {}
    g = inferred.graph
    for t in g.initializer:
        out[t.name] = (DTYPE.get(t.data_type, "type%d" % t.data_type), list(t.dims))
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("elem_type") or not tt.HasField("shape"):
            continue
        dims = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        out.setdefault(vi.name, (DTYPE.get(tt.elem_type, "type%d" % tt.elem_type), dims))
    return out


def run_pipecc(path, batch, micro):
    cmd = [PIPECC, path, "--batch", str(batch), "--microbatches", str(micro), "--dump-shapes"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, "%s exited %d: %s" % (" ".join(cmd), p.returncode, p.stderr.strip())
    shapes = {}
    for ln, line in enumerate(p.stdout.splitlines(), 1):
        f = line.split("\t")
        if len(f) != 4 or f[3] not in ("const", "run"):
            return None, "bad --dump-shapes line %d: %r" % (ln, line)
        try:
            dims = [int(x) for x in f[2].split(",")] if f[2] else []
        except ValueError:
            return None, "bad dims on --dump-shapes line %d: %r" % (ln, line)
        if f[0] in shapes:
            return None, "tensor %r printed twice" % f[0]
        shapes[f[0]] = (f[1], dims)
    return shapes, None


def compare(ref, got, batch_sym, mb, fails, unk):
    """Checks every tensor of ref against got. Returns (tensors, dims checked, dims unchecked)."""
    tensors = checked = unchecked = 0
    for name, (dt, dims) in sorted(ref.items()):
        tensors += 1
        if name not in got:
            fails.append("%s: onnx gives %s%s, pipecc does not print it" % (name, dt, dims))
            continue
        gdt, gdims = got[name]
        if gdt != dt:
            fails.append("%s: element type: onnx %s, pipecc %s" % (name, dt, gdt))
        if len(gdims) != len(dims):
            fails.append("%s: rank: onnx %s (rank %d), pipecc %s (rank %d)" % (name, dims, len(dims), gdims, len(gdims)))
            continue
        for i, (d, g) in enumerate(zip(dims, gdims)):
            if isinstance(d, int):
                checked += 1
                if d != g:
                    fails.append("%s: axis %d: onnx %d, pipecc %d (onnx %s, pipecc %s)" % (name, i, d, g, dims, gdims))
            elif d is not None and d == batch_sym:
                checked += 1
                if g != mb:
                    fails.append("%s: axis %d is '%s' = micro-batch %d, pipecc %d (pipecc %s)" % (name, i, d, mb, g, gdims))
            else:
                unchecked += 1
                if d is not None and unk is not None:
                    unk.setdefault(d, []).append((name, i, g))
    return tensors, checked, unchecked


def main():
    # pipecc caches its machine probe; keep that inside a temp dir.
    cache = tempfile.TemporaryDirectory(prefix="pipecc-shapes.")
    os.environ["PIPECC_CACHE"] = os.path.join(cache.name, "machine.txt")
    for model_name in MODELS:
        path = os.path.join(ROOT, "onnx_models", model_name + ".onnx")
        model = onnx.load(path)
        bsym = batch_param(model)
        sym_ref = onnx_types(infer(model))
        ratios = {}  # unk symbol -> {pipecc size / micro-batch size}
        for batch, micro in CONFIGS:
            mb = batch // micro
            label = "%s --batch %d --microbatches %d" % (model_name, batch, micro)
            fails = []
            got, err = run_pipecc(path, batch, micro)
            tensors = checked = unchecked = resolved = 0
            extra = 0
            if err:
                fails.append(err)
            else:
                unk = {}
                tensors, checked, unchecked = compare(sym_ref, got, bsym, mb, fails, unk)
                # Tensors sharing an unk symbol: one size, a fixed multiple of the micro-batch.
                for sym, uses in sorted(unk.items()):
                    sizes = {g for _, _, g in uses}
                    if len(sizes) != 1:
                        fails.append("'%s' is one size for onnx but pipecc gives %s" % (
                            sym, ", ".join("%s[%d]=%d" % u for u in uses)))
                        continue
                    size = sizes.pop()
                    if size <= 0 or size % mb:
                        fails.append("'%s' = %d in pipecc is not a multiple of the micro-batch %d (%s)" % (
                            sym, size, mb, uses[0][0]))
                        continue
                    ratios.setdefault(sym, set()).add(size // mb)
                # The same model with a static batch: onnx resolves what was unknown.
                con_ref = onnx_types(infer(fix_batch(model, mb)))
                cfails = []
                _, c_checked, c_unchecked = compare(con_ref, got, None, mb, cfails, None)
                fails += ["(static batch %d) %s" % (mb, f) for f in cfails]
                resolved = unchecked - c_unchecked
                extra = len(set(got) - set(sym_ref))
            print("%s: %d tensors compared, %d dims checked, %d dims unchecked (%d of them checked with a static "
                  "batch), %d tensors only pipecc prints, %d failures" % (
                      label, tensors, checked, unchecked, resolved, extra, len(fails)))
            for f in fails:
                print("    FAIL " + f)
            tally.count(not fails)
        bad = {s: r for s, r in ratios.items() if len(r) > 1}
        label = "%s unk dims scale with the batch" % model_name
        tally.count(not bad)
        if bad:
            print("%s: FAIL: %s" % (label, "; ".join("'%s' is %s x micro-batch" % (s, sorted(r)) for s, r in sorted(bad.items()))))
        else:
            print("%s: ok (%d symbols)" % (label, len(ratios)))
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
