#!/usr/bin/python3
"""Frozen layers (pipecc --frozen FILE) against PyTorch with requires_grad=False.

A parameterised layer is a compute node that reads a trained weight, in
topological order; `--frozen FILE` ("pipecc-frozen 1" / "layers N") freezes the
first N.  The reference is the same model in PyTorch, from the ONNX file's own
initializers, whose first N layers' parameters have requires_grad=False, trained
on the same batches and micro-batches with the same optimizer.  Checked, per
model and n:

  * every step's loss within 1e-5 relative of PyTorch's, every trained weight
    within 1e-5 (AdamW: the rounding-noise rule of test_async.py);
  * the frozen weights in the saved model are bit-identical to the initial ones;
  * the listing names the frozen layers PyTorch froze (first and last), and says
    where the backward stops; plan.json counts them;
  * n = 2 and n = 4 give bit-identical weights (fewer than two successful runs
    is a failure);
  * the planner sees it: the frozen layers' stages predict a cheaper backward
    (the predicted step of the frozen plan is below the unfrozen one's);
  * hostile FILEs are refused naming FILE:LINE, and a FILE freezing every layer
    (nothing left to train) is refused.

Models: LeNet (MNIST format, AdamW), the GPT (tokens, SGD) and the ResNet
(CIFAR format, SGD; --frozen at lr 0.002 with 4 micro-batches each normalised
with its own statistics as the reference does, and --freeze-at at lr 0.001 with
the whole batch as one micro-batch, PyTorch's own batch statistics; frozen BatchNorm layers still normalise with
batch statistics and move their running statistics, which are checked too).
Its running statistics are held to 1e-4 relative to 1 + |value|.  The reference starts from the file's
running statistics, not a fresh module's zeros and ones: an export in training mode runs the model once.
(From fresh ones it parted by 3e-2 with one micro-batch of 16, decaying with 0.9 per micro-batch.)

  /usr/bin/python3 tests/test_freeze.py [--quick] [--keep]

run.sh --val against PyTorch's model in eval mode: LeNet, a Conv-BatchNorm-Dropout-Linear net exported
in training mode (its eval forward: BatchNorm on running statistics, Dropout off) and the ResNet.

--quick (what make test runs): LeNet (--freeze-at at n = 2 and 4, so --frozen re-plans too; a
re-plan killed and resumed; --freeze auto against a PyTorch simulation of its rule), --val on LeNet
and the BatchNorm-Dropout net at n = 2, the refusals.  The whole suite: `make test-freeze`.
PIPECC overrides the pipecc binary.  Ends with "N passed, M failed, K skipped, R refused" (tests/tally.py).
"""
import argparse
import csv
import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
STEPS = 8
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


def load_module(name, rel):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ta = load_module("test_async_helpers", os.path.join("tests", "test_async.py"))
par = ta.par
result = ta.result


def onnx_layers(om, mapping):
    """The ONNX nodes (in file order) that read a trained weight, with the weights each reads."""
    out = []
    for nd in om.graph.node:
        ws = [i for i in nd.input if i in mapping]
        if ws:
            out.append((nd.name, ws))
    return out


class CifarData:
    """CIFAR-10-format files (bin/piperun-data cifar); step t takes samples [tB, (t+1)B), one micro-batch."""

    def __init__(self, tmp, B, M, steps):
        self.B, self.M = B, M
        self.path = os.path.join(tmp, "cifar")
        subprocess.run([DATAGEN, "cifar", self.path, "--n", str(B * steps), "--seed", "3"], check=True, capture_output=True)
        pm = load_module("test_parity_models", os.path.join("tests", "test_parity_models.py"))
        x, y = pm.read_cifar(self.path, B * steps)
        self.x, self.y = torch.from_numpy(np.asarray(x, dtype=np.float32)), torch.from_numpy(np.asarray(y, dtype=np.int64))

    def batches(self, t):
        mb = self.B // self.M
        return [(self.x[t * self.B + k * mb:t * self.B + (k + 1) * mb], self.y[t * self.B + k * mb:t * self.B + (k + 1) * mb])
                for k in range(self.M)]


def reference(build, onnx_path, data, opt_cfg, steps, nfrozen, at=0):
    """PyTorch with the first nfrozen layers' parameters frozen after step `at` (0: from the start;
    zero_grad(set_to_none=True), so a frozen parameter has no gradient and the optimizer skips it).
    Returns (losses, expected initializers, frozen initializer names, [first, last] frozen layer
    names, BatchNorm running statistics)."""
    om = onnx.load(onnx_path)
    torch.manual_seed(0)
    model = build() if callable(build) else build
    mapping, _ = load_state_from_onnx(model, om)
    layers = onnx_layers(om, mapping)
    frozen = sorted({w for _, ws in layers[:nfrozen] for w in ws})
    params = dict(model.named_parameters())
    model.train()
    opt = ta.make_optimizer(list(model.parameters()), opt_cfg)
    losses = []
    for t in range(steps):
        if t == at:
            for w in frozen:
                params[mapping[w][0]].requires_grad_(False)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        mbs = data.batches(t)
        for x, y in mbs:
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)) * (x.shape[0] / data.B)
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    want = par.expected_initializers(om, model, mapping)
    # BatchNorm running statistics, by their ONNX names (frozen BatchNorm layers still move them).
    init = {t.name for t in om.graph.initializer}
    stats = {k: v.detach().numpy().copy() for k, v in model.state_dict().items() if k in init and "running" in k}
    return np.array(losses), want, frozen, [layers[0][0], layers[nfrozen - 1][0]] if nfrozen else [], stats


