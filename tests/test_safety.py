"""Every failure safe, nothing lost (issue 9, items 7-9), on a 2-stage MLP:

  checkpoints: a stage killed (SIGKILL) at every write, sync, rename and
    removal point of a checkpoint leaves the last committed checkpoint, which
    resumes to weights bit-identical to an uninterrupted run; flipped bytes in
    a stage file, an edited step and a checkpoint of another plan are refused
    naming the file or what differs;
  fail early, never hang: --save into a missing directory and --checkpoint
    under a missing parent fail before step 1; a data file truncated during
    the run stops it with a message naming the file (not SIGBUS); a stopped
    stage (kill -STOP) ends the job after --timeout naming the stage;
  NaN: a NaN bias before a ReLU stops the run naming NaN (it used to become 0
    and exit 0), and --save / checkpoints refuse weights that are not finite;
  buffers (issue 34, item 5): an initializer holding -inf and one --constant
    names are constants, trained bit-identically to Constant nodes, and saved.

The crash points come from the runtime's testing hook PIPERUN_CRASH_AT=R:K
(rank R kills itself with SIGKILL at its K-th checkpoint point).  Run with
/usr/bin/python3; prints ok / not ok lines and "N passed, M failed, K skipped, R refused" (tests/tally.py)."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.path.join(ROOT, "bin", "pipecc")
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


def check(cond, what):
    tally.count(cond)
    print(("ok - " if cond else "not ok - ") + what, flush=True)
    return cond


def sh(cmd, timeout=120, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def build(model, out, batch=64, mb=4):
    r = sh([PIPECC, model, "-n", "2", "--batch", str(batch), "--microbatches", str(mb), "--devices", DEVICES, "-o", out],
           timeout=120)
    if r.returncode:
        return r.stderr
    r = sh(["make", "-s", "-j2", "-C", out], timeout=600)
    return r.stderr if r.returncode else ""


def weights(path):
    return {t.name: numpy_helper.to_array(t).tobytes() for t in onnx.load(path).graph.initializer}


def same_weights(a, b):
    wa, wb = weights(a), weights(b)
    return len(wa) > 0 and wa.keys() == wb.keys() and all(wa[k] == wb[k] for k in wa)


def errors(r):
    return " | ".join(l for l in r.stderr.splitlines() if "piperun" in l)[:400]


def manifest_step(ck):
    try:
        for line in open(os.path.join(ck, "MANIFEST")):
            if line.startswith("step "):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def stage_pids(pipe, k):
    return [int(p) for p in sh(["pgrep", "-f", "^" + os.path.join(pipe, f"stage_{k}")]).stdout.split()]


def kill_leftovers(pipe):
    for k in range(2):
        for pid in stage_pids(pipe, k):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass


def start_long(run, args, log):
    """A run of many steps, returned once it has logged a few."""
    p = subprocess.Popen([run, "--steps", "1000000", "--quiet", "--log", log, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(log) and sum(1 for _ in open(log)) >= 4:
            break
        time.sleep(0.1)
    return p


def finish(p, timeout):
    t0 = time.time()
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, err, time.time() - t0
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return None, err, time.time() - t0


# ---- models ----

def nan_bias_mlp(src, dst):
    """The sample MLP with fc2.bias[5] = NaN: the NaN enters right before a ReLU."""
    m = onnx.load(src)
    for t in m.graph.initializer:
        if t.name == "fc2.bias":
            b = numpy_helper.to_array(t).copy()
            b[5] = np.nan
            t.CopyFrom(numpy_helper.from_array(b, t.name))
    onnx.save(m, dst)


def hidden_nan_model(dst):
    """784 -> 32 -> ReLU -> 10, and a trainable 'hidden_nan' whose value Where never picks:
    a NaN there reaches neither the loss nor a gradient, so training runs on and only the
    check before writing weights can see it.  The model holds zeros (an initializer that is
    not finite is a constant, never a weight: issue 34, item 5); test_nan writes the NaN
    into the stage's initial weights, as a weight gone bad would be."""
    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array((rng.standard_normal((32, 784)) * 0.05).astype(np.float32), "w1"),
            numpy_helper.from_array(np.zeros(32, np.float32), "b1"),
            numpy_helper.from_array(np.zeros(32, np.float32), "hidden_nan"),
            numpy_helper.from_array(np.ones(32, bool), "pick"),
            numpy_helper.from_array((rng.standard_normal((10, 32)) * 0.1).astype(np.float32), "w2"),
            numpy_helper.from_array(np.zeros(10, np.float32), "b2"),
            numpy_helper.from_array(np.array([-1, 784], np.int64), "shape")]
    nodes = [helper.make_node("Reshape", ["input", "shape"], ["x"]),
             helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
             helper.make_node("Add", ["h", "hidden_nan"], ["h2"]),
             helper.make_node("Where", ["pick", "h", "h2"], ["h3"]),
             helper.make_node("Relu", ["h3"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"], transB=1)]
    g = helper.make_graph(nodes, "hidden_nan", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], init)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), dst)


