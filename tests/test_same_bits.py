#!/usr/bin/python3
"""The before/after bit test (issue 32): a restructuring of the compiler or the runtime that promises
that nothing numeric changes, checked against an earlier commit's outputs.

BASE (--base REV, default HEAD~1; any git revision) is checked out in a git worktree at
build/same-bits/base (reused where it is already at that commit; at another commit, that commit is
checked out in it and make redoes what changed; a stale registration whose directory is gone, as after
make clean, is added again with git worktree add --force, touching no other worktree), and its bin/pipecc
and bin/piperun-data are built there with make -j2.  "After" is this checkout's bin/pipecc.  Each side's stage programs build against that side's
own runtime/ (PIPECC_RUNTIME names it, and each side has its own PIPERUN_OBJ_CACHE, so libpiperun's
objects are built once per side).  Both sides plan the same ONNX files (this checkout's onnx_models/)
with the same flags and the same --devices figures (tests/devices_equal.txt), from working directories of
the same shape, and train on the same data (written once by this checkout's bin/piperun-data; the base's
piperun-data must write the same bytes, a check of its own).

Each case plans, builds and trains STEPS = 3 steps with --save on both sides and checks:
  * both sides plan, build and train (a failure on either side is a failure, printed with its output's
    tail); a plan that both sides refuse with the same message is a pinned refusal (counted apart);
  * the saved .onnx files are byte-identical, and so are the logged losses (and --val's held-out losses);
  * plan.json is the same, fields that are timings aside (keys ending in _s, bubble, jitter, imbalance):
    a value that differs is a failure, a field only one side has is printed;
  * whether the generated stage_*.c text changed is printed per case (not a failure: a refactor may
    change the text of the programs, not their numbers); a difference only in .predicted_step_s is
    named as such (a file offload's plan times the disk as it plans, so it moves from run to run).

The matrix: every sample model (mlp, lenet, gpt, gpt_opset17, resnet, densenet, inception) at n = 1, 2
and 4 under gpipe, 1f1b and zb1; and on a few models --mem-limit with offload to a peer, to a file and
recompute (the limit is found on the base side as tests/test_memory.py does: the first between the
target's floor and the plain plan's need whose plan moves something; none found is a skip), --frozen,
run.sh --freeze-at (a freeze event re-plans with each side's own pipecc), --schedule async --staleness
K, --schedule pipefb, run.sh --val, and momentum / AdamW.

  /usr/bin/python3 tests/test_same_bits.py [--base REV] [--quick] [--jobs J] [--keep DIR] [--only WORD]
  make test-same-bits [BASE=rev] [SAME_BITS_FLAGS="--quick ..."]

--quick: lenet n=4 1f1b, gpt n=2 zb1, mlp n=4 async, lenet n=2 pipefb, lenet n=4 offload to a peer.
--jobs J (default 2): cases run J at a time (each case's make then runs one job).  --keep DIR: work in
DIR and leave it (else a temporary directory, removed).  --only WORD: the cases whose name holds WORD.
Ends with "N passed, M failed, K skipped, R refused"; exit 1 on any failure or when nothing passed.
"""
import argparse
import concurrent.futures
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402
import test_memory as TM  # noqa: E402  (its devices file for the peer target)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_WT = os.path.join(ROOT, "build", "same-bits", "base")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
MODELS = os.path.join(ROOT, "onnx_models")
STEPS = 3
LR = "0.05"
KEEP = False

# Every sample model, the data it trains on, and (batch, micro-batches): small, so that a case is quick.
DATA = {"mlp": "mnist", "lenet": "mnist", "gpt": "tokens", "gpt_opset17": "tokens", "resnet": "cifar", "densenet": "cifar",
        "inception": "cifar"}
SIZES = {"mlp": (32, 4), "lenet": (32, 4), "gpt": (8, 4), "gpt_opset17": (8, 4), "resnet": (16, 4), "densenet": (16, 4),
         "inception": (16, 4)}
ASYNC_SIZES = {"mlp": (32, 8), "lenet": (32, 8), "gpt": (16, 8)}  # test_async.py's M = 8
# The memory plan's targets (tests/test_memory.py): "peer" limits the first half of the ranks (--devices)
# and leaves the rest unlimited to hold their activations.
MEM_FLAGS = {"peer": ["--offload", "peer", "--recompute", "none"],
             "file": ["--offload", "file:offload", "--recompute", "none"],  # relative: each side's own offload/
             "recompute": ["--offload", "none", "--recompute", "auto"]}
