#!/usr/bin/python3
"""LSTM and GRU trained end to end against PyTorch, on models exported from
torch.nn (opset 14, training mode, so the exporter's reordering of torch's
gates - [i, f, g, o] to ONNX's [i, o, f, c], [r, z, n] to [z, r, h] - is part
of the graph as Slice / Concat / Unsqueeze of torch's own weights):

    s = tanh(fc1(image rows))            [B, 28, 16]: 28 steps of 16 features
    y, h = rnn(s)                         LSTM or GRU, hidden 12, one layer
    logits = fc2(h + y.mean(time))        both Y and Y_h carry gradients

LSTM with batch_first=True, GRU (linear_before_reset=1, torch's form) with
batch_first=False, and a bidirectional LSTM (hidden 12 each way, h of both
directions side by side).  Each is compiled for -n 1 and -n 2 (1F1B), and -n 2 under
ZB-H1 (whose deferred weight-gradient half runs the backward pass through time
a second time for dW, dR, dB), B = 32, M = 4,
and trained 20 plain-SGD steps (lr 0.05) on MNIST-format data with
test_parity.py's run_case: every step's loss within 1e-5 relative of
PyTorch's (float32, the same nn.Module and initial weights), every trained
weight within 1e-5 absolute; the weights of the three runs must be
bit-identical, and the stage programs must call the recurrent kernels.  The
exporter's Slices of torch's weights must not draw pipecc's warning about
weights that nodes of one kind share.

  /usr/bin/python3 tests/test_rnn.py [--keep]

PIPECC overrides the pipecc binary.  Ends with "N passed, M failed, K skipped, R refused" (tests/tally.py)."""
import argparse
import glob
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time

import onnx
import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


def load_parity():
    spec = importlib.util.spec_from_file_location("parity", os.path.join(ROOT, "tests", "test_parity.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class RnnNet(nn.Module):
    KIND, BATCH_FIRST, BIDIRECTIONAL = "LSTM", True, False

    def __init__(self):
        super().__init__()
        d = 2 if self.BIDIRECTIONAL else 1
        self.fc1 = nn.Linear(28, 16)
        self.rnn = getattr(nn, self.KIND)(16, 12, batch_first=self.BATCH_FIRST, bidirectional=self.BIDIRECTIONAL)
        self.fc2 = nn.Linear(12 * d, 10)

    def forward(self, x):
        s = torch.tanh(self.fc1(x.reshape(-1, 28, 28)))
        if not self.BATCH_FIRST:
            s = s.transpose(0, 1)
        y, h = self.rnn(s)
        if self.KIND == "LSTM":
            h = h[0]
        last = h.transpose(0, 1).reshape(h.shape[1], -1)   # [B, directions * hidden]
        return self.fc2(last + y.mean(1 if self.BATCH_FIRST else 0))


class LstmNet(RnnNet):
    KIND, BATCH_FIRST = "LSTM", True


class GruNet(RnnNet):
    KIND, BATCH_FIRST = "GRU", False


class BiLstmNet(RnnNet):
    KIND, BATCH_FIRST, BIDIRECTIONAL = "LSTM", True, True


def export(model, path):
    """As test_parity.py's export_model, at opset 14 (LSTM / GRU with layout) and
    without constant folding: the graph reads torch's parameters by name (folding
    would bake the gate reordering into new initializers)."""
    model.train()
    buf = io.BytesIO()
    torch.onnx.export(model, (torch.randn(2, 1, 28, 28),), buf, export_params=True, opset_version=14,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING, input_names=["input"],
                      output_names=["logits"], dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    m = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(m)
    ops = {n.op_type for n in m.graph.node}
    if model.KIND not in ops:
        raise RuntimeError(f"the export has no {model.KIND} node: {sorted(ops)}")
    dirs = [onnx.helper.get_attribute_value(a).decode() for nd in m.graph.node if nd.op_type == model.KIND
            for a in nd.attribute if a.name == "direction"]
    if dirs != (["bidirectional"] if model.BIDIRECTIONAL else []):
        raise RuntimeError(f"the {model.KIND} node's direction attribute is {dirs}")
    onnx.save(m, path)
    return path


def check_no_tie_warning(par, name, path, tmp, env):
    """The exporter reads each of torch's weights through three Slices (its
    gate reordering): parts of one weight, which pipecc must not call an
    exporter's merge of equal initializers (a warning, and --untie copies)."""
    out = os.path.join(tmp, "plan_" + name.replace(" ", "_").replace("=", ""))
    r = subprocess.run([par.PIPECC, path, "--plan-only", "-o", out], capture_output=True, text=True, env=env)
    ok = r.returncode == 0 and not r.stderr
    par.result(ok, f"{name}: pipecc compiles the export without a warning",
               "" if ok else r.stderr.strip().splitlines()[0] if r.stderr.strip() else f"exit {r.returncode}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    par = load_parity()
    par.LOSS_RTOL = 1e-5     # run_case reads these: this test asks for 1e-5 on both
    par.WEIGHT_ATOL = 1e-5
    tmp = tempfile.mkdtemp(prefix="pipecc-rnn.")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PIPECC_CACHE=os.path.join(tmp, "machine.txt"))
    try:
        imgs, labels = par.make_dataset(par.N_SAMPLES, seed=3)
        datadir = os.path.join(tmp, "data")
        par.write_dataset(datadir, imgs, labels)
        torch.set_num_threads(1)
        for cls, kernels in ((LstmNet, ("k_lstm(", "k_lstm_grad(")), (GruNet, ("k_gru(", "k_gru_grad(")),
                             (BiLstmNet, ("k_lstm(", "k_lstm_grad("))):
            name = f"{cls.KIND} batch_first={cls.BATCH_FIRST}" + (" bidirectional" if cls.BIDIRECTIONAL else "")
            try:
                torch.manual_seed(7)
                path = export(cls(), os.path.join(tmp, cls.__name__ + ".onnx"))
                ref = par.torch_reference(cls, path, imgs, labels)
            except Exception as e:
                par.result(False, f"{name}: export and PyTorch reference", f"{type(e).__name__}: {e}")
                continue
            print(f"# {name}: torch losses {ref[0][0]:.4f} -> {ref[0][-1]:.4f} over {par.STEPS} steps")
            check_no_tie_warning(par, name, path, tmp, env)
            runs = {}
            for n, sched in ((1, "1f1b"), (2, "1f1b"), (2, "zb1")):
                tag = f"{name} n={n} {sched} (loss rel 1e-5, weights 1e-5)"
                casedir = os.path.join(tmp, f"{cls.__name__}_n{n}_{sched}")
                got = par.run_case(tag, path, n, sched, {}, datadir, casedir, env, ref)
                if isinstance(got, dict):
                    runs[(n, sched)] = got
                    code = "".join(open(f).read() for f in glob.glob(os.path.join(casedir, "out.pipe", "stage_*.c")))
                    missing = [k.rstrip("(") for k in kernels if k not in code]
                    par.result(not missing, f"{name} n={n} {sched}: the stage programs call {', '.join(k.rstrip('(') for k in kernels)}",
                               f"missing {missing}" if missing else "")
            what = f"{name}: n=1 1f1b, n=2 1f1b and n=2 zb1 give bit-identical weights"
            if len(runs) < 3:
                par.result(False, what, f"not checked: only {len(runs)} of 3 runs succeeded")
            else:
                first = list(runs.values())[0]
                par.result(all(r == first for r in runs.values()), what)
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
