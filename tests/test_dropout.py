#!/usr/bin/python3
"""Dropout at run time: pipecc's masks, their statistics, and training against PyTorch.

pipecc draws Dropout masks from Philox4x32-10 keyed by the run's --seed, the
step, the node and the element's index in the step (runtime/kernels.h), not
from PyTorch's generator, so a PyTorch reference is fed pipecc's own masks,
read from a small harness that calls the kernel (k_dropout) itself.

  1. the harness's masks = this file's numpy Philox (which test_gradcheck.py
     uses for its Dropout cases); masks differ across steps and nodes;
  2. a --forward-only program of four Dropouts (ratio 0.1, 0.3, 0.5, 0.9,
     training_mode true) on 10^6 values: kept fraction within 5 sigma of
     1 - ratio, kept values exactly x * (1 / (1 - ratio)) in float (PyTorch's
     CPU noise), dropped ones 0, the mask output = the harness's mask;
  3. nn.Dropout(0.0) exported in training mode (opset 17) trains as PyTorch with its
     own dropout (losses and weights within 1e-5), n = 1 and 2;
  4. an MLP with two nn.Dropout(0.3) (opset 13, training mode): every step's
     loss and the trained weights within 1e-5 of a PyTorch model that applies
     the harness's masks as PyTorch's dropout does (x * mask / (1 - p)),
     n = 1, 2, 4 and gpipe / 1f1b / zb1, bit-identical across them (at least
     two successful runs compared); with 8 micro-batches instead of 4, the same
     masks (PyTorch's reference is the same);
  5. the same MLP exported at opset 11 (ratio attribute, no training flag)
     drops in a training program; with training_mode removed (opset 13: false
     when absent) it is the identity and trains as PyTorch's eval-mode dropout;
  6. a run stopped at a checkpoint and resumed ends with the straight run's weights;
  7. a ratio computed at run time, or outside [0, 1], is refused naming the node.

Reuses tests/test_parity.py (data, weight mapping, compile-build-train-compare).

  /usr/bin/python3 tests/test_dropout.py [--keep]

PIPECC overrides the pipecc binary.  Ends with "N passed, M failed, K skipped, R refused" (tests/tally.py)."""
import argparse
import glob
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)
import test_parity as tp  # noqa: E402

PIPECC = tp.PIPECC
P = 0.3
HID = (64, 32)
tp.STEPS = 8                   # SGD steps per run (test_parity's helpers read these)
tp.LOSS_RTOL = 1e-5
tp.WEIGHT_ATOL = 1e-5
SEED = 1                       # run.sh's default --seed


def result(ok, what, detail=""):
    tally.count(ok)
    print(("ok - " if ok else "not ok - ") + what + (": " + detail if detail else ""))
    sys.stdout.flush()
    return ok


# --------------------------------------------------------------------------
# Masks: the kernel's (a harness) and numpy's Philox
# --------------------------------------------------------------------------

HARNESS = r'''
#include <stdio.h>
#include <stdlib.h>
#include "kernels.h"
/* mask SEED STEP NODE N RATIO: the step's first N mask bytes of a Dropout node, from k_dropout itself. */
int main(int argc, char **argv) {
  if (argc != 6) return 2;
  RandCtx rc = {strtoull(argv[1], 0, 10), atoll(argv[2]), 0};
  int64_t n = atoll(argv[4]);
  float *x = calloc((size_t)n, sizeof(float)), *y = malloc(sizeof(float) * (size_t)n);
  uint8_t *m = malloc((size_t)n);
  k_dropout(x, y, m, n, strtof(argv[5], 0), atoll(argv[3]), &rc);
  fwrite(m, 1, (size_t)n, stdout);
  return 0;
}
'''


def build_harness(tmp):
    src, exe = os.path.join(tmp, "mask.c"), os.path.join(tmp, "mask")
    open(src, "w").write(HARNESS)
    subprocess.run(["clang", "-O2", "-I" + os.path.join(ROOT, "runtime"), src, "-o", exe, "-lopenblas", "-lm"], check=True)
    return exe


def kernel_mask(exe, step, node, n, ratio, seed=SEED):
    out = subprocess.run([exe, str(seed), str(step), str(node), str(n), repr(float(np.float32(ratio)))],
                         check=True, capture_output=True).stdout
    assert len(out) == n
    return np.frombuffer(out, dtype=np.uint8).astype(bool)