TIMING_KEYS = re.compile(r"(_s|bubble|bubble_at_medians|jitter|imbalance)$")
# The one timing in the stage programs' text: the plan's predicted step time (a file offload's plan times
# the disk when it plans, so two runs of the same pipecc may differ there).
PREDICTED = re.compile(r"(\.predicted_step_s = )[-+0-9.eE]+")

lock = threading.Lock()
counts = {"passed": 0, "failed": 0, "skipped": 0, "refused": 0}


def say(kind, what, detail=""):
    """One result, counted by the one tally (tests/tally.py); kind is passed, failed, skipped or refused."""
    with lock:
        counts[kind] += 1
        detail = "\n".join("  " + line for line in detail.rstrip("\n").splitlines())
        if kind == "passed":
            tally.check(True, what)
        elif kind == "failed":
            tally.fail(what, detail)
        elif kind == "skipped":
            tally.skip(what, detail.strip() or "see above")
        else:
            tally.refused(what, detail.strip() or "both sides refuse it alike")


def tail(text, lines=25):
    ls = (text or "").rstrip("\n").splitlines()
    if len(ls) > lines:
        ls = [f"... ({len(ls) - lines} lines cut)"] + ls[-lines:]
    return "\n".join(ls)


def sh(cmd, cwd=None, env=None, timeout=600):
    """(returncode, stdout + stderr); a timeout is returncode 124."""
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        return 124, (out.decode(errors="replace") if isinstance(out, bytes) else out) + f"\n(timed out after {timeout} s)"


def git(*args, cwd=ROOT):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


# --------------------------------------------------------------------------
# The base side: a worktree at BASE, built
# --------------------------------------------------------------------------

def registered_worktrees():
    out = git("worktree", "list", "--porcelain").stdout
    return {os.path.realpath(l[len("worktree "):]) for l in out.splitlines() if l.startswith("worktree ")}


def prepare_base(rev):
    """Checks BASE out at build/same-bits/base and builds its pipecc and piperun-data; returns its commit."""
    r = git("rev-parse", "--verify", "--quiet", rev + "^{commit}")
    if r.returncode:
        sys.exit(f"test_same_bits: {rev!r} is not a commit here")
    sha = r.stdout.strip()
    wt = os.path.realpath(BASE_WT) if os.path.exists(BASE_WT) else BASE_WT
    ours = os.path.realpath(BASE_WT) in registered_worktrees()
    here = git("rev-parse", "HEAD", cwd=BASE_WT).stdout.strip() if ours and os.path.isdir(BASE_WT) else None
    if ours and here:
        if here != sha:  # ours, at another commit: check the wanted one out in place (its build/ is kept, make redoes what changed)
            r = git("checkout", "--quiet", "--detach", "--force", sha, cwd=BASE_WT)
            if r.returncode:
                sys.exit(f"test_same_bits: git checkout {sha[:12]} in {BASE_WT} failed:\n{r.stderr}")
            git("clean", "-fdq", cwd=BASE_WT)  # untracked files of the other commit (build/ is ignored and stays)
        print(f"# base: {rev} = {sha[:12]}, worktree {os.path.relpath(BASE_WT, ROOT)} " +
              ("reused" if here == sha else f"moved from {here[:12]}"), flush=True)
    else:
        # A stale worktree: registered but its directory gone or broken (make clean removes build/), or a
        # directory there that git does not know.  Only this path is touched.
        if ours:
            git("worktree", "remove", "--force", BASE_WT)
        if os.path.lexists(BASE_WT) and os.path.realpath(BASE_WT) not in registered_worktrees():
            shutil.rmtree(BASE_WT)
        os.makedirs(os.path.dirname(BASE_WT), exist_ok=True)
        r = git("worktree", "add", "--force", "--detach", BASE_WT, sha)
        if r.returncode:
            sys.exit(f"test_same_bits: git worktree add {BASE_WT} {sha[:12]} failed:\n{r.stderr}")
        print(f"# base: {rev} = {sha[:12]}, new worktree {os.path.relpath(BASE_WT, ROOT)}", flush=True)
    t0 = time.time()
    rc, out = sh(["make", "-j2", "bin/pipecc", "bin/piperun-data"], cwd=BASE_WT, timeout=1800)
    if rc:
        sys.exit(f"test_same_bits: the base's make -j2 bin/pipecc bin/piperun-data failed:\n{tail(out, 40)}")
    print(f"# base: built bin/pipecc and bin/piperun-data ({time.time() - t0:.0f} s)", flush=True)
    return sha