def frozen_file(tmp, n):
    path = os.path.join(tmp, f"frozen{n}.txt")
    with open(path, "w") as f:
        f.write(f"pipecc-frozen 1\n# the first {n} parameterised layers\nlayers {n}\n")
    return path


def run_case(tmp, tag, onnx_path, n, B, M, opt_cfg, data, frozen, env, extra=()):
    out, log, saved = (os.path.join(tmp, f"{tag}.{x}") for x in ("pipe", "csv", "onnx"))
    cmd = [PIPECC, onnx_path, "-n", str(n), "--batch", str(B), "--microbatches", str(M), "--optimizer", opt_cfg["optimizer"],
           "--lr", repr(opt_cfg["lr"]), "--devices", DEVICES, "-o", out, *extra]
    if opt_cfg.get("weight_decay"):
        cmd += ["--weight-decay", repr(opt_cfg["weight_decay"])]
    if frozen:
        cmd += ["--frozen", frozen]
    par.run_cmd("pipecc", cmd, env)
    par.run_cmd("make", ["make", "-s", "-j2", "-C", out], env)
    par.run_cmd("run.sh", [os.path.join(out, "run.sh"), "--data", data.path, "--steps", str(STEPS), "--no-shuffle", "--quiet",
                           "--log", log, "--save", saved], env, cwd=tmp)
    losses = ta.read_log(log, STEPS)
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(saved).graph.initializer}
    with open(os.path.join(out, "plan.json")) as f:
        plan = json.load(f)
    with open(os.path.join(out, "schedule.txt")) as f:
        listing = f.read()
    return losses, inits, plan, listing


def model_case(tmp, env, name, build, path, data, B, M, opt_name, nfrozen, ns, tol=(ta.LOSS_RTOL, ta.WEIGHT_ATOL, 1e-3)):
    opt_cfg = ta.OPTS[opt_name]
    want_l, want_w, frozen, names, stats = reference(build, path, data, opt_cfg, STEPS, nfrozen)
    want_w = {k: v for k, v in want_w.items() if k not in stats}   # the statistics are checked on their own
    print(f"# {name}: {nfrozen} frozen layers ({', '.join(names)}), torch losses {want_l[0]:.4f} -> {want_l[-1]:.4f}")
    init = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    ff = frozen_file(tmp, nfrozen)
    runs, steps = {}, {}
    for n in ns:
        tag = f"{name}-n{n}"
        try:
            got_l, got_w, plan, listing = run_case(tmp, tag, path, n, B, M, opt_cfg, data, ff, env)
        except ta.StepFailed as e:
            result(False, f"{tag}: run", e.args[0])
            if e.args[1]:
                ta.note(par.tail(e.args[1], 20))
            continue
        ok = ta.compare(tag, f"first {nfrozen} layers frozen: matches PyTorch with requires_grad=False",
                        (got_l, {k: v for k, v in got_w.items() if k not in stats}),
                        (want_l, want_w, None), tol[0], tol[1], noise_atol=ta.noise_bound(opt_name))
        if stats:  # they sum every micro-batch's statistics' rounding: relative to 1 + |value|
            err = max(float((np.abs(got_w[k] - v) / (1 + np.abs(v))).max()) for k, v in stats.items())
            result(err < tol[2], f"{tag}: BatchNorm running statistics (frozen layers' too) within {tol[2]:g} of PyTorch, relative to "
                   "1 + |value|", f"max {err:.2e}")
        same = all(np.array_equal(got_w[w], init[w]) for w in frozen)
        result(same, f"{tag}: the {len(frozen)} frozen weights are bit-identical to the initial ones")
        head = f"frozen       {nfrozen} of "
        line = next((ln for ln in listing.splitlines() if ln.strip().startswith(head.strip())), "")
        result(bool(line) and names and names[0] in line and names[-1] in line,
               f"{tag}: the listing names the frozen layers ({names[0]} .. {names[-1]})", line.strip()[:200])
        result(plan.get("frozen_layers") == nfrozen, f"{tag}: plan.json counts {nfrozen} frozen layers",
               str(plan.get("frozen_layers")))
        if ok:
            runs[n] = got_w
        steps[n] = plan["predicted_step_time_s"]
    if len(ns) > 1:
        what = f"{name}: n={' and n='.join(map(str, ns))} give bit-identical weights"
        if len(runs) < 2:
            result(False, what, f"not checked: only {len(runs)} run(s) succeeded")
        else:
            g = list(runs.values())
            result(all(np.array_equal(g[0][k], x[k]) for x in g[1:] for k in g[0]), what)
    # The planner sees the frozen layers: a cheaper predicted step than the unfrozen plan's.
    n = ns[-1]
    try:
        cmd = [PIPECC, path, "-n", str(n), "--batch", str(B), "--microbatches", str(M), "--devices", DEVICES, "--plan-only",
               "-o", os.path.join(tmp, f"{name}-plain{n}.pipe")]
        par.run_cmd("pipecc", cmd, env)
        with open(os.path.join(tmp, f"{name}-plain{n}.pipe", "plan.json")) as f:
            plain = json.load(f)["predicted_step_time_s"]
        if n in steps:
            result(steps[n] < plain, f"{name} n={n}: the frozen plan predicts a shorter step ({steps[n] * 1e3:.3f} ms, "
                   f"unfrozen {plain * 1e3:.3f} ms)")
    except ta.StepFailed as e:
        result(False, f"{name} n={n}: unfrozen plan", e.args[0])


