"""Training runs end to end: the demo's loss falls, checkpoint + resume is bit
identical to an uninterrupted run, a killed rank stops the others quickly with
the stage named and leaves the last checkpoint loadable, NaN stops the run with
step/stage/tensor named, and data that does not fit the model is refused on
every rank before the first step.  Run with /usr/bin/python3."""
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.path.join(ROOT, "bin", "pipecc")
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


def check(cond, what):
    tally.count(cond)
    print(("ok - " if cond else "not ok - ") + what)
    return cond


def sh(cmd, timeout=300, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def build(model, n, out, *extra):
    r = sh([PIPECC, os.path.join(ROOT, "onnx_models", model), "-n", str(n), "--batch", "64", "--microbatches", "8",
            "--devices", DEVICES, "-o", out, *extra])
    if r.returncode:
        return r.stderr
    r = sh(["make", "-s", "-C", out], timeout=600)
    return r.stderr if r.returncode else ""


def weights(path):
    return {t.name: numpy_helper.to_array(t).tobytes() for t in onnx.load(path).graph.initializer}


def losses(path):
    with open(path) as f:
        return [float(row["loss"]) for row in csv.DictReader(f)]


def manifest_step(ck):
    """The step of the committed checkpoint in ck (its MANIFEST's "step S" line)."""
    for line in open(os.path.join(ck, "MANIFEST")):
        if line.startswith("step "):
            return int(line.split()[1])
    return -1


def main():
    tmp = tempfile.mkdtemp(prefix="pipecc-train.")
    os.environ["PIPECC_CACHE"] = os.path.join(tmp, "machine.txt")
    data = os.path.join(tmp, "mnist")
    r = sh([DATAGEN, "mnist", data, "--n", "12800", "--seed", "1"])
    if not check(r.returncode == 0, f"synthetic MNIST written ({r.stderr.strip()})"):
        return tally.finish()
    pipe = os.path.join(tmp, "lenet.pipe")
    err = build("lenet.onnx", 4, pipe, "--lr", "0.1")
    if not check(not err, f"lenet compiled for 4 stages and built ({err.strip()})"):
        return tally.finish()
    run = os.path.join(pipe, "run.sh")

    # The demo: 200 steps, loss from ~2.3 to well under 0.5.
    log = os.path.join(tmp, "demo.csv")
    r = sh([run, "--data", data, "--steps", "200", "--shuffle", "--quiet", "--log", log])
    if check(r.returncode == 0, f"200 training steps on 4 ranks ({r.stderr.strip()[-300:]})"):
        ls = losses(log)
        check(len(ls) == 200 and ls[0] > 2.0 and np.mean(ls[-10:]) < 0.5,
              f"loss falls from {ls[0]:.3f} to {np.mean(ls[-10:]):.3f} (mean of the last 10 steps; must be < 0.5)")

    # Checkpoint + resume reproduces the uninterrupted run bit for bit.
    full, part = os.path.join(tmp, "full.onnx"), os.path.join(tmp, "resumed.onnx")
    ck = os.path.join(tmp, "ckpt")
    a = sh([run, "--data", data, "--steps", "30", "--shuffle", "--quiet", "--save", full, "--log", os.path.join(tmp, "a.csv")])
    b = sh([run, "--data", data, "--steps", "12", "--shuffle", "--quiet", "--checkpoint", ck, "--checkpoint-every", "6"])
    c = sh([run, "--data", data, "--steps", "30", "--shuffle", "--quiet", "--resume", ck, "--save", part])
    if check(a.returncode == b.returncode == c.returncode == 0, f"runs with checkpoint/resume ({a.stderr}{b.stderr}{c.stderr})"[:400]):
        check(manifest_step(ck) == 12, "the checkpoint's manifest records step 12")
        wa, wc = weights(full), weights(part)
        check(len(wa) > 0 and wa.keys() == wc.keys() and all(wa[k] == wc[k] for k in wa),
              f"30 steps straight and 12 + resume to 30 give bit-identical weights ({len(wa)} initializers compared)")

    # A rank killed mid-run: the others stop within 10 s naming it; the checkpoint survives.
    ck2 = os.path.join(tmp, "ckpt2")
    p = subprocess.Popen([run, "--data", data, "--steps", "100000", "--quiet", "--checkpoint", ck2, "--checkpoint-every", "20"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not os.path.exists(os.path.join(ck2, "MANIFEST")):
        time.sleep(0.2)
    # The rank's own process (its command line starts with the binary), not mpirun's.
    victim = sh(["pgrep", "-f", "^" + os.path.join(pipe, "stage_2")]).stdout.split()
    if check(victim and p.poll() is None, "the run is going and stage 2's process is found"):
        os.kill(int(victim[0]), signal.SIGKILL)
        t0 = time.time()
        try:
            out, errout = p.communicate(timeout=10)
            took = time.time() - t0
            check(p.returncode != 0, f"killing stage 2 stops the run with a non-zero status ({p.returncode}) in {took:.1f} s")
            named = "rank 2" in errout or "stage 2" in errout
            check(named, "the message names the failed stage: " + " | ".join(l for l in errout.splitlines() if "2" in l)[:300])
        except subprocess.TimeoutExpired:
            p.kill()
            check(False, "the other ranks did not stop within 10 s of stage 2 being killed")
        left = sh(["pgrep", "-f", "^" + pipe + "/stage_"]).stdout.split()
        check(not left, f"no stage process is left running ({left})")
        for pid in left:
            os.kill(int(pid), signal.SIGKILL)
        r = sh([run, "--data", data, "--steps", str(manifest_step(ck2) + 1), "--quiet", "--resume", ck2])
        check(r.returncode == 0, f"the last checkpoint is intact and resumes ({r.stderr.strip()[-200:]})")
    else:
        p.kill()

    # NaN: a huge learning rate blows up; the run stops naming step, stage and tensor.
    r = sh([run, "--data", data, "--steps", "50", "--quiet", "--lr", "1e9"])
    msg = [l for l in r.stderr.splitlines() if "NaN" in l or "Inf" in l]
    check(r.returncode != 0 and msg and "step" in msg[0] and "stage" in msg[0] and ("loss" in msg[0] or "gradient" in msg[0]),
          f"a NaN/Inf stops the run: {msg[0] if msg else r.stderr.strip()[-300:]}")

    # Data that does not match the model: refused before the first step, on every rank.
    cifar = os.path.join(tmp, "cifar")
    sh([DATAGEN, "cifar", cifar, "--n", "256"])
    bad_labels = os.path.join(tmp, "badlabels")
    sh([DATAGEN, "mnist", bad_labels, "--n", "256"])
    lab = bytearray(open(os.path.join(bad_labels, "train-labels-idx1-ubyte"), "rb").read())
    lab[8 + 100] = 12
    open(os.path.join(bad_labels, "train-labels-idx1-ubyte"), "wb").write(bytes(lab))
    tokens = os.path.join(tmp, "tokens.bin")
    sh([DATAGEN, "tokens", tokens, "--n", "5000"])
    for label, path, words in (("CIFAR images for an MNIST model", cifar, ["28"]),
                               ("a label out of range", bad_labels, ["12", "100"]),
                               ("a token file for an image model", tokens, ["token"]),
                               ("a missing data directory", os.path.join(tmp, "nope"), ["nope"])):
        r = sh([run, "--data", path, "--steps", "5", "--quiet"], timeout=60)
        lines = [l for l in r.stderr.splitlines() if "error" in l]
        stages = {s for s in range(4) if any(f"stage {s}:" in l for l in lines)}
        check(r.returncode != 0 and stages == {0, 1, 2, 3} and all(w in " ".join(lines) for w in words)
              and "step 1/" not in r.stdout,
              f"{label}: every rank stops before the first step: {lines[0] if lines else r.stderr.strip()[-200:]}")
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
