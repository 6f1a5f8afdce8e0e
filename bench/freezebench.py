#!/usr/bin/python3
"""Section 9 of `make bench`: time to accuracy with frozen layers (FreezePipe, issue 14).

For LeNet (MNIST-format data) and the ResNet (CIFAR-10-format data), both at n = 4, 1F1B, planned with
measured node costs (`--costs`, a profile taken first as in section 5), the same model, batch,
micro-batches, learning rate and data are trained S steps as:

  * pipecc without freezing;
  * pipecc with `run.sh --freeze auto` at its defaults (`--freeze-every 50 --freeze-threshold 0.05`) and at
    other settings (VARIANTS);
  * pipecc with a fixed `--freeze-at` schedule (FREEZE_AT: what a re-plan does to the cuts and the step,
    whether or not the automatic rule fires);
  * torch's GPipe, `torch.distributed.pipeline.sync.Pipe`, on the same model (onnx_models/export.py's class,
    the ONNX file's initial weights), cut into 4 partitions where pipecc's plan cuts it (LeNet exactly; the
    ResNet at the nearest BasicBlock boundary), chunks = micro-batches, the same SGD, batches and order.

Every run evaluates the same held-out set in eval mode every K steps and after the last one
(pipecc: `run.sh --val`; torch: the Pipe in eval mode under no_grad).  The held-out set is
`bin/piperun-data --test` of the training set's seed (the same classes, other samples), written beside the
training files; both with `--noise` (MODELS), since the default set is learnt before any freeze event.

Clocks.  pipecc's log gives each step's time since the first step (the run's own clock; across a re-plan
it goes on counting, but leaves out the re-plan itself: pipecc, make, a new mpirun).  Each run's stdout is
time-stamped line by line, so each re-plan's cost is measured too, and the time axis here is the log's
time plus the re-plans before that step ("wall time"); torch's is perf_counter from its first step.  Both
include the held-out evaluations before the step (pipecc logs a step's time before its own evaluation; torch
is timed the same way).  The whole invocation (mpirun and torch start-up included) is reported beside it.

Reported: per model and variant the steps, wall time, final held-out accuracy, time to the target
accuracy (the best accuracy the no-freezing run reaches, less TARGET_MARGIN), the ratios freeze / no freeze
and freeze / torch Pipe; per plan each freezing run went through (the original and each <name>.frozenN.pipe)
the cuts (node_begin of each stage), the predicted step (plan.json) and the measured median step of the
steps run under it; the freeze events.  Plots: bench/freeze_lenet.svg, bench/freeze_resnet.svg.

Standalone (`make bench-freeze`): /usr/bin/python3 bench/freezebench.py [lenet] [resnet] writes bench/freeze.md
and the plots (not results.md); each model's measurements are saved in bench/work/freezebench/<model>.result.json,
and `freezebench.py --report [lenet] [resnet]` writes the report again from them without running anything.
The torch side is this file run as a child: `freezebench.py torch --model lenet --data DIR --val DIR ...`
(prints one JSON line).
Environment: BENCH_QUICK=1 (a smoke run: fewer steps, fewer variants), BENCH_FREEZE_REPEATS (rounds,
default 1; the fastest run of each variant is kept: accuracy does not depend on the round).
"""
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SEC = "9_freeze"
TARGET_MARGIN = 0.01      # target accuracy = the no-freezing run's best, less one point
FINAL_TOLERANCE = 0.005   # the issue's target: final accuracy no worse than 0.5 points below no freezing
PRED_TOLERANCE = 0.15     # "the measured step time drops to within 15% of the new prediction"
CLAIM = 0.645             # FreezePipe's claim: -64.5% time to accuracy against torchgpipe
TIMEOUT_RUN = 420         # one training run, re-plans included
TIMEOUT_TORCH = 420
THREADS = 2               # torch's intra-op threads: the cores pipecc's 4 ranks share here

# model: data kind, batch, micro-batches, lr, steps, held-out rows, evaluate every K steps,
# --freeze-at schedule (fractions of the steps : layers), training rows
# --noise: bin/piperun-data's per-pixel noise; its default (0.1) is learnt in about 100 steps, before any freeze
# event, so the sets are harder: at these levels the no-freezing run reaches its plateau about half-way.
MODELS = {
    "lenet": dict(kind="mnist", noise=1.2, B=64, m=8, lr=0.05, steps=1000, nval=1024, every=50,
                  freeze_at=[(0.4, 2), (0.7, 3)]),          # 5 layers: the convs, then fc1
    "resnet": dict(kind="cifar", noise=0.9, B=32, m=8, lr=0.02, steps=500, nval=512, every=25,
                   freeze_at=[(0.4, 10), (0.7, 20)]),       # 31 layers: stem + layer1, then layer2
}
# (name, run.sh flags); None: torch Pipe; "freeze-at": MODELS' schedule
VARIANTS = [
    ("no freezing", []),
    ("auto (defaults: every 50, threshold 0.05)", ["--freeze", "auto"]),
    ("auto (every 25, threshold 0.1)", ["--freeze", "auto", "--freeze-every", "25", "--freeze-threshold", "0.1"]),
    ("auto (every 50, threshold 0.25)", ["--freeze", "auto", "--freeze-every", "50", "--freeze-threshold", "0.25"]),
    ("freeze-at", "freeze-at"),
    ("torch Pipe", None),
]
SHORT = {"no freezing": "nofreeze", "auto (defaults: every 50, threshold 0.05)": "auto_default",
         "auto (every 25, threshold 0.1)": "auto_25_0.1", "auto (every 50, threshold 0.25)": "auto_50_0.25",
         "freeze-at": "freeze_at", "torch Pipe": "torch_pipe"}