def philox4x32_10(c, k0, k1):
    """Philox4x32-10 on uint64 arrays holding 32-bit words (Random123's philox4x32_R(10, ...))."""
    M32 = np.uint64(0xFFFFFFFF)
    c0, c1, c2, c3 = (np.asarray(v, dtype=np.uint64) & M32 for v in c)
    k0, k1 = np.uint64(k0) & M32, np.uint64(k1) & M32
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M32, (k1 + np.uint64(0xBB67AE85)) & M32
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & M32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & M32
    return np.stack([c0, c1, c2, c3])


def philox_mask(step, node, n, ratio, seed=SEED, first=0):
    """Keep flags of elements first .. first + n - 1 of a step (runtime/kernels.h's keying)."""
    e = np.arange(first, first + n, dtype=np.uint64)
    block = e // np.uint64(4)
    words = philox4x32_10([block, block >> np.uint64(32), np.full_like(e, node), np.full_like(e, step & 0xFFFFFFFF)],
                          seed & 0xFFFFFFFF, seed >> 32)
    draw = words[(e % np.uint64(4)).astype(np.int64), np.arange(n)]
    r = float(np.float32(ratio))
    thr = 1 << 32 if r >= 1 else 0 if r <= 0 else int(r * 4294967296.0)
    return draw >= np.uint64(thr) if thr < (1 << 32) else np.zeros(n, bool)


def check_masks(exe):
    ok = True
    for step, node, n, ratio, seed in ((0, 3, 4099, 0.3, 1), (17, 5, 1000, 0.5, 1), (2, 9, 333, 0.9, 12345678901234)):
        a, b = kernel_mask(exe, step, node, n, ratio, seed), philox_mask(step, node, n, ratio, seed)
        ok &= bool(np.array_equal(a, b))
    a = kernel_mask(exe, 0, 3, 4096, P)
    distinct = not np.array_equal(a, kernel_mask(exe, 1, 3, 4096, P)) and not np.array_equal(a, kernel_mask(exe, 0, 4, 4096, P)) \
        and not np.array_equal(a, kernel_mask(exe, 0, 3, 4096, P, seed=2))
    result(ok, "k_dropout's masks = the numpy Philox4x32-10 (3 keys, 5428 elements)")
    result(distinct, "masks differ across steps, nodes and seeds")


# --------------------------------------------------------------------------
# 2. Statistics through a forward-only program
# --------------------------------------------------------------------------