def freeze_at_case(tmp, env, name, build, path, data, B, M, opt_name, at, nfrozen, ns):
    """run.sh --freeze-at AT:N: the run stops after step AT, writes a freeze checkpoint, re-plans with
    the first N layers frozen and goes on; against PyTorch freezing them after step AT."""
    opt_cfg = ta.OPTS[opt_name]
    want_l, want_w, frozen, names, stats = reference(build, path, data, opt_cfg, STEPS, nfrozen, at)
    want_w = {k: v for k, v in want_w.items() if k not in stats}   # BatchNorm's running statistics: on their own below
    runs = {}
    for n in ns:
        tag = f"{name}-n{n} --freeze-at {at}:{nfrozen}"
        out, log, saved, ck = (os.path.join(tmp, f"{name}-fa{n}.{x}") for x in ("pipe", "csv", "onnx", "ck"))
        cmd = [PIPECC, path, "-n", str(n), "--batch", str(B), "--microbatches", str(M), "--optimizer", opt_cfg["optimizer"],
               "--lr", repr(opt_cfg["lr"]), "--devices", DEVICES, "-o", out]
        if opt_cfg.get("weight_decay"):
            cmd += ["--weight-decay", repr(opt_cfg["weight_decay"])]
        try:
            par.run_cmd("pipecc", cmd, env)
            par.run_cmd("make", ["make", "-s", "-j2", "-C", out], env)
            r = subprocess.run([os.path.join(out, "run.sh"), "--data", data.path, "--steps", str(STEPS), "--no-shuffle", "--log", log,
                                "--save", saved, "--checkpoint", ck, "--freeze-at", f"{at}:{nfrozen}"], capture_output=True,
                               text=True, env=env, cwd=tmp, timeout=600)
            if r.returncode:
                raise ta.StepFailed(f"run.sh exit {r.returncode}", r.stdout + r.stderr)
            got_l = ta.read_log(log, STEPS)
        except ta.StepFailed as e:
            result(False, f"{tag}: run", e.args[0])
            if e.args[1]:
                ta.note(par.tail(e.args[1], 25))
            continue
        new = out[:-len(".pipe")] + f".frozen{nfrozen}.pipe"
        said = [ln for ln in r.stdout.splitlines() if ln.startswith("run.sh:")]
        result(os.path.isdir(new) and any("cuts before" in ln for ln in said) and any("cuts after" in ln for ln in said) and
               any(names[0] in ln and names[-1] in ln for ln in said),
               f"{tag}: run.sh re-planned into {os.path.basename(new)} and said which layers froze and the cuts and predicted steps "
               "before and after", " | ".join(said)[:400])
        got_w = {t.name: numpy_helper.to_array(t) for t in onnx.load(saved).graph.initializer}
        if ta.compare(tag, f"matches PyTorch freezing the first {nfrozen} layers after step {at}",
                      (got_l, {k: v for k, v in got_w.items() if k not in stats}), (want_l, want_w, None),
                      noise_atol=ta.noise_bound(opt_name)):
            runs[n] = got_w
        if stats:
            err = max(float((np.abs(got_w[k] - v) / (1 + np.abs(v))).max()) for k, v in stats.items())
            result(err < 1e-4, f"{tag}: BatchNorm running statistics (frozen layers' too) within 1e-4 of PyTorch, relative to "
                   "1 + |value|", f"max {err:.2e}")
        at_freeze = {t.name: numpy_helper.to_array(t) for t in onnx.load(os.path.join(ck, f"freeze-{at}", "model.onnx")).graph.initializer}
        result(all(np.array_equal(got_w[w], at_freeze[w]) for w in frozen),
               f"{tag}: the frozen weights are bit-unchanged from the freeze step on")
    if len(ns) > 1:
        what = f"{name} --freeze-at: n={' and n='.join(map(str, ns))} give bit-identical weights"
        g = list(runs.values())
        result(len(g) >= 2 and all(np.array_equal(g[0][k], x[k]) for x in g[1:] for k in g[0]), what,
               "" if len(g) >= 2 else f"not checked: only {len(g)} run(s) succeeded")
    return runs