# ---- item 7: checkpoints ----

def test_crash_points(run, data, tmp, full):
    """Crash each rank at each checkpoint point of a run that resumes from step 2 and checkpoints
    at 4; the last committed checkpoint (2 or 4) must resume to the uninterrupted 6-step weights."""
    base = os.path.join(tmp, "ck-base")
    r = sh([run, "--data", data, "--steps", "2", "--quiet", "--checkpoint", base, "--checkpoint-every", "2"])
    if not check(r.returncode == 0 and manifest_step(base) == 2, f"a checkpoint at step 2 is committed ({errors(r)})"):
        return
    for rank in (0, 1):
        resumed, bad, points = [], [], 0
        for k in range(1, 40):
            ck = os.path.join(tmp, f"ck-crash-{rank}-{k}")
            shutil.copytree(base, ck)
            env = dict(os.environ, PIPERUN_CRASH_AT=f"{rank}:{k}")
            c = sh([run, "--data", data, "--steps", "4", "--quiet", "--resume", ck, "--checkpoint", ck, "--checkpoint-every", "2"],
                   env=env)
            if c.returncode == 0:
                break  # k is past the last point: the run finished
            points += 1
            out = os.path.join(tmp, f"crash-{rank}-{k}.onnx")
            step = manifest_step(ck)
            r = sh([run, "--data", data, "--steps", "6", "--quiet", "--resume", ck, "--save", out])
            if r.returncode == 0 and same_weights(full, out):
                resumed.append(step)
            else:
                bad.append(f"point {k}: step {step}, rc {r.returncode}: {errors(r)}")
            shutil.rmtree(ck, ignore_errors=True)
        # Stage 1's points all come before rank 0's commit; rank 0's span both sides of it.
        check(points >= 4 and not bad and set(resumed) == ({2, 4} if rank == 0 else {2}),
              f"stage {rank} killed at each of its {points} checkpoint points: the last committed checkpoint resumed every time "
              f"(from step 2 x{resumed.count(2)}, step 4 x{resumed.count(4)}) to weights bit-identical to 6 steps straight"
              + (f"; failures: {bad[:3]}" if bad else ""))


def test_refusals(run, data, tmp, pipe_other):
    ck = os.path.join(tmp, "ck-good")
    r = sh([run, "--data", data, "--steps", "4", "--quiet", "--checkpoint", ck, "--checkpoint-every", "2"])
    if not check(r.returncode == 0, f"a checkpoint at step 4 ({errors(r)})"):
        return

    def attempt(tag, edit):
        c = os.path.join(tmp, "ck-" + tag)
        shutil.copytree(ck, c)
        what = edit(c)
        r = sh([run, "--data", data, "--steps", "6", "--quiet", "--resume", c])
        return r, what

    def flip(c):
        f = glob.glob(os.path.join(c, "**", "stage_1.ckpt"), recursive=True)[0]
        b = bytearray(open(f, "rb").read())
        at = len(b) // 2 & ~3
        b[at:at + 16] = np.full(4, 0.25, np.float32).tobytes()  # finite garbage over weights, the size unchanged
        open(f, "wb").write(bytes(b))
        return f

    r, f = attempt("flip", flip)
    check(r.returncode != 0 and "stage_1.ckpt" in r.stderr and "corrupt" in r.stderr and "step 5/" not in r.stdout,
          f"flipped bytes in a stage file are refused naming it: {errors(r)}")

    def edit_step(c, fix_sum):
        p = os.path.join(c, "MANIFEST")
        if not os.path.exists(p):
            return None
        text = open(p).read().replace("step 4\n", "step 2\n")
        if fix_sum:  # a consistent manifest: the step in the stage files must still disagree
            body = text[:text.index("checksum ")]
            text = body + "checksum %016x\n" % fnv1a(body.encode())
        open(p, "w").write(text)
        return p

    r, p = attempt("step", lambda c: edit_step(c, False))
    check(p and r.returncode != 0 and "MANIFEST" in r.stderr and "step 3/" not in r.stdout,
          f"an edited step in the manifest is refused: {errors(r)}")
    r, p = attempt("step2", lambda c: edit_step(c, True))
    check(p and r.returncode != 0 and "step 4" in r.stderr and "step 2" in r.stderr,
          f"an edited step with the manifest's checksum redone is refused by the stage files' own step: {errors(r)}")

    other = os.path.join(pipe_other, "run.sh")
    r = sh([other, "--data", data, "--steps", "6", "--quiet", "--resume", ck])
    check(r.returncode != 0 and "another plan" in r.stderr and "batch" in r.stderr,
          f"a checkpoint of another plan (batch 64 in 4 micro-batches; this one 32 in 2, same buffers) is refused: {errors(r)}")


