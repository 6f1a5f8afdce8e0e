"""PipeFB (--schedule pipefb [--fb-split NF]): the forward and the backward on
different ranks.

Ranks 0..NF-1 run only forwards (a chain whose last rank computes the loss),
ranks NF..N-1 only backwards (a chain carrying the gradients back; rank N-1
holds the last layers' backward).  Each forward rank sends its stashed
activations straight to the backward rank that needs them; the backward ranks
own the gradients and the optimizer and send the updated weights back before
the next step's first forward, so training is bit-identical to -n 1.

For each case - a sample model, n, an --fb-split (n/2, or none: the planner's
choice) - this test checks that:
  - pipecc compiles it (a refusal fails unless pinned in EXPECTED with its
    reason: then it is counted as a pinned refusal, never as passed), and plan.json says "schedule": "pipefb" and "fb_split": NF (the
    one asked for, else one in 1..n-1), has n stage plans whose "role" is
    "forward" for ranks < NF and "backward" for the rest, each with
    node_begin, node_end, arena_bytes and memory; the forward ranks' node
    ranges tile [0, compute_nodes) in rank order, and so do the backward
    ranks' (rank NF the first layers', rank n-1 the last layers');
  - the listing (schedule.txt) has a rank/stage line saying "forward" and one
    saying "backward", and mentions the traffic between the chains; this is
    deliberately loose: it only looks for the words "stash" or "sends";
  - trained 3 steps with --seed 1, the --log losses and the --save weights
    file are bit-identical to the same model at -n 1 with the same --batch and
    --microbatches (two successful runs compared: the reference must itself
    have trained);
  - on the GPT and the ResNet at n = 4 (--quick: the GPT), each forward rank
    keeps no weight gradients and no optimizer state (memory.grads and
    memory.optimizer are 0) and its arena is at most its weights plus two
    micro-batches of its crossing values and stash plus its temporaries:
        arena_bytes <= params + 2 * (stash + received) / copies + workspace
    from plan.json's breakdown ("copies": the copies of one micro-batch's
    crossing values and stash that the arena holds, so (stash + received) /
    copies is one micro-batch's), and arena_bytes is the ARENA_BYTES the
    generated stage program allocates.  A breakdown field that is missing is
    reported by name.  On the same cases, under --mem-limit: a limit no split
    meets is refused naming the least that fits, that limit compiles with every
    arena under it, and it trains bit-identically to -n 1 on the same
    convolutions (plan.json's "convolutions": a plan that fits only with
    im2col + GEMM is compared with -n 1 --conv gemm; oneDNN's bits differ).
And that each malformed use is one `pipecc: error:` line on stderr naming the
flag, exit 2, and no output directory: --schedule pipefb -n 1, --fb-split 0,
--fb-split N (and N+1, -1) for -n N, --fb-split x, --fb-split without
--schedule pipefb (none, or 1f1b); while their valid neighbours compile
(--plan-only): -n 2 (fb_split 1, the only choice), --fb-split 1 and N-1.

--quick (make test): LeNet and the GPT at n = 2 and 4, the error cases, the
arena check on the GPT.  No flag: mlp, lenet, resnet, gpt, gpt_opset17 at
n = 2, 4, 6.  --only=MODEL runs one model's cases.  PIPECC selects the
compiler (default bin/pipecc).  Run with /usr/bin/python3."""
import csv
import json
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
if os.sep in PIPECC:
    PIPECC = os.path.abspath(PIPECC)
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")  # fixed machine figures: the planner's choice does not depend on this machine
STEPS = 3
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)

DATA = {"mlp": "mnist", "lenet": "mnist", "resnet": "cifar", "gpt": "tokens", "gpt_opset17": "tokens"}
# (batch, micro-batches) per model for n <= 4 and for n = 6: small, B % m == 0, m >= 2.
SIZES = {
    "mlp": ((32, 4), (48, 6)),
    "lenet": ((32, 4), (48, 6)),
    "resnet": ((16, 4), (24, 6)),
    "gpt": ((8, 4), (12, 6)),
    "gpt_opset17": ((8, 4), (12, 6)),
}
# The breakdown fields (plan.json stage_plans[r].memory) the arena check reads.
ARENA_FIELDS = ("params", "grads", "optimizer", "stash", "received", "workspace", "copies")

# Cases pipecc may refuse, and why: (model, n, fb_split or "planner") -> reason.  Any other refusal fails.
EXPECTED = {}


def check(cond, what):
    return tally.check(cond, what)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def size(model, n):
    return SIZES[model][1] if n > 4 else SIZES[model][0]