def quick_config():
    for c in MODELS.values():
        c["steps"] = 200 if c["kind"] == "mnist" else 60
        c["every"] = 20 if c["kind"] == "mnist" else 10
        c["nval"] = min(c["nval"], 256)
        c["freeze_at"] = [(0.75, c["freeze_at"][0][1])]
    VARIANTS[:] = [v for v in VARIANTS if v[0] in ("no freezing", "auto (defaults: every 50, threshold 0.05)", "freeze-at", "torch Pipe")]


# ---------------------------------------------------------------- data
def make_data(b, model, cfg, work):
    """One directory: B x steps training rows (no sample is seen twice) and nval held-out rows (`--test`: the
    same classes, other samples), both with the model's --noise, from bin/piperun-data (seed 1).  run.sh
    --data DIR reads the training files, --val DIR the test files."""
    ntrain = cfg["B"] * cfg["steps"]
    d = os.path.join(work, "data", f"{cfg['kind']}_n{ntrain}_t{cfg['nval']}_noise{cfg['noise']}")
    test = os.path.join(d, "t10k-labels-idx1-ubyte" if cfg["kind"] == "mnist" else "test_batch.bin")
    if not os.path.exists(test):
        base = [b.DATAGEN, cfg["kind"], d, "--seed", "1", "--noise", str(cfg["noise"]), "--force"]  # over a run cut short
        b.run_cmd(base + ["--n", str(ntrain)], 120)
        b.run_cmd(base + ["--n", str(cfg["nval"]), "--test"], 120)   # last: its file says the directory is complete
    return d, d


# ---------------------------------------------------------------- processes
def run_stamped(b, cmd, timeout, env=None):
    """Run cmd in its own process group, stamping each stdout line with the seconds since the start.
    Returns (rc, [(t, line)], stderr, seconds); on timeout kills the group and raises CmdError."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, bufsize=1)
    lines, err = [], []

    def rd_out():
        for ln in p.stdout:
            lines.append((time.monotonic() - t0, ln.rstrip("\n")))

    def rd_err():
        err.append(p.stderr.read())
    ts = [threading.Thread(target=rd_out, daemon=True), threading.Thread(target=rd_err, daemon=True)]
    for t in ts:
        t.start()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        b.kill_group(p, lambda t: p.wait(timeout=t))
        raise b.CmdError(f"timed out after {timeout} s: {' '.join(cmd)[:200]}")
    secs = time.monotonic() - t0
    for t in ts:
        t.join(5)
    return p.returncode, lines, "".join(err), secs


def err_tail(rc, lines, err, cmd):
    text = (err + "\n" + "\n".join(ln for _, ln in lines)).strip().splitlines()
    tail = [ln for ln in text if "error" in ln.lower() and "mpirun" not in ln.lower()][:2] or text[-3:]
    return f"exit {rc}: {' '.join(cmd)[:160]}: {' | '.join(tail)[:400]}"


# ---------------------------------------------------------------- pipecc
FREEZE_RE = re.compile(r"run\.sh: freeze after step (\d+): the first (\d+) parameterised layers; re-planning into (\S+)")
STEP_RE = re.compile(r"^step (\d+)/(\d+)\s")
AUTO_RE = re.compile(r"^freeze auto after step (\d+): .*-> (\d+) layers frozen")


def read_plan(d):
    with open(os.path.join(d, "plan.json")) as f:
        p = json.load(f)
    return {"dir": d, "predicted_s": p["predicted_step_time_s"], "cuts": [s["node_begin"] for s in p["stage_plans"]],
            "frozen": p.get("frozen_layers", 0), "layers": p.get("layers"), "nodes": [s["nodes"] for s in p["stage_plans"]],
            "max_stage_s": p.get("max_stage_time_s")}


def clean_variant(d):
    """Remove a variant's directory, its re-planned siblings and its log files."""
    stem = d[:-len(".pipe")]
    parent = os.path.dirname(d)
    for f in os.listdir(parent):
        p = os.path.join(parent, f)
        if p == d or (p.startswith(stem + ".frozen") and p.endswith(".pipe")) or p.startswith(stem + ".log"):
            if os.path.isdir(p):
                shutil.rmtree(p)
            else:
                os.remove(p)


