#!/usr/bin/python3
"""The run-time movement ops (Slice, Expand, Tile, Cast) trained end to end
against PyTorch, on a model exported from torch.nn:

    h = tanh(fc1(x.flatten(1))).reshape(-1, 12, 8)
    a = h[:, 1::2]                                  Slice, step 2
    b = h[:, ::2].flip(2)                           Slice, and a Slice with step -1
    m = a.mean(1, keepdim=True).expand(-1, 6, 8)    Expand
    t = a[:, :3, :4].repeat(1, 2, 2)                Slice of a slice, Tile
    q = (b * 3).long().float()                      Cast float -> int64 -> float (no gradient)
    g = gate.expand(x.shape[0], 6, 8)               Expand of a weight (a weight gradient), its shape from x's
    logits = fc2((a * m + t * b + q * a * g).flatten(1))

Exported at opset 13 with a dynamic batch axis (tests/test_parity.py's
export), compiled for -n 1 and -n 2 (1F1B) and -n 2 (ZB-H1, whose deferred
weight-gradient half holds the Expand of the weight), B = 32, M = 4, trained 20
plain-SGD steps (lr 0.05) on MNIST-format data, and checked with
test_parity.py's run_case: every step's loss within 1e-5 relative of
PyTorch's (float32, the same nn.Module and initial weights), every trained
weight within 1e-4 absolute, the saved model's graph unchanged.  The weights
of the three runs must be bit-identical, and each generated program must call the
run-time kernels (k_view, k_view_grad, k_cast_f32_i64, k_cast_i64_f32): a
model that folded them away would test nothing.

Then each run-time Cast on its own, in an inference program (--forward-only,
which reads typed ONNX inputs): bool, int32, int64, float16 -> float32 and
float32 -> int64 / float32, on special values (float16 subnormals, infinities
and NaN; int32/int64 extremes; float32 halves, NaN, out of int64 range), must
equal numpy's astype bit for bit.

  /usr/bin/python3 tests/test_movement.py [--keep]

PIPECC overrides the pipecc binary.  Ends with "N passed, M failed, K skipped, R refused" (tests/tally.py)."""
import argparse
import glob
import importlib.util
import os
import shutil
import sys
import tempfile
import time

import subprocess
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
KERNELS = ("k_view(", "k_view_grad(", "k_cast_f32_i64(", "k_cast_i64_f32(")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


