"""The memory plan (issue 11): keep, offload (to a peer rank or a file) or
recompute each stashed activation so that every rank fits --mem-limit.

For each case - a sample model, n, a schedule, a target - the plain plan is
compiled and trained first.  The limits tried for a target run from the
smallest limit that target can reach (its floor, which pipecc names when it
refuses 1K) to just under the leanest plain plan's need (the smallest limit
named with --offload none --recompute none: below it no other cut fits as it
stands, so the plan must move something); "auto" cases take fractions of the
busiest plain arena.  The case then checks that:
  - pipecc plans under the limit with that target alone (--offload peer
    --recompute none, --offload file:DIR --recompute none, --offload none
    --recompute auto), and the plan really moves or recomputes something
    (OFFLOAD / RECOMPUTE actions in the stage programs, xslots in plan.json);
  - every stage's arena (ARENA_BYTES) is at most the limit, the ranks that
    hold a peer's activations included (the peer target: the first half of
    the ranks have the limit, in --devices, and the rest none - BPipe's case,
    the first stages stash most and the last have room; --quick also runs
    LeNet with one limit on every rank, hosts included);
  - the trained losses and the saved weights are bit-identical to the plain
    plan's, over 3 steps (two successful runs compared);
  - each stage's measured peak anonymous RSS is at most the limit plus the
    runtime's fixed overhead measured on the same stage of the plain run (the
    memory that is not the arena: MPI, BLAS, the loader), plus 256 KiB of
    run-to-run noise;
  - a limit below what any plan can reach is refused, naming the smallest
    limit that fits, and writes nothing; that limit itself compiles.

A case that cannot be planned is a failure unless it is pinned in EXPECTED
with its reason: then it is counted as a pinned refusal ("refused (pinned) -
CASE: REASON", tests/tally.py), never as passed, and a pinned case that plans
fails ("unpin it").  --quick (make test) runs a few cases; with no flag (make
test-memory) every sample model at n = 2 and 4 under 1f1b and zb1 with each
target.

Values at the cuts (issue 37): a residual CNN made here (make_rescnn: a stem and three
residual blocks of 16 channels on 16x16 inputs, written with torch) whose busiest stage
is dominated by the values it receives and sends.  Its cases plan at 50% of the busiest
plain arena (the limit on every rank for the file target, on the first half of the ranks
for peer), and check besides the above that the plan moves values at the cuts (a sent or
received value offloaded or recomputed, or held only while in flight).  Run with
/usr/bin/python3."""
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
STEPS = 3
SLACK = 256 * 1024  # run-to-run noise of what MPI and OpenBLAS allocate outside the arena
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)

TARGETS = {
    "peer": ["--offload", "peer", "--recompute", "none"],
    "peer-all": ["--offload", "peer", "--recompute", "none"],  # one --mem-limit on every rank, hosts included
    "file": ["--offload", "file:{dir}", "--recompute", "none"],
    "recompute": ["--offload", "none", "--recompute", "auto"],
    "auto": [],
}
# Every sample model and the data it trains on; the full matrix (make test-memory) runs each.
DATA = {"mlp": "mnist", "lenet": "mnist", "resnet": "cifar", "gpt": "tokens", "gpt_opset17": "tokens", "densenet": "cifar",
        "inception": "cifar"}
# Models this suite writes itself (name -> path, filled by main) and the data they train on.
MADE = {}
MADE_DATA = {"rescnn": "img16"}

# Cases with no memory plan to check, and why (each is still run: it must be refused or move nothing).
EXPECTED = {
    ("lenet", 2, "1f1b", "peer"): "with rank 1 unlimited the plain cut fits at every limit tried by moving nodes onto rank 1, "
                                  "and no offloading cut is faster",
    ("rescnn", 4, "zb1", "file@"): "under zb1 the leanest file plan needs 61.5% of the busiest plain arena (1691904 of 2750080 "
                                   "bytes; with the late layout the plain arena itself is 12% smaller, and 54% of the hold layout's "
                                   "3126592), and what fills it is not at the cuts: what W reads waits for W (the gradients I passes "
                                   "to W, W's input activations in xslots: kept activations 832 KiB), the cut's gradients and values "
                                   "576 KiB, temporaries 208 KiB",
}