def run_pipecc(b, base, d, cfg, train, val, flags):
    """Copy the built base directory to d and train there with run.sh (flags added); parse the log, the
    held-out log, the freeze events, the plans it went through."""
    clean_variant(d)
    b.run_cmd(["cp", "-rp", base, d], 120)
    logf = d[:-len(".pipe")] + ".log.csv"
    cmd = [os.path.join(d, "run.sh"), "--data", train, "--steps", str(cfg["steps"]), "--log", logf,
           "--val", val, "--val-every", str(cfg["every"]), "--no-shuffle", "--log-every", "1"] + flags  # every step's line: stamped below
    load0 = os.getloadavg()[0]
    rc, lines, err, secs = run_stamped(b, cmd, TIMEOUT_RUN)
    if rc != 0:
        raise b.CmdError(err_tail(rc, lines, err, cmd))
    with open(logf) as f:
        log = [(int(r["step"]), float(r["loss"]), float(r["samples_per_s"]), float(r["time_s"])) for r in csv.DictReader(f)]
    with open(logf + ".val.csv") as f:
        vals = [(int(r["step"]), float(r["val_loss"]), float(r["val_accuracy"])) for r in csv.DictReader(f)]
    if [s for s, *_ in log] != list(range(1, cfg["steps"] + 1)):
        raise b.CmdError(f"{logf}: {len(log)} steps logged, expected 1..{cfg['steps']} once each")
    stamp = {}    # step -> seconds since the invocation started, when its progress line came out
    events, autos, info = [], [], []
    for t, ln in lines:
        ms = STEP_RE.match(ln)
        if ms:
            stamp.setdefault(int(ms.group(1)), t)
            continue
        mf = FREEZE_RE.match(ln)
        if mf:
            events.append({"step": int(mf.group(1)), "layers": int(mf.group(2)), "dir": mf.group(3), "t": t})
        if AUTO_RE.match(ln):
            autos.append(ln)
        if ln.startswith("run.sh: "):
            info.append(ln)
    tlog = {s: t for s, _, _, t in log}
    # Each re-plan's cost: the stamped gap between the event's step and the next, less the log's.
    for e in events:
        s = e["step"]
        if s in stamp and s + 1 in stamp:
            e["overhead_s"] = max(0.0, (stamp[s + 1] - stamp[s]) - (tlog[s + 1] - tlog[s]))
        else:
            e["overhead_s"] = None
        e["decision"] = next((a for a in autos if a.startswith(f"freeze auto after step {s}:")), "")
        e["frozen_names"] = ""
    # run.sh prints, per event: "run.sh: frozen: ...", "run.sh: cuts before: ...", "run.sh: cuts after: ..."
    k = -1
    for ln in info:
        if FREEZE_RE.match(ln):
            k += 1
        elif k >= 0 and k < len(events):
            key = "frozen_names" if ln.startswith("run.sh: frozen:") else ("cuts_before" if "cuts before" in ln else
                                                                           "cuts_after" if "cuts after" in ln else None)
            if key:
                if key == "frozen_names":
                    mn = re.search(r"\): (.*?);", ln)
                    events[k][key] = mn.group(1) if mn else ln.split(":", 2)[-1].strip()
                else:
                    events[k][key] = " ".join(ln[len("run.sh: "):].split())

    def clock(step):   # the log's time plus the re-plans before this step
        return tlog[step] + sum(e["overhead_s"] or 0.0 for e in events if e["step"] < step)
    # The plans: the original, then each re-planned directory, with the steps each ran.
    plans, begin = [], 1
    dirs = [d] + [e["dir"] for e in events]
    ends = [e["step"] for e in events] + [cfg["steps"]]
    for pd, end in zip(dirs, ends):
        pl = read_plan(pd)
        seg = [(s, cfg["B"] / sps) for s, _, sps, _ in log if begin <= s <= end]
        warm = min(len(seg) - 1, max(3, len(seg) // 10)) if seg else 0   # each program's first steps warm up
        pl.update(first=begin, last=end, measured_s=statistics.median(dt for _, dt in seg[warm:]) if seg else None,
                  measured_steps=len(seg) - warm)
        plans.append(pl)
        begin = end + 1
    checks = []   # every decision of --freeze auto: (step, each layer's relative change, layers frozen after it)
    for a in autos:
        ma = AUTO_RE.match(a)
        nums = a.split("norm:", 1)[-1].split("->")[0].replace("...", "").split()
        checks.append((int(ma.group(1)), [float(x) for x in nums], int(ma.group(2))))
    for e in events:
        e["clock"] = clock(e["step"])
    med = {}
    for pl in plans:
        for st in range(pl["first"], pl["last"] + 1):
            med[st] = pl["measured_s"]
    steady = steady_clock(clock, {st: cfg["B"] / sps for st, _, sps, _ in log}, med)
    return {"log": log, "vals": vals, "events": events, "plans": plans, "invocation_s": secs, "checks": checks,
            "points": [(clock(s), acc) for s, _, acc in vals], "val_clock": {s: clock(s) for s, _, _ in vals},
            "steady": {s: steady(s) for s, _, _ in vals}, "load": load0,
            "wall_s": clock(cfg["steps"]), "final_acc": vals[-1][2] if vals else None,
            "replan_s": sum(e["overhead_s"] or 0.0 for e in events)}


def steady_clock(clock, dts, med):
    """The clock with every step's time replaced by the median step of its plan (evaluations and re-plans as
    measured): what the run would have taken without the slow outliers other jobs on the machine cause."""
    excess, acc = {}, 0.0
    for st in sorted(dts):
        acc += dts[st] - (med.get(st) if med.get(st) is not None else dts[st])
        excess[st] = acc
    return lambda st: clock(st) - excess[st]


# ---------------------------------------------------------------- torch Pipe
def torch_partitions(model, plan):
    """Where to cut the torch layer list (torch_bench.layers_of) so its 4 partitions match pipecc's plan:
    returns (split indices, note).  LeNet: one layer per ONNX node, exact.  ResNet: stem, six BasicBlocks,
    head; each pipecc cut moves to the nearest block boundary."""
    nodes = [nm for st in plan["nodes"] for nm in st]
    cuts = [sum(len(st) for st in plan["nodes"][:k]) for k in range(1, len(plan["nodes"]))]
    if model == "lenet":
        if len(nodes) != 12:
            raise RuntimeError(f"lenet: {len(nodes)} plan nodes, torch_bench.layers_of has 12")
        return cuts, "exact (one torch layer per ONNX node)"

    def layer_of(nm):
        mm = re.match(r"/layer(\d)/layer\d\.(\d)/", nm)
        if mm:
            return 1 + (int(mm.group(1)) - 1) * 2 + int(mm.group(2))
        return 7 if re.search(r"avgpool|GlobalAveragePool|Flatten|/fc/", nm) else 0
    lay = [layer_of(nm) for nm in nodes]
    starts = {}
    for i, L in enumerate(lay):
        starts.setdefault(L, i)
    out, prev = [], 0
    for k, c in enumerate(cuts):
        cands = [L for L in range(prev + 1, 8 - (len(cuts) - 1 - k)) if L in starts]
        L = min(cands, key=lambda L: (abs(starts[L] - c), L))
        out.append(L)
        prev = L
    exact = all(starts[L] == c for L, c in zip(out, cuts)) and all(lay[i] <= lay[i + 1] for i in range(len(lay) - 1))
    return out, "exact" if exact else (f"nearest BasicBlock boundary: torch layers {out} of stem, 6 blocks, head; "
                                       f"pipecc cuts at nodes {cuts}")


def run_torch(b, model, cfg, train, val, splits):
    env = b.torch_env(THREADS)   # the stages' OpenBLAS kernels for torch too
    env.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
    cmd = [b.PY, os.path.abspath(__file__), "torch", "--model", model, "--kind", cfg["kind"], "--data", train, "--val", val,
           "--batch", str(cfg["B"]), "--chunks", str(cfg["m"]), "--lr", str(cfg["lr"]), "--steps", str(cfg["steps"]),
           "--val-every", str(cfg["every"]), "--splits", ",".join(map(str, splits)), "--threads", str(THREADS)]
    t0, load0 = time.monotonic(), os.getloadavg()[0]
    _, out, _, _ = b.run_cmd(cmd, TIMEOUT_TORCH, env=env)
    secs = time.monotonic() - t0
    res = next((json.loads(ln) for ln in reversed(out.strip().splitlines()) if ln.startswith("{")), None)
    if res is None:
        raise b.CmdError("the torch Pipe run printed no result")
    tlog = {s: t for s, _, t, _ in res["steps"]}
    res["points"] = [(tlog[s], acc) for s, _, acc in res["vals"]]
    res["val_clock"] = {s: tlog[s] for s, _, _ in res["vals"]}
    res["wall_s"] = tlog[cfg["steps"]]
    res["final_acc"] = res["vals"][-1][2]
    res["invocation_s"] = secs
    res["events"], res["plans"], res["replan_s"] = [], [], 0.0
    res["median_step_s"] = statistics.median(dt for _, dt, _, _ in res["steps"][max(3, len(res["steps"]) // 10):])
    res["losses"] = [lo for _, _, _, lo in res["steps"]]
    steady = steady_clock(lambda st: tlog[st], {st: dt for st, dt, _, _ in res["steps"]},
                          {st: res["median_step_s"] for st, _, _, _ in res["steps"]})
    res["steady"] = {st: steady(st) for st, _, _ in res["vals"]}
    res["load"] = load0
    return res


def torch_main(argv):
    """The torch side, in a child process: prints one JSON line."""
    import argparse
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--kind", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--chunks", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--val-every", type=int, required=True)
    ap.add_argument("--splits", required=True)
    ap.add_argument("--threads", type=int, default=THREADS)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import onnx
    import torch_bench as tb
    from test_parity import load_weights_from_onnx

    def read(path, test):
        """The training files of path, or its test files (what run.sh --val reads), as float32 / 255."""
        if a.kind == "mnist":
            def idx(name, hdr):
                with open(os.path.join(path, name), "rb") as f:
                    return np.frombuffer(f.read()[hdr:], dtype=np.uint8)
            pre = "t10k" if test else "train"
            y = idx(f"{pre}-labels-idx1-ubyte", 8).astype(np.int64)
            x = idx(f"{pre}-images-idx3-ubyte", 16).reshape(-1, 1, 28, 28)
        else:
            name = "test_batch.bin" if test else "data_batch_1.bin"
            raw = np.fromfile(os.path.join(path, name), dtype=np.uint8).reshape(-1, 3073)
            x, y = raw[:, 1:].reshape(-1, 3, 32, 32), raw[:, 0].astype(np.int64)
        return torch.from_numpy(x.astype(np.float32) / np.float32(255.0)), torch.from_numpy(y)
    x, y = read(a.data, False)
    vx, vy = read(a.val, True)
    model = tb.build(a.model)
    om = onnx.load(os.path.join(ROOT, "onnx_models", f"{a.model}.onnx"))
    mapping, _ = load_weights_from_onnx(model, om)
    # and its float buffers (BatchNorm's running statistics, by name): a training-mode export ran the model
    # once, so they are not a fresh module's zeros and ones (as tests/test_freeze.py's load_state_from_onnx)
    from onnx import numpy_helper
    inits = {t.name: numpy_helper.to_array(t) for t in om.graph.initializer}
    nbuf = 0
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name in inits and buf.dtype == torch.float32:
                buf.copy_(torch.from_numpy(np.array(inits[name], dtype=np.float32)))
                nbuf += 1
    layers = tb.layers_of(a.model, model)
    cuts = [0] + [int(c) for c in a.splits.split(",")] + [len(layers)]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    import torch.distributed.rpc as rpc
    from torch.distributed.pipeline.sync import Pipe
    rpc.init_rpc("worker", rank=0, world_size=1)
    seq = nn.Sequential(*[nn.Sequential(*layers[lo:hi]) for lo, hi in zip(cuts, cuts[1:])])
    pipe = Pipe(seq, chunks=a.chunks, checkpoint="never")
    opt = torch.optim.SGD(pipe.parameters(), lr=a.lr)
    B, nb = a.batch, x.shape[0] // a.batch
    nv = vx.shape[0] // B * B

    def evaluate():
        pipe.eval()
        loss = correct = 0.0
        with torch.no_grad():
            for lo in range(0, nv, B):
                out = pipe(vx[lo:lo + B]).local_value()
                loss += F.cross_entropy(out, vy[lo:lo + B], reduction="sum").item()
                correct += (out.argmax(1) == vy[lo:lo + B]).sum().item()
        pipe.train()
        return loss / nv, correct / nv
    steps, vals = [], []
    pipe.train()
    t0 = time.perf_counter()
    for s in range(a.steps):          # the same batches as run.sh --no-shuffle: step s takes batch s mod (n / B)
        ts = time.perf_counter()
        k = s % nb
        xb, yb = x[k * B:(k + 1) * B], y[k * B:(k + 1) * B]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(pipe(xb).local_value(), yb)
        loss.backward()
        opt.step()
        now = time.perf_counter()
        steps.append((s + 1, now - ts, now - t0, loss.item()))
        if (s + 1) % a.val_every == 0 or s + 1 == a.steps:
            vl, va = evaluate()
            vals.append((s + 1, vl, va))
    rpc.shutdown()
    print(json.dumps({"steps": steps, "vals": vals, "threads": torch.get_num_threads(), "splits": cuts[1:-1],
                      "layers": len(layers), "weights_from_onnx": len(mapping), "buffers_from_onnx": nbuf,
                      "last_loss": loss.item()}), flush=True)


# ---------------------------------------------------------------- one model
def time_to(points, target):
    return next((t for t, acc in points if acc >= target), None)


def bench_model(b, model, cfg, repeats):
    import memcurve as mc
    work = os.path.join(b.WORK, "freezebench")
    os.makedirs(work, exist_ok=True)
    b.log(f"freeze: {model}: data, profile, plan")
    train, val = make_data(b, model, cfg, work)
    prof, pn = mc.profile_model(b, model, cfg["B"], cfg["m"], train, work)
    base = os.path.join(work, f"{model}_base.pipe")
    if os.path.isdir(base):
        shutil.rmtree(base)
    b.run_cmd([b.PIPECC, os.path.join(ROOT, "onnx_models", f"{model}.onnx"), "-n", "4", "--batch", str(cfg["B"]),
               "--microbatches", str(cfg["m"]), "--schedule", "1f1b", "--lr", str(cfg["lr"]), "--costs", os.path.abspath(prof),
               "-o", base], b.TIMEOUT_COMPILE)
    mc.build_dir(b, base)
    plan0 = read_plan(base)
    splits, split_note = torch_partitions(model, plan0)
    fa = ",".join(f"{max(1, int(f * cfg['steps']))}:{n}" for f, n in cfg["freeze_at"])
    runs = {name: [] for name, _ in VARIANTS}
    for rnd in range(repeats):
        order = VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]
        for name, flags in order:
            b.log(f"freeze: {model}: {name}")
            if flags is None:
                runs[name].append(b.attempt(run_torch, b, model, cfg, train, val, splits))
            else:
                fl = ["--freeze-at", fa] if flags == "freeze-at" else flags
                d = os.path.join(work, f"{model}_{SHORT[name]}.pipe")
                runs[name].append(b.attempt(run_pipecc, b, base, d, cfg, train, val, fl))
    res = {}
    for name, _ in VARIANTS:
        ok = [r for r in runs[name] if isinstance(r, dict)]
        res[name] = min(ok, key=lambda r: r["wall_s"]) if ok else {"error": str(runs[name][0]) if runs[name] else "no run"}
    return {"res": res, "plan0": plan0, "splits": splits, "split_note": split_note, "freeze_at": fa, "profile_n": pn}


# ---------------------------------------------------------------- report
def fmt(x, spec=".2f"):
    return "n/a" if x is None else format(x, spec)


def report_model(b, model, cfg, out, svg_dir):
    res = out["res"]
    case = f"{model} n=4 B={cfg['B']} m={cfg['m']}"
    body = [f"### {model}: {cfg['kind'].upper()}-format data (`--noise {cfg['noise']}`), n = 4, 1F1B, B = {cfg['B']}, "
            f"m = {cfg['m']}, SGD lr {cfg['lr']}, {cfg['steps']} steps", "",
            f"Held-out set: {cfg['nval']} rows (`piperun-data --test`), evaluated every {cfg['every']} steps and after the last.  Plans made with "
            f"`--costs` (a profile at n = {out['profile_n']}).  `--freeze-at {out['freeze_at']}` for the fixed schedule.  "
            f"torch Pipe: 4 partitions, {out['split_note']}; chunks = {cfg['m']}, checkpoint='never', "
            f"torch.set_num_threads({THREADS}).", ""]
    nf = res.get("no freezing", {})
    tp = res.get("torch Pipe", {})
    target = None
    if "error" not in nf and nf.get("vals"):
        target = max(acc for _, _, acc in nf["vals"]) - TARGET_MARGIN
    b.add_row(SEC, case, "target_accuracy", target, "fraction",
              note=f"the no-freezing run's best held-out accuracy less {TARGET_MARGIN:.2f}")
    body += [f"Target accuracy: {fmt(target and target * 100)}% (the no-freezing run's best, less {TARGET_MARGIN * 100:.0f} point).", ""]
    runs = ["| variant | load avg at start | steps | wall time s | re-plans s | whole invocation s | final accuracy % | "
            "vs no freezing (points) | mean of the last 4 evaluations % | vs no freezing (points) | best % | "
            "freeze events (after step: layers frozen) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ttab = ["| variant | target reached after step | time to target s | / no freezing | / torch Pipe | "
            "at median steps: time to target s | / no freezing | / torch Pipe |", "|---|---|---|---|---|---|---|---|"]
    tt, ts, sv = {}, {}, {}
    for name, _ in VARIANTS:
        r = res[name]
        if "error" in r:
            runs.append(f"| {name} | ERROR: {r['error'][:300]} |||||||||||")
            b.add_row(SEC, f"{case} {name}", "run", "ERROR", note=r["error"])
            continue
        tt[name] = time_to(r["points"], target) if target is not None else None
        sv[name] = next((st for st, _, acc in r["vals"] if acc >= target), None) if target is not None else None
        ts[name] = r["steady"][sv[name]] if sv[name] is not None else None

    def ratio(d, name, ref):
        return d[name] / d[ref] if d.get(name) is not None and d.get(ref) else None
    for name, _ in VARIANTS:
        r = res[name]
        if "error" in r:
            continue
        t, q = tt[name], ts[name]
        rn, rt = ratio(tt, name, "no freezing"), ratio(tt, name, "torch Pipe")
        qn, qt = ratio(ts, name, "no freezing"), ratio(ts, name, "torch Pipe")
        dacc = (r["final_acc"] - nf["final_acc"]) * 100 if "error" not in nf and r.get("final_acc") is not None else None
        ev = ", ".join(f"{e['step']}: {e['layers']}" for e in r["events"]) or ("-" if name != "torch Pipe" else "n/a")
        tail = statistics.mean(acc for _, _, acc in r["vals"][-4:]) * 100
        dtail = tail - statistics.mean(acc for _, _, acc in nf["vals"][-4:]) * 100 if "error" not in nf else None
        best = max(acc for _, _, acc in r["vals"]) * 100
        runs.append(f"| {name} | {r['load']:.2f} | {cfg['steps']} | {r['wall_s']:.2f} | {r['replan_s']:.2f} | {r['invocation_s']:.2f} | "
                    f"{fmt(r['final_acc'] * 100)} | {fmt(dacc, '+.2f') if name != 'no freezing' else ''} | {tail:.2f} | "
                    f"{fmt(dtail, '+.2f') if name != 'no freezing' else ''} | {best:.2f} | {ev} |")
        nr = "not reached"
        ttab.append(f"| {name} | {sv[name] if sv[name] is not None else nr} | {fmt(t) if t is not None else nr} | {fmt(rn, '.3f')} | "
                    f"{fmt(rt, '.3f')} | {fmt(q) if q is not None else nr} | {fmt(qn, '.3f')} | {fmt(qt, '.3f')} |")
        sc = f"{case} {name}"
        b.add_row(SEC, sc, "wall_s", r["wall_s"], "s", note="training clock: first step to last, re-plans included")
        b.add_row(SEC, sc, "invocation_s", r["invocation_s"], "s")
        b.add_row(SEC, sc, "replan_s", r["replan_s"], "s")
        b.add_row(SEC, sc, "final_val_accuracy", r["final_acc"], "fraction")
        b.add_row(SEC, sc, "val_accuracy_mean_last_4", tail / 100, "fraction")
        b.add_row(SEC, sc, "time_to_target_s", t if t is not None else nr, "s", note=f"reached after step {sv[name]}")
        b.add_row(SEC, sc, "time_to_target_at_median_steps_s", q if q is not None else nr, "s",
                  note="each step's time replaced by its plan's median step")
        if name != "torch Pipe":
            b.add_row(SEC, sc, "freeze_events", len(r["events"]), "", note="; ".join(f"step {e['step']}: {e['layers']} layers"
                                                                               for e in r["events"]))
            b.add_row(SEC, sc, "time_to_target_over_torch_pipe", rt, "x", f"<= {1 - CLAIM:.3f} (FreezePipe's -64.5%)"
                      if name != "no freezing" else "", b.yes(rt <= 1 - CLAIM) if rt is not None and name != "no freezing" else "")
            b.add_row(SEC, sc, "time_to_target_at_median_steps_over_torch_pipe", qt, "x")
        if name not in ("no freezing", "torch Pipe"):
            ok = dacc is not None and dacc >= -FINAL_TOLERANCE * 100 - 1e-9
            b.add_row(SEC, sc, "final_accuracy_minus_nofreeze", dacc, "points", ">= -0.5", b.yes(ok) if dacc is not None else "")
            b.add_row(SEC, sc, "mean_last_4_accuracy_minus_nofreeze", dtail, "points")
            b.add_row(SEC, sc, "time_to_target_over_nofreeze", rn, "x")
            b.add_row(SEC, sc, "time_to_target_at_median_steps_over_nofreeze", qn, "x")
            if name.startswith("auto (defaults"):
                b.targets.append((f"freeze {model}: --freeze auto (defaults) final accuracy >= no freezing - 0.5 points",
                                  f"{fmt(dacc, '+.2f')} points", b.yes(ok) if dacc is not None else "n/a"))
                b.targets.append((f"freeze {model}: --freeze auto (defaults) time to {fmt(target and target * 100, '.1f')}% "
                                  f"<= 0.355x torch Pipe's (FreezePipe's -64.5%)",
                                  f"{fmt(rt, '.3f')}x ({fmt(t)} s vs {fmt(tt.get('torch Pipe'))} s)",
                                  b.yes(rt <= 1 - CLAIM) if rt is not None else "n/a"))
    body += runs + ["", "Time to the target: the first evaluation at or above it, on the wall-time clock; beside it the same "
                    "clock with every step's time replaced by the median step of its plan (evaluations and re-plans as "
                    "measured), which leaves out slow outliers caused by other jobs on the machine.", ""] + ttab
    if "error" not in tp and "error" not in nf:
        body += ["", f"Median step: torch Pipe {tp['median_step_s'] * 1e3:.1f} ms, pipecc without freezing "
                 f"{fmt(nf['plans'][0]['measured_s'] and nf['plans'][0]['measured_s'] * 1e3, '.1f')} ms.  Same model, weights and "
                 f"batches: the training loss after step 1 is {nf['log'][0][1]:.5f} (pipecc) and {tp['losses'][0]:.5f} (torch), after "
                 f"step {cfg['steps']} {nf['log'][-1][1]:.5f} and {tp['losses'][-1]:.5f}."]
    # plans
    body += ["", "Plans each pipecc run went through: the cuts (node_begin of each stage), the predicted step (plan.json) and "
             "the median measured step of the steps run under it (B / samples_per_s from the log, each program's first "
             f"steps left out); a re-plan's target: measured within {PRED_TOLERANCE * 100:.0f}% of the new prediction.", "",
             "| variant | plan | frozen layers | steps | cuts | predicted ms | measured ms | measured / predicted | "
             "within 15%? | measured / previous plan's |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, _ in VARIANTS:
        r = res[name]
        if "error" in r or name == "torch Pipe":
            continue
        prev = None
        for k, pl in enumerate(r["plans"]):
            ratio = pl["measured_s"] / pl["predicted_s"] if pl["measured_s"] else None
            ok = ratio is not None and abs(ratio - 1) <= PRED_TOLERANCE
            drop = pl["measured_s"] / prev if prev and pl["measured_s"] else None
            body.append(f"| {name} | {os.path.basename(pl['dir'])} | {pl['frozen']} | {pl['first']}-{pl['last']} | "
                        f"{' '.join(map(str, pl['cuts']))} | {pl['predicted_s'] * 1e3:.2f} | {fmt(pl['measured_s'] and pl['measured_s'] * 1e3)} | "
                        f"{fmt(ratio)} | {b.yes(ok) if ratio is not None else 'n/a'} | {fmt(drop, '.3f')} |")
            pc = f"{case} {name} plan {k} ({pl['frozen']} frozen)"
            b.add_row(SEC, pc, "cuts", " ".join(map(str, pl["cuts"])), "node_begin")
            b.add_row(SEC, pc, "step_predicted", pl["predicted_s"] * 1e3, "ms")
            b.add_row(SEC, pc, "step_measured_median", pl["measured_s"] and pl["measured_s"] * 1e3, "ms",
                      note=f"steps {pl['first']}-{pl['last']}")
            b.add_row(SEC, pc, "measured_over_predicted", ratio, "x", "within 15%" if k else "",
                      b.yes(ok) if k and ratio is not None else "")
            if k:
                b.add_row(SEC, pc, "measured_over_previous_plan", drop, "x")
            prev = pl["measured_s"]
    rp = [(name, k, pl) for name, _ in VARIANTS if "error" not in res[name] and name != "torch Pipe"
          for k, pl in enumerate(res[name]["plans"]) if k and pl["measured_s"]]
    if rp:
        good = sum(1 for _, _, pl in rp if abs(pl["measured_s"] / pl["predicted_s"] - 1) <= PRED_TOLERANCE)
        b.targets.append((f"freeze {model}: after a re-plan the measured step is within 15% of the new prediction",
                          f"{good} of {len(rp)} re-planned programs (measured / predicted "
                          f"{min(pl['measured_s'] / pl['predicted_s'] for _, _, pl in rp):.2f} .. "
                          f"{max(pl['measured_s'] / pl['predicted_s'] for _, _, pl in rp):.2f})", b.yes(good == len(rp))))
    # events
    evs = [(name, e) for name, _ in VARIANTS if "error" not in res[name] for e in res[name]["events"]]
    body += ["", "Freeze events:", ""]
    if evs:
        body += ["| variant | after step | layers frozen | which | rule's numbers | re-plan s | run.sh |", "|---|---|---|---|---|---|---|"]
        for name, e in evs:
            dec = e["decision"].split(":", 2)[-1].strip() if e["decision"] else "(--freeze-at)"
            body.append(f"| {name} | {e['step']} | {e['layers']} | {e.get('frozen_names', '')} | {dec} | {fmt(e['overhead_s'])} | "
                        f"{e.get('cuts_before', '')}; {e.get('cuts_after', '')} |")
    else:
        body.append("none")
    # what the automatic rule saw
    body += ["", "What `--freeze auto` saw: at each check (step), the first unfrozen layer's relative gradient-norm change "
             "|G - G_prev| / G_prev (a prefix freezes only when every layer in it is below the threshold), and the layers "
             "frozen after it:", "", "| variant | checks: step: first unfrozen layer's change (layers frozen) |", "|---|---|"]
    for name, flags in VARIANTS:
        r = res[name]
        if "error" in r or not isinstance(flags, list) or "auto" not in flags:
            continue
        body.append(f"| {name} | " + ", ".join(f"{st}: {ch[0]:.3g}" + (f" ({k})" if k else "") for st, ch, k in r["checks"] if ch)
                    + " |")
    # findings, from the numbers above
    if "error" not in nf and target is not None:
        s_nf = next((s for s, _, acc in nf["vals"] if acc >= target), None)
        lines = [f"No freezing reaches the target after step {s_nf} of {cfg['steps']}." if s_nf else
                 "No freezing does not reach the target."]
        for name, _ in VARIANTS:
            r = res[name]
            if "error" in r or name in ("no freezing", "torch Pipe"):
                continue
            acc = (f" Final accuracy {r['final_acc'] * 100:.2f}% ({(r['final_acc'] - nf['final_acc']) * 100:+.2f} points against no "
                   f"freezing){'' if r['final_acc'] >= nf['final_acc'] - FINAL_TOLERANCE else ': below the 0.5-point target'}; "
                   + (f"target reached after step {next((st for st, _, a in r['vals'] if a >= target), None)}."
                      if any(a >= target for _, _, a in r["vals"]) else "target not reached."))
            if r["events"]:
                e0 = r["events"][0]
                steps_before = e0["step"] - 1
                last = r["plans"][-1]
                lines.append(f"{name}: first freeze after step {e0['step']}"
                             + (" (after the target was reached, so freezing cannot shorten the time to it)"
                                if s_nf and e0["step"] >= s_nf else "")
                             + f"; {len(r['events'])} re-plan(s) cost {r['replan_s']:.1f} s; the last plan's measured step "
                             f"{fmt(last['measured_s'] and last['measured_s'] * 1e3)} ms against "
                             f"{fmt(r['plans'][0]['measured_s'] and r['plans'][0]['measured_s'] * 1e3)} ms before "
                             f"({steps_before} steps under the first plan)." + acc)
            else:
                lines.append(f"{name}: never froze in {cfg['steps']} steps." + acc)
        body += [""] + [f"- {ln}" for ln in lines]
    # plot
    series = []
    for name, _ in VARIANTS:
        r = res[name]
        if "error" not in r:
            series.append({"name": name, "points": [(t, acc * 100) for t, acc in r["points"]]})
    svg = os.path.join(svg_dir, f"freeze_{model}.svg")
    if series:
        try:
            import svgplot
            notes = [f"{name}: froze " + ", ".join(f"{e['layers']} layers after step {e['step']} (t = {e['clock']:.1f} s)"
                                                   for e in r["events"])
                     for name, _ in VARIANTS for r in [res[name]] if "error" not in r and r["events"]]
            xmax = max(x for sr in series for x, _ in sr["points"])
            ymin = min([y for sr in series for _, y in sr["points"]] + [target * 100 if target is not None else 100])
            svgplot.plot(svg, series, title=f"{model}, n = 4, B = {cfg['B']}, m = {cfg['m']}: held-out accuracy against wall time",
                         xlim=(0, xmax * 1.04), ylim=(max(0, (ymin // 10) * 10), 101),
                         xlabel="wall time, s (training clock, re-plans included)", ylabel="held-out accuracy, %",
                         hlines=[(target * 100, "target")] if target is not None else [], notes=notes)
            body += ["", f"![{model}: held-out accuracy against wall time](freeze_{model}.svg)"]
        except Exception as e:  # noqa: BLE001
            body.append(f"(plot failed: {e})")
    return body


def saved_path(b, model):
    return os.path.join(b.WORK, "freezebench", f"{model}.result.json")


def load_saved(b, model):
    """A run's measurements as section_freeze saved them (JSON turns the step keys into strings)."""
    with open(saved_path(b, model)) as f:
        sv = json.load(f)
    for r in sv["out"]["res"].values():
        for k in ("val_clock", "steady"):
            if k in r:
                r[k] = {int(st): v for st, v in r[k].items()}
    return sv


def section_freeze(b, data=None, models=None, svg_dir=HERE, md_path=os.path.join(HERE, "freeze.md"), report_only=False):
    """bench.py calls this (data is unused: the section makes its own data sets).  Each model's measurements
    are saved to bench/work/freezebench/<model>.result.json; report_only writes the report from those."""
    if b.QUICK and not report_only:
        quick_config()
    repeats = max(1, int(os.environ.get("BENCH_FREEZE_REPEATS", "1")))
    t0 = time.time()
    ntargets = len(b.targets)
    header = [f"4 MPI ranks share this machine's cores ({os.cpu_count()}), so pipecc's stages oversubscribe them; torch Pipe "
              f"gets {THREADS} intra-op threads (on CPU every Pipe partition runs on one worker thread: no overlap between "
              "partitions, only intra-op threads).  Wall time: each step's time since the run's first step, re-plans "
              "(pipecc, make, a new mpirun) included, held-out evaluations before the step included, start-up not (the "
              "whole invocation, start-up included, is reported beside it).  FreezePipe's claim is time to accuracy -64.5% "
              "against torchgpipe, i.e. a ratio of 0.355.", ""]
    body, stamps = [], []
    for model in (models or list(MODELS)):
        try:
            if report_only:
                sv = load_saved(b, model)
                cfg, out = sv["cfg"], sv["out"]
                VARIANTS[:] = [tuple(v) for v in sv["variants"]]   # the variants that run had
                stamps.append(f"{model}: measured {sv['date']} at pipecc {sv['commit']} in {sv['seconds']:.0f} s"
                              f"{' (BENCH_QUICK: a smoke run)' if sv.get('quick') else ''}")
            else:
                cfg = MODELS[model]
                t1 = time.time()
                out = bench_model(b, model, cfg, repeats)
                sv = {"cfg": cfg, "out": out, "variants": VARIANTS, "date": b.machine_info()[0][1], "quick": b.QUICK,
                      "seconds": time.time() - t1,
                      "commit": b.first_line(["git", "rev-parse", "--short", "HEAD"])}
                with open(saved_path(b, model), "w") as f:
                    json.dump(sv, f)
                stamps.append(f"{model}: measured {sv['date']} at pipecc {sv['commit']} in {sv['seconds']:.0f} s"
                              f"{' (BENCH_QUICK: a smoke run)' if b.QUICK else ''}")
            body += report_model(b, model, cfg, out, svg_dir)
        except Exception as e:  # noqa: BLE001
            b.log(f"  error: {e}")
            b.add_row(SEC, model, "case", "ERROR", note=str(e))
            body += [f"### {model}", "", f"ERROR: {e}"]
        body.append("")
    tg = b.targets[ntargets:]
    text = "\n".join(header + [f"Written by bench/freezebench.py: {'; '.join(stamps)}.", "",
                               "| target | measured | met? |", "|---|---|---|"]
                     + [f"| {t} | {m} | {ok} |" for t, m, ok in tg] + [""] + body)
    b.md_sections.append(("9. Freezing: time to accuracy with `--freeze auto` against no freezing and torch's GPipe Pipe", text))
    with open(md_path + ".tmp", "w") as f:
        f.write(f"# Freezing: time to accuracy (bench section 9)\n\n{text}\n")
    os.replace(md_path + ".tmp", md_path)
    b.log(f"freeze: section {time.time() - t0:.0f} s")
    return text


if __name__ == "__main__":
    if sys.argv[1:2] == ["torch"]:
        torch_main(sys.argv[2:])
        sys.exit(0)
    sys.path.insert(0, HERE)
    import bench as b  # noqa: E402
    os.makedirs(b.WORK, exist_ok=True)
    models = [m for m in sys.argv[1:] if m in MODELS] or None
    section_freeze(b, None, models, report_only="--report" in sys.argv[1:])
    b.log("wrote bench/freeze.md")