def compile_plan(model, n, out, batch, m, extra=()):
    return run([PIPECC, os.path.join(ROOT, "onnx_models", model + ".onnx"), "-n", str(n), "--batch", str(batch),
                "--microbatches", str(m), "--devices", DEVICES, "-o", out, *extra])


def tail(r, k=300):
    return (r.stderr or r.stdout or "").strip()[-k:]


def train(out, data, tmp, tag):
    """Builds and trains STEPS steps with --seed 1; (losses as logged, saved model bytes) or None."""
    b = run(["make", "-s", "-C", out, "-j2"])
    if not check(b.returncode == 0, f"{tag}: the stages build" + ("" if b.returncode == 0 else f" ({tail(b)})")):
        return None
    base = os.path.join(tmp, os.path.basename(out))
    log, saved = base + ".csv", base + ".saved.onnx"
    try:
        x = run([os.path.join(out, "run.sh"), "--data", data, "--steps", str(STEPS), "--seed", "1", "--log", log,
                 "--save", saved, "--timeout", "120", "--quiet"], timeout=600)
    except subprocess.TimeoutExpired:
        check(False, f"{tag}: trains (run.sh still running after 600 s)")
        return None
    if not check(x.returncode == 0 and os.path.exists(log) and os.path.exists(saved),
                 f"{tag}: trains" + ("" if x.returncode == 0 else f" (exit {x.returncode}: {tail(x, 400)})")):
        return None
    losses = [row["loss"] for row in csv.DictReader(open(log))]

    def finite(s):
        try:
            return math.isfinite(float(s))
        except ValueError:
            return False
    if not check(len(losses) == STEPS and all(finite(v) for v in losses),
                 f"{tag}: the log holds {STEPS} finite losses ({losses})"):
        return None
    return losses, open(saved, "rb").read()


def arenas_in_code(out, n):
    """ARENA_BYTES of each generated stage_<k>.c (None where it cannot be read)."""
    got = []
    for k in range(n):
        p = os.path.join(out, f"stage_{k}.c")
        m = re.search(r"^#define ARENA_BYTES (\d+)LL$", open(p).read(), re.M) if os.path.exists(p) else None
        got.append(int(m.group(1)) if m else None)
    return got


def tiles(ranges, total):
    """Whether [(begin, end), ...] in this order cover [0, total) contiguously."""
    at = 0
    for b, e in ranges:
        if b != at or e < b:
            return False
        at = e
    return at == total


def plan_checks(out, n, split, tag):
    """plan.json's schedule, fb_split, roles and node ranges; returns (plan, NF) or None."""
    try:
        plan = json.load(open(os.path.join(out, "plan.json")))
    except (OSError, ValueError) as e:
        check(False, f"{tag}: plan.json reads ({e})")
        return None
    check(plan.get("schedule") == "pipefb", f"{tag}: plan.json \"schedule\" is \"pipefb\" ({plan.get('schedule')!r})")
    nf = plan.get("fb_split")
    if split is not None:
        ok = check(nf == split, f"{tag}: plan.json \"fb_split\" is {split} ({nf!r})")
    else:
        ok = check(isinstance(nf, int) and 1 <= nf <= n - 1, f"{tag}: plan.json \"fb_split\" (the planner's) is in 1..{n - 1} ({nf!r})")
    sps = plan.get("stage_plans", [])
    if not check(len(sps) == n, f"{tag}: plan.json has {n} stage plans ({len(sps)})") or not ok:
        return None
    missing = [(r, f) for r, sp in enumerate(sps) for f in ("role", "node_begin", "node_end", "arena_bytes", "memory") if f not in sp]
    if not check(not missing, f"{tag}: every stage plan has role, node_begin, node_end, arena_bytes and memory "
                              f"(missing (rank, field): {missing})"):
        return None
    roles = [sp["role"] for sp in sps]
    want = ["forward"] * nf + ["backward"] * (n - nf)
    check(roles == want, f"{tag}: ranks 0..{nf - 1} are \"forward\", {nf}..{n - 1} \"backward\" ({roles})")
    total = plan.get("compute_nodes")
    fwd = [(sp["node_begin"], sp["node_end"]) for sp in sps[:nf]]
    bwd = [(sp["node_begin"], sp["node_end"]) for sp in sps[nf:]]
    check(isinstance(total, int) and tiles(fwd, total),
          f"{tag}: the forward ranks' node ranges tile [0, compute_nodes={total}) in rank order ({fwd})")
    check(isinstance(total, int) and tiles(bwd, total),
          f"{tag}: the backward ranks' node ranges tile [0, compute_nodes={total}) in rank order, rank {n - 1} the last layers ({bwd})")
    return plan, nf


