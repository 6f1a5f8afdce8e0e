#!/usr/bin/python3
"""Asynchronous pipeline training (--schedule async --staleness K) against a
single-process PyTorch simulation of the stated rule.

The rule, exact and the same on every stage: step t (from 0) runs the forward
and backward of all its micro-batches on the weights W_{max(0, t-K)}; the
optimizer then applies the step's summed gradient (the gradient of the batch's
mean loss: each micro-batch's loss scaled by mb/B, summed over the micro-batches
in order) to the NEWEST weights:

    W_{t+1} = update(W_t, g(W_{t-K}; batch t))

SGD: W_{t+1} = W_t - lr*g; momentum, Adam and AdamW apply torch.optim's rule to
that gradient (weight decay reads the newest weights W_t: the simulation sets
p.grad = g on the newest model and calls opt.step()).  The loss logged for step
t is the loss of step t's micro-batches on W_{max(0, t-K)}.  K = 0 would be
synchronous training.

async_reference() simulates it: it keeps the last K+1 weight versions, loads
W_{max(0,t-K)} into a work model, runs step t's micro-batches there (the
micro-batch split and order of the synchronous references), copies the summed
gradient onto the newest model's .grad and steps the newest model's optimizer.

Models: the sample mlp.onnx and lenet.onnx (MNIST-format IDX data from
test_parity.make_dataset, B = 32, M = 8) and gpt.onnx (uint16 tokens from
bin/piperun-data, llm.c batches with next-token labels, B = 16, M = 8, T = 32);
n = 2 and 4; K = 1 and 2; optimizers sgd (lr 0.05) and adamw (lr 1e-3, weight
decay 0.01); STEPS steps, --no-shuffle.  M = 8 for both n, so that n = 2 and
n = 4 sum the same micro-batches.  Checked:

  * the simulation itself: with K = 0 it equals the synchronous references
    (test_parity.torch_reference, one full batch per step, for mlp/lenet;
    gpt_parity's micro-batched loop for the GPT) within 1e-5 (it prints the
    maximum differences);
  * per async run: every step's loss (LOG.csv) within 1e-5 relative of the
    simulation's, every trained initializer in the saved ONNX within 1e-5
    absolute of the simulation's final weights.  One exception, under AdamW:
    elements whose gradient is only float rounding noise at every step (the
    GPT's 4 x 64 attention key biases, which softmax makes gradient-free) move
    by about lr per step in the noise's sign, which no two programs share, so
    they are held to 4 * lr * steps instead (see NOISE_REL; their count and
    largest difference are printed);
  * per model, K = 1: a synchronous 1F1B run (n = 2, sgd) matches the K = 0
    simulation within the same bounds, and the async run's weights differ from
    it by more than 1e-6 (the schedule really is asynchronous);
  * per (model, K, optimizer): n = 2 and n = 4 give bit-identical weights
    (fewer than two successful runs is a failure, not a pass);
  * refusals (exit status 2, stderr starting "pipecc: error:" and naming the
    flag, no output directory): --staleness without --schedule async (or with
    1f1b; the message names async),
    --staleness 0, --staleness x, and async with too few micro-batches
    (n = 4, M = 1, K = 1), whose message names the smallest M: compiling with
    that M succeeds and with one fewer is refused.

When a run disagrees with the simulation, the step that first diverges is named
and the run's losses are compared with simulations at other staleness values,
which usually tells an off-by-one from a wrong rule.

  /usr/bin/python3 tests/test_async.py           # everything (24 async runs, 3 sync runs)
  /usr/bin/python3 tests/test_async.py --quick   # mlp n=2,4 and gpt n=2 K=1 sgd, lenet n=4 K=2 adamw, resume,
                                                 # one sync run, the refusals (what make test runs)
  --keep         keep the temp dir (its path is printed)
  --model NAME   only this model (mlp, lenet, gpt; repeatable)

PIPECC overrides the pipecc binary.  Ends with "N passed, M failed, K skipped, R refused" (tests/tally.py); exit 1 on
any failure.
"""
import argparse
import collections
import copy
import csv
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")

