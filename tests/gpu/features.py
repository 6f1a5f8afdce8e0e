#!/usr/bin/python3
"""The runtime's other features on the GPU target (check.sh runs it after parity.py, whose saved models
it reuses from /tmp/<case>.onnx; prepare.py built the plans and the CPU references here):

  * pipefb: gpt at n = 2 (--schedule pipefb) trains to the bits of the GPU's n = 1 run;
  * async: lenet at n = 2 (--schedule async --staleness 1): per-step losses within 1e-5 of the CPU
    target's async run (the same stated rule);
  * checkpoints: lenet at n = 2 (1f1b), 5 steps with --checkpoint, then --resume to step 10: the bits of
    the uninterrupted run;
  * --val: lenet at n = 1, the held-out loss and accuracy after steps 5 and 10 within 1e-5 of the CPU
    target's.
Freezing (--freeze-at) re-plans with pipecc and make on the machine that runs the job; the GPU machine
here has neither, so it is not checked (a counted skip).

  features.py PLANS_DIR FEATURES_DIR DATA_DIR META_JSON OUT_DIR   writes OUT_DIR/features.txt"""
import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
from onnx import numpy_helper

PLANS, FEAT, DATA, META, OUT = sys.argv[1:6]
lines = []
counts = {"passed": 0, "failed": 0, "skipped": 0}


def say(s):
    print(s, flush=True)
    lines.append(s)


def check(ok, what):
    counts["passed" if ok else "failed"] += 1
    say(f"{'ok' if ok else 'not ok'} - {what}")
    return ok


def run(what, cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if r.returncode:
        check(False, f"{what}: {(r.stdout + r.stderr).strip()[-1200:]}")
        return False
    return True


def weights(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def same_bits(a, b):
    return set(a) == set(b) and all(np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a)


def losses(path, col="loss"):
    return [float(r[col]) for r in csv.DictReader(open(path))]


def rel(a, b):
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(p - q) / max(abs(q), 1e-30) for p, q in zip(a, b))


def reference(tag, data):
    """parity.py's saved model of a case, or the case run here when parity.py did not run first."""
    path = f"/tmp/{tag}.onnx"
    if not os.path.exists(path):
        run(f"{tag} (the reference run)", [os.path.join(PLANS, tag, "run.sh"), "--data", data, "--steps", "10", "--quiet", "--save", path])
    return path if os.path.exists(path) else None


def main():
    meta = json.load(open(META))["features"]
    mnist, tokens = os.path.join(DATA, "mnist"), os.path.join(DATA, "tokens.bin")
    reference("gpt_n1", tokens), reference("lenet_1f1b_n2", mnist)
    # pipefb against the GPU's own n = 1
    saved = "/tmp/feat_gpt_pipefb.onnx"
    if os.path.exists("/tmp/gpt_n1.onnx"):
        if run("gpt pipefb n=2 trains on the GPU", [os.path.join(FEAT, "gpt_pipefb_n2", "run.sh"), "--data", tokens, "--steps", "10",
                                                     "--quiet", "--save", saved]):
            check(same_bits(weights(saved), weights("/tmp/gpt_n1.onnx")), "gpt pipefb n=2: the trained weights are the GPU's n = 1 bits")
    else:
        check(False, "gpt pipefb n=2: no n = 1 run to compare with (parity.py's /tmp/gpt_n1.onnx)")
    # async against the CPU target's async
    log = os.path.join(OUT, "feat_lenet_async.csv")
    if run("lenet async n=2 trains on the GPU", [os.path.join(FEAT, "lenet_async_n2", "run.sh"), "--data", mnist, "--steps", "10",
                                                  "--quiet", "--log", log]):
        got, want = losses(log), meta["lenet_async_cpu"]
        check(rel(got, want) <= 1e-5, f"lenet async n=2 (staleness 1): losses within 1e-5 of the CPU target's async run (max rel {rel(got, want):.2e})")
    # checkpoint and resume against the uninterrupted run
    ck = "/tmp/feat_ck"
    shutil.rmtree(ck, ignore_errors=True)
    runsh = os.path.join(PLANS, "lenet_1f1b_n2", "run.sh")
    if os.path.exists("/tmp/lenet_1f1b_n2.onnx") and \
            run("lenet n=2: 5 steps with --checkpoint", [runsh, "--data", mnist, "--steps", "5", "--quiet", "--checkpoint", ck,
                                                        "--checkpoint-every", "5"]) and \
            run("lenet n=2: --resume to step 10", [runsh, "--data", mnist, "--steps", "10", "--quiet", "--resume", ck, "--save",
                                                  "/tmp/feat_resumed.onnx"]):
        check(same_bits(weights("/tmp/feat_resumed.onnx"), weights("/tmp/lenet_1f1b_n2.onnx")),
              "lenet n=2: checkpoint at step 5 and --resume: the uninterrupted run's bits")
    # --val against the CPU target's
    log = os.path.join(OUT, "feat_lenet_val.csv")
    if run("lenet n=1 --val", [os.path.join(PLANS, "lenet_n1", "run.sh"), "--data", mnist, "--steps", "10", "--quiet", "--log", log,
                               "--val", mnist, "--val-every", "5"]):
        got, want = losses(log + ".val.csv", "val_loss"), meta["lenet_val_cpu"]
        acc, wacc = losses(log + ".val.csv", "val_accuracy"), meta["lenet_val_acc_cpu"]
        check(rel(got, want) <= 1e-5 and acc == wacc,
              f"lenet --val: held-out losses within 1e-5 of the CPU target's (max rel {rel(got, want):.2e}), accuracy {acc} vs {wacc}")
    counts["skipped"] += 1
    say("skip - --freeze-at on the GPU: the re-plan runs pipecc and make where the job runs; this GPU machine has neither")
    say(f"total: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    with open(os.path.join(OUT, "features.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
