#!/usr/bin/python3
"""Virtual stages (issue 36): --schedule interleaved and zbv, each rank running several stages (chunks).

For each sample model (all seven in the whole matrix), pipecc plans it at -n 1 (1f1b) and, with --chunks 2, at n = 2 and 4 under
interleaved and zbv (interleaved needs m a multiple of n: M = 4); make builds the stages; run.sh trains
STEPS steps with --save and --log.  Checks:

  * every run plans, builds and trains (a failure, with the output's tail, when one does not);
  * each chunked run's saved model is byte-identical to -n 1's, and so are its logged losses: the V x n
    stages are built as if each had a rank, so the sums are the same in the same order;
  * each rank's program names its chunks' stages (the header), and its descriptor lists them;
  * the listing states every rank's arena, and the generated ARENA_BYTES of each rank equals it;
  * zbv holds a local copy (two stages on one rank: stages n-1 and n on rank n-1): its program's RECV and
    SEND tables have a row whose peer is the rank itself;
  * --val after training (lenet, n = 2, zbv) runs and its held-out loss equals -n 1's.
  * Refusals, each one line naming the flag and exit 2 with nothing written: --chunks with a schedule of one
    stage per rank, zbv with 3 chunks, interleaved with 1, interleaved with m not a multiple of n, --offload
    and --recompute with chunks, more stages than nodes, a --mem-limit under the leanest plan (the smallest
    that fits is named, and it fits: one kilobyte less does not), a weight two stages of one rank read.

  /usr/bin/python3 tests/test_chunks.py [--ci | --quick] [--keep] [--model NAME]
  make test-chunks     # the whole matrix (every model at n = 2 and 4, both schedules)

--ci (make test): lenet at n = 2 under both schedules and at n = 4 under zbv, gpt at n = 2 under zbv; --quick:
lenet and gpt, the whole matrix.  Ends with "N passed, M failed, K skipped, R refused" (tests/tally.py).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
MODELS = ["mlp", "lenet", "gpt", "gpt_opset17", "resnet", "densenet", "inception"]
DATA = {"mlp": "mnist", "lenet": "mnist", "gpt": "tokens", "gpt_opset17": "tokens", "resnet": "cifar", "densenet": "cifar", "inception": "cifar"}
SIZES = {"mlp": (32, 4), "lenet": (32, 4), "gpt": (8, 4), "gpt_opset17": (8, 4), "resnet": (16, 4), "densenet": (16, 4), "inception": (16, 4)}
STEPS = 3
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")


def sh(cmd, cwd=None, timeout=900):
    p = subprocess.run(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


def tail(text, n=25):
    return "\n".join(text.strip().splitlines()[-n:])


def make_data(work):
    paths = {}
    for kind, args in {"mnist": ["mnist", "--n", "256", "--seed", "1"], "cifar": ["cifar", "--n", "256", "--seed", "1"],
                       "tokens": ["tokens", "--n", "20000", "--seed", "1"], "valmnist": ["mnist", "--n", "64", "--seed", "2"]}.items():
        p = os.path.join(work, "data", kind + (".bin" if kind == "tokens" else ""))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        rc, out = sh([DATAGEN, args[0], p] + args[1:])
        if rc:
            sys.exit(f"piperun-data {kind}: {out}")
        paths[kind] = p
    return paths


def run(work, data, model, n, sched, chunks, val=False):
    """Plans, builds and trains: (out dir, saved bytes, losses, val text) or None after counting a failure."""
    batch, mbs = SIZES[model]
    tag = f"{model}_n{n}_{sched}"
    out = os.path.join(work, tag + ".pipe")
    what = f"{model} n={n} {sched}" + (f" --chunks {chunks}" if chunks else "")
    cmd = [PIPECC, os.path.join(ROOT, "onnx_models", model + ".onnx"), "-n", str(n), "--batch", str(batch), "--microbatches", str(mbs),
           "--schedule", sched, "--lr", "0.05", "-o", out]
    if chunks:
        cmd += ["--chunks", str(chunks)]
    rc, text = sh(cmd)
    if rc:
        tally.check(False, f"{what}: plans", tail(text))
        return None
    rc, text = sh(["make", "-s", "-j2", "-C", out])
    if rc:
        tally.check(False, f"{what}: builds", tail(text))
        return None
    log, saved = os.path.join(work, tag + ".csv"), os.path.join(work, tag + ".onnx")
    rcmd = [os.path.join(out, "run.sh"), "--data", data[DATA[model]], "--steps", str(STEPS), "--seed", "1", "--log", log, "--save",
            saved, "--timeout", "240", "--quiet"]
    if val:
        rcmd += ["--val", data["valmnist"]]
    rc, text = sh(rcmd)
    if rc or not os.path.exists(saved):
        tally.check(False, f"{what}: trains", tail(text))
        return None
    tally.check(True, f"{what}: plans, builds and trains {STEPS} steps")
    losses = [l.split(",")[1] for l in open(log).read().splitlines()[1:] if l.count(",") >= 1]
    vals = open(log + ".val.csv").read() if val and os.path.exists(log + ".val.csv") else None
    return out, open(saved, "rb").read(), losses, vals


def check_program(out, model, n, sched):
    """The rank programs name their chunks; their arenas are the listing's; zbv has its local copy."""
    what = f"{model} n={n} {sched}"
    plan = json.load(open(os.path.join(out, "plan.json")))
    ranks = plan.get("ranks")
    tally.check(isinstance(ranks, list) and len(ranks) == n, f"{what}: plan.json lists {n} ranks", str(ranks)[:300])
    local = False
    for r in range(n):
        src = open(os.path.join(out, f"stage_{r}.c")).read()
        stages = [int(s) for s in re.findall(r"\*   chunk \d+: stage (\d+) of", src)]
        want = [r, r + n] if sched == "interleaved" else [r, 2 * n - 1 - r]
        tally.check(stages == want, f"{what}: rank {r}'s header names its chunks' stages {want}", str(stages))
        tally.check(".chunks = CHUNKS, .nchunks = 2," in src, f"{what}: rank {r}'s descriptor lists its chunks")
        arena = int(re.search(r"#define ARENA_BYTES (\d+)LL", src).group(1))
        if isinstance(ranks, list) and len(ranks) == n:
            tally.check(ranks[r].get("arena_bytes") == arena, f"{what}: rank {r}'s arena in plan.json is its ARENA_BYTES ({arena})",
                        str(ranks[r].get("arena_bytes")))
        for table in ("RECV", "SEND"):
            m = re.search(r"static const PrValue %s\[\] = \{\n(.*?)\n\};" % table, src, re.S)
            for row in (m.group(1).splitlines() if m else []):
                fields = [f.strip() for f in row.rsplit("}", 1)[0].split(",")]
                if len(fields) >= 3 and fields[-3] == str(r):
                    local = True
    if sched == "zbv":
        tally.check(local, f"{what}: rank {n - 1} holds stages {n - 1} and {n}: a value between them is a local copy (its own rank as peer)")