STEPS = 8
IMG_B, IMG_M = 32, 8          # images: batch, micro-batches (M = 2n for n = 4, used for n = 2 as well)
GPT_B, GPT_M, GPT_T = 16, 8, 32
OPTS = {"sgd": dict(optimizer="sgd", lr=0.05),
        "adamw": dict(optimizer="adamw", lr=1e-3, weight_decay=0.01)}
LOSS_RTOL = 1e-5              # per-step loss, relative
WEIGHT_ATOL = 1e-5            # trained initializers, absolute
SIM_TOL = 1e-5                # the K = 0 simulation against the synchronous references
ASYNC_DIFF_MIN = 1e-6         # async K = 1 weights must differ from sync weights by more than this
# Adam/AdamW divide by sqrt(v) + 1e-8, so an element whose true gradient is zero but whose
# computed gradient is float rounding noise (the GPT's attention key biases: softmax ignores
# q.b_k, the same for every key; their gradients are 1e-10 of the tensor's largest) steps by
# about lr in the noise's sign, which no two programs share.  Such elements (gradient at most
# NOISE_REL of the tensor's largest at every step; real small gradients here are above 2e-6)
# are held to NOISE_ATOL_STEPS * lr * steps instead of WEIGHT_ATOL.
NOISE_REL = 1e-7
NOISE_ATOL_STEPS = 4.0

warnings.filterwarnings("ignore", category=UserWarning)

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
    sys.stdout.flush()


def load_module(name, relpath):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relpath))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


par = load_module("pipecc_parity", os.path.join("tests", "test_parity.py"))   # helpers
StepFailed = par.StepFailed


# --------------------------------------------------------------------------
# The simulation
# --------------------------------------------------------------------------

def make_optimizer(params, cfg):
    """torch.optim for an optimizer config: optimizer sgd|adam|adamw, lr, momentum, weight_decay."""
    kind, lr, wd = cfg.get("optimizer", "sgd"), cfg["lr"], cfg.get("weight_decay", 0.0)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.get("momentum", 0.0), weight_decay=wd)
    raise ValueError(f"unknown optimizer {kind!r}")