def check_statistics(tmp, env, exe):
    ratios = (0.1, 0.3, 0.5, 0.9)
    shape = [1000, 1000]
    nodes, outs, inits = [], [], []
    for k, r in enumerate(ratios):
        inits += [numpy_helper.from_array(np.array(r, np.float32), f"ratio{k}"), numpy_helper.from_array(np.array(True), f"train{k}")]
        nodes.append(helper.make_node("Dropout", ["x", f"ratio{k}", f"train{k}"], [f"y{k}", f"m{k}"], name=f"drop{k}"))
        outs += [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, shape),
                 helper.make_tensor_value_info(f"m{k}", TensorProto.BOOL, shape)]
    g = helper.make_graph(nodes, "dropout_stats", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    path, out = os.path.join(tmp, "stats.onnx"), os.path.join(tmp, "stats.pipe")
    onnx.save(m, path)
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    ind, outd = os.path.join(tmp, "stats_in"), os.path.join(tmp, "stats_out")
    os.makedirs(ind), os.makedirs(outd)
    open(os.path.join(ind, "input_0.pb"), "wb").write(numpy_helper.from_array(x, "x").SerializeToString())
    try:
        tp.run_cmd("pipecc", [PIPECC, path, "--forward-only", "-o", out], env)
        tp.run_cmd("make", ["make", "-s", "-C", out, "-j2"], env)
        tp.run_cmd("stage_0", [os.path.join(out, "stage_0"), ind, outd], dict(env, PIPERUN_DIR=out))
    except tp.StepFailed as e:
        result(False, "forward-only Dropout program", e.args[0])
        tp.note(e.args[1])
        return
    import json
    sends = [v["name"] for v in json.load(open(os.path.join(out, "plan.json")))["stage_plans"][0]["send"]]
    got = {}
    for k, name in enumerate(sends):
        dt = np.uint8 if name.startswith("m") else np.float32
        got[name] = np.fromfile(os.path.join(outd, f"{k}.bin"), dtype=dt).reshape(shape)
    n = x.size
    for k, r in enumerate(ratios):
        y, mask = got[f"y{k}"], got[f"m{k}"].astype(bool)
        scale = np.float32(1.0) / np.float32(1.0 - float(np.float32(r)))
        kept = mask.mean()
        sigma = np.sqrt((1 - r) * r / n)
        z = (kept - (1 - r)) / sigma
        result(abs(z) <= 5, f"ratio {r}: kept fraction over 10^6 values within 5 sigma of {1 - r:g}",
               f"{kept:.5f} ({z:+.2f} sigma)")
        exact = np.array_equal(y[mask], x[mask] * scale) and bool(np.all(y[~mask] == 0))
        result(exact, f"ratio {r}: kept values exactly x * {scale!r} (float 1 / (1 - p)), dropped ones 0")
        node = int(re.search(r"k_dropout\([^;]*\bv_y%d\b[^;]*, (\d+), &pr_rand\);" % k,
                             open(os.path.join(out, "stage_0.c")).read()).group(1))
        result(np.array_equal(mask.reshape(-1), kernel_mask(exe, 0, node, n, r)),
               f"ratio {r}: the program's mask output is the kernel's mask (node {node}, step 0, seed 1)")


# --------------------------------------------------------------------------
# 3-5. Training against PyTorch
# --------------------------------------------------------------------------

class DropMLP(nn.Module):
    """Flatten -> Linear(784,64) -> ReLU -> Dropout(p) -> Linear(64,32) -> ReLU -> Dropout(p) -> Linear(32,10)."""

    def __init__(self, p=P):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(784, HID[0])
        self.fc2 = nn.Linear(HID[0], HID[1])
        self.fc3 = nn.Linear(HID[1], 10)
        self.drop1, self.drop2 = nn.Dropout(p), nn.Dropout(p)

    def forward(self, x):
        h = self.drop1(torch.relu(self.fc1(self.flatten(x))))
        return self.fc3(self.drop2(torch.relu(self.fc2(h))))


class MaskedMLP(DropMLP):
    """DropMLP whose dropouts apply given masks as PyTorch's CPU dropout applies
    its own: noise = mask / (1 - p), x * noise.  masks(step) -> two [B, H] bool arrays."""

    def __init__(self, masks, p=P):
        super().__init__(p)
        self.masks, self.p, self.step = masks, p, 0

    def drop(self, h, mask):
        noise = torch.from_numpy(mask.reshape(h.shape)).to(torch.float32)
        noise.div_(1 - self.p)
        return h * noise

    def forward(self, x):
        m1, m2 = self.masks(self.step)
        self.step += 1
        h = self.drop(torch.relu(self.fc1(self.flatten(x))), m1)
        return self.fc3(self.drop(torch.relu(self.fc2(h)), m2))


def export(model, path, opset):
    torch.manual_seed(1)
    buf = io.BytesIO()
    torch.onnx.export(model, (torch.randn(2, 1, 28, 28),), buf, opset_version=opset, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    m = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return path


def dropout_ids(onnx_path):
    """The Dropout nodes' indices in the ONNX graph: pipecc's node ids (compiler/ops/movement.c)."""
    return [i for i, n in enumerate(onnx.load(onnx_path).graph.node) if n.op_type == "Dropout"]


def compiled_ids(casedir):
    """Node ids in the generated k_dropout calls (every stage)."""
    ids = set()
    for f in glob.glob(os.path.join(casedir, "out.pipe", "stage_*.c")):
        ids |= {int(v) for v in re.findall(r"k_dropout\([^;]*, (\d+), &pr_rand\);", open(f).read())}
    return sorted(ids)


def run(tag, path, n, sched, ref, tmp, env, datadir, want_ids):
    casedir = os.path.join(tmp, re.sub(r"[^a-z0-9]+", "-", tag.lower()))
    r = tp.run_case(tag, path, n, sched, {}, datadir, casedir, env, ref)
    if want_ids is not None and os.path.isdir(os.path.join(casedir, "out.pipe")):
        ids = compiled_ids(casedir)
        result(ids == want_ids, f"{tag}: the stage programs call k_dropout for nodes {want_ids}", f"found {ids}")
    return r if isinstance(r, dict) else None


def bit_identical(tag, runs):
    if len(runs) < 2 or None in runs.values():
        return result(False, tag, f"not checked: {sum(v is not None for v in runs.values())} run(s) succeeded (at least 2 needed)")
    keys = list(runs)
    diff = [k for k in keys[1:] if runs[k] != runs[keys[0]]]
    return result(not diff, tag, f"{len(runs)} runs" + (f"; differ from {keys[0]}: {diff}" if diff else ""))


def mask_source(exe, ids, p=P):
    """masks(step) for MaskedMLP: the kernel's masks of the two Dropout nodes over the whole batch."""
    cache = {}

    def masks(step):
        if step not in cache:
            cache[step] = [kernel_mask(exe, step, ids[k], tp.B * HID[k], p).reshape(tp.B, HID[k]) for k in range(2)]
        return cache[step]
    return masks


def check_resume(tmp, env, datadir, straight):
    """Half the steps, a checkpoint, a resume: the masks of the later steps, and so the weights, are the straight run's."""
    tag = f"p={P} n=2 1f1b: {tp.STEPS // 2} steps, checkpoint, resume to {tp.STEPS}: the straight run's weights bit for bit"
    if straight is None:
        return result(False, tag, "not checked: the straight run failed")
    case = os.path.join(tmp, re.sub(r"[^a-z0-9]+", "-", f"p={P} n=2 1f1b vs PyTorch with pipecc's masks".lower()))
    runsh, ck, saved = os.path.join(case, "out.pipe", "run.sh"), os.path.join(tmp, "ckpt"), os.path.join(tmp, "resumed.onnx")
    try:
        tp.run_cmd("run.sh", [runsh, "--data", datadir, "--steps", str(tp.STEPS // 2), "--checkpoint", ck, "--checkpoint-every",
                              str(tp.STEPS // 2), "--quiet"], env, cwd=tmp)
        tp.run_cmd("run.sh --resume", [runsh, "--data", datadir, "--steps", str(tp.STEPS), "--resume", ck, "--save", saved,
                                       "--quiet"], env, cwd=tmp)
    except tp.StepFailed as e:
        result(False, tag, e.args[0])
        return tp.note(e.args[1])
    got = {t.name: numpy_helper.to_array(t).tobytes() for t in onnx.load(saved).graph.initializer}
    return result(got == straight, tag, f"{len(got)} initializers")


def check_training(tmp, env, exe):
    datadir = os.path.join(tmp, "data")
    imgs, labels = tp.make_dataset(tp.STEPS * tp.B)
    tp.write_dataset(datadir, imgs, labels)

    # 3. p = 0: PyTorch's own dropout.
    torch.manual_seed(0)
    path0 = export(DropMLP(0.0), os.path.join(tmp, "p0.onnx"), 17)   # the same form as opset 13's below
    ref0 = tp.torch_reference(lambda: DropMLP(0.0), path0, imgs, labels)
    runs = {(n, s): run(f"p=0 n={n} {s} vs PyTorch", path0, n, s, ref0, tmp, env, datadir, None)
            for n, s in ((1, "1f1b"), (2, "gpipe"))}
    bit_identical("p=0: trained weights bit-identical across n = 1 and 2", runs)

    # 4. p = 0.3, PyTorch fed pipecc's masks.
    torch.manual_seed(0)
    path = export(DropMLP(P), os.path.join(tmp, "p03.onnx"), 13)
    ids = dropout_ids(path)
    ref = tp.torch_reference(lambda: MaskedMLP(mask_source(exe, ids)), path, imgs, labels)
    print(f"# p={P}: Dropout nodes {ids}; PyTorch with pipecc's masks: loss {ref[0][0]:.4f} -> {ref[0][-1]:.4f}")
    runs = {}
    for n, s in ((1, "1f1b"), (2, "1f1b"), (4, "gpipe"), (4, "1f1b"), (4, "zb1")):
        runs[(n, s)] = run(f"p={P} n={n} {s} vs PyTorch with pipecc's masks", path, n, s, ref, tmp, env, datadir, ids)
    bit_identical(f"p={P}: trained weights bit-identical across n = 1, 2, 4 and gpipe / 1f1b / zb1", runs)
    # The masks key on the element's place in the step's batch, so the micro-batch count does not change
    # them either (the weights then differ in the last bits only: the gradient sums group differently).
    m = tp.M
    tp.M = 2 * m
    run(f"p={P} n=2 1f1b {tp.M} micro-batches vs PyTorch with the same masks", path, 2, "1f1b", ref, tmp, env, datadir, ids)
    tp.M = m
    check_resume(tmp, env, datadir, runs.get((2, "1f1b")))

    # 5. The opset 11 form (ratio attribute) drops in training ...
    torch.manual_seed(0)
    path11 = export(DropMLP(P), os.path.join(tmp, "p03_op11.onnx"), 11)
    ids11 = dropout_ids(path11)
    ok11 = all("ratio" in [a.name for a in n.attribute] and len(n.input) == 1
               for n in onnx.load(path11).graph.node if n.op_type == "Dropout")
    result(ok11 and len(ids11) == 2, "opset 11 export: two Dropout nodes with a ratio attribute, no training_mode")
    ref11 = tp.torch_reference(lambda: MaskedMLP(mask_source(exe, ids11)), path11, imgs, labels)
    run(f"opset 11 p={P} n=2 1f1b vs PyTorch with pipecc's masks", path11, 2, "1f1b", ref11, tmp, env, datadir, ids11)

    # ... and training_mode absent (false) is the identity, as PyTorch's eval-mode dropout.
    m = onnx.load(path)
    for nd in m.graph.node:
        if nd.op_type == "Dropout":
            del nd.input[2:]
    path_eval = os.path.join(tmp, "p03_no_training_mode.onnx")
    onnx.save(m, path_eval)
    ones = lambda step: [np.ones((tp.B, h), bool) for h in HID]  # noqa: E731
    ref_eval = tp.torch_reference(lambda: MaskedMLP(ones, p=0.0), path_eval, imgs, labels)
    run("training_mode absent (false): identity, n=2 1f1b vs PyTorch without dropout", path_eval, 2, "1f1b", ref_eval, tmp, env,
        datadir, [])


# --------------------------------------------------------------------------
# 7. Refusals
# --------------------------------------------------------------------------

def check_refusals(tmp, env):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    cases = [
        ("a ratio computed at run time", [helper.make_node("ReduceMean", ["x"], ["r"], keepdims=0, name="mean"),
                                          helper.make_node("Dropout", ["x", "r"], ["y"], name="drop_rt")], [],
         ["drop_rt", "the ratio", "compile-time constant"]),
        ("ratio 1.5", [helper.make_node("Dropout", ["x", "r"], ["y"], name="drop_big")],
         [numpy_helper.from_array(np.array(1.5, np.float32), "r")], ["drop_big", "outside [0, 1]"]),
        ("ratio attribute -0.25 (opset 11)", [helper.make_node("Dropout", ["x"], ["y"], name="drop_neg", ratio=-0.25)], [],
         ["drop_neg", "outside [0, 1]"]),
    ]
    for what, nodes, inits, want in cases:
        opset = 11 if "opset 11" in what else 13
        m = helper.make_model(helper.make_graph(nodes, "bad", [x], [y], inits), opset_imports=[helper.make_opsetid("", opset)])
        path = os.path.join(tmp, "bad.onnx")
        onnx.save(m, path)
        r = subprocess.run([PIPECC, path, "-o", os.path.join(tmp, "bad.pipe")], capture_output=True, text=True, env=env)
        line = r.stderr.strip()
        ok = r.returncode == 2 and line.startswith("pipecc: error:") and len(line.splitlines()) == 1 and all(w in line for w in want)
        result(ok and not os.path.exists(os.path.join(tmp, "bad.pipe")), f"refused: {what}", line.replace(tmp + "/", ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="pipecc-dropout.")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PIPECC_CACHE=os.path.join(tmp, "machine.txt"))
    t0 = time.time()
    try:
        exe = build_harness(tmp)
        check_masks(exe)
        check_statistics(tmp, env, exe)
        check_refusals(tmp, env)
        check_training(tmp, env, exe)
    except Exception as e:   # setup failure: report, not a traceback
        result(False, "setup", f"{type(e).__name__}: {e}")
    finally:
        if args.keep:
            print(f"# kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {time.time() - t0:.0f} s")
    return tally.finish()   # test_parity's run_case counts into the same tally


if __name__ == "__main__":
    sys.exit(main())
