#!/usr/bin/python3
"""Split into K outputs and Concat of K inputs, trained, against PyTorch.

Models built with onnx.helper (opset 17, batch B = 16, M = 4 micro-batches):

  split:  x [B,1,28,28] -> Flatten -> Gemm(W0, b0) -> Reshape [B, S, D]
          -> Split along axis 2 (or 1) into K outputs (equal sizes, or the
             unequal sizes given as the split input)
          -> each: Relu -> ReduceSum over the other axis (keepdims 0)
                   -> Gemm(W_k, b_k) -> [B, 10]
          -> Add of the K heads -> logits
  concat: x -> Flatten -> K Gemms (W_k [784, d_k], b_k) -> Concat on axis 1
          -> Gemm(Wo, bo) -> logits

for K = 2..16.  Each model is compiled with pipecc for -n 1 and -n 2 (1F1B),
built, and trained STEPS plain-SGD steps (lr 0.05) on MNIST-format data; a
PyTorch model holding the same initializers (torch.split / torch.cat) trains
on the same batches.  Checked per run: every step's loss within 1e-4 relative,
every trained initializer within 1e-4 absolute; per model: the -n 1 and -n 2
weights are bit-identical (at least two successful runs needed).  A
'pipecc: error:' refusal is a failure: these ops must train.

  /usr/bin/python3 tests/test_split_concat.py [--only SUBSTR]... [--keep]

PIPECC overrides the pipecc binary.  Ends with "N passed, M failed, K skipped, R refused" (tests/tally.py)."""
import argparse
import csv
import glob
import importlib.util
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")

B, M, STEPS, LR, CLASSES = 16, 4, 5, 0.05, 10
LOSS_RTOL, WEIGHT_ATOL = 1e-4, 1e-4

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


def result(ok, what, detail=""):
    tally.count(ok)
    print(("ok - " if ok else "not ok - ") + what + (": " + detail if detail else ""))
    sys.stdout.flush()
    return ok


def note(text):
    for line in str(text).rstrip("\n").splitlines():
        print("#   " + line)


def load_parity():
    spec = importlib.util.spec_from_file_location("parity", os.path.join(ROOT, "tests", "test_parity.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------
# Models: ONNX graph + the same computation in torch
# --------------------------------------------------------------------------

def sizes_for(total, k, equal, least=1):
    if equal:
        return [total // k] * k
    # unequal: 1, 2, 3, ... scaled to add up to total (every part >= least)
    raw = np.arange(1, k + 1, dtype=np.float64)
    s = np.maximum(least, np.floor(raw / raw.sum() * total)).astype(int)
    s[-1] += total - s.sum()
    assert s.min() >= least and s.sum() == total
    return [int(v) for v in s]


def split_model(k, equal, axis, seed):
    """Returns (onnx model, init dict, torch forward(params, x))."""
    rng = np.random.default_rng(seed)
    S, per = 3, 4                       # the split axis gets K*per (equal) or the sizes below
    D = k * per
    shape3 = [S, D] if axis == 2 else [D, S]
    sizes = sizes_for(D, k, equal)
    red = 1 if axis == 2 else 2         # ReduceSum over the other non-batch axis
    inits = {"W0": rng.standard_normal((784, S * D)) * 0.05, "b0": rng.standard_normal(S * D) * 0.1}
    for i, d in enumerate(sizes):
        inits[f"W{i + 1}"] = rng.standard_normal((d, CLASSES)) / np.sqrt(S * d)
        inits[f"b{i + 1}"] = rng.standard_normal(CLASSES) * 0.1
    inits = {n: v.astype(np.float32) for n, v in inits.items()}
    consts = {"shape3": np.array([-1] + shape3, np.int64), "red_axes": np.array([red], np.int64)}
    if not equal:
        consts["split"] = np.array(sizes, np.int64)
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=1),
             helper.make_node("Gemm", ["f", "W0", "b0"], ["h"]),
             helper.make_node("Reshape", ["h", "shape3"], ["h3"]),
             helper.make_node("Split", ["h3"] + (["split"] if not equal else []), [f"s{i}" for i in range(k)], axis=axis)]
    heads = []
    for i in range(k):
        nodes += [helper.make_node("Relu", [f"s{i}"], [f"r{i}"]),
                  helper.make_node("ReduceSum", [f"r{i}", "red_axes"], [f"q{i}"], keepdims=0),
                  helper.make_node("Gemm", [f"q{i}", f"W{i + 1}", f"b{i + 1}"], [f"z{i}"])]
        heads.append(f"z{i}")
    acc = heads[0]
    for i in range(1, k):
        out = "logits" if i == k - 1 else f"a{i}"
        nodes.append(helper.make_node("Add", [acc, heads[i]], [out]))
        acc = out
    model = make_model(nodes, inits, consts, f"split_k{k}")

    def forward(p, x):
        h = (x.reshape(x.shape[0], -1) @ p["W0"] + p["b0"]).reshape([-1] + shape3)
        parts = torch.split(h, sizes, dim=axis)
        out = 0
        for i, s in enumerate(parts):
            out = out + torch.relu(s).sum(dim=red) @ p[f"W{i + 1}"] + p[f"b{i + 1}"]
        return out
    return model, inits, forward, f"sizes {sizes} of [B,{','.join(map(str, shape3))}] on axis {axis}"


def concat_model(k, equal, seed):
    rng = np.random.default_rng(seed)
    total = 4 * k
    # Each part has its own Gemm bias of its width; pipecc treats a one-element
    # initializer as a constant (ops.c mark_params), so every part is >= 2 wide.
    sizes = sizes_for(total, k, equal, least=2)
    inits = {}
    for i, d in enumerate(sizes):
        inits[f"W{i}"] = rng.standard_normal((784, d)) * 0.05
        inits[f"b{i}"] = rng.standard_normal(d) * 0.1
    inits["Wo"] = rng.standard_normal((total, CLASSES)) / np.sqrt(total)
    inits["bo"] = rng.standard_normal(CLASSES) * 0.1
    inits = {n: v.astype(np.float32) for n, v in inits.items()}
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=1)]
    for i in range(k):
        nodes.append(helper.make_node("Gemm", ["f", f"W{i}", f"b{i}"], [f"g{i}"]))
    nodes += [helper.make_node("Concat", [f"g{i}" for i in range(k)], ["c"], axis=1),
              helper.make_node("Gemm", ["c", "Wo", "bo"], ["logits"])]
    model = make_model(nodes, inits, {}, f"concat_k{k}")

    def forward(p, x):
        f = x.reshape(x.shape[0], -1)
        c = torch.cat([f @ p[f"W{i}"] + p[f"b{i}"] for i in range(k)], dim=1)
        return c @ p["Wo"] + p["bo"]
    return model, inits, forward, f"sizes {sizes} on axis 1"