def async_reference(model_builder_or_model, onnx_path, batches_fn, K, opt_cfg, steps):
    """Train `steps` steps under the asynchronous rule with staleness K (K = 0:
    synchronous), starting from the ONNX file's initializers.

    batches_fn(t) -> [(x, y), ...]: step t's micro-batches, in order; the loss of
    each is cross-entropy over its rows (every position, for a language model)
    scaled by its share of the batch.  Returns (per-step losses, the trained
    initializers as test_parity.expected_initializers gives them, noise) where
    noise maps an initializer to the mask of its elements whose gradient was
    rounding noise at every step (nonzero, at most NOISE_REL of the tensor's
    largest): under Adam/AdamW those follow the noise's sign (see NOISE_REL);
    empty for SGD."""
    torch.set_num_threads(1)
    om = onnx.load(onnx_path)
    if isinstance(model_builder_or_model, nn.Module):
        newest = model_builder_or_model
    else:
        # The sample models were exported from seed 0; initializers that constant folding
        # renamed (the GPT's transposed weights) are matched to parameters by value.
        torch.manual_seed(0)
        newest = model_builder_or_model()
    mapping, _ = par.load_weights_from_onnx(newest, om)
    newest.train()
    work = copy.deepcopy(newest)
    work.train()
    new_params = dict(newest.named_parameters())
    work_params = dict(work.named_parameters())
    opt = make_optimizer(newest.parameters(), opt_cfg)
    snap = lambda: {k: p.detach().clone() for k, p in new_params.items()}
    versions = collections.deque([snap()], maxlen=K + 1)    # versions[-1] = W_t, versions[0] = W_{max(0,t-K)}
    losses = []
    noise_rel, nonzero = {}, {}   # per parameter: max over steps of |g| / max |g|, and whether g was ever nonzero
    for t in range(steps):
        stale = versions[0]
        with torch.no_grad():
            for k, p in work_params.items():
                p.copy_(stale[k])
                p.grad = None
        mbs = batches_fn(t)
        batch = sum(int(x.shape[0]) for x, _ in mbs)
        total = 0.0
        for x, y in mbs:
            out = work(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)) * (x.shape[0] / batch)
            loss.backward()
            total += loss.item()
        losses.append(total)
        opt.zero_grad()
        for k, p in new_params.items():
            g = work_params[k].grad
            p.grad = None if g is None else g.detach().clone()
        for k, p in new_params.items():
            if p.grad is not None:
                a = p.grad.detach().abs()
                rel = a / max(float(a.max()), 1e-30)
                noise_rel[k] = rel if k not in noise_rel else torch.maximum(noise_rel[k], rel)
                nonzero[k] = (a > 0) if k not in nonzero else (nonzero[k] | (a > 0))
        opt.step()
        versions.append(snap())
    noise = {}
    if opt_cfg.get("optimizer") in ("adam", "adamw"):
        for name, (key, transposed) in mapping.items():
            if key in noise_rel:
                mask = ((noise_rel[key] <= NOISE_REL) & nonzero[key]).numpy()
                if mask.any():
                    noise[name] = np.ascontiguousarray(mask.T if transposed else mask)
    return np.array(losses, dtype=np.float64), par.expected_initializers(om, newest, mapping), noise


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

class ImageData:
    """MNIST-format IDX files of STEPS*B samples; step t takes samples [tB, (t+1)B)."""

    def __init__(self, tmp, B, M, steps):
        self.B, self.M = B, M
        self.imgs, self.labels = par.make_dataset(steps * B)
        self.path = os.path.join(tmp, "images")
        par.write_dataset(self.path, self.imgs, self.labels)
        self.x = torch.from_numpy(self.imgs.astype(np.float32) / np.float32(255.0)).reshape(-1, 1, 28, 28)
        self.y = torch.from_numpy(self.labels.astype(np.int64))

    def batches(self, t):
        mb = self.B // self.M
        return [(self.x[t * self.B + k * mb:t * self.B + (k + 1) * mb], self.y[t * self.B + k * mb:t * self.B + (k + 1) * mb])
                for k in range(self.M)]


class TokenData:
    """A uint16 token file (bin/piperun-data tokens); llm.c's batches: step t
    starts at (t mod nb)*B*T, micro-batch k holds mb sequences from there plus
    k*mb*T, labels shifted by one token (as test_parity_models.gpt_parity)."""

    def __init__(self, tmp, B, M, T):
        self.B, self.M, self.T = B, M, T
        self.path = os.path.join(tmp, "tokens.bin")
        subprocess.run([DATAGEN, "tokens", self.path, "--n", "20000", "--vocab", "64", "--seed", "5"],
                       check=True, capture_output=True)
        self.tok = np.fromfile(self.path, dtype=np.uint16).astype(np.int64)

    def batches(self, t):
        B, M, T = self.B, self.M, self.T
        nb = (len(self.tok) - 1) // (B * T)
        start, mb = (t % nb) * B * T, B // M
        out = []
        for k in range(M):
            lo = start + k * mb * T
            out.append((torch.from_numpy(self.tok[lo:lo + mb * T].reshape(mb, T)),
                        torch.from_numpy(self.tok[lo + 1:lo + 1 + mb * T].reshape(mb, T))))
        return out