def load_parity():
    spec = importlib.util.spec_from_file_location("parity", os.path.join(ROOT, "tests", "test_parity.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_conformance():
    spec = importlib.util.spec_from_file_location("conformance", os.path.join(ROOT, "tests", "conformance", "run.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cast_cases():
    """(name, input array, ONNX 'to', numpy result type)."""
    rng = np.random.default_rng(11)
    i64 = np.iinfo(np.int64)
    f32 = np.concatenate([[2.7, -2.7, -0.5, 0.5, 1e18, -1e19, 2.0 ** 63, np.nan, np.inf, -np.inf], rng.normal(0, 50, 6)])
    f16_bits = np.array([0x3c00, 0xc000, 0x0001, 0x03ff, 0x7bff, 0x3555, 0x7c00, 0xfc00, 0x8000, 0x7e00], np.uint16)
    return [
        ("bool -> float32", rng.integers(0, 2, 16).astype(np.bool_), TensorProto.FLOAT, np.float32),
        ("int32 -> float32", np.concatenate([[-7, 0, 2 ** 31 - 1, -2 ** 31], rng.integers(-2 ** 31, 2 ** 31, 12)]).astype(np.int32),
         TensorProto.FLOAT, np.float32),
        ("int64 -> float32", np.concatenate([[i64.max, i64.min, 2 ** 53 + 1, -(2 ** 24) - 1], rng.integers(-10 ** 12, 10 ** 12, 12)])
         .astype(np.int64), TensorProto.FLOAT, np.float32),
        ("float16 -> float32", np.concatenate([f16_bits.view(np.float16), rng.normal(0, 100, 6).astype(np.float16)]),
         TensorProto.FLOAT, np.float32),
        ("float32 -> int64", f32.astype(np.float32), TensorProto.INT64, np.int64),
        ("float32 -> float32", f32.astype(np.float32), TensorProto.FLOAT, np.float32),
    ]


def check_casts(par, tmp, env):
    """Each run-time Cast alone in a --forward-only program, against numpy's astype."""
    conf = load_conformance()
    rt_obj = conf.build_runtime(tmp)
    runtime = os.path.join(ROOT, "runtime")
    for name, x, to, want_type in cast_cases():
        work = os.path.join(tmp, "cast_" + name.replace(" ", "").replace(">", ""))
        os.makedirs(os.path.join(work, "in"))
        os.makedirs(os.path.join(work, "out"))
        x = x.reshape(2, 8)
        elem = onnx.mapping.NP_TYPE_TO_TENSOR_TYPE[x.dtype]
        g = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], name="cast_node", to=to)], "cast",
                              [helper.make_tensor_value_info("x", elem, [2, 8])],
                              [helper.make_tensor_value_info("y", to, [2, 8])])
        path = os.path.join(work, "cast.onnx")
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
        with open(os.path.join(work, "in", "input_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(x).SerializeToString())
        out = os.path.join(work, "prog")
        try:
            par.run_cmd("pipecc", [PIPECC, path, "--forward-only", "-o", out], env)
            par.run_cmd("cc", ["mpicc", "-O1", "-Wall", "-Werror", *conf.lib_cflags(), "-I" + runtime, "-I" + os.path.join(ROOT, "build", "gen"),
                               "-D_GNU_SOURCE", os.path.join(out, "stage_0.c"), *rt_obj, "-o", os.path.join(out, "stage_0"),
                               "-lopenblas", "-lprotobuf-c", "-lm", "-lpthread", *conf.lib_ldlibs()], dict(env, OMPI_CC="clang"))
            par.run_cmd("stage_0", [os.path.join(out, "stage_0"), os.path.join(work, "in"), os.path.join(work, "out")],
                        dict(env, PIPERUN_DIR=out))
            code = open(os.path.join(out, "stage_0.c")).read()
        except par.StepFailed as e:
            par.result(False, f"Cast {name} at run time", e.args[0])
            if e.args[1]:
                par.note(e.args[1])
            continue
        got = np.fromfile(os.path.join(work, "out", "0.bin"), dtype=want_type)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # numpy warns on NaN/inf -> int64 (it gives INT64_MIN, as x86 does)
            want = x.reshape(-1).astype(want_type)
        kernel = "k_copy(" if name == "float32 -> float32" else "k_cast_"
        same = got.shape == want.shape and np.array_equal(got.view(np.uint8), want.view(np.uint8))
        par.result(same and kernel in code, f"Cast {name} at run time equals numpy's astype bit for bit",
                   "" if same else f"got {got.tolist()}, numpy {want.tolist()}" if kernel in code else "no run-time kernel call")


class MoveNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 96)
        self.fc2 = nn.Linear(6 * 8, 10)
        self.gate = nn.Parameter(torch.rand(1, 1, 8) + 0.5)

    def forward(self, x):
        h = torch.tanh(self.fc1(x.flatten(1))).reshape(-1, 12, 8)
        a = h[:, 1::2]
        b = h[:, ::2].flip(2)
        m = a.mean(1, keepdim=True).expand(-1, 6, 8)
        t = a[:, :3, :4].repeat(1, 2, 2)
        q = (b * 3).long().float()
        g = self.gate.expand(x.shape[0], 6, 8)
        return self.fc2((a * m + t * b + q * a * g).flatten(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    par = load_parity()
    par.LOSS_RTOL = 1e-5   # run_case reads it: this test asks for 1e-5
    tmp = tempfile.mkdtemp(prefix="pipecc-movement.")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PIPECC_CACHE=os.path.join(tmp, "machine.txt"))
    try:
        torch.manual_seed(7)
        path = par.export_model(MoveNet(), os.path.join(tmp, "movenet.onnx"))
        imgs, labels = par.make_dataset(par.N_SAMPLES, seed=3)
        datadir = os.path.join(tmp, "data")
        par.write_dataset(datadir, imgs, labels)
        torch.set_num_threads(1)
        ref = par.torch_reference(MoveNet, path, imgs, labels)
        print(f"# torch losses {ref[0][0]:.4f} -> {ref[0][-1]:.4f} over {par.STEPS} steps")
        runs = {}
        for n, sched in ((1, "1f1b"), (2, "1f1b"), (2, "zb1")):
            tag = f"movenet n={n} {sched}"
            casedir = os.path.join(tmp, f"n{n}_{sched}")
            got = par.run_case(f"{tag} (loss rel 1e-5)", path, n, sched, {}, datadir, casedir, env, ref)
            if isinstance(got, dict):
                runs[tag] = got
                code = "".join(open(f).read() for f in glob.glob(os.path.join(casedir, "out.pipe", "stage_*.c")))
                missing = [k.rstrip("(") for k in KERNELS if k not in code]
                par.result(not missing, f"{tag}: the stage programs call {', '.join(k.rstrip('(') for k in KERNELS)}",
                           f"missing {missing}" if missing else "")
        what = "movenet: n=1 1f1b, n=2 1f1b and n=2 zb1 give bit-identical weights"
        if len(runs) < 3:
            par.result(False, what, f"not checked: only {len(runs)} of 3 runs succeeded")
        else:
            first = list(runs.values())[0]
            par.result(all(r == first for r in runs.values()), what)
        check_casts(par, tmp, env)
    except Exception as e:
        par.result(False, "setup", f"{type(e).__name__}: {e}")
    finally:
        if args.keep:
            print(f"# work dir kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {time.time() - t0:.0f} s")
    return tally.finish()   # the one tally: what the imported suite's helpers counted is in it


if __name__ == "__main__":
    sys.exit(main())