# ---- item 8: fail early, never hang ----

def test_fail_early(run, data, tmp):
    missing = os.path.join(tmp, "no-such-dir")
    r = sh([run, "--data", data, "--steps", "3", "--save", os.path.join(missing, "out.onnx")])
    check(r.returncode != 0 and "step 1/" not in r.stdout and "--save" in r.stderr and missing in r.stderr,
          f"--save into a missing directory fails before step 1: {errors(r)}")
    r = sh([run, "--data", data, "--steps", "3", "--checkpoint", os.path.join(missing, "ck"), "--checkpoint-every", "1"])
    check(r.returncode != 0 and "step 1/" not in r.stdout and "--checkpoint" in r.stderr and missing in r.stderr,
          f"--checkpoint under a missing parent fails before step 1: {errors(r)}")


def test_truncated_data(run, data, tmp):
    d = os.path.join(tmp, "mnist-trunc")
    shutil.copytree(data, d)
    p = start_long(run, ["--data", d], os.path.join(tmp, "trunc.csv"))
    images = os.path.join(d, "train-images-idx3-ubyte")
    os.truncate(images, 4096)
    rc, err, took = finish(p, 30)
    named = [l for l in err.splitlines() if "train-images-idx3-ubyte" in l]
    check(rc not in (None, 0, 135, -signal.SIGBUS) and named,
          f"a data file truncated during the run stops it (rc {rc}, {took:.1f} s) naming the file: {named[0][:300] if named else err[-300:]}")


def test_stopped_stage(run, data, tmp, pipe):
    p = start_long(run, ["--data", data, "--timeout", "3"], os.path.join(tmp, "stop.csv"))
    victim = stage_pids(pipe, 1)
    if not check(victim and p.poll() is None, "the run is going and stage 1's process is found"):
        p.kill()
        return
    os.kill(victim[0], signal.SIGSTOP)
    rc, err, took = finish(p, 40)
    kill_leftovers(pipe)
    lines = [l for l in err.splitlines() if "no progress" in l]
    check(rc not in (None, 0) and lines and "waiting for stage 1" in lines[0],
          f"a stopped stage (kill -STOP) ends the job in {took:.1f} s with --timeout 3, naming it: "
          f"{lines[0][:300] if lines else err[-300:]}")


# ---- item 9: NaN ----

def plant_nan(pipe, name, k):
    """Element k of weight `name` made NaN in the stage's initial weights (weights/manifest.txt says where); "" or why not."""
    for line in open(os.path.join(pipe, "weights", "manifest.txt")):
        f = line.split()
        if len(f) == 4 and f[3] == name:
            with open(os.path.join(pipe, "weights", f"stage_{f[0]}.bin"), "r+b") as w:
                w.seek(int(f[1]) + 4 * k)
                w.write(np.array([np.nan], np.float32).tobytes())
            return ""
    return f"{name} is not in {pipe}/weights/manifest.txt"


# ---- issue 34, item 5: buffers are constants ----

