#!/usr/bin/python3
"""The run-time movement ops (Slice, Expand, Tile, Cast) trained end to end
against PyTorch, on a model exported from torch.nn:

    h = tanh(fc1(x.flatten(1))).reshape(-1, 12, 8)
    a = h[:, 1::2]                                  Slice, step 2
    b = h[:, ::2].flip(2)                           Slice, and a Slice with step -1
    m = a.mean(1, keepdim=True).expand(-1, 6, 8)    Expand
    t = a[:, :3, :4].repeat(1, 2, 2)                Slice of a slice, Tile
    q = (b * 3).long().float()                      Cast float -> int64 -> float (no gradient)
    logits = fc2((a * m + t * b + q * a).flatten(1))

Exported at opset 13 with a dynamic batch axis (tests/test_parity.py's
export), compiled for -n 1 and -n 2 (1F1B, B = 32, M = 4), trained 20
plain-SGD steps (lr 0.05) on MNIST-format data, and checked with
test_parity.py's run_case: every step's loss within 1e-5 relative of
PyTorch's (float32, the same nn.Module and initial weights), every trained
weight within 1e-4 absolute, the saved model's graph unchanged.  The -n 1 and
-n 2 weights must be bit-identical, and each generated program must call the
run-time kernels (k_view, k_view_grad, k_cast_f32_i64, k_cast_i64_f32): a
model that folded them away would test nothing.

  /usr/bin/python3 tests/test_movement.py [--keep]

PIPECC overrides the pipecc binary.  Ends with "N passed, M failed"."""
import argparse
import glob
import importlib.util
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = ("k_view(", "k_view_grad(", "k_cast_f32_i64(", "k_cast_i64_f32(")


def load_parity():
    spec = importlib.util.spec_from_file_location("parity", os.path.join(ROOT, "tests", "test_parity.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class MoveNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 96)
        self.fc2 = nn.Linear(6 * 8, 10)

    def forward(self, x):
        h = torch.tanh(self.fc1(x.flatten(1))).reshape(-1, 12, 8)
        a = h[:, 1::2]
        b = h[:, ::2].flip(2)
        m = a.mean(1, keepdim=True).expand(-1, 6, 8)
        t = a[:, :3, :4].repeat(1, 2, 2)
        q = (b * 3).long().float()
        return self.fc2((a * m + t * b + q * a).flatten(1))


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
        for n in (1, 2):
            casedir = os.path.join(tmp, f"n{n}")
            got = par.run_case(f"movenet n={n} 1f1b (loss rel 1e-5)", path, n, "1f1b", {}, datadir, casedir, env, ref)
            if isinstance(got, dict):
                runs[n] = got
                code = "".join(open(f).read() for f in glob.glob(os.path.join(casedir, "out.pipe", "stage_*.c")))
                missing = [k.rstrip("(") for k in KERNELS if k not in code]
                par.result(not missing, f"movenet n={n}: the stage programs call {', '.join(k.rstrip('(') for k in KERNELS)}",
                           f"missing {missing}" if missing else "")
        if len(runs) < 2:
            par.result(False, "movenet: n=1 and n=2 give bit-identical weights",
                       f"not checked: only {len(runs)} run(s) succeeded")
        else:
            par.result(runs[1] == runs[2], "movenet: n=1 and n=2 give bit-identical weights")
    except Exception as e:
        par.result(False, "setup", f"{type(e).__name__}: {e}")
    finally:
        if args.keep:
            print(f"# work dir kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {time.time() - t0:.0f} s")
    print(f"{par.passed} passed, {par.failed} failed")
    return 1 if par.failed else 0


if __name__ == "__main__":
    sys.exit(main())