def refuse(args, want, what):
    out = os.path.join(tempfile.gettempdir(), "pipecc-chunks-refused.pipe")
    shutil.rmtree(out, ignore_errors=True)
    rc, text = sh([PIPECC] + args + ["-o", out])
    errors = [l for l in text.strip().splitlines() if not l.startswith("pipecc: warning:")]
    ok = rc == 2 and want in text and len(errors) == 1 and not os.path.exists(out)
    tally.check(ok, f"refused: {what}", text.strip()[:300])
    return text


def tied_model(work):
    """y = relu(x W) W: one weight read by two MatMuls, which two stages of one rank hold at -n 1 --chunks 2."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.random.RandomState(0).randn(8, 8).astype(np.float32) * 0.3, "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                           helper.make_node("MatMul", ["r", "W"], ["y"])], "tied",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], [w])
    path = os.path.join(work, "tied.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def refusals(work):
    lenet = os.path.join(ROOT, "onnx_models", "lenet.onnx")
    base = [lenet, "-n", "2", "--batch", "32", "--microbatches", "4"]
    refuse(base + ["--schedule", "1f1b", "--chunks", "2"], "--chunks 2: only --schedule interleaved and zbv", "--chunks with 1f1b")
    refuse(base + ["--schedule", "zbv", "--chunks", "3"], "the V shape has exactly 2 chunks", "zbv --chunks 3")
    refuse(base + ["--schedule", "interleaved", "--chunks", "1"], "interleaving needs 2 or more chunks", "interleaved --chunks 1")
    refuse(base + ["--schedule", "interleaved", "--chunks", "x"], "--chunks 'x': expected a whole number", "--chunks x")
    refuse([lenet, "-n", "3", "--microbatches", "4", "--schedule", "interleaved"], "a multiple of the ranks (n = 3)", "interleaved, m = 4, n = 3")
    refuse(base + ["--schedule", "zbv", "--offload", "peer"], "do not offload or recompute stashed activations yet", "zbv --offload peer")
    refuse(base + ["--schedule", "interleaved", "--recompute", "none"], "do not offload or recompute", "interleaved --recompute none")
    refuse([os.path.join(ROOT, "onnx_models", "mlp.onnx"), "-n", "8", "--microbatches", "8", "--schedule", "interleaved"],
           "-n 8 with --chunks 2 is 16 stages, more than the compute nodes", "more stages than nodes")
    text = refuse(base + ["--schedule", "zbv", "--mem-limit", "1M"], "raise --mem-limit to at least", "zbv under a 1 MiB limit")
    m = re.search(r"at least (\d+)K", text)
    if m:
        k = int(m.group(1))
        out = os.path.join(work, "limit.pipe")
        rc, t = sh([PIPECC] + base + ["--schedule", "zbv", "--mem-limit", f"{k}K", "-o", out])
        tally.check(rc == 0, f"zbv at the named limit {k}K plans", tail(t))
        refuse(base + ["--schedule", "zbv", "--mem-limit", f"{k - 1}K"], "raise --mem-limit", f"zbv at {k - 1}K, a kilobyte under it")
    refuse([tied_model(work), "-n", "1", "--batch", "8", "--microbatches", "2", "--schedule", "interleaved"],
           "weight 'W' is read by stages 0 and 1, which both run on rank 0", "a tied weight two stages of one rank read")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ci", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--model", action="append")
    args = ap.parse_args()
    models = args.model or (["lenet", "gpt"] if args.quick or args.ci else MODELS)
    work = tempfile.mkdtemp(prefix="pipecc-chunks-")
    data = make_data(work)
    refusals(work)
    for model in models:
        ref = run(work, data, model, 1, "1f1b", 0)
        if not ref:
            continue
        cases = [(n, sched) for n in (2, 4) for sched in ("interleaved", "zbv")]
        if args.ci:
            cases = [(2, "interleaved"), (2, "zbv"), (4, "zbv")] if model == "lenet" else [(2, "zbv")]
        for n, sched in cases:
                got = run(work, data, model, n, sched, 2)
                if not got:
                    continue
                tally.check(got[1] == ref[1], f"{model} n={n} {sched} --chunks 2: the trained model is -n 1's, byte for byte")
                tally.check(got[2] == ref[2], f"{model} n={n} {sched} --chunks 2: the losses are -n 1's", f"{got[2]} vs {ref[2]}")
                check_program(got[0], model, n, sched)
    if "lenet" in models:
        ref = run(work, data, "lenet", 1, "1f1b", 0, val=True)
        got = run(work, data, "lenet", 2, "zbv", 2, val=True)
        if ref and got:
            tally.check(got[3] is not None and got[3] == ref[3], "lenet n=2 zbv --val: the held-out loss is -n 1's", f"{got[3]} vs {ref[3]}")
    if args.keep:
        print("kept", work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