def listing_check(out, tag):
    """Loose on purpose: a rank/stage line saying forward, one saying backward, and the words stash or sends."""
    try:
        text = open(os.path.join(out, "schedule.txt")).read()
    except OSError as e:
        check(False, f"{tag}: schedule.txt reads ({e})")
        return
    lines = text.splitlines()
    rank_line = re.compile(r"\b(rank|stage)\s+\d+", re.I)
    for role in ("forward", "backward"):
        word = re.compile(r"\b" + role + r"\b", re.I)
        check(any(rank_line.search(l) and word.search(l) for l in lines),
              f"{tag}: the listing has a rank line saying \"{role}\"")
    check(re.search(r"\bstash|\bsends\b", text, re.I) is not None,
          f"{tag}: the listing mentions the traffic between the chains (loose: only the word \"stash\" or \"sends\")")


def arena_check(out, plan, nf, tag):
    """Each forward rank: no gradients, no optimizer state, at most two micro-batches of crossing values and stash."""
    code = arenas_in_code(out, len(plan["stage_plans"]))
    for r, sp in enumerate(plan["stage_plans"][:nf]):
        rt = f"{tag} forward rank {r}"
        mem, arena = sp["memory"], sp["arena_bytes"]
        check(code[r] == arena, f"{rt}: plan.json arena_bytes {arena} is stage_{r}.c's ARENA_BYTES ({code[r]})")
        have = sorted(mem) if isinstance(mem, dict) else []
        missing = [f for f in ARENA_FIELDS if not isinstance(mem.get(f) if isinstance(mem, dict) else None, (int, float))]
        if not check(not missing, f"{rt}: plan.json stage_plans[{r}].memory has the breakdown fields the arena check reads "
                                  f"({', '.join(ARENA_FIELDS)})" +
                                  (f"; missing or not a number: {', '.join(missing)} (it has: {', '.join(have) or repr(mem)})" if missing else "")):
            continue
        others = [f for f in have if f not in ARENA_FIELDS + ("total", "inflight", "estimate", "exact")]
        if others:
            print(f"# {rt}: memory also has {', '.join(f'{f}={mem[f]}' for f in others)}, which the bound below does not count "
                  f"as crossing values or stash", flush=True)
        check(mem["grads"] == 0 and mem["optimizer"] == 0,
              f"{rt}: keeps no weight gradients and no optimizer state (memory.grads {mem['grads']}, memory.optimizer {mem['optimizer']})")
        crossing = mem["stash"] + mem["received"]
        if crossing and not check(mem["copies"] >= 1, f"{rt}: memory.copies, the copies of a micro-batch's crossing values and stash, is at "
                                         f"least 1 ({mem['copies']})" +
                                         ("" if mem["copies"] >= 1 else "; one micro-batch's bytes cannot be derived without it")):
            continue
        per_mb = crossing / mem["copies"] if crossing else 0
        bound = mem["params"] + 2 * per_mb + mem["workspace"]
        lists = sum(v.get("bytes", 0) for k in ("recv", "send") for v in sp.get(k, []) if isinstance(v, dict))
        check(arena <= bound,
              f"{rt}: arena {arena} <= weights {mem['params']} + 2 x one micro-batch's crossing values and stash "
              f"{per_mb:.0f} ((stash {mem['stash']} + received {mem['received']}) / copies {mem['copies']}) + temporaries "
              f"{mem['workspace']} = {bound:.0f} (for comparison, its recv and send lists: {lists} bytes per micro-batch)")