def auto_case(tmp, env, build, path, data, B, M, every=3, steps=12):
    """run.sh --freeze auto: a PyTorch simulation of the stated rule (each layer's gradient norm -
    its weights' gradients' norm - summed over each interval of `every` steps; after the second
    interval, the longest prefix whose relative change is below the threshold freezes) names the
    layers; a threshold halfway between the prefix's largest change and the next layer's makes the
    decision clear of rounding.  pipecc must freeze those layers after step 2*every and then match
    PyTorch freezing them there."""
    opt_cfg = ta.OPTS["sgd"]
    om = onnx.load(path)
    torch.manual_seed(0)
    model = build()
    mapping, _ = load_state_from_onnx(model, om)
    layers = onnx_layers(om, mapping)
    first = {}
    for li, (_, ws) in enumerate(layers):
        for w in ws:
            first.setdefault(w, li)
    params = dict(model.named_parameters())
    opt = ta.make_optimizer(list(model.parameters()), opt_cfg)
    sums = []
    cur = np.zeros(len(layers))
    for t in range(2 * every):
        opt.zero_grad(set_to_none=True)
        for x, y in data.batches(t):
            out = model(x)
            (F.cross_entropy(out, y) * (x.shape[0] / data.B)).backward()
        sq = np.zeros(len(layers))
        for w, li in first.items():
            g = params[mapping[w][0]].grad
            if g is not None:
                sq[li] += float((g.double() ** 2).sum())
        cur += np.sqrt(sq)
        opt.step()
        if (t + 1) % every == 0:
            sums.append(cur.copy())
            cur[:] = 0
    change = np.abs(sums[1] - sums[0]) / sums[0]
    # The prefixes a threshold can pick: N layers whose changes are all below the next layer's; or all
    # but the last layer (the rule never freezes that one), with a threshold above every change before it.
    order = [i for i in range(1, len(layers) - 1) if change[:i].max() < change[i]]
    if order:
        n = order[len(order) // 2]
        thr = (change[:n].max() + change[n]) / 2
    else:
        n = len(layers) - 1
        thr = 1.5 * change[:n].max()
    print(f"# --freeze auto: relative changes {np.round(change, 4).tolist()}: threshold {thr:.4g} freezes {n} layers after step {2 * every}")
    want_l, want_w, frozen, names, _ = reference(build, path, data, opt_cfg, steps, n, 2 * every)
    out, log, saved = (os.path.join(tmp, f"auto.{x}") for x in ("pipe", "csv", "onnx"))
    try:
        par.run_cmd("pipecc", [PIPECC, path, "-n", "2", "--batch", str(B), "--microbatches", str(M), "--lr", repr(opt_cfg["lr"]),
                               "--devices", DEVICES, "-o", out], env)
        par.run_cmd("make", ["make", "-s", "-j2", "-C", out], env)
        r = subprocess.run([os.path.join(out, "run.sh"), "--data", data.path, "--steps", str(steps), "--no-shuffle", "--log", log,
                            "--save", saved, "--freeze", "auto", "--freeze-every", str(every), "--freeze-threshold", repr(thr)],
                           capture_output=True, text=True, env=env, cwd=tmp, timeout=600)
        if r.returncode:
            raise ta.StepFailed(f"run.sh exit {r.returncode}", r.stdout + r.stderr)
        got_l = ta.read_log(log, steps)
    except ta.StepFailed as e:
        result(False, "--freeze auto: run", e.args[0])
        if e.args[1]:
            ta.note(par.tail(e.args[1], 25))
        return
    # A threshold of 0 would never freeze: refused, not replaced by the default.
    z = subprocess.run([os.path.join(out, "run.sh"), "--data", data.path, "--steps", "1", "--freeze", "auto", "--freeze-threshold", "0"],
                       capture_output=True, text=True, env=env, cwd=tmp, timeout=300)
    result(z.returncode == 2 and "--freeze-threshold must be above 0" in z.stderr, "--freeze auto --freeze-threshold 0 is refused, "
           "naming the flag", z.stderr.strip()[:200])
    said = [ln for ln in r.stdout.splitlines() if ln.startswith("run.sh: freeze after") or ln.startswith("freeze auto")]
    result(any(f"freeze after step {2 * every}: the first {n} " in ln for ln in said),
           f"--freeze auto froze the {n} layers the rule names after step {2 * every}", " | ".join(said)[:300])
    got_w = {t.name: numpy_helper.to_array(t) for t in onnx.load(saved).graph.initializer}
    ta.compare("--freeze auto", f"matches PyTorch freezing those {n} layers after step {2 * every}", (got_l, got_w),
               (want_l, want_w, None), noise_atol=ta.noise_bound("sgd"))


def load_state_from_onnx(model, om):
    """The ONNX file's weights and its float buffers (BatchNorm's running statistics, by name: an export
    in training mode runs the model once, so they are not a fresh module's zeros and ones)."""
    mapping = par.load_weights_from_onnx(model, om)
    inits = {t.name: numpy_helper.to_array(t) for t in om.graph.initializer}
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name in inits and buf.dtype == torch.float32:
                buf.copy_(torch.from_numpy(np.array(inits[name], dtype=np.float32)))
    return mapping


def val_case(tmp, env, name, build, path, data, val, B, M, ns, opt_cfg, steps=STEPS, every=4):
    """run.sh --val DIR --val-every K: the held-out set's loss (mean over its rows) and accuracy after
    steps K, 2K, ... against PyTorch's model in eval mode on the same samples, in whole batches.  The
    reference trains on the same micro-batches in train mode (each normalised with its own statistics,
    moving the running statistics in order, as the pipeline does); its eval mode is the eval forward
    pipecc emits (BatchNorm on the running statistics, Dropout off).  val = (vdir, vx, vy)."""
    vdir, vx, vy = val
    om = onnx.load(path)
    torch.manual_seed(0)
    model = build()
    load_state_from_onnx(model, om)
    opt = ta.make_optimizer(list(model.parameters()), opt_cfg)
    want = {}
    for t in range(steps):
        model.train()
        opt.zero_grad(set_to_none=True)
        for x, y in data.batches(t):
            (F.cross_entropy(model(x), y) * (x.shape[0] / data.B)).backward()
        opt.step()
        if (t + 1) % every == 0:
            model.eval()
            with torch.no_grad():
                out = model(vx)
                want[t + 1] = (F.cross_entropy(out, vy).item(), float((out.argmax(1) == vy).float().mean()))
    for n in ns:
        tag = f"{name}-n{n} --val"
        out, log = os.path.join(tmp, f"val-{name}{n}.pipe"), os.path.join(tmp, f"val-{name}{n}.csv")
        try:
            par.run_cmd("pipecc", [PIPECC, path, "-n", str(n), "--batch", str(B), "--microbatches", str(M), "--lr", repr(opt_cfg["lr"]),
                                   "--devices", DEVICES, "-o", out], env)
            par.run_cmd("make", ["make", "-s", "-j2", "-C", out], env)
            par.run_cmd("run.sh", [os.path.join(out, "run.sh"), "--data", data.path, "--steps", str(steps), "--no-shuffle", "--quiet",
                                   "--log", log, "--val", vdir, "--val-every", str(every)], env, cwd=tmp)
            with open(log + ".val.csv") as f:
                rows = {int(r["step"]): (float(r["val_loss"]), float(r["val_accuracy"])) for r in csv.DictReader(f)}
            evals = sum("forward_eval(" in open(os.path.join(out, f"stage_{k}.c")).read() for k in range(n))
        except (ta.StepFailed, OSError, KeyError, ValueError) as e:
            result(False, f"{tag}: run", str(e.args[0] if e.args else e))
            continue
        nrows = len(vy)   # accuracy: the same count of rows right (PyTorch's mean is float32)
        ok = rows.keys() == want.keys() and all(abs(rows[k][0] - want[k][0]) <= 1e-5 * abs(want[k][0]) and
                                                 round(rows[k][1] * nrows) == round(want[k][1] * nrows) for k in want)
        result(ok, f"{tag}: the held-out loss (1e-5 relative) and accuracy (exactly) after steps {sorted(want)} match PyTorch in eval mode"
                   f" ({evals} stage(s) with an eval forward)", f"pipecc {rows}, PyTorch {want}")


def val_offload_case(tmp, env, path, data, B, M):
    """--val under the memory plan (the leanest --mem-limit, file offload): the held-out pass receives and
    computes its offloaded values in copy 0 of the leaving block, and prints what the plain plan prints.
    Both plans take --conv gemm: at the leanest limit oneDNN's 96 KiB a convolution do not fit, the plan
    falls back to im2col (its listing says so), and the two algorithms round differently under some
    OpenBLAS kernels (Haswell's: the 9th digit)."""
    tag = "lenet-n2 --val --offload file"
    out, log, off, plain, plain_log = (os.path.join(tmp, f"valoff.{x}") for x in ("pipe", "csv", "dir", "plain.pipe", "plain.csv"))
    os.makedirs(off, exist_ok=True)
    common = [PIPECC, path, "-n", "2", "--batch", str(B), "--microbatches", str(M), "--lr", repr(ta.OPTS["sgd"]["lr"]), "--devices", DEVICES,
              "--conv", "gemm"]
    memory = ["--offload", f"file:{off}", "--recompute", "none"]
    r = subprocess.run(common + memory + ["--mem-limit", "1K", "-o", out], capture_output=True, text=True, env=env)
    import re
    m = re.search(r"at least (\d+)K", r.stderr)
    if not m:
        result(False, f"{tag}: setup", r.stderr.strip()[-300:])
        return
    run = [os.path.join("{}", "run.sh"), "--data", data.path, "--steps", str(STEPS), "--no-shuffle", "--quiet", "--val", os.path.join(tmp, "val"),
           "--val-every", "4"]
    try:
        par.run_cmd("pipecc", common + memory + ["--mem-limit", m.group(1) + "K", "-o", out], env)
        par.run_cmd("pipecc", common + ["-o", plain], env)
        offloads = "XSLOT_BASE" in open(os.path.join(out, "stage_0.c")).read()
        for d, lg in ((out, log), (plain, plain_log)):
            par.run_cmd("make", ["make", "-s", "-j2", "-C", d], env)
            par.run_cmd("run.sh", [run[0].format(d), *run[1:], "--log", lg], env, cwd=tmp)
        got, want = open(log + ".val.csv").read(), open(plain_log + ".val.csv").read()
    except (ta.StepFailed, OSError) as e:
        result(False, f"{tag}: run", str(e.args[0] if e.args else e))
        return
    result(offloads and got == want, f"{tag} (--mem-limit {m.group(1)}K, stage 0 offloads: {offloads}): the same held-out loss and "
                                     "accuracy as the plain plan, bit for bit", f"{got!r} vs {want!r}")


def mnist_val(tmp, B):
    """A held-out set in MNIST format: 3 whole batches (and 5 samples left over, not used)."""
    vdir = os.path.join(tmp, "val")
    vimgs, vlabels = par.make_dataset(3 * B + 5, seed=11)
    par.write_dataset(vdir, vimgs, vlabels)
    vx = torch.from_numpy(vimgs.astype(np.float32) / np.float32(255.0)).reshape(-1, 1, 28, 28)[:3 * B]
    return vdir, vx, torch.from_numpy(vlabels.astype(np.int64))[:3 * B]


def cifar_val(tmp, B):
    """A held-out set in CIFAR-10 format (another seed than the training set's): 2 whole batches."""
    vdir = os.path.join(tmp, "valcifar")
    subprocess.run([DATAGEN, "cifar", vdir, "--n", str(2 * B), "--seed", "17"], check=True, capture_output=True)
    pm = load_module("test_parity_models", os.path.join("tests", "test_parity_models.py"))
    x, y = pm.read_cifar(vdir, 2 * B)
    return vdir, torch.from_numpy(np.asarray(x, dtype=np.float32)), torch.from_numpy(np.asarray(y, dtype=np.int64))


class BnDropNet(torch.nn.Module):
    """Both ops whose eval forward differs: a training-mode BatchNorm and a Dropout (exported in training mode)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, stride=2)
        self.bn = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(0.3)
        self.fc = torch.nn.Linear(4 * 13 * 13, 10)

    def forward(self, x):
        return self.fc(self.drop(torch.flatten(torch.relu(self.bn(self.conv(x))), 1)))


def bndrop_val_case(tmp, env, data, B, M, ns):
    """--val on BnDropNet at lr 0: training moves only the running statistics (Dropout's masks, which
    PyTorch draws otherwise, then change nothing), and the held-out pass must use them and drop nothing."""
    path = os.path.join(tmp, "bndrop.onnx")
    torch.manual_seed(5)
    m = BnDropNet()
    torch.onnx.export(m, (torch.randn(2, 1, 28, 28),), path, opset_version=13, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    val_case(tmp, env, "bndrop", BnDropNet, path, data, mnist_val(tmp, B), B, M, ns, dict(optimizer="sgd", lr=0.0), steps=2, every=1)


def killed_replan_case(tmp, env, path, data, B, M, want):
    """A run killed while run.sh re-plans (during make), then run.sh --resume CK: the same weights."""
    out, log, saved, ck = (os.path.join(tmp, f"kill.{x}") for x in ("pipe", "csv", "onnx", "ck"))
    new = os.path.join(tmp, "kill.frozen2.pipe")
    try:
        par.run_cmd("pipecc", [PIPECC, path, "-n", "2", "--batch", str(B), "--microbatches", str(M), "--optimizer", "adamw", "--lr",
                               repr(ta.OPTS["adamw"]["lr"]), "--weight-decay", repr(ta.OPTS["adamw"]["weight_decay"]), "--devices",
                               DEVICES, "-o", out], env)
        par.run_cmd("make", ["make", "-s", "-j2", "-C", out], env)
    except ta.StepFailed as e:
        return result(False, "killed re-plan: setup", e.args[0])
    args = ["--data", data.path, "--steps", str(STEPS), "--no-shuffle", "--quiet", "--log", log, "--save", saved, "--checkpoint", ck,
            "--freeze-at", "3:2"]
    p = subprocess.Popen([os.path.join(out, "run.sh")] + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tmp,
                         start_new_session=True)
    t0, killed = time.time(), False
    while p.poll() is None and time.time() - t0 < 300:
        if os.path.exists(os.path.join(new, "plan.json")):   # pipecc is done: make is building
            os.killpg(p.pid, 9)
            killed = True
            break
        time.sleep(0.01)
    p.wait()
    if not result(killed, "killed re-plan: the run was killed while run.sh re-planned", f"exit {p.returncode}"):
        return
    r = subprocess.run([os.path.join(out, "run.sh")] + args[:-2] + ["--resume", ck], capture_output=True, text=True, env=env, cwd=tmp,
                       timeout=600)
    ok = r.returncode == 0 and os.path.exists(saved)
    got = {t.name: numpy_helper.to_array(t) for t in onnx.load(saved).graph.initializer} if ok else {}
    same = ok and got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    result(same, "killed re-plan: run.sh --resume CK re-plans again and ends with the uninterrupted run's weights, bit for bit",
           "" if ok else par.tail(r.stdout + r.stderr, 10))


def refusals(tmp, env):
    lenet = os.path.join(ROOT, "onnx_models", "lenet.onnx")
    cases = [("no header", "layers 1\n", ":1:"), ("a bad count", "pipecc-frozen 1\nlayers x\n", ":2:"),
             ("a negative count", "pipecc-frozen 1\nlayers -1\n", ":2:"), ("two counts", "pipecc-frozen 1\nlayers 1\nlayers 2\n", ":3:"),
             ("no count", "pipecc-frozen 1\n", "no 'layers N'"), ("more layers than the model has", "pipecc-frozen 1\nlayers 99\n", "has 5"),
             ("every layer", "pipecc-frozen 1\nlayers 5\n", "no trained weight"), ("binary junk", "pipecc-frozen 1\n\x00\xff\n", ":2:")]
    for what, text, want in cases:
        path = os.path.join(tmp, "bad_frozen.txt")
        with open(path, "w", encoding="latin-1") as f:
            f.write(text)
        out = os.path.join(tmp, "bad.pipe")
        r = subprocess.run([PIPECC, lenet, "-n", "2", "--frozen", path, "-o", out], capture_output=True, text=True, env=env)
        result(r.returncode == 2 and r.stderr.startswith("pipecc: error: --frozen") and want in r.stderr and not os.path.exists(out),
               f"--frozen with {what} is refused ({want})", r.stderr.strip()[:200])
    r = subprocess.run([PIPECC, lenet, "-n", "2", "--frozen", os.path.join(tmp, "missing.txt"), "-o", os.path.join(tmp, "m.pipe")],
                       capture_output=True, text=True, env=env)
    result(r.returncode == 2 and "cannot read" in r.stderr, "--frozen with a missing file is refused", r.stderr.strip()[:200])
    replan_refusals(tmp, env, lenet)


def replan_refusals(tmp, env, lenet):
    """Issue 34, items 9 and 16: run.sh --resume of a freeze checkpoint re-plans into NAME.frozenN.pipe.  A directory
    there holding what pipecc did not write (a trained model, notes) is refused by pipecc -o's own check, not
    removed (run.sh rm -rf'd it); the checkpoint's frozen.txt a FIFO is refused, not waited on."""
    out, new, ck = (os.path.join(tmp, x) for x in ("rp.pipe", "rp.frozen1.pipe", "rp-ck"))
    sub = os.path.join(ck, "freeze-3")
    os.makedirs(sub)
    shutil.copy(lenet, os.path.join(sub, "model.onnx"))
    with open(os.path.join(sub, "frozen.txt"), "w") as f:
        f.write("pipecc-frozen 1\nlayers 1\n")
    with open(os.path.join(ck, "FREEZE"), "w") as f:
        f.write("pipecc-freeze 1\nstep 3\nlayers 1\ndir freeze-3\nelapsed 0\n")
    for d in (out, new):   # new: a re-plan's directory, as a killed one leaves it (pipecc's plan.json and run.sh)
        r = subprocess.run([PIPECC, lenet, "-n", "2", "--devices", DEVICES, "-o", d], capture_output=True, text=True, env=env)
        if not result(r.returncode == 0, f"re-plan refusals: pipecc -o {os.path.basename(d)}", r.stderr.strip()[-200:]):
            return
    mine = {"trained.onnx": b"days of training", "notes.txt": b"what I tried"}
    for k, v in mine.items():
        with open(os.path.join(new, k), "wb") as f:
            f.write(v)

    def resume(timeout):
        p = subprocess.Popen([os.path.join(out, "run.sh"), "--data", tmp, "--steps", "5", "--quiet", "--resume", ck], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=tmp, start_new_session=True)
        try:
            o, e = p.communicate(timeout=timeout)
            return p.returncode, e
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            return None, p.communicate()[1] + f" [still running after {timeout} s: killed]"

    rc, err = resume(600)
    kept = all(os.path.exists(os.path.join(new, k)) and open(os.path.join(new, k), "rb").read() == v for k, v in mine.items())
    result(rc == 2 and kept and "trained.onnx" in err and "cannot re-plan" in err and os.path.exists(os.path.join(new, "plan.json")),
           "a re-plan into a directory holding a trained model and notes is refused by pipecc -o's check, nothing removed",
           f"rc {rc}, files kept: {kept}: {err.strip()[-300:]}")
    shutil.rmtree(new)
    os.remove(os.path.join(sub, "frozen.txt"))
    os.mkfifo(os.path.join(sub, "frozen.txt"))
    rc, err = resume(60)
    result(rc == 2 and "frozen.txt" in err and "not a regular file" in err and not os.path.exists(new),
           "a freeze checkpoint whose frozen.txt is a FIFO is refused at once, not waited on", f"rc {rc}: {err.strip()[-300:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="pipecc-freeze.")
    os.environ["PIPECC_CACHE"] = os.path.join(tmp, "machine.txt")
    os.environ["OMPI_ALLOW_RUN_AS_ROOT"] = os.environ["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env = dict(os.environ)
    t0 = time.time()
    try:
        ex = load_module("pipecc_onnx_export", os.path.join("onnx_models", "export.py"))
        images = ta.ImageData(tmp, 32, 4, STEPS)
        if not args.quick:
            model_case(tmp, env, "lenet", ex.LeNet5, os.path.join(ROOT, "onnx_models", "lenet.onnx"), images, 32, 4, "adamw", 2, (2, 4))
        tokens = ta.TokenData(tmp, 16, 4, 32)
        if not args.quick:
            model_case(tmp, env, "gpt", ex.GPT, os.path.join(ROOT, "onnx_models", "gpt.onnx"), tokens, 16, 4, "sgd", 6, (2, 4))
        runs = freeze_at_case(tmp, env, "lenet", ex.LeNet5, os.path.join(ROOT, "onnx_models", "lenet.onnx"), images, 32, 4, "adamw", 3, 2,
                              (2, 4))
        if 2 in runs:
            killed_replan_case(tmp, env, os.path.join(ROOT, "onnx_models", "lenet.onnx"), images, 32, 4, runs[2])
        os.makedirs(os.path.join(tmp, "auto"))
        auto_data = ta.ImageData(os.path.join(tmp, "auto"), 32, 4, 12)   # 12 steps: two intervals of 3, then six more
        auto_case(tmp, env, ex.LeNet5, os.path.join(ROOT, "onnx_models", "lenet.onnx"), auto_data, 32, 4)
        if not args.quick:
            freeze_at_case(tmp, env, "gpt", ex.GPT, os.path.join(ROOT, "onnx_models", "gpt.onnx"), tokens, 16, 4, "sgd", 4, 6, (2, 4))
            # As test_parity_models.py: 4 micro-batches normalised each with its own statistics, in order (GPipe's
            # BatchNorm, which the reference runs too), lr 0.002 (at 0.05 this ResNet's own float32 and float64 runs part).
            cifar = CifarData(tmp, 32, 4, STEPS)
            ta.OPTS["sgd_small"] = dict(optimizer="sgd", lr=0.002)
            model_case(tmp, env, "resnet", ex.SmallResNet, os.path.join(ROOT, "onnx_models", "resnet.onnx"), cifar, 32, 4, "sgd_small", 4,
                       (2, 4), tol=(ta.LOSS_RTOL, ta.WEIGHT_ATOL, 1e-4))
            # The whole batch as one micro-batch (BatchNorm's statistics are then PyTorch's of the batch), --freeze-at
            # after step 3, lr 0.001 (this ResNet's float32 runs part past 1e-5 within 8 steps at 0.002 with M = 1).
            os.makedirs(os.path.join(tmp, "m1"), exist_ok=True)
            cifar1 = CifarData(os.path.join(tmp, "m1"), 32, 1, STEPS)
            ta.OPTS["sgd_tiny"] = dict(optimizer="sgd", lr=0.001)
            freeze_at_case(tmp, env, "resnet-m1", ex.SmallResNet, os.path.join(ROOT, "onnx_models", "resnet.onnx"), cifar1, 32, 1,
                           "sgd_tiny", 3, 4, (2, 4))
        val_case(tmp, env, "lenet", ex.LeNet5, os.path.join(ROOT, "onnx_models", "lenet.onnx"), images, mnist_val(tmp, 32), 32, 4,
                 (2,) if args.quick else (2, 4), ta.OPTS["sgd"])
        val_offload_case(tmp, env, os.path.join(ROOT, "onnx_models", "lenet.onnx"), images, 32, 4)
        bndrop_val_case(tmp, env, images, 32, 4, (2,) if args.quick else (2, 4))
        if not args.quick:
            val_case(tmp, env, "resnet", ex.SmallResNet, os.path.join(ROOT, "onnx_models", "resnet.onnx"), cifar, cifar_val(tmp, 32), 32, 4,
                     (2, 4), ta.OPTS["sgd_small"])
        refusals(tmp, env)
    except Exception as e:  # noqa: BLE001
        import traceback
        result(False, "setup", f"{type(e).__name__}: {e}")
        ta.note(traceback.format_exc())
    finally:
        if args.keep:
            print(f"# kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {time.time() - t0:.0f} s")
    return tally.finish()   # the one tally: what the imported suite's helpers counted is in it


if __name__ == "__main__":
    sys.exit(main())