def make_model(nodes, inits, consts, name):
    tensors = [numpy_helper.from_array(v, n) for n, v in inits.items()]
    tensors += [numpy_helper.from_array(v, n) for n, v in consts.items()]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 28, 28])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])], tensors)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def torch_reference(inits, forward, imgs, labels):
    """STEPS full-batch SGD steps in float32 from the same initializers."""
    torch.set_num_threads(1)
    p = {n: torch.tensor(v, requires_grad=True) for n, v in inits.items()}
    opt = torch.optim.SGD(list(p.values()), lr=LR)
    x_all = torch.from_numpy(imgs.astype(np.float32) / np.float32(255.0)).reshape(-1, 1, 28, 28)
    y_all = torch.from_numpy(labels.astype(np.int64))
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(forward(p, x_all[s * B:(s + 1) * B]), y_all[s * B:(s + 1) * B])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses), {n: v.detach().numpy().copy() for n, v in p.items()}


# --------------------------------------------------------------------------
# pipecc
# --------------------------------------------------------------------------

class Runner:
    def __init__(self, par, tmp, datadir, env):
        self.par, self.tmp, self.datadir, self.env, self.rt_obj = par, tmp, datadir, env, None

    def train(self, tag, path, n, casedir):
        """Compile, build, train.  Returns (losses, trained initializers); raises StepFailed."""
        par = self.par
        out = os.path.join(casedir, "out.pipe")
        log, saved = os.path.join(casedir, "log.csv"), os.path.join(casedir, "trained.onnx")
        os.makedirs(casedir, exist_ok=True)
        par.run_cmd("pipecc", [PIPECC, path, "-n", str(n), "-o", out, "--batch", str(B), "--microbatches", str(M),
                               "--schedule", "1f1b", "--optimizer", "sgd", "--lr", repr(LR), "--devices", DEVICES], self.env)
        cmd = ["make", "-s", "-C", out]
        if self.rt_obj:
            cmd.append("RT_OBJ=" + " ".join(self.rt_obj))
        par.run_cmd("make", cmd, self.env)
        if not self.rt_obj:   # libpiperun's objects once, for every later build
            objs = sorted(glob.glob(os.path.join(out, "build", "*.o")))
            keep = os.path.join(self.tmp, "rt_obj")
            os.makedirs(keep, exist_ok=True)
            for o in objs:
                shutil.copy2(o, keep)
            self.rt_obj = [os.path.join(keep, os.path.basename(o)) for o in objs] or None
        par.run_cmd("run.sh", [os.path.join(out, "run.sh"), "--data", self.datadir, "--steps", str(STEPS), "--no-shuffle",
                               "--quiet", "--log", log, "--save", saved], self.env, cwd=casedir)
        with open(log) as f:
            rows = list(csv.DictReader(f))
        if [int(r["step"]) for r in rows] != list(range(1, STEPS + 1)):
            raise par.StepFailed(f"{log}: steps {[r['step'] for r in rows]}, want 1..{STEPS}", "")
        losses = np.array([float(r["loss"]) for r in rows])
        return losses, {t.name: numpy_helper.to_array(t) for t in onnx.load(saved).graph.initializer}