def errors(tmp):
    """Malformed pipefb uses: one `pipecc: error:` line naming the flag, exit 2, nothing written."""
    cases = [
        ("--schedule pipefb -n 1", ["-n", "1", "--schedule", "pipefb"], "pipefb"),
        ("--fb-split 0 at -n 4", ["-n", "4", "--schedule", "pipefb", "--fb-split", "0"], "fb-split"),
        ("--fb-split 4 at -n 4 (must be 1..3)", ["-n", "4", "--schedule", "pipefb", "--fb-split", "4"], "fb-split"),
        ("--fb-split 5 at -n 4 (must be 1..3)", ["-n", "4", "--schedule", "pipefb", "--fb-split", "5"], "fb-split"),
        ("--fb-split 2 at -n 2 (must be 1)", ["-n", "2", "--schedule", "pipefb", "--fb-split", "2"], "fb-split"),
        ("--fb-split -1 at -n 4", ["-n", "4", "--schedule", "pipefb", "--fb-split", "-1"], "fb-split"),
        ("--fb-split x", ["-n", "4", "--schedule", "pipefb", "--fb-split", "x"], "fb-split"),
        ("--fb-split 2 without --schedule", ["-n", "4", "--fb-split", "2"], "fb-split"),
        ("--fb-split 2 with --schedule 1f1b", ["-n", "4", "--schedule", "1f1b", "--fb-split", "2"], "fb-split"),
        # not combined yet: refused rather than silently ignored
        ("--offload peer with pipefb", ["-n", "4", "--schedule", "pipefb", "--offload", "peer"], "offload"),
        ("--recompute auto with pipefb", ["-n", "4", "--schedule", "pipefb", "--recompute", "auto"], "recompute"),
    ]
    # The valid neighbours of those cases compile (--plan-only), so a refusal above is about the flag's value,
    # not pipefb missing altogether: -n 2, and --fb-split at both ends of 1..N-1.
    for what, flags, nf in (("--schedule pipefb -n 2", ["-n", "2", "--schedule", "pipefb"], None),
                            ("--fb-split 1 at -n 4", ["-n", "4", "--schedule", "pipefb", "--fb-split", "1"], 1),
                            ("--fb-split 3 at -n 4", ["-n", "4", "--schedule", "pipefb", "--fb-split", "3"], 3)):
        out = os.path.join(tmp, "valid." + "_".join(flags))
        r = run([PIPECC, os.path.join(ROOT, "onnx_models", "lenet.onnx"), "--batch", "32", "--microbatches", "4",
                 "--devices", DEVICES, "--plan-only", "-o", out, *flags])
        ok = r.returncode == 0
        if ok:
            try:
                plan = json.load(open(os.path.join(out, "plan.json")))
                ok = plan.get("schedule") == "pipefb" and (plan.get("fb_split") == nf if nf else plan.get("fb_split") == 1)
            except (OSError, ValueError):
                ok = False
        check(ok, f"{what} (--plan-only): compiles, plan.json says pipefb with fb_split {nf or 1}" + ("" if r.returncode == 0 else f" ({tail(r)})"))
    for i, (what, flags, names) in enumerate(cases):
        out = os.path.join(tmp, f"err{i}")
        r = run([PIPECC, os.path.join(ROOT, "onnx_models", "lenet.onnx"), "--batch", "32", "--microbatches", "4",
                 "--devices", DEVICES, "-o", out, *flags])
        err = r.stderr.strip()
        check(r.returncode == 2 and err.startswith("pipecc: error:") and "\n" not in err and names in err and not os.path.exists(out),
              f"{what}: refused with one `pipecc: error:` line naming {names!r}, exit 2, nothing written "
              f"(exit {r.returncode}, {'an output directory' if os.path.exists(out) else 'no output'}: {err[:240]})")


REFS = {}


def reference(model, batch, m, data, tmp, extra=()):
    """-n 1 with the same batch and micro-batches (and EXTRA flags), trained once: (losses, saved) or None."""
    key = (model, batch, m, tuple(extra))
    if key not in REFS:
        out = os.path.join(tmp, f"{model}.b{batch}.m{m}.n1" + "".join("." + e.strip("-") for e in extra))
        tag = f"{model} -n 1 B={batch} m={m}{''.join(' ' + e for e in extra)} (reference)"
        r = compile_plan(model, 1, out, batch, m, extra)
        REFS[key] = (train(out, data, tmp, tag)
                     if check(r.returncode == 0, f"{tag}: compiles" + ("" if r.returncode == 0 else f" ({tail(r)})"))
                     else None)
    return REFS[key]