def buffer_model(dst, as_nodes):
    """784 -> 16 (+ a causal-style mask holding -inf) -> Softmax (+ a finite buffer 'pos') -> 10.  as_nodes: the
    mask and pos are Constant nodes (never weights, whatever pipecc decides about initializers); else initializers,
    as torch.onnx exports a registered buffer."""
    rng = np.random.default_rng(1)
    mask = np.where(np.arange(16) % 4 == 3, -np.inf, 0).astype(np.float32)
    pos = (rng.standard_normal(16) * 0.5).astype(np.float32)
    init = [numpy_helper.from_array((rng.standard_normal((16, 784)) * 0.05).astype(np.float32), "w1"),
            numpy_helper.from_array(np.zeros(16, np.float32), "b1"),
            numpy_helper.from_array((rng.standard_normal((10, 16)) * 0.3).astype(np.float32), "w2"),
            numpy_helper.from_array(np.zeros(10, np.float32), "b2"),
            numpy_helper.from_array(np.array([-1, 784], np.int64), "shape")]
    nodes = [helper.make_node("Reshape", ["input", "shape"], ["x"]),
             helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
             helper.make_node("Add", ["h", "mask"], ["hm"]),
             helper.make_node("Softmax", ["hm"], ["s"], axis=1),
             helper.make_node("Add", ["s", "pos"], ["sp"]),
             helper.make_node("Gemm", ["sp", "w2", "b2"], ["logits"], transB=1)]
    if as_nodes:
        nodes = [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(v, n)) for n, v in (("mask", mask), ("pos", pos))] + nodes
    else:
        init += [numpy_helper.from_array(mask, "mask"), numpy_helper.from_array(pos, "pos")]
    g = helper.make_graph(nodes, "buffers", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], init)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), dst)