def gpt_sync_loop(ex, onnx_path, data, opt_cfg, steps):
    """test_parity_models.gpt_parity's reference loop (optimizer generalised):
    the K = 0 check of the simulation for the GPT."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ex.GPT()
    om = onnx.load(onnx_path)
    mapping, _ = par.load_weights_from_onnx(model, om)
    opt = make_optimizer(model.parameters(), opt_cfg)
    B, M, T = data.B, data.M, data.T
    nb = (len(data.tok) - 1) // (B * T)
    mb = B // M
    tok = data.tok
    want = []
    for s in range(steps):
        start = (s % nb) * B * T
        opt.zero_grad()
        total = 0.0
        for k in range(M):
            lo = start + k * mb * T
            x = torch.from_numpy(tok[lo:lo + mb * T].reshape(mb, T))
            y = torch.from_numpy(tok[lo + 1:lo + 1 + mb * T].reshape(mb, T))
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)) * (mb / B)
            loss.backward()
            total += loss.item()
        opt.step()
        want.append(total)
    return np.array(want, dtype=np.float64), par.expected_initializers(om, model, mapping)


def image_sync_reference(build, onnx_path, data, opt_cfg, steps):
    """test_parity.torch_reference (one full-batch forward per step) for this B and STEPS."""
    par.B, par.STEPS = data.B, steps
    return par.torch_reference(build, onnx_path, data.imgs, data.labels, momentum=opt_cfg.get("momentum", 0.0),
                               weight_decay=opt_cfg.get("weight_decay", 0.0), optimizer=opt_cfg.get("optimizer", "sgd"),
                               lr=opt_cfg["lr"])


# --------------------------------------------------------------------------
# pipecc runs
# --------------------------------------------------------------------------

def pipecc_cmd(onnx_path, n, out, B, M, opt_cfg, schedule, K=None):
    cmd = [PIPECC, onnx_path, "-n", str(n), "--schedule", schedule]
    if K is not None:
        cmd += ["--staleness", str(K)]
    cmd += ["--batch", str(B), "--microbatches", str(M), "--optimizer", opt_cfg.get("optimizer", "sgd"),
            "--lr", repr(opt_cfg["lr"])]
    if opt_cfg.get("momentum"):
        cmd += ["--momentum", repr(opt_cfg["momentum"])]
    if opt_cfg.get("weight_decay"):
        cmd += ["--weight-decay", repr(opt_cfg["weight_decay"])]
    return cmd + ["--devices", DEVICES, "-o", out]


def read_log(path, steps):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows or "step" not in rows[0] or "loss" not in rows[0]:
        raise StepFailed(f"{path}: no step,loss columns", "")
    got = [int(r["step"]) for r in rows]
    if got != list(range(1, steps + 1)):
        raise StepFailed(f"{path}: steps {got}, want 1..{steps}", "")
    return np.array([float(r["loss"]) for r in rows], dtype=np.float64)


def train(casedir, onnx_path, n, B, M, opt_cfg, schedule, K, data_path, env):
    """Compile, build, train STEPS steps.  Returns (losses, initializers);
    raises StepFailed."""
    os.makedirs(casedir, exist_ok=True)
    out, log, saved = (os.path.join(casedir, f) for f in ("out.pipe", "log.csv", "trained.onnx"))
    par.run_cmd("pipecc", pipecc_cmd(onnx_path, n, out, B, M, opt_cfg, schedule, K), env)
    par.run_cmd("make", ["make", "-s", "-C", out, "-j2"], env)
    par.run_cmd("run.sh", [os.path.join(out, "run.sh"), "--data", data_path, "--steps", str(STEPS), "--no-shuffle",
                           "--quiet", "--log", log, "--save", saved], env, cwd=casedir)
    for p in (log, saved):
        if not os.path.exists(p):
            raise StepFailed(f"run.sh wrote no {p}", "")
    losses = read_log(log, STEPS)
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(saved).graph.initializer}
    return losses, inits


def resume_check(casedir, onnx_path, n, B, M, opt_cfg, K, data_path, env, full):
    """A run stopped by a checkpoint half way and resumed gives the uninterrupted run's losses and
    weights bit for bit: the checkpoint holds the newest weights, the K older versions the next
    steps compute on, and the optimizer state; the resumed run refills the pipeline from them."""
    tag = f"n={n} K={K}: a checkpoint at step {STEPS // 2} and --resume"
    os.makedirs(casedir, exist_ok=True)
    out, log, saved, ck = (os.path.join(casedir, f) for f in ("out.pipe", "log.csv", "trained.onnx", "ck"))
    try:
        par.run_cmd("pipecc", pipecc_cmd(onnx_path, n, out, B, M, opt_cfg, "async", K), env)
        par.run_cmd("make", ["make", "-s", "-C", out, "-j2"], env)
        run = [os.path.join(out, "run.sh"), "--data", data_path, "--no-shuffle", "--quiet", "--log", log]
        par.run_cmd("run.sh", run + ["--steps", str(STEPS // 2), "--checkpoint", ck, "--checkpoint-every", str(STEPS // 2)], env, cwd=casedir)
        par.run_cmd("run.sh --resume", run + ["--steps", str(STEPS), "--resume", ck, "--save", saved], env, cwd=casedir)
        losses = read_log(log, STEPS)
    except StepFailed as e:
        return result(False, tag, e.args[0])
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(saved).graph.initializer}
    same_w = inits.keys() == full[1].keys() and all(np.array_equal(inits[k], full[1][k]) for k in inits)
    same_l = np.array_equal(losses, full[0])
    return result(same_w and same_l, f"{tag} give the uninterrupted run's losses and weights bit for bit",
                  "" if same_w and same_l else f"losses equal: {same_l}, weights equal: {same_w}")


def weight_diff(a, b):
    """(max |a - b| over the initializers both hold, the worst name, names only in one)."""
    worst, where = 0.0, ""
    for k in a:
        if k in b and a[k].shape == b[k].shape and a[k].size:
            d = float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max())
            if not np.isfinite(d):
                d = float("inf")
            if not where or d > worst:
                worst, where = d, k
    return worst, where, sorted(set(a) ^ set(b))


def noise_bound(opt_name):
    return NOISE_ATOL_STEPS * OPTS[opt_name]["lr"] * STEPS


def compare(tag, what, got, want, loss_rtol=LOSS_RTOL, weight_atol=WEIGHT_ATOL, noise_atol=None):
    """got: (losses, initializers); want: the same, or async_reference's
    (losses, initializers, noise): the noise elements are held to noise_atol.
    One ok/not ok line; on failure, the first step past the bound and the
    per-step losses side by side."""
    gl, gw = got[0], got[1]
    wl, ww = want[0], want[1]
    noise = want[2] if len(want) > 2 else {}
    if noise:   # see NOISE_REL: those elements get their own, looser bound
        gw, ww = dict(gw), dict(ww)
        n_noise, noise_err, noise_bad = 0, 0.0, []
        for k, mask in noise.items():
            if k in gw and k in ww and gw[k].shape == mask.shape == ww[k].shape:
                d = np.abs(gw[k].astype(np.float64) - ww[k].astype(np.float64))[mask]
                n_noise += int(mask.sum())
                e = float(d.max()) if np.isfinite(d).all() else float("inf")
                noise_err = max(noise_err, e)
                if not e <= noise_atol:
                    noise_bad.append(f"{k}: {e:.2e}")
                gw[k] = np.where(mask, 0, gw[k])
                ww[k] = np.where(mask, 0, ww[k])
    problems = []
    if len(gl) != len(wl):
        problems.append(f"{len(gl)} losses, want {len(wl)}")
        rel = np.array([np.inf])
    else:
        rel = np.abs(gl - wl) / np.maximum(np.abs(wl), 1e-12)
        rel[~np.isfinite(rel)] = np.inf
    w_err, worst, odd = weight_diff(gw, ww)
    if odd:
        problems.append(f"initializer names differ: {odd[:6]}")
    loss_err = float(rel.max())
    if not loss_err <= loss_rtol:
        s = int(np.argmax(rel > loss_rtol))
        problems.append(f"losses first differ at step {s} (from 0; log row {s + 1}): {gl[s]!r} vs {wl[s]!r} "
                        f"(rel {rel[s]:.2e}); max rel {loss_err:.2e} at step {int(np.argmax(rel))}")
    if not w_err <= weight_atol:
        problems.append(f"worst initializer {worst}: max abs err {w_err:.2e}")
    detail = f"max loss rel err {loss_err:.2e}, max weight abs err {w_err:.2e}"
    if noise:
        detail += (f" ({n_noise} elements with rounding-noise gradients under Adam: max {noise_err:.2e}, "
                   f"bound {noise_atol:.1e})")
        if noise_bad:
            problems.append("noise elements past their bound: " + ", ".join(noise_bad[:6]))
    ok = result(not problems, f"{tag}: {what}", detail)
    if problems:
        note("\n".join(problems))
        if len(gl) == len(wl):
            note("step  run            reference      rel")
            for s in range(len(gl)):
                note(f"{s:4d}  {gl[s]:<14.9g} {wl[s]:<14.9g} {rel[s]:.2e}")
    return ok


# --------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------

def expect_refusal(tag, cmd, flag, env, out, also=()):
    """pipecc refuses: exit 2, one 'pipecc: error:' message naming flag (and
    every string in also), no output dir.  Returns stderr."""
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    err = r.stderr.strip()
    problems = []
    if r.returncode != 2:
        problems.append(f"exit status {r.returncode}, want 2")
    if not err.startswith("pipecc: error:"):
        problems.append("stderr does not start with 'pipecc: error:'")
    for want in (flag, *also):
        if want not in err:
            problems.append(f"message does not name {want}")
    if os.path.exists(out):
        problems.append(f"{out} was written")
    result(not problems, f"refused: {tag}", "; ".join(problems) + (" | " if problems else "") + repr(err[:300]))
    return err


def refusals(tmp, env):
    mlp = os.path.join(ROOT, "onnx_models", "mlp.onnx")
    out = os.path.join(tmp, "refused.pipe")
    base = [PIPECC, mlp, "-n", "2", "--batch", "32", "--microbatches", "8", "--devices", DEVICES, "-o", out]
    expect_refusal("--staleness 1 without --schedule async", base + ["--staleness", "1"], "--staleness", env, out,
                   also=("async",))
    expect_refusal("--staleness 1 with --schedule 1f1b", base + ["--schedule", "1f1b", "--staleness", "1"], "--staleness", env,
                   out, also=("async",))
    expect_refusal("--schedule async --staleness 0", base + ["--schedule", "async", "--staleness", "0"], "--staleness", env, out)
    expect_refusal("--schedule async --staleness x", base + ["--schedule", "async", "--staleness", "x"], "--staleness", env, out)
    few = lambda m: [PIPECC, mlp, "-n", "4", "--schedule", "async", "--staleness", "1", "--batch", str(4 * m),
                     "--microbatches", str(m), "--devices", DEVICES, "-o", out]
    err = expect_refusal("async n=4 K=1 --microbatches 1", few(1), "--microbatches", env, out)
    m = re.search(r"(\d+)\s+or more", err) or re.search(r"--microbatches\s+(?!1\b)(\d+)", err)
    if not result(m is not None, "async n=4 K=1: the too-few-micro-batches message names the smallest M", repr(err[:300])):
        return
    mmin = int(m.group(1))
    if not result(mmin >= 2, f"async n=4 K=1: the smallest M named ({mmin}) is more than the refused 1"):
        return
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run(few(mmin), capture_output=True, text=True, env=env, timeout=120)
    stages = sorted(f for f in os.listdir(out) if f.startswith("stage_") and f.endswith(".c")) if os.path.isdir(out) else []
    result(r.returncode == 0 and len(stages) == 4, f"async n=4 K=1 --batch {4 * mmin} --microbatches {mmin} (the named smallest) compiles",
           f"exit {r.returncode}, {len(stages)} stage programs" + (f", {r.stderr.strip()[:300]!r}" if r.returncode else ""))
    if mmin > 2:
        expect_refusal(f"async n=4 K=1 --microbatches {mmin - 1} (one fewer than the named smallest)", few(mmin - 1),
                       "--microbatches", env, out)
    shutil.rmtree(out, ignore_errors=True)


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="mlp and gpt n=2 K=1 sgd, lenet n=4 K=2 adamw, one sync run, refusals")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--model", action="append", choices=("mlp", "lenet", "gpt"), help="only this model (repeatable)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="pipecc-async.")
    os.environ["PIPECC_CACHE"] = os.path.join(tmp, "machine.txt")
    os.environ["OMPI_ALLOW_RUN_AS_ROOT"] = os.environ["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env = dict(os.environ)
    t_start = time.time()
    try:
        ex = load_module("pipecc_onnx_export", os.path.join("onnx_models", "export.py"))
        images = tokens = None
        models = {}
        names = args.model or ["mlp", "lenet", "gpt"]
        for name in names:
            path = os.path.join(ROOT, "onnx_models", name + ".onnx")
            if name == "gpt":
                tokens = tokens or TokenData(tmp, GPT_B, GPT_M, GPT_T)
                models[name] = dict(build=ex.GPT, path=path, data=tokens, B=GPT_B, M=GPT_M)
            else:
                images = images or ImageData(tmp, IMG_B, IMG_M, STEPS)
                models[name] = dict(build=ex.MLP if name == "mlp" else ex.LeNet5, path=path, data=images, B=IMG_B, M=IMG_M)

        if args.quick:
            cases = [("mlp", 2, 1, "sgd"), ("mlp", 4, 1, "sgd"), ("gpt", 2, 1, "sgd"), ("lenet", 4, 2, "adamw")]
            sync_models = ["mlp"]
        else:
            cases = [(nm, n, K, o) for nm in names for o in OPTS for K in (1, 2) for n in (2, 4)]
            sync_models = list(names)
        cases = [c for c in cases if c[0] in models]
        sync_models = [nm for nm in sync_models if nm in models]

        # The simulation at K = 0 against the synchronous references.
        sims = {}

        def sim(nm, K, o):
            if (nm, K, o) not in sims:
                md = models[nm]
                sims[(nm, K, o)] = async_reference(md["build"], md["path"], md["data"].batches, K, OPTS[o], STEPS)
            return sims[(nm, K, o)]

        for nm, o in sorted({(c[0], c[3]) for c in cases} | {(nm, "sgd") for nm in sync_models}):
            md = models[nm]
            if nm == "gpt":
                ref = gpt_sync_loop(ex, md["path"], md["data"], OPTS[o], STEPS)
                what = "gpt_parity's loop"
            else:
                ref = image_sync_reference(md["build"], md["path"], md["data"], OPTS[o], STEPS)
                what = "test_parity.torch_reference"
            s0 = sim(nm, 0, o)
            compare(f"{nm} {o}", f"simulation at K=0 equals {what}", s0, (ref[0], ref[1], s0[2]), SIM_TOL, SIM_TOL,
                    noise_bound(o))
            print(f"# {nm} {o}: sync losses {ref[0][0]:.4f} -> {ref[0][-1]:.4f}")

        # Async runs against the simulation.
        runs = {}
        for nm, n, K, o in cases:
            md = models[nm]
            tag = f"{nm} n={n} K={K} {o}"
            want = sim(nm, K, o)
            try:
                got = train(os.path.join(tmp, f"{nm}-n{n}-K{K}-{o}"), md["path"], n, md["B"], md["M"], OPTS[o], "async", K,
                            md["data"].path, env)
            except StepFailed as e:
                result(False, f"{tag}: async run", e.args[0])
                if e.args[1]:
                    note(par.tail(e.args[1], 20))
                continue
            if compare(tag, "async run matches the simulation", got, want, noise_atol=noise_bound(o)):
                runs[(nm, n, K, o)] = got[1]
            else:
                # Which staleness, if any, does the run follow?
                fits = []
                for k2 in range(0, K + 3):
                    sl = sim(nm, k2, o)[0]
                    fits.append(f"K'={k2}: {float((np.abs(got[0] - sl) / np.abs(sl)).max()):.1e}")
                note(f"max loss rel err of the run against the simulation at other staleness: {', '.join(fits)}")

        # Synchronous 1F1B against the K = 0 simulation, and async K = 1 differs from it.
        for nm in sync_models:
            md = models[nm]
            tag = f"{nm} n=2 sync 1f1b sgd"
            try:
                got = train(os.path.join(tmp, f"{nm}-sync"), md["path"], 2, md["B"], md["M"], OPTS["sgd"], "1f1b", None,
                            md["data"].path, env)
            except StepFailed as e:
                result(False, f"{tag}: run", e.args[0])
                if e.args[1]:
                    note(par.tail(e.args[1], 20))
                continue
            sync_ok = compare(tag, "matches the simulation at K=0", got, sim(nm, 0, "sgd"), noise_atol=noise_bound("sgd"))
            key = (nm, 2, 1, "sgd")
            what = f"{nm} n=2 sgd: async K=1 weights differ from sync 1f1b by more than {ASYNC_DIFF_MIN:g}"
            if key not in runs:
                result(False, what, "not checked: the async run failed")
                continue
            d, where, _ = weight_diff(runs[key], got[1])
            sim_d = weight_diff(sim(nm, 1, "sgd")[1], sim(nm, 0, "sgd")[1])[0]
            result(sync_ok and d > ASYNC_DIFF_MIN, what,
                   f"max {d:.2e} ({where}); the simulation's K=1 and K=0 differ by {sim_d:.2e}"
                   + ("" if sync_ok else "; the sync run itself does not match the simulation"))

        # n = 2 and n = 4 bit-identical.
        groups = collections.defaultdict(list)
        for nm, n, K, o in cases:
            groups[(nm, K, o)].append(n)
        for (nm, K, o), ns in groups.items():
            if len(ns) < 2:
                continue
            what = f"{nm} K={K} {o}: n={' and n='.join(map(str, ns))} give bit-identical weights"
            got = [runs[(nm, n, K, o)] for n in ns if (nm, n, K, o) in runs]
            if len(got) < 2:
                result(False, what, f"not checked: only {len(got)} run(s) succeeded (at least 2 needed)")
                continue
            same = all(g.keys() == got[0].keys() and all(np.array_equal(g[k], got[0][k]) for k in g) for g in got)
            result(same, what, "" if same else f"differ by up to {weight_diff(got[0], got[1])[0]:.2e}")

        # Checkpoint and resume in the middle of an async run.
        key = ("lenet", 4, 2, "adamw") if ("lenet", 4, 2, "adamw") in runs else next(iter(runs), None)
        if key:
            nm, n, K, o = key
            md = models[nm]
            full = (read_log(os.path.join(tmp, f"{nm}-n{n}-K{K}-{o}", "log.csv"), STEPS), runs[key])
            resume_check(os.path.join(tmp, f"{nm}-resume"), md["path"], n, md["B"], md["M"], OPTS[o], K, md["data"].path, env, full)
        else:
            result(False, "checkpoint and --resume", "not checked: no async run succeeded")

        refusals(tmp, env)
    except Exception as e:   # setup failure: report, not a traceback
        import traceback
        result(False, "setup", f"{type(e).__name__}: {e}")
        note(traceback.format_exc())
    finally:
        if args.keep:
            print(f"# kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {time.time() - t_start:.0f} s")
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