def check(cond, what):
    tally.count(cond)
    print(("ok - " if cond else "not ok - ") + what, flush=True)
    return cond


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def compile_plan(model, n, sched, out, extra=(), devices=DEVICES):
    return run([PIPECC, MADE.get(model) or os.path.join(ROOT, "onnx_models", model + ".onnx"), "-n", str(n), "--schedule", sched,
                "--batch", "32", "--microbatches", "8", "--devices", devices, "-o", out, *extra])


def half_limited(tmp, n, lim):
    """A devices file (tests/devices_equal.txt's figures) whose first half of the ranks have lim bytes and
    the rest no limit: BPipe's case, the first stages stash most, the last have room for them."""
    path = os.path.join(tmp, f"devices.{n}.{lim}")
    with open(path, "w") as f:
        f.write("rank * flops=50G\n" + "".join(f"rank {r} flops=50G mem={lim}\n" for r in range((n + 1) // 2)) +
                "link * bandwidth=5G latency=2us\nmemcpy bandwidth=10G\n")
    return path


def make_rescnn(path):
    """A small residual CNN (issue 37's case): stem Conv(3->16, 3x3, pad 1) + Relu on 16x16 inputs, three
    blocks relu(x + conv2(relu(conv1(x)))) of 16 channels, flatten, Linear(16*16*16 -> 10); ONNX opset 14 with a
    dynamic batch axis.  Its stages' busiest arena is mostly the values crossing its cuts."""
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)

        def forward(self, x):
            return torch.relu(x + self.c2(torch.relu(self.c1(x))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, padding=1)
            self.blocks = nn.Sequential(*[Block(16) for _ in range(3)])
            self.fc = nn.Linear(16 * 16 * 16, 10)

        def forward(self, x):
            return self.fc(torch.flatten(self.blocks(torch.relu(self.stem(x))), 1))

    torch.manual_seed(0)
    torch.onnx.export(Net(), torch.randn(2, 3, 16, 16), path, opset_version=14, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    return path


def make_img16(path, n=512):
    """NumPy data for make_rescnn's model: x.npy float32 [n, 3, 16, 16], y.npy int64 labels (0..3, learnable from x)."""
    import numpy as np
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 3, 16, 16)).astype(np.float32)
    y = 2 * (x[:, 0, :4, :4].sum(axis=(1, 2)) > 0) + (x[:, 1, :4, :4].sum(axis=(1, 2)) > 0)
    np.save(os.path.join(path, "x.npy"), x)
    np.save(os.path.join(path, "y.npy"), y.astype(np.int64))
    return path


def cut_values_moved(out, sent_only=False):
    """The values at the cuts the plan moves: (stage, tensor, fate) for each sent or received value (sent_only: sent)
    whose fate is not kept (plan.json's memory_plan values against each stage's send and recv lists)."""
    got = []
    for sp in json.load(open(os.path.join(out, "plan.json")))["stage_plans"]:
        cut = {v["name"] for v in sp.get("send", []) + ([] if sent_only else sp.get("recv", []))}
        got += [(sp["stage"], v["tensor"], v["fate"]) for v in (sp.get("memory_plan") or {}).get("values", []) if v["tensor"] in cut]
    return got


def passed_through(out):
    """(stage, tensor, fate) of each value a stage receives and sends on whose fate is not kept."""
    got = []
    for sp in json.load(open(os.path.join(out, "plan.json")))["stage_plans"]:
        through = {v["name"] for v in sp.get("recv", [])} & {v["name"] for v in sp.get("send", [])}
        got += [(sp["stage"], v["tensor"], v["fate"]) for v in (sp.get("memory_plan") or {}).get("values", []) if v["tensor"] in through]
    return got


def arenas(out):
    got = []
    for k in range(64):
        p = os.path.join(out, f"stage_{k}.c")
        if not os.path.exists(p):
            break
        got.append(int(re.search(r"#define ARENA_BYTES (\d+)LL", open(p).read()).group(1)))
    return got


def memory_actions(out):
    text = "".join(open(os.path.join(out, f)).read() for f in os.listdir(out) if f.startswith("stage_") and f.endswith(".c"))
    return len(re.findall(r"\{PR_(OFFLOAD|RECOMPUTE),", text))


def train(out, data, tmp, tag, env=None, extra=()):
    """Trains 3 steps; (losses, saved model bytes, per-stage summary rows, stdout) or None."""
    b = run(["make", "-s", "-C", out, "-j2"])
    if not check(b.returncode == 0, f"{tag}: the stages build" + ("" if b.returncode == 0 else f" ({b.stderr.strip()[-300:]})")):
        return None
    log, saved = os.path.join(tmp, tag + ".csv"), os.path.join(tmp, tag + ".onnx")
    x = run([os.path.join(out, "run.sh"), "--data", data, "--steps", str(STEPS), "--log", log, "--save", saved, "--timeout", "120",
             *extra], timeout=600, env=dict(os.environ, **(env or {})))
    if not check(x.returncode == 0, f"{tag}: trains" + ("" if x.returncode == 0 else f" ({(x.stderr or x.stdout).strip()[-400:]})")):
        return None
    losses = [row["loss"] for row in csv.DictReader(open(log))]
    lines = x.stdout.splitlines()
    head = next(i for i, l in enumerate(lines) if l.startswith("stage  compute_s"))
    cols = lines[head].split()
    rows = [dict(zip(cols, map(float, l.split()))) for l in lines[head + 1:] if l.split() and l.split()[0].isdigit()]
    return losses, open(saved, "rb").read(), rows, x.stdout


def io_uring_usable():
    """Whether this kernel lets a process make an io_uring (io_uring_setup, syscall 425 on x86-64):
    a container may forbid it, and the runtime then copies on a thread of its own."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)
    fd = libc.syscall(425, 4, params)
    if fd >= 0:
        os.close(fd)
    return fd >= 0


def file_copies(tag, out, data, tmp, odir, p_losses, p_model, stdout):
    """A file offload's copies run as io_uring requests where liburing was built in and the kernel allows
    it, else on the runtime's I/O thread (runtime/xfer.c); both give the plain plan's bits, and a file
    that cannot take the copies (a full disk) stops the job naming it, with either."""
    plans = json.load(open(os.path.join(out, "plan.json")))["stage_plans"]
    to_file = [k for k, sp in enumerate(plans) if (sp.get("memory_plan") or {}).get("offload_to") == "file"
               and sp["memory_plan"].get("offloaded_bytes", 0) > 0]
    if not to_file:  # the limit was met by xslots alone (values kept in one copy), nothing goes to the file
        tally.skip(f"{tag}: the file offload's copies", "the plan offloads nothing to its file (the limit was met by xslots alone)")
        return
    line = next((l for l in stdout.splitlines() if l.startswith("offload file copies:")), "")
    want = "io_uring" if (os.path.exists("/usr/include/liburing.h") and io_uring_usable()
                          and os.environ.get("PIPERUN_XFER") != "thread") else "an I/O thread"
    check(line == "offload file copies: " + ", ".join(f"stage {k} by {want}" for k in to_file),
          f"{tag}: the summary says stages {to_file}' copies run by {want} ({line!r})")
    res = train(out, data, tmp, tag.replace(" ", ".") + ".thread", env={"PIPERUN_XFER": "thread"})
    if res:
        losses, saved, _, so = res
        check(losses == p_losses and saved == p_model and "by an I/O thread" in so and "by io_uring" not in so,
              f"{tag}, PIPERUN_XFER=thread: the I/O thread's copies give the plain plan's bits too ({losses[-1:]} vs {p_losses[-1:]})")
    # A directory that fills up: a tmpfs of one page, smaller than any sample model's offload file (the
    # MLP's is 33 KiB; mounting needs root, as the suite runs in CI).
    tiny = os.path.join(tmp, "tiny")
    os.makedirs(tiny, exist_ok=True)
    if os.geteuid() != 0:
        tally.skip(f"{tag}: a full offload directory stops the job", "the full-disk case needs root to mount a tmpfs")
        return
    if not check(run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", tiny]).returncode == 0,
                 f"{tag}: a one-page tmpfs mounts for the full-disk case (as root)"):
        return
    try:
        for how, env in (("io_uring" if want == "io_uring" else "the I/O thread", {}), ("the I/O thread", {"PIPERUN_XFER": "thread"})):
            x = run([os.path.join(out, "run.sh"), "--data", data, "--steps", str(STEPS), "--offload-dir", tiny, "--timeout", "60"],
                    timeout=300, env=dict(os.environ, **env))
            msg = (x.stderr + x.stdout).strip()
            check(x.returncode != 0 and "offloading activations failed: writing " + tiny + "/pipecc-offload-" in msg
                  and "No space left on device" in msg and not os.listdir(tiny),
                  f"{tag}: a full offload directory stops the job naming the file, by {how}, nothing left behind "
                  f"(rc {x.returncode}: {msg[-300:]!r})")
    finally:
        run(["umount", tiny])


def case(model, n, sched, target, fracs, tmp, data, plain_cache, at_fracs=False, want=None, copies=True):
    """at_fracs: the limits are the fractions `fracs` of the busiest plain arena for this target too (not
    its floor to the plain need), and values at the cuts must be among those that move.  want: a fate
    ("offloaded", "recomputed") that a value this stage sends (and its backward reads) must have in the plan,
    or "through": a value a stage receives and sends on leaves its ring (offloaded or in flight); the first of
    the fractions whose plan has one is taken.  copies: a file target's copies are checked by both
    backends and against a full directory too (file_copies)."""
    at_fracs = at_fracs or want is not None
    tag = f"{model} n={n} {sched} {target}" + (f" at {', '.join(f'{f:.0%}' for f in fracs)}" if at_fracs else "")
    tag += ", a value passed through" if want == "through" else f", a sent value {want}" if want else ""
    key = (model, n, sched)

    def plain(conv):
        """The plain plan's busiest arena and training results, its convolutions run as `conv` (plan.json's
        "convolutions"): a plan that fits its limit only with im2col + GEMM (pipecc falls back to it when
        oneDNN's memory beside the arena does not fit) is compared with a plain plan on the same kernels."""
        if key + (conv,) not in plain_cache:
            out = os.path.join(tmp, f"{model}.{n}.{sched}.plain.{conv}")
            r = compile_plan(model, n, sched, out, ["--conv", "gemm"] if conv == "im2col" else [])
            if not check(r.returncode == 0, f"{model} n={n} {sched}: the plain plan ({conv}) compiles ({r.stderr.strip()[-300:]})"):
                plain_cache[key + (conv,)] = None
            else:
                plain_cache[key + (conv,)] = (max(arenas(out)), train(out, data, tmp, f"{model}.{n}.{sched}.plain.{conv}"))
        got = plain_cache[key + (conv,)]
        return got if got and got[1] else None

    if not plain("onednn"):
        return
    busiest = plain("onednn")[0]
    # The limits tried: for "auto", fractions of the busiest plain arena; for
    # one target, from the smallest limit it can reach (its floor F, named by
    # its refusal of 1K) up to just under the leanest plain plan's need P
    # (below P no other cut fits as it stands, so the plan must move something).
    odir = os.path.join(tmp, "offload")
    os.makedirs(odir, exist_ok=True)
    flags = [f.format(dir=odir) for f in TARGETS[target]]
    if target == "auto" or at_fracs:
        limits = [int(busiest * f) for f in fracs]
        base = f"{', '.join(f'{f:.0%}' for f in fracs)} of the busiest plain arena ({busiest} bytes)"
    else:
        need = {}
        for name, extra in (("plain", ["--offload", "none", "--recompute", "none"]), ("floor", flags)):
            r = compile_plan(model, n, sched, os.path.join(tmp, "need"), ["--mem-limit", "1K", *extra])
            m = re.search(r"at least (\d+)K", r.stderr)
            if not check(m is not None, f"{tag}: the {name} planner names its smallest limit ({r.stderr.strip()[-200:]})"):
                return
            need[name] = int(m.group(1)) * 1024
        P, F = need["plain"], need["floor"]
        limits = sorted({x for x in (F, (3 * F + P) // 4, (F + P) // 2, P - 4096) if F <= x < P})
        base = f"limits from its floor {F} to the plain need {P} bytes ({limits})"
    # The first limit whose plan moves something (OFFLOAD or RECOMPUTE actions); failing that, the first
    # whose plan keeps values in xslots (a stage whose micro-batches go straight to their backward
    # needs one copy instead of a ring: memory saved, nothing moved).
    suffix = ('.at' if at_fracs else '') + (f'.{want}' if want else '')
    out, limit, errors, fallback = os.path.join(tmp, f"{model}.{n}.{sched}.{target}{suffix}"), None, [], None
    for lim in limits:
        if target == "peer":  # the limit on the first half of the ranks, none on the rest (their hosts)
            r = compile_plan(model, n, sched, out, flags, half_limited(tmp, n, lim))
        else:
            r = compile_plan(model, n, sched, out, ["--mem-limit", str(lim), *flags])
        sent = want is None or (r.returncode == 0 and (passed_through(out) if want == "through" else
                                                        any(f == want for _, _, f in cut_values_moved(out, sent_only=True))))
        if r.returncode == 0 and memory_actions(out) and sent:
            limit = lim
            break
        if r.returncode == 0 and not sent:
            errors.append(f"{lim}: no " + ("value passed through leaves" if want == "through" else f"sent value {want}"))
            continue
        if r.returncode == 0 and fallback is None and any(s.get("memory_plan", {}).get("xslots", 0) for s in
                                                           json.load(open(os.path.join(out, "plan.json")))["stage_plans"]):
            fallback = lim
        errors.append(f"{lim}: {r.stderr.strip()[-160:] or 'nothing moved'}")
    if limit is None and fallback is not None:
        limit = fallback
        r = compile_plan(model, n, sched, out, ["--mem-limit", str(limit), *flags] if target != "peer" else flags,
                         DEVICES if target != "peer" else half_limited(tmp, n, limit))
        print(f"# {tag}: nothing moves at any limit tried; checking the plan at {limit}, which keeps values in xslots")
    pin = key + (target + ("@" if at_fracs else "") + (want or ""),)
    if pin in EXPECTED:   # pinned: no memory plan (a refusal, counted as one, never as passed)
        if limit is None:
            tally.refused(f"{tag}: no memory plan", f"{EXPECTED[pin]} ({'; '.join(errors) or 'no limit between'})")
        else:
            check(False, f"{tag}: pinned as having no memory plan ({EXPECTED[pin]}), but it plans at {limit}: unpin it")
        return
    if not check(limit is not None, f"{tag}: plans under one of {base} and moves something ({'; '.join(errors) or 'no limit between'})"):
        return
    conv = json.load(open(os.path.join(out, "plan.json"))).get("convolutions", "onednn")
    ref = plain(conv)
    if not check(ref is not None, f"{tag}: the plain plan on the limited plan's convolutions ({conv}) trains"):
        return
    _, (p_losses, p_model, p_rows, _) = ref
    got = arenas(out)
    bound = [limit if target != "peer" or r < (n + 1) // 2 else float("inf") for r in range(n)]
    check(all(a <= b for a, b in zip(got, bound)), f"{tag} limit {limit}: every limited rank's arena fits ({got})")
    plan = json.load(open(os.path.join(out, "plan.json")))
    mp = [s.get("memory_plan", {}) for s in plan["stage_plans"]]
    check(any(m.get("xslots", 0) for m in mp), f"{tag}: plan.json states the memory plan (xslots, fates)")
    if at_fracs:
        moved = cut_values_moved(out)
        check(moved, f"{tag} limit {limit} ({limit / busiest:.1%} of the busiest plain arena {busiest}): values at the cuts leave "
                     f"their rings ({moved})")
    res = train(out, data, tmp, f"{model}.{n}.{sched}.{target}{suffix}")
    if not res:
        return
    losses, saved, rows, stdout = res
    check(losses == p_losses and len(losses) == STEPS, f"{tag}: the losses are bit-identical to the plain plan's ({losses[-1:]} vs {p_losses[-1:]})")
    check(saved == p_model, f"{tag}: the trained weights are bit-identical to the plain plan's")
    over = [(r["stage"], r["rss_peak_bytes"], b + p["rss_overhead_bytes"] + SLACK) for r, p, b in zip(rows, p_rows, bound)
            if r["rss_peak_bytes"] > b + p["rss_overhead_bytes"] + SLACK]
    check(not over and len(rows) == n, f"{tag}: every stage's peak RSS is at most the limit plus the plain run's overhead "
                                       f"(stage, peak, allowed: {over})")
    if target == "file" and copies:
        file_copies(tag, out, data, tmp, odir, p_losses, p_model, stdout)


def infeasible(tmp):
    """A limit no plan meets: an error naming the smallest that fits; nothing written; that one compiles."""
    out = os.path.join(tmp, "nofit")
    r = compile_plan("lenet", 4, "1f1b", out, ["--mem-limit", "100K"])
    m = re.search(r"at least (\d+)K", r.stderr)
    check(r.returncode == 2 and r.stderr.startswith("pipecc: error:") and m and not os.path.exists(out),
          f"--mem-limit 100K with offload and recompute allowed: refused naming the smallest limit, nothing written ({r.stderr.strip()})")
    if m:
        need = int(m.group(1)) * 1024
        r = compile_plan("lenet", 4, "1f1b", out, ["--mem-limit", str(need)])
        check(r.returncode == 0 and max(arenas(out)) <= need, f"--mem-limit {need} (the stated need) compiles and fits ({r.stderr.strip()})")
    r = compile_plan("lenet", 4, "1f1b", out + "2", ["--mem-limit", "100K", "--offload", "none", "--recompute", "none"])
    check(r.returncode == 2 and "at least" in r.stderr and not os.path.exists(out + "2"),
          f"--offload none --recompute none: the plain planner's refusal stands ({r.stderr.strip()[:200]})")
    r = compile_plan("lenet", 4, "1f1b", out + "3", ["--offload", "file:/nonexistent/dir"])
    check(r.returncode == 2 and "file:/nonexistent/dir" in r.stderr and not os.path.exists(out + "3"),
          f"--offload file:DIR with no such directory is refused, naming it ({r.stderr.strip()})")
    r = compile_plan("lenet", 4, "1f1b", out + "4", ["--offload", "disk"])
    check(r.returncode == 2 and "--offload 'disk'" in r.stderr, f"--offload disk is refused ({r.stderr.strip()})")


def main():
    quick = "--quick" in sys.argv
    with tempfile.TemporaryDirectory() as tmp:
        data = {}
        for kind in ("mnist", "cifar"):
            data[kind] = os.path.join(tmp, kind)
            run([DATAGEN, kind, data[kind], "--n", "512"])
        data["tokens"] = os.path.join(tmp, "tokens.bin")
        run([DATAGEN, "tokens", data["tokens"], "--n", "20000"])
        infeasible(tmp)
        only = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")]  # --only=gpt: one model's cases
        if not only or "rescnn" in only:
            MADE["rescnn"] = make_rescnn(os.path.join(tmp, "rescnn.onnx"))
            data["img16"] = make_img16(os.path.join(tmp, "img16"))
        plain = {}
        if quick:
            cases = [("lenet", 4, "1f1b", t, (0.9, 0.7)) for t in ("peer", "file", "recompute", "peer-all")]
            cases += [("gpt", 2, "zb1", "recompute", (0.9, 0.8)), ("resnet", 4, "1f1b", "auto", (0.5,))]
            # (the file copies' backends and a full directory: LeNet's file case above)
            cases += [("rescnn", 4, "1f1b", "file", (0.5,), True, None, False)]  # a sent value recomputed: the full run
        else:
            cases = [(m, n, s, t, (0.9, 0.8, 0.7, 0.6)) for m in DATA for n in (2, 4)
                     for s in ("1f1b", "zb1") for t in ("peer", "file", "recompute")]
            cases += [(m, 4, "1f1b", "auto", (0.5,)) for m in ("gpt", "resnet")]
            # Values at the cuts: the residual CNN at 50% of its busiest plain arena; a value it sends offloaded (to
            # the file, to a peer) or recomputed; and each target from its floor.
            cases += [("rescnn", 4, s, t, (0.5,), True) for s in ("1f1b", "zb1") for t in ("file", "peer")]
            cases += [("rescnn", 4, "1f1b", "file", (0.55, 0.6, 0.65), True, "offloaded"),
                      ("rescnn", 4, "1f1b", "peer", (0.5, 0.6), True, "offloaded"),
                      ("rescnn", 4, "1f1b", "recompute", (0.6, 0.7), True, "recomputed"),
                      ("rescnn", 4, "zb1", "file", (0.62, 0.63), True, "offloaded"),
                      ("rescnn", 4, "zb1", "peer", (0.45, 0.5), True, "offloaded"),
                      ("rescnn", 4, "zb1", "recompute", (0.7, 0.75), True, "recomputed"),
                      ("rescnn", 8, "1f1b", "file", (0.5, 0.6), True, "through")]  # n = 8: stages that pass values on
            cases += [("rescnn", 4, s, t, (0.9, 0.8, 0.7, 0.6)) for s in ("1f1b", "zb1") for t in ("file", "recompute", "peer")]
        for model, n, sched, target, fracs, *at in cases:
            if only and model not in only:
                continue
            case(model, n, sched, target, fracs, tmp, data[MADE_DATA.get(model) or DATA[model]], plain, *at)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