def check_model(runner, tag, model, inits, forward, desc, imgs, labels):
    casedir = os.path.join(runner.tmp, tag.replace(" ", "_").replace("=", ""))
    os.makedirs(casedir)
    path = os.path.join(casedir, "model.onnx")
    onnx.save(model, path)
    ref_losses, ref_w = torch_reference(inits, forward, imgs, labels)
    print(f"# {tag} ({desc}): torch losses {ref_losses[0]:.4f} -> {ref_losses[-1]:.4f}")
    runs = {}
    for n in (1, 2):
        what = f"{tag} n={n}"
        try:
            losses, got = runner.train(what, path, n, os.path.join(casedir, f"n{n}"))
        except runner.par.StepFailed as e:
            first = (e.args[1] or "").strip().splitlines()
            refused = e.args[0].startswith("pipecc exited 2") and first and first[0].startswith("pipecc: error:")
            result(False, what, ("refused at compile time: " + first[0]) if refused else e.args[0])
            if not refused and e.args[1]:
                note(e.args[1])
            continue
        except Exception as e:
            result(False, what, f"{type(e).__name__}: {e}")
            continue
        loss_err = float((np.abs(losses - ref_losses) / np.abs(ref_losses)).max())
        problems = []
        if set(got) - {"shape3", "red_axes", "split"} != set(ref_w):
            problems.append(f"initializers {sorted(got)}, want {sorted(ref_w)}")
        w_err, worst = 0.0, ""
        for k, w in ref_w.items():
            if k in got:
                e = float(np.abs(got[k].astype(np.float64) - w).max()) if got[k].shape == w.shape else float("inf")
                if not e <= w_err:
                    w_err, worst = e, k
        if not loss_err <= LOSS_RTOL:
            s = int(np.argmax(np.abs(losses - ref_losses) / np.abs(ref_losses)))
            problems.append(f"step {s + 1}: loss {losses[s]!r}, torch {ref_losses[s]!r}")
        if not w_err <= WEIGHT_ATOL:
            problems.append(f"worst initializer {worst}")
        ok = result(not problems, what, f"max loss rel err {loss_err:.2e}, max weight abs err {w_err:.2e}"
                    + (f" ({worst})" if w_err > WEIGHT_ATOL else ""))
        for p in problems:
            note(p)
        if ok:
            runs[n] = got
    what = f"{tag}: n=1 and n=2 give bit-identical weights"
    if len(runs) < 2:
        result(False, what, f"not checked: only {len(runs)} run(s) succeeded (at least 2 needed)")
    else:
        result(all(np.array_equal(runs[1][k], runs[2][k]) for k in runs[1]) and runs[1].keys() == runs[2].keys(), what)


def cases():
    out = []
    # Split: K = 2..16, equal and unequal sizes, on the last axis and on axis 1.
    for k, equal, axis in ((2, False, 2), (3, True, 2), (4, False, 1), (5, True, 2), (6, False, 2), (6, True, 1),
                           (7, True, 2), (8, False, 2), (11, True, 1), (16, True, 2), (16, False, 1)):
        tag = f"split K={k} {'equal' if equal else 'unequal'} axis={axis}"
        out.append((tag, lambda k=k, equal=equal, axis=axis, tag=tag: split_model(k, equal, axis, seed=hash_seed(tag))))
    # Concat: K = 2..16 inputs, each its own Gemm of the input.
    for k, equal in ((2, True), (3, False), (6, True), (9, False), (16, True)):
        tag = f"concat K={k} {'equal' if equal else 'unequal'}"
        out.append((tag, lambda k=k, equal=equal, tag=tag: concat_model(k, equal, seed=hash_seed(tag))))
    return out


def hash_seed(s):
    import zlib
    return zlib.crc32(s.encode())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", default=[], help="only cases whose name contains this")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="pipecc-split-concat.")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PIPECC_CACHE=os.path.join(tmp, "machine.txt"))
    try:
        par = load_parity()
        imgs, labels = par.make_dataset(B * STEPS, seed=4)
        datadir = os.path.join(tmp, "data")
        par.write_dataset(datadir, imgs, labels)
        runner = Runner(par, tmp, datadir, env)
        for tag, build in cases():
            if args.only and not any(s in tag for s in args.only):
                continue
            try:
                model, inits, forward, desc = build()
            except Exception as e:
                result(False, tag, f"building the model: {type(e).__name__}: {e}")
                continue
            check_model(runner, tag, model, inits, forward, desc, imgs, labels)
    except Exception as e:
        result(False, "setup", f"{type(e).__name__}: {e}")
    finally:
        if args.keep:
            print(f"# work dir kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {time.time() - t0:.0f} s")
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