def test_buffers(data, tmp):
    """A -inf mask initializer is a constant, and --constant pos makes a finite buffer one: trained with both, the
    model's weights after 4 steps are bit-identical to the same model with both as Constant nodes, --save writes the
    buffers back unchanged, and plan.json says which initializers train.  (The mask used to be trained, its finite
    entries moving from step 2, and --save refused its -inf.)"""
    saved = {}
    for kind in ("initializers", "nodes"):
        m, pipe = os.path.join(tmp, f"buffers_{kind}.onnx"), os.path.join(tmp, f"buffers_{kind}.pipe")
        buffer_model(m, kind == "nodes")
        r = sh([PIPECC, m, "-n", "1", "--batch", "64", "--microbatches", "2", "-o", pipe]
               + (["--constant", "pos"] if kind == "initializers" else []))
        mk = sh(["make", "-s", "-j2", "-C", pipe], timeout=600) if r.returncode == 0 else r
        if not check(mk.returncode == 0, f"buffers as {kind}: compiled and built ({mk.stderr.strip()[-300:]})"):
            return
        if kind == "initializers":
            check(r.returncode == 0 and "'mask'" in r.stderr and "-inf" in r.stderr and "'pos'" not in r.stderr,
                  f"pipecc warns that the -inf mask is a constant, and not about the declared pos ({r.stderr.strip()[:300]})")
            inits = {i["name"]: i for i in json.load(open(os.path.join(pipe, "plan.json")))["initializers"]}
            ms, ps = inits.get("mask", {}), inits.get("pos", {})
            check(ms.get("trained") is False and "-inf" in (ms.get("why") or "") and ps.get("trained") is False
                  and "--constant" in (ps.get("why") or "") and all(inits[w]["trained"] for w in ("w1", "b1", "w2", "b2")),
                  f"plan.json: w1, b1, w2, b2 trained; mask and pos constants, saying why ({ms}, {ps})")
        out = os.path.join(tmp, f"buffers_{kind}_saved.onnx")
        r = sh([os.path.join(pipe, "run.sh"), "--data", data, "--steps", "4", "--quiet", "--save", out])
        if not check(r.returncode == 0, f"buffers as {kind}: 4 steps and --save ({errors(r)})"):
            return
        saved[kind] = {t.name: numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    a, b = saved["initializers"], saved["nodes"]
    check(all(a[w].tobytes() == b[w].tobytes() for w in ("w1", "b1", "w2", "b2")),
          "the weights after 4 steps are bit-identical to the model whose buffers are Constant nodes")
    buffer_model(os.path.join(tmp, "buffers_ref.onnx"), False)
    ref = {t.name: numpy_helper.to_array(t) for t in onnx.load(os.path.join(tmp, "buffers_ref.onnx")).graph.initializer}
    check(all(a[n].tobytes() == ref[n].tobytes() for n in ("mask", "pos")), "--save writes the mask (-inf and all) and pos back unchanged")


def test_nan(data, tmp):
    src = os.path.join(ROOT, "onnx_models", "mlp.onnx")
    m = os.path.join(tmp, "mlp_nan.onnx")
    nan_bias_mlp(src, m)
    pipe = os.path.join(tmp, "mlp_nan.pipe")
    err = build(m, pipe)
    if check(not err, f"an MLP with a NaN in fc2.bias compiled ({err.strip()[-200:]})"):
        out = os.path.join(tmp, "nan.onnx")
        r = sh([os.path.join(pipe, "run.sh"), "--data", data, "--steps", "3", "--quiet", "--save", out])
        check(r.returncode != 0 and "NaN" in r.stderr and not os.path.exists(out),
              f"a NaN bias before a ReLU stops the run naming NaN, nothing saved: {errors(r)}")
    m = os.path.join(tmp, "hidden_nan.onnx")
    hidden_nan_model(m)
    pipe = os.path.join(tmp, "hidden_nan.pipe")
    err = build(m, pipe) or plant_nan(pipe, "hidden_nan", 7)
    if check(not err, f"a model with a NaN weight that never reaches the loss compiled ({err.strip()[-200:]})"):
        run = os.path.join(pipe, "run.sh")
        out = os.path.join(tmp, "hidden.onnx")
        r = sh([run, "--data", data, "--steps", "2", "--quiet", "--save", out])
        check(r.returncode != 0 and "hidden_nan" in r.stderr and "NaN" in r.stderr and not os.path.exists(out),
              f"--save refuses a NaN weight, naming the tensor: {errors(r)}")
        ck = os.path.join(tmp, "ck-nan")
        r = sh([run, "--data", data, "--steps", "2", "--quiet", "--checkpoint", ck, "--checkpoint-every", "1"])
        check(r.returncode != 0 and "hidden_nan" in r.stderr and not os.path.exists(os.path.join(ck, "MANIFEST"))
              and not glob.glob(os.path.join(ck, "**", "*.ckpt"), recursive=True),
              f"a checkpoint refuses a NaN weight, naming the tensor: {errors(r)}")


def main():
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="pipecc-safety.")
    os.environ.setdefault("PIPECC_CACHE", os.path.join(tmp, "machine.txt"))
    try:
        data = os.path.join(tmp, "mnist")
        r = sh([DATAGEN, "mnist", data, "--n", "1280", "--seed", "1"])
        if not check(r.returncode == 0, f"synthetic MNIST written ({r.stderr.strip()})"):
            return tally.finish()
        mlp = os.path.join(ROOT, "onnx_models", "mlp.onnx")
        pipe, other = os.path.join(tmp, "mlp.pipe"), os.path.join(tmp, "mlp-b32.pipe")
        err = build(mlp, pipe) or build(mlp, other, batch=32, mb=2)
        if not check(not err, f"the MLP compiled for 2 stages, batch 64 / 4 and batch 32 / 2 micro-batches ({err.strip()[-300:]})"):
            return tally.finish()
        run = os.path.join(pipe, "run.sh")
        full = os.path.join(tmp, "full.onnx")
        r = sh([run, "--data", data, "--steps", "6", "--quiet", "--save", full])
        if not check(r.returncode == 0, f"6 steps straight ({errors(r)})"):
            return tally.finish()
        for name, fn, args in (("crash points", test_crash_points, (run, data, tmp, full)),
                               ("refusals", test_refusals, (run, data, tmp, other)),
                               ("fail early", test_fail_early, (run, data, tmp)),
                               ("truncated data", test_truncated_data, (run, data, tmp)),
                               ("stopped stage", test_stopped_stage, (run, data, tmp, pipe)),
                               ("NaN", test_nan, (data, tmp)),
                               ("buffers", test_buffers, (data, tmp))):
            try:
                fn(*args)
            except Exception as e:  # one broken part must not hide the others' results
                check(False, f"{name}: the test itself failed: {type(e).__name__}: {e}")
    finally:
        for p in glob.glob(os.path.join(tmp, "*.pipe")):
            kill_leftovers(p)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {time.time() - t0:.0f} s")
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