class Side:
    def __init__(self, name, root, work):
        self.name, self.root = name, root
        self.pipecc = os.path.join(root, "bin", "pipecc")
        self.datagen = os.path.join(root, "bin", "piperun-data")
        self.dir = os.path.join(work, name)  # plans are written here, and pipecc and run.sh run here
        os.makedirs(os.path.join(self.dir, "offload"), exist_ok=True)
        self.env = dict(os.environ, PIPECC_RUNTIME=os.path.join(root, "runtime"),
                        PIPERUN_OBJ_CACHE=os.path.join(self.dir, "rt"),
                        PIPECC_CACHE=os.path.join(self.dir, "machine.txt"),
                        PIPECC_KERNEL_CACHE=os.path.join(self.dir, "kernels.txt"))


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------

def case(name, model, n, sched, size=None, pipecc=(), run=(), mem=None, val=False):
    return dict(name=name, model=model, n=n, sched=sched, size=size or SIZES[model], pipecc=list(pipecc), run=list(run),
                mem=mem, val=val)


def matrix(quick):
    if quick:
        return [case("lenet n=4 1f1b", "lenet", 4, "1f1b"),
                case("gpt n=2 zb1", "gpt", 2, "zb1"),
                case("mlp n=4 async K=1", "mlp", 4, "async", ASYNC_SIZES["mlp"], ["--staleness", "1"]),
                case("lenet n=2 pipefb", "lenet", 2, "pipefb"),
                case("lenet n=4 1f1b offload peer", "lenet", 4, "1f1b", mem="peer")]
    cases = [case(f"{m} n={n} {s}", m, n, s) for m in DATA for n in (1, 2, 4) for s in ("gpipe", "1f1b", "zb1")]
    for m, n, s in (("lenet", 4, "1f1b"), ("gpt", 4, "zb1")):
        cases += [case(f"{m} n={n} {s} {'offload ' if t != 'recompute' else ''}{t}", m, n, s, mem=t) for t in MEM_FLAGS]
    cases += [case("resnet n=2 1f1b recompute", "resnet", 2, "1f1b", mem="recompute")]
    cases += [case(f"{m} n={n} 1f1b --frozen {k} layers", m, n, "1f1b", pipecc=["--frozen", f"@frozen{k}"])
              for m, n, k in (("lenet", 4, 2), ("gpt", 2, 3), ("resnet", 4, 2))]
    cases += [case("lenet n=2 1f1b run.sh --freeze-at 1:2", "lenet", 2, "1f1b", run=["--freeze-at", "1:2"])]
    cases += [case(f"{m} n={n} async K={k}", m, n, "async", ASYNC_SIZES[m], ["--staleness", str(k)])
              for m, n, k in (("mlp", 4, 1), ("lenet", 2, 1), ("lenet", 4, 2), ("gpt", 4, 1))]
    cases += [case(f"{m} n={n} pipefb", m, n, "pipefb") for m, n in (("lenet", 2), ("mlp", 4), ("gpt", 4), ("resnet", 2))]
    cases += [case(f"{m} n={n} 1f1b run.sh --val", m, n, "1f1b", val=True) for m, n in (("lenet", 2), ("resnet", 4))]
    cases += [case("lenet n=2 1f1b momentum 0.9, weight decay 1e-4", "lenet", 2, "1f1b",
                   pipecc=["--momentum", "0.9", "--weight-decay", "1e-4"]),
              case("gpt n=2 1f1b adamw", "gpt", 2, "1f1b", pipecc=["--optimizer", "adamw", "--lr", "1e-3", "--weight-decay", "0.01"])]
    return cases


def slug(name):
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def pipecc_cmd(side, c, out, extra=(), devices=DEVICES):
    flags = [f.replace("@frozen", os.path.join(WORK, "frozen")) + (".txt" if f.startswith("@frozen") else "")
             for f in c["pipecc"]]
    if "--lr" not in flags:
        flags = ["--lr", LR] + flags
    return [side.pipecc, os.path.join(MODELS, c["model"] + ".onnx"), "-n", str(c["n"]), "--schedule", c["sched"],
            "--batch", str(c["size"][0]), "--microbatches", str(c["size"][1]), "--devices", devices, *flags, *extra, "-o", out]