def limit_case(model, n, data, tmp, ref):
    """Under --mem-limit the chains are cut so that every rank fits: a limit no split meets is
    refused naming the least that fits; that limit compiles, every arena is under it, and the
    plan trains bit-identically to -n 1 on the same convolutions (--conv gemm where the limited
    plan fell back to im2col + GEMM)."""
    batch, m = size(model, n)
    tag = f"{model} n={n} pipefb --mem-limit"
    bad = compile_plan(model, n, os.path.join(tmp, f"{model}.lim.bad"), batch, m, ["--schedule", "pipefb", "--mem-limit", "1K"])
    mt = re.search(r"at least (\d+)K", bad.stderr)
    if not check(bad.returncode == 2 and bad.stderr.startswith("pipecc: error:") and mt and
                 not os.path.exists(os.path.join(tmp, f"{model}.lim.bad")),
                 f"{tag} 1K: refused, naming the least limit that fits, nothing written ({tail(bad, 300)})"):
        return
    lim = int(mt.group(1)) * 1024
    out = os.path.join(tmp, f"{model}.lim")
    r = compile_plan(model, n, out, batch, m, ["--schedule", "pipefb", "--mem-limit", f"{mt.group(1)}K"])
    if not check(r.returncode == 0, f"{tag} {mt.group(1)}K (the limit named): compiles ({tail(r)})"):
        return
    plan = json.load(open(os.path.join(out, "plan.json")))
    arenas = [sp["arena_bytes"] for sp in plan["stage_plans"]]
    check(max(arenas) <= lim and arenas == arenas_in_code(out, n),
          f"{tag} {mt.group(1)}K: every rank's arena is under it and is its ARENA_BYTES ({arenas})")
    tight = compile_plan(model, n, os.path.join(tmp, f"{model}.lim.tight"), batch, m,
                         ["--schedule", "pipefb", "--mem-limit", str(lim - 1024)])
    check(tight.returncode == 2, f"{tag}: 1K below the named limit is refused ({tail(tight, 200)})")
    # A plan that fits the limit only with im2col + GEMM convolutions (plan.json's "convolutions";
    # pipecc falls back to them, docs/kernels.md) is compared with -n 1 on the same convolutions:
    # oneDNN and im2col + GEMM do not give the same bits.
    on = ""
    if plan.get("convolutions") == "im2col":
        on = " --conv gemm"
        ref = reference(model, batch, m, data, tmp, ["--conv", "gemm"])
    res = train(out, data, tmp, tag)
    if res and check(ref is not None, f"{tag}: the -n 1{on} reference trained"):
        check(res[0] == ref[0] and res[1] == ref[1], f"{tag}: losses and weights bit-identical to -n 1{on}'s")


def main():
    quick = "--quick" in sys.argv
    only = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")]
    models = ["lenet", "gpt"] if quick else ["mlp", "lenet", "resnet", "gpt", "gpt_opset17"]
    ns = (2, 4) if quick else (2, 4, 6)
    arena_cases = {("gpt", 4)} if quick else {("gpt", 4), ("resnet", 4)}
    with tempfile.TemporaryDirectory() as tmp:
        data = {}
        for kind, path, n in (("mnist", "mnist", "512"), ("cifar", "cifar", "512"), ("tokens", "tokens.bin", "20000")):
            data[kind] = os.path.join(tmp, path)
            if any(DATA[m] == kind for m in models if not only or m in only):
                g = run([DATAGEN, kind, data[kind], "--n", n])
                check(g.returncode == 0, f"piperun-data {kind} writes the data set" + ("" if g.returncode == 0 else f" ({tail(g)})"))
        errors(tmp)
        for model in models:
            if only and model not in only:
                continue
            for n in ns:
                batch, m = size(model, n)
                ref = reference(model, batch, m, data[DATA[model]], tmp)  # -n 1, same batch and micro-batches
                for split in (n // 2, None) if not quick or n == 4 else (None,):   # --quick: the planner's split at n = 2
                    name = "planner" if split is None else split
                    tag = f"{model} n={n} pipefb --fb-split {name} B={batch} m={m}"
                    out = os.path.join(tmp, f"{model}.n{n}.fb{name}")
                    r = compile_plan(model, n, out, batch, m, ["--schedule", "pipefb", *(["--fb-split", str(split)] if split is not None else [])])
                    if (model, n, name) in EXPECTED:   # a pinned refusal: counted as refused, never as passed
                        if r.returncode == 2 and r.stderr.startswith("pipecc: error:"):
                            tally.refused(tag, f"{EXPECTED[(model, n, name)]}: {tail(r, 200)}")
                        else:
                            check(False, f"{tag}: pinned as refused ({EXPECTED[(model, n, name)]})" +
                                  (f", exit {r.returncode}: {tail(r, 200)}" if r.returncode else ": it compiles now, remove it from EXPECTED"))
                        continue
                    if not check(r.returncode == 0, f"{tag}: compiles" + ("" if r.returncode == 0 else f" ({tail(r)})")):
                        continue
                    got = plan_checks(out, n, split, tag)
                    listing_check(out, tag)
                    if got and (model, n) in arena_cases:
                        arena_check(out, got[0], got[1], tag)
                    res = train(out, data[DATA[model]], tmp, tag)
                    if not check(ref is not None, f"{tag}: the -n 1 reference trained, so there is something to compare with"):
                        continue
                    if not res:
                        continue
                    losses, saved = res
                    check(losses == ref[0], f"{tag}: the losses are bit-identical to -n 1's ({losses} vs {ref[0]})")
                    check(saved == ref[1], f"{tag}: the trained weights (--save) are bit-identical to -n 1's")
                if (model, n) in arena_cases:
                    limit_case(model, n, data[DATA[model]], tmp, ref)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