def moves_something(out):
    text = "".join(open(os.path.join(out, f)).read() for f in os.listdir(out) if f.startswith("stage_") and f.endswith(".c"))
    return len(re.findall(r"\{PR_(OFFLOAD|RECOMPUTE),", text)) > 0


def find_limit(side, c):
    """The memory case's planning flags, found with the base's pipecc: (extra flags, devices, note) or (None, None, why)."""
    flags = MEM_FLAGS[c["mem"]]
    scratch = os.path.join(side.dir, slug(c["name"]) + ".search")
    need = {}
    for what, extra in (("plain", ["--offload", "none", "--recompute", "none"]), ("floor", flags)):
        rc, out = sh(pipecc_cmd(side, c, scratch, ["--mem-limit", "1K", *extra]), cwd=side.dir, env=side.env, timeout=120)
        m = re.search(r"at least (\d+)K", out)
        if not m:
            return None, None, f"the base's {what} planner names no smallest limit: {tail(out, 3)}"
        need[what] = int(m.group(1)) * 1024
    P, F = need["plain"], need["floor"]
    for lim in sorted({x for x in (F, (3 * F + P) // 4, (F + P) // 2, P - 4096) if F <= x < P}):
        if c["mem"] == "peer":
            extra, dev = flags, TM.half_limited(WORK, c["n"], lim)
        else:
            extra, dev = ["--mem-limit", str(lim), *flags], DEVICES
        shutil.rmtree(scratch, ignore_errors=True)
        rc, _ = sh(pipecc_cmd(side, c, scratch, extra, dev), cwd=side.dir, env=side.env, timeout=120)
        if rc == 0 and moves_something(scratch):
            shutil.rmtree(scratch, ignore_errors=True)
            return extra, dev, f"limit {lim} (floor {F}, plain need {P})"
    shutil.rmtree(scratch, ignore_errors=True)
    return None, None, f"no limit between the floor {F} and the plain need {P} makes the base's plan move something"


def plan_fields(obj, path=""):
    """plan.json flattened to {path: value}, timing fields left out."""
    got = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not TIMING_KEYS.search(k):
                got.update(plan_fields(v, f"{path}/{k}"))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            got.update(plan_fields(v, f"{path}[{i}]"))
    else:
        got[path] = obj
    return got


def read_plan(out):
    """plan_fields of out/plan.json, the side's own directory written <side> (a re-plan names its checkpoint)."""
    return plan_fields(json.loads(open(os.path.join(out, "plan.json")).read().replace(os.path.dirname(out) + "/", "<side>/")))


def stage_text(b_out, a_out):
    """Whether the generated stage_*.c text changed: a short phrase.  Each side's own directory is written
    <side> first (a freeze event's re-plan names the checkpoint's model.onnx in comments and strings)."""
    names = sorted(set(f for d in (b_out, a_out) for f in os.listdir(d) if re.fullmatch(r"stage_\d+\.c", f)),
                   key=lambda f: int(f[6:-2]))
    changed, timings = [], []
    for f in names:
        pb, pa = os.path.join(b_out, f), os.path.join(a_out, f)
        if not (os.path.exists(pb) and os.path.exists(pa)):
            changed.append(f + (" (after only)" if os.path.exists(pa) else " (base only)"))
            continue
        tb, ta = (open(os.path.join(d, f)).read().replace(os.path.dirname(d) + "/", "<side>/") for d in (b_out, a_out))
        if tb != ta and PREDICTED.sub(r"\1", tb) == PREDICTED.sub(r"\1", ta):
            timings.append(f)  # only the plan's predicted step time, which a file offload's disk probe moves
        elif tb != ta:
            d = [l for l in difflib.unified_diff(tb.splitlines(), ta.splitlines(), lineterm="", n=0)
                 if l[:1] in "+-" and not l.startswith(("+++", "---"))]
            changed.append(f"{f} (+{sum(l[0] == '+' for l in d)} -{sum(l[0] == '-' for l in d)} lines)")
    if changed:
        return "stage text changed: " + ", ".join(changed)
    return f"stage text same ({len(names)} files" + (f"; {len(timings)} differ only in .predicted_step_s)" if timings else ")")


def weight_diff(pb, pa):
    """Which initializers of two saved models differ, and by how much (for a failure's message)."""
    try:
        import numpy as np
        import onnx
        from onnx import numpy_helper
        mb, ma = onnx.load(pb), onnx.load(pa)
        ib = {t.name: numpy_helper.to_array(t) for t in mb.graph.initializer}
        ia = {t.name: numpy_helper.to_array(t) for t in ma.graph.initializer}
        lines = []
        for k in ib:
            if k not in ia:
                lines.append(f"{k}: base only")
            elif ib[k].shape != ia[k].shape or ib[k].dtype != ia[k].dtype:
                lines.append(f"{k}: {ib[k].dtype}{list(ib[k].shape)} vs {ia[k].dtype}{list(ia[k].shape)}")
            elif ib[k].tobytes() != ia[k].tobytes():
                d = np.abs(ib[k].astype(np.float64) - ia[k].astype(np.float64))
                lines.append(f"{k}: {int((ib[k] != ia[k]).sum())} of {ib[k].size} elements differ, max |diff| {d.max():.3g}")
        lines += [f"{k}: after only" for k in ia if k not in ib]
        if not lines:
            lines = ["every initializer is the same: the models differ elsewhere (graph, metadata)"]
        return f"{len(lines)} initializer(s) differ:\n" + "\n".join(lines[:12]) + (f"\n... and {len(lines) - 12} more" if len(lines) > 12 else "")
    except Exception as e:  # onnx missing, or a file that does not parse
        return f"(could not compare initializers: {e})"


def run_side(side, c, plan_extra, devices, jobs):
    """Plans, builds and trains one side: ("ok", out dir, files) / ("refused", text) / ("failed", what, text)."""
    tag = slug(c["name"])
    out = os.path.join(side.dir, tag + ".pipe")
    for p in (out, out[:-5] + ".frozen2.pipe"):
        shutil.rmtree(p, ignore_errors=True)
    rc, text = sh(pipecc_cmd(side, c, out, plan_extra, devices), cwd=side.dir, env=side.env, timeout=300)
    if rc:
        return ("refused", f"pipecc exit {rc}: {text.strip()}")
    rc, text = sh(["make", "-s", f"-j{2 if jobs == 1 else 1}", "-C", out], cwd=side.dir, env=side.env, timeout=1200)
    if rc:
        return ("failed", "make", text)
    log, saved = os.path.join(side.dir, tag + ".csv"), os.path.join(side.dir, tag + ".saved.onnx")
    for p in (log, saved, log + ".val.csv"):
        if os.path.exists(p):
            os.remove(p)
    cmd = [os.path.join(out, "run.sh"), "--data", DATASETS[DATA[c["model"]]], "--steps", str(STEPS), "--seed", "1",
           "--log", log, "--save", saved, "--timeout", "240", "--quiet", *c["run"]]
    if c["val"]:
        cmd += ["--val", DATASETS["val" + DATA[c["model"]]], "--val-every", "1"]
    rc, text = sh(cmd, cwd=side.dir, env=side.env, timeout=600)
    if rc or not os.path.exists(saved):
        return ("failed", "run.sh" + ("" if rc else " (no saved model)"), f"exit {rc}\n{text}")
    losses = [l.split(",")[1] for l in open(log).read().splitlines()[1:] if l.count(",") >= 1]
    vals = open(log + ".val.csv").read() if c["val"] and os.path.exists(log + ".val.csv") else None
    return ("ok", out, saved, losses, vals)


def run_case(c, base, after, jobs):
    plan_extra, devices, note = [], DEVICES, ""
    if c["mem"]:
        plan_extra, devices, note = find_limit(base, c)
        if plan_extra is None:
            say("skipped", c["name"], note)
            return
        note = "; " + note
    b = run_side(base, c, plan_extra, devices, jobs)
    a = run_side(after, c, plan_extra, devices, jobs)
    if b[0] == "refused" and a[0] == "refused":
        if b[1] == a[1]:
            say("refused", f"{c['name']}: both sides refuse it alike", tail(b[1], 4))
        else:
            say("failed", f"{c['name']}: both sides refuse it, differently", f"base: {tail(b[1], 6)}\nafter: {tail(a[1], 6)}")
        return
    bad = [(s, r) for s, r in (("base", b), ("after", a)) if r[0] != "ok"]
    if bad:
        say("failed", f"{c['name']}: " + ", ".join(f"the {s} side's {r[1] if r[0] == 'failed' else 'pipecc'} failed" for s, r in bad),
            "\n".join(f"{s}: " + tail(r[-1], 30) for s, r in bad))
        return
    _, b_out, b_saved, b_losses, b_val = b
    _, a_out, a_saved, a_losses, a_val = a
    problems = []
    bb, ab = open(b_saved, "rb").read(), open(a_saved, "rb").read()
    if bb != ab:
        first = next((i for i, (x, y) in enumerate(zip(bb, ab)) if x != y), min(len(bb), len(ab)))
        problems.append(("the saved models differ", f"the saved models differ ({len(bb)} vs {len(ab)} bytes, first at byte {first}); " + weight_diff(b_saved, a_saved)))
    if b_losses != a_losses:
        problems.append(("the losses differ", f"the losses differ: base {b_losses}, after {a_losses}"))
    if c["val"] and (b_val is None or a_val is None):
        problems.append(("--val wrote no held-out losses", "--val wrote no LOG.val.csv on " + " and ".join(s for s, v in (("base", b_val), ("after", a_val)) if v is None)))
    if b_val != a_val:
        problems.append(("the held-out losses differ", f"--val's held-out losses differ: base {b_val!r}, after {a_val!r}"))
    pb, pa = (read_plan(d) for d in (b_out, a_out))
    differ = [k for k in pb if k in pa and pb[k] != pa[k]]
    only = [f"{k} ({'base' if k in pb else 'after'} only)" for k in list(pb) + list(pa) if (k in pb) != (k in pa)]
    if differ:
        problems.append(("plan.json differs", f"plan.json differs in {len(differ)} field(s) (timings aside): " +
                        "; ".join(f"{k}: {pb[k]!r} vs {pa[k]!r}" for k in differ[:6])))
    text = stage_text(b_out, a_out) + ("; plan.json fields on one side only: " + ", ".join(only[:6]) if only else "")
    # A freeze event's re-plan (run.sh --freeze-at), by each side's own pipecc: its plan and text too.
    re_b, re_a = (b_out[:-5] + ".frozen2.pipe", a_out[:-5] + ".frozen2.pipe")
    if os.path.isdir(re_b) or os.path.isdir(re_a):
        if not (os.path.isdir(re_b) and os.path.isdir(re_a)):
            problems.append(("one side did not re-plan", f"only the {'base' if os.path.isdir(re_b) else 'after'} side re-planned at the freeze event"))
        else:
            qb, qa = (read_plan(d) for d in (re_b, re_a))
            # As for the plan itself: a field only one side states (a newer pipecc's) is noted, not a difference.
            rdiffer = [k for k in sorted(qb) if k in qa and qb[k] != qa[k]]
            if rdiffer:
                problems.append(("the re-plan differs", "the freeze event's re-plan differs in plan.json (timings aside): " +
                                "; ".join(f"{k}: {qb[k]!r} vs {qa[k]!r}" for k in rdiffer)[:600]))
            text += "; the re-plan's " + stage_text(re_b, re_a)
    if not KEEP:  # the disk: a case's builds are done with (the full matrix would leave some 600 MB)
        for d in (b_out, a_out, re_b, re_a):
            shutil.rmtree(d, ignore_errors=True)
    if problems:
        say("failed", f"{c['name']}: {', '.join(h for h, _ in problems)}; {text}{note}", "\n".join(d for _, d in problems))
    else:
        vals = " and held-out losses" if c["val"] else ""
        say("passed", f"{c['name']}: saved models byte-identical ({len(bb)} bytes), losses{vals} the same "
                      f"(last {b_losses[-1] if b_losses else '?'}), plan the same; {text}{note}")


def main():
    global WORK, DATASETS, KEEP
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="HEAD~1", help="the git revision to compare with (default HEAD~1)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", metavar="DIR")
    ap.add_argument("--only", action="append", default=[], metavar="WORD")
    args = ap.parse_args()
    KEEP = bool(args.keep)
    t0, data_checks = time.time(), 0
    after_pipecc = os.path.join(ROOT, "bin", "pipecc")
    if not os.access(after_pipecc, os.X_OK):
        sys.exit("test_same_bits: build this checkout's bin/pipecc and bin/piperun-data first (make bin/pipecc bin/piperun-data)")
    sha = prepare_base(args.base)
    head = git("rev-parse", "HEAD").stdout.strip()
    dirty = " with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no").stdout.strip() else ""
    print(f"# after: this checkout ({head[:12]}{dirty})", flush=True)
    if args.keep:
        WORK = os.path.abspath(args.keep)
        os.makedirs(WORK, exist_ok=True)
    else:
        WORK = tempfile.mkdtemp(prefix="pipecc-same-bits.")
    try:
        base, after = Side("base", BASE_WT, WORK), Side("after", ROOT, WORK)
        cases = [c for c in matrix(args.quick) if not args.only or any(w in c["name"] for w in args.only)]
        for k in (2, 3):
            with open(os.path.join(WORK, f"frozen{k}.txt"), "w") as f:
                f.write(f"pipecc-frozen 1\n# the first {k} parameterised layers\nlayers {k}\n")
        # The data, written once by this checkout's generator; the base's must write the same bytes.
        kinds = {DATA[c["model"]] for c in cases} | {"val" + DATA[c["model"]] for c in cases if c["val"]}
        gen = {"mnist": ["mnist", "--n", "512", "--seed", "1"], "cifar": ["cifar", "--n", "512", "--seed", "1"],
               "tokens": ["tokens", "--n", "20000", "--seed", "1"], "valmnist": ["mnist", "--n", "64", "--seed", "2"],
               "valcifar": ["cifar", "--n", "64", "--seed", "2"]}
        DATASETS, data_checks = {}, 0
        for kind in sorted(kinds):
            DATASETS[kind] = os.path.join(WORK, "data", kind + (".bin" if kind == "tokens" else ""))
            paths = {}
            for side in (after, base):
                p = DATASETS[kind] if side is after else os.path.join(WORK, "data-base", kind + (".bin" if kind == "tokens" else ""))
                os.makedirs(os.path.dirname(p), exist_ok=True)
                if os.path.isdir(p):
                    shutil.rmtree(p)
                elif os.path.exists(p):  # piperun-data replaces a file only with --force, which the base may not know
                    os.remove(p)
                rc, out = sh([side.datagen, gen[kind][0], p, *gen[kind][1:]], timeout=300)
                if rc:
                    sys.exit(f"test_same_bits: the {side.name} side's piperun-data {' '.join(gen[kind])} failed:\n{tail(out)}")
                paths[side.name] = p

            def contents(p):
                files = sorted(os.listdir(p)) if os.path.isdir(p) else [""]
                return [(f, open(os.path.join(p, f) if f else p, "rb").read()) for f in files]
            same = contents(paths["base"]) == contents(paths["after"])
            say("passed" if same else "failed", f"piperun-data {' '.join(gen[kind])}: both sides write the same bytes")
            data_checks += same
        # libpiperun's objects, once per side (the runtimes may differ): a small plan's make runtime.
        def warm(side):
            out = os.path.join(side.dir, "warm.pipe")
            shutil.rmtree(out, ignore_errors=True)
            rc, text = sh([side.pipecc, os.path.join(MODELS, "mlp.onnx"), "-n", "1", "--devices", DEVICES, "-o", out],
                          cwd=side.dir, env=side.env, timeout=120)
            if rc == 0:
                rc, text = sh(["make", "-s", "-j2", "-C", out, "runtime"], cwd=side.dir, env=side.env, timeout=1200)
            return side.name, rc, text
        t1 = time.time()
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(2, args.jobs)) as ex:
            for name, rc, text in ex.map(warm, (base, after)):
                if rc:
                    print(f"# {name}: building libpiperun's objects failed (each case will try again):\n{tail(text)}", flush=True)
        print(f"# libpiperun's objects built for each side ({time.time() - t1:.0f} s); {len(cases)} cases, "
              f"{args.jobs} at a time, in {WORK}", flush=True)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
            futs = [ex.submit(run_case, c, base, after, args.jobs) for c in cases]
            for f, c in zip(futs, cases):
                try:
                    f.result()
                except Exception as e:  # a bug of this script's: the case fails, the rest go on
                    say("failed", f"{c['name']}: the test itself raised {type(e).__name__}: {e}")
    finally:
        if args.keep:
            print(f"# kept {WORK}")
        else:
            shutil.rmtree(WORK, ignore_errors=True)
    print(f"# base {args.base} = {sha[:12]}, after {head[:12]}{dirty}; {time.time() - t0:.0f} s in all")
    if counts["passed"] == data_checks:  # a pass beside the data checks is needed
        tally.fail("no case passed beside the data checks")
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
