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
  nothing of the user's damaged (issue 34, items 7, 8, 10-12): --save over a
    FIFO, a symbolic link or a device node is refused before step 1; the
    clean-up after a commit leaves a user's step-size-sweep/ and the files in a
    step folder it did not write; a second run on a checkpoint directory is
    refused naming the first, which goes on; --log and --trace to /dev/full,
    and --save, --trace and --log past a file size limit, stop the run with the
    reason, leave no temporary file, no trace cut short (the old one stays) and
    a log of whole rows; the model's file name holds a newline (every
    checkpoint here resumes with it);
  buffers (issue 34, item 5): an initializer holding -inf and one --constant
    names are constants, trained bit-identically to Constant nodes, and saved;
  issue 34: a FIFO as --data, --val, --log (or LOG.val.csv) or --trace is
    refused, not waited on; run.sh's non-finite and non-integer numbers, flags
    without a value, --resume past --steps, a NaN weight at load and a damaged
    weights/manifest.txt are refused before step 1, naming what; a stage arena
    over 2 GiB (LeNet at -n 1 --batch 16384) builds and starts.

The file size limits are set from outside (prlimit) on a running rank: Open
MPI's own files at start-up need more room than the limit leaves.

Issue 34, items 1 and 14, crashes on data:
  Gather indices computed from the data (an ArgMax over the pixels, a Cast of
    max(x) * 1e6) that fall outside the table stop the run naming the node, the
    step and the stage (the ArgMax one exited 0 having added into another
    weight's gradient; the Cast one segfaulted);
  a --val token file with ids past the vocabulary is refused before step 1
    (it segfaulted at the first validation), and a token file rewritten in
    place during the run stops it naming the file (it segfaulted: ids were
    checked only at the start, and the mapping shows the new bytes).

The crash points come from the runtime's testing hook PIPERUN_CRASH_AT=R:K
(rank R kills itself with SIGKILL at its K-th checkpoint point).  Run with
/usr/bin/python3; prints ok / not ok lines and "N passed, M failed, K skipped, R refused" (tests/tally.py)."""
import glob
import json
import os
import resource
import shutil
import signal
import stat
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


def gather_from_data_model(kind, dst):
    """784 -> 10 logits plus a row of a 10 x 10 table picked by an index computed from the image:
    an ArgMax over the 784 pixels (kind 'argmax', mostly past row 9) or Cast(max(x) * 1e6) ('cast', 1e6)."""
    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array((rng.standard_normal((10, 10)) * 0.1).astype(np.float32), "table"),
            numpy_helper.from_array((rng.standard_normal((784, 10)) * 0.01).astype(np.float32), "w"),
            numpy_helper.from_array(np.array(1e6, np.float32), "big")]
    nodes = [helper.make_node("Flatten", ["input"], ["flat"], axis=1, name="flatten")]
    if kind == "argmax":
        nodes.append(helper.make_node("ArgMax", ["flat"], ["ids"], axis=1, keepdims=0, name="brightest"))
    else:
        nodes += [helper.make_node("ReduceMax", ["flat"], ["top"], axes=[1], keepdims=0, name="max"),
                  helper.make_node("Mul", ["top", "big"], ["scaled"], name="scale"),
                  helper.make_node("Cast", ["scaled"], ["ids"], to=TensorProto.INT64, name="to_ids")]
    nodes += [helper.make_node("Gather", ["table", "ids"], ["row"], axis=0, name="lookup/Gather"),
              helper.make_node("MatMul", ["flat", "w"], ["lin"], name="fc"),
              helper.make_node("Add", ["lin", "row"], ["logits"], name="sum")]
    g = helper.make_graph(nodes, "gather_from_data", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], init)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), dst)


def tiny_lm(dst, vocab=64):
    """Token ids [batch, 8] -> an embedding of vocab x 16 -> logits over the vocabulary."""
    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array((rng.standard_normal((vocab, 16)) * 0.1).astype(np.float32), "wte"),
            numpy_helper.from_array((rng.standard_normal((16, vocab)) * 0.1).astype(np.float32), "head")]
    nodes = [helper.make_node("Gather", ["wte", "ids"], ["h"], axis=0, name="embed"),
             helper.make_node("MatMul", ["h", "head"], ["logits"], name="lm_head")]
    g = helper.make_graph(nodes, "tiny_lm", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 8, vocab])], init)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), dst)


# ---- item 7: checkpoints ----

def test_crash_points(run, data, tmp, full):
    """Crash each rank at each checkpoint point of a run that resumes from step 2 and checkpoints
    at 4; the last committed checkpoint (2 or 4) must resume to the uninterrupted 6-step weights."""
    base = os.path.join(tmp, "ck-base")
    r = sh([run, "--data", data, "--steps", "2", "--quiet", "--checkpoint", base, "--checkpoint-every", "2"])
    if not check(r.returncode == 0 and manifest_step(base) == 2, f"a checkpoint at step 2 is committed ({errors(r)})"):
        return
    shared_tmp = []
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
            if os.path.exists(os.path.join(ck, "MANIFEST.tmp")):
                shared_tmp.append(f"stage {rank} point {k}")
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
    check(not shared_tmp, "no crash left a MANIFEST.tmp in the checkpoint directory, where two runs would share it (each checkpoint's "
          f"is in its own step folder){': ' + ', '.join(shared_tmp[:4]) if shared_tmp else ''}")


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


# ---- issue 34, items 1 and 14: crashes on data ----

def test_gather_from_data(data, tmp):
    for kind, index in (("argmax", None), ("cast", "1000000")):
        m = os.path.join(tmp, f"gather_{kind}.onnx")
        gather_from_data_model(kind, m)
        pipe = os.path.join(tmp, f"gather_{kind}.pipe")
        err = build(m, pipe)
        if not check(not err, f"a model whose Gather indices come from the data ({kind}) compiled ({err.strip()[-200:]})"):
            continue
        r = sh([os.path.join(pipe, "run.sh"), "--data", data, "--steps", "3", "--quiet"])
        lines = [l for l in r.stderr.splitlines() if "lookup/Gather" in l]
        check(0 < r.returncode < 128 and lines and "step 1, micro-batch 0" in lines[0] and "stage 1" in lines[0]
              and "outside its table of 10 rows" in lines[0] and (index is None or f"index {index} " in lines[0]),
              f"Gather indices from the data ({kind}) outside the table stop the run (rc {r.returncode}) naming node, step and stage: "
              f"{lines[0][:300] if lines else errors(r)}")


def test_token_data(tmp):
    m = os.path.join(tmp, "tiny_lm.onnx")
    tiny_lm(m)
    pipe = os.path.join(tmp, "tiny_lm.pipe")
    r = sh([PIPECC, m, "-n", "2", "--batch", "8", "--microbatches", "2", "--devices", DEVICES, "-o", pipe])
    err = r.stderr if r.returncode else sh(["make", "-s", "-j2", "-C", pipe], timeout=600).stderr
    if not check(os.path.exists(os.path.join(pipe, "stage_1")), f"a token model (vocabulary 64) compiled for 2 stages ({err.strip()[-200:]})"):
        return
    run = os.path.join(pipe, "run.sh")
    tokens, wide = os.path.join(tmp, "tokens.bin"), os.path.join(tmp, "tokens-vocab200.bin")
    sh([DATAGEN, "tokens", tokens, "--n", "20000", "--vocab", "64"])
    sh([DATAGEN, "tokens", wide, "--n", "5000", "--vocab", "200"])
    r = sh([run, "--data", tokens, "--steps", "2", "--quiet", "--val", wide])
    lines = [l for l in r.stderr.splitlines() if "error" in l and "tokens-vocab200.bin" in l]
    check(0 < r.returncode < 128 and lines and "vocabulary 64" in lines[0] and "step 1/" not in r.stdout,
          f"a --val token file with ids past the vocabulary is refused before step 1 (rc {r.returncode}): "
          f"{lines[0][:300] if lines else errors(r)}")
    live = os.path.join(tmp, "tokens-live.bin")
    shutil.copy(tokens, live)
    p = start_long(run, ["--data", live], os.path.join(tmp, "live.csv"))
    with open(live, "r+b") as f:  # in place: the same inode and size, every id now 65535
        f.write(b"\xff" * os.path.getsize(live))
    rc, err, took = finish(p, 30)
    kill_leftovers(pipe)
    named = [l for l in err.splitlines() if "tokens-live.bin" in l and "changed during the run" in l]
    check(rc is not None and 0 < rc < 128 and named and "65535" in named[0],
          f"a token file rewritten in place during the run stops it (rc {rc}, {took:.1f} s) naming the file and the id: "
          f"{named[0][:300] if named else err[-300:]}")
# ---- issue 34: nothing of the user's damaged, every failed write said ----

def test_save_target(run, data, tmp):
    """--save PATH renamed the model over whatever PATH was: as root, --save /dev/null replaced /dev/null (item 7)."""
    fifo, link, elsewhere, dev = (os.path.join(tmp, n) for n in ("save.fifo", "save-link.onnx", "elsewhere.onnx", "save-null"))
    os.mkfifo(fifo)
    os.symlink(elsewhere, link)
    targets = [(fifo, "a FIFO", stat.S_ISFIFO), (link, "a symbolic link", stat.S_ISLNK)]
    try:  # a device node of our own, /dev/null's numbers (as root)
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        targets.append((dev, "a device", stat.S_ISCHR))
    except OSError as e:
        tally.skip("--save over a device node is refused", f"cannot make one here ({e.strerror})")
    for path, what, is_kind in targets:
        r = sh([run, "--data", data, "--steps", "2", "--save", path])
        check(r.returncode != 0 and "step 1/" not in r.stdout and "not a regular file" in r.stderr and what in r.stderr
              and is_kind(os.lstat(path).st_mode) and not os.path.exists(elsewhere),
              f"--save over {what} is refused before step 1, which stays: {errors(r)}")


def test_cleanup_keeps_users_files(run, data, tmp):
    """The clean-up after a commit emptied every step-* folder (a user's step-size-sweep/results.csv went) (item 8)."""
    ck = os.path.join(tmp, "ck-user")
    mine = {os.path.join(ck, "step-size-sweep", "results.csv"): "lr,loss\n0.1,0.5\n",
            os.path.join(ck, "step-00000001-0badf00d", "notes.txt"): "the good run\n"}
    for path, text in mine.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").write(text)
    r = sh([run, "--data", data, "--steps", "3", "--quiet", "--checkpoint", ck, "--checkpoint-every", "1"])
    kept = all(os.path.exists(p) and open(p).read() == t for p, t in mine.items())
    with_files = sorted(os.path.basename(os.path.dirname(f)) for f in glob.glob(os.path.join(ck, "step-*", "*.ckpt")))
    check(r.returncode == 0 and manifest_step(ck) == 3 and kept and len(set(with_files)) == 1,
          f"checkpoints at steps 1, 2, 3 leave a user's step-size-sweep/results.csv and the notes in a step-<S>-<id> folder, "
          f"the older checkpoints removed (stage files in {sorted(set(with_files))}) {errors(r)}")


def test_lock(run, data, tmp, pipe):
    """Two runs on one checkpoint directory: the second killed the first's checkpoints (item 10)."""
    ck = os.path.join(tmp, "ck-lock")
    p = start_long(run, ["--data", data, "--checkpoint", ck, "--checkpoint-every", "5"], os.path.join(tmp, "lock.csv"))
    deadline = time.time() + 30
    while time.time() < deadline and p.poll() is None and manifest_step(ck) < 0:
        time.sleep(0.1)
    first = stage_pids(pipe, 0)
    if not check(first and p.poll() is None and manifest_step(ck) > 0, "the first run is checkpointing"):
        kill_leftovers(pipe)
        finish(p, 30)
        return
    r = sh([run, "--data", data, "--steps", "3", "--quiet", "--checkpoint", ck, "--checkpoint-every", "1"])
    alive = p.poll() is None
    check(r.returncode != 0 and "another run" in r.stderr and f"pid {first[0]} " in r.stderr and pipe in r.stderr and alive,
          f"a second run on the checkpoint directory is refused, naming the first (its pid and stages), which goes on: {errors(r)}")
    os.kill(first[0], signal.SIGKILL)  # the first, killed: its lock goes with it
    finish(p, 30)
    kill_leftovers(pipe)
    step = manifest_step(ck)
    r = sh([run, "--data", data, "--steps", str(step + 1), "--quiet", "--resume", ck, "--checkpoint", ck, "--checkpoint-every", "1"])
    check(r.returncode == 0 and manifest_step(ck) == step + 1,
          f"after the first run is killed (-9) its last checkpoint (step {step}) resumes, and checkpoints there again: no stale lock "
          f"{errors(r)}")


def rows(path):
    try:
        return sum(1 for _ in open(path))
    except OSError:
        return 0


def limited_run(run, data, pipe, rank, limit, args, log):
    """A 400-step run whose `rank` may write at most limit(bytes of the log now) bytes per file (RLIMIT_FSIZE) once the
    log has rows: set from outside with the rank stopped meanwhile, since Open MPI's files at start-up need more.
    (rc, stderr), or (None, why) when the run ended first."""
    p = subprocess.Popen([run, "--data", data, "--steps", "400", "--quiet", "--log", log, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None and rows(log) < 2:
        time.sleep(0.02)
    pid = stage_pids(pipe, rank)
    if p.poll() is not None or not pid:
        finish(p, 30)
        return None, "the run ended before the limit was set"
    os.kill(pid[0], signal.SIGSTOP)
    n = limit(os.path.getsize(log))
    try:
        resource.prlimit(pid[0], resource.RLIMIT_FSIZE, (n, n))
    finally:
        os.kill(pid[0], signal.SIGCONT)
    rc, err, _ = finish(p, 120)
    kill_leftovers(pipe)
    return rc, err


def tmp_files(d):
    return [f for f in os.listdir(d) if ".tmp" in f]


def test_write_failures(run, data, tmp, pipe):
    """--log and --trace ignored failed writes (exit 0, a CSV cut mid-line, truncated JSON); a failed --save left
    FILE.tmp (item 11)."""
    r = sh([run, "--data", data, "--steps", "3", "--quiet", "--log", "/dev/full"])
    check(r.returncode != 0 and "--log" in r.stderr and "/dev/full" in r.stderr and "No space left" in r.stderr,
          f"--log /dev/full stops the run with the reason: {errors(r)}")
    r = sh([run, "--data", data, "--steps", "3", "--quiet", "--trace", "/dev/full"])
    check(r.returncode != 0 and "--trace /dev/full" in r.stderr and "No space left" in r.stderr,
          f"--trace /dev/full: a non-zero exit with the reason, not a warning and exit 0: {errors(r)}")
    d = os.path.join(tmp, "fsize")
    os.makedirs(d)
    out = os.path.join(d, "trained.onnx")
    rc, err = limited_run(run, data, pipe, 0, lambda _: 100000, ["--save", out], os.path.join(d, "save.csv"))
    check(rc not in (None, 0) and "trained.onnx" in err and "File too large" in err and not os.path.exists(out) and not tmp_files(d),
          f"--save past a file size limit (100 kB, the model 1 MB): the reason, no model, no temporary file left "
          f"{tmp_files(d)}: {' | '.join(l for l in err.splitlines() if 'piperun' in l or 'signal' in l)[:300]}")
    trace = os.path.join(d, "run.json")
    r = sh([run, "--data", data, "--steps", "2", "--quiet", "--trace", trace])
    old = open(trace).read() if r.returncode == 0 else None
    rc, err = limited_run(run, data, pipe, 0, lambda _: 100000, ["--trace", trace], os.path.join(d, "trace.csv"))
    check(old and rc not in (None, 0) and "--trace" in err and "File too large" in err and open(trace).read() == old and not tmp_files(d),
          f"--trace past a file size limit: the reason, the old trace whole (not JSON cut short), no temporary file "
          f"{tmp_files(d)}: {' | '.join(l for l in err.splitlines() if 'piperun' in l or 'signal' in l)[:300]}")
    log = os.path.join(d, "cut.csv")
    rc, err = limited_run(run, data, pipe, 1, lambda size: size + 150, [], log)  # stage 1 has the loss: it writes the log
    text = open(log).read() if os.path.exists(log) else ""
    lines = text.splitlines()
    whole = text.endswith("\n") and lines[0] == "step,loss,samples_per_s,time_s" and all(
        len(l.split(",")) == 4 for l in lines[1:]) and [int(l.split(",")[0]) for l in lines[1:]] == list(range(1, len(lines)))
    check(rc not in (None, 0) and "--log" in err and "File too large" in err and whole,
          f"--log past a file size limit: the reason, and the log's rows whole ({len(lines) - 1} rows, ends "
          f"{text[-20:]!r}): {' | '.join(l for l in err.splitlines() if 'piperun' in l or 'signal' in l)[:300]}")


def test_newline_name(run, data, tmp):
    """The model's file name holds a newline (these plans are compiled from one): the manifest wrote the name on two
    lines, and no checkpoint of such a model could be resumed (item 12)."""
    ck = os.path.join(tmp, "ck-newline")
    a = sh([run, "--data", data, "--steps", "2", "--quiet", "--checkpoint", ck, "--checkpoint-every", "2"])
    b = sh([run, "--data", data, "--steps", "3", "--quiet", "--resume", ck])
    check(a.returncode == 0 and b.returncode == 0 and manifest_step(ck) == 2,
          f"a model whose file name holds a newline: its checkpoint resumes {errors(a)}{errors(b)}")


# ---- issue 34, items 9, 15, 16 and 18: no hang, clear refusals, large arenas ----

def sh_group(cmd, timeout):
    """cmd in its own session; past timeout the whole group (mpirun and its ranks) is killed: (rc or None, out, err)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err + f" [still running after {timeout} s: killed]"


def test_no_hang(run, data, tmp):
    """A FIFO as --data, --val, --log or --trace is refused before step 1; open() used to wait for the other end."""
    fifo = os.path.join(tmp, "a.fifo")
    os.mkfifo(fifo)
    base = ["--data", data, "--steps", "2", "--quiet"]
    for flag, args in (("--data", ["--data", fifo, "--steps", "2", "--quiet"]), ("--val", base + ["--val", fifo]),
                       ("--log", base + ["--log", fifo]), ("--trace", base + ["--trace", fifo])):
        rc, out, err = sh_group([run, *args], 30)
        check(rc not in (None, 0) and "a.fifo" in err and "not a regular file" in err and "step 1/" not in out,
              f"a FIFO as {flag} is refused at once (rc {rc}): {errors_of(err)}")
    log = os.path.join(tmp, "val.csv")
    os.mkfifo(log + ".val.csv")
    rc, out, err = sh_group([run, *base, "--val", data, "--log", log], 30)
    check(rc not in (None, 0) and "val.csv.val.csv" in err and "not a regular file" in err,
          f"a FIFO where --val writes beside --log (LOG.val.csv) is refused at once (rc {rc}): {errors_of(err)}")


def errors_of(err):
    return " | ".join(l for l in err.splitlines() if "piperun" in l or "run.sh" in l or "killed" in l)[:300]


def test_clear_refusals(run, data, tmp, pipe):
    """run.sh's numbers, --resume past --steps, run.sh's flags without a value, a NaN weight at load, a damaged manifest."""
    for args, words in ((["--lr", "inf"], ["--lr", "'inf'", "finite"]), (["--weight-decay", "inf"], ["--weight-decay", "'inf'"]),
                        (["--min-lr", "inf"], ["--min-lr", "'inf'"]), (["--steps", "inf"], ["--steps", "'inf'", "whole number"]),
                        (["--steps", "1.9"], ["--steps", "'1.9'", "whole number"])):
        r = sh([run, "--data", data, "--steps", "3", "--quiet", *args])
        check(r.returncode == 2 and all(w in r.stderr for w in words) and "step 1/" not in r.stdout and "lower --lr" not in r.stderr,
              f"run.sh {' '.join(args)} is refused at parse: {errors(r)}")
    ck = os.path.join(tmp, "ck-steps")
    r = sh([run, "--data", data, "--steps", "4", "--quiet", "--checkpoint", ck, "--checkpoint-every", "4"])
    if check(r.returncode == 0 and manifest_step(ck) == 4, f"a checkpoint at step 4 ({errors(r)})"):
        r = sh([run, "--data", data, "--steps", "2", "--resume", ck])
        check(r.returncode == 2 and "step 4" in r.stderr and "--steps 2" in r.stderr and "done:" not in r.stdout,
              f"--resume of step 4 with --steps 2 is refused (it printed 'done: -2 steps ... loss nan' and exited 0): {errors(r)}")
    for flag in ("--mca", "--hostfile", "--checkpoint", "--resume"):
        r = sh([run, "--data", data, "--steps", "2", flag])
        check(r.returncode == 2 and f"run.sh: error: {flag} needs" in r.stderr and "unbound" not in r.stderr,
              f"run.sh {flag} without its value says so: {r.stderr.strip()[:200]}")

    def copy_pipe(name):
        dst = os.path.join(tmp, name)
        shutil.copytree(pipe, dst, symlinks=True)
        return dst, [l.split() for l in open(os.path.join(dst, "weights", "manifest.txt")) if not l.startswith("#")]

    nanw, man = copy_pipe("nanw.pipe")
    stage, off, cnt, name = next(l for l in man if l[0] == "1")
    wfile = os.path.join(nanw, "weights", "stage_1.bin")
    b = bytearray(open(wfile, "rb").read())
    b[int(off) + 8:int(off) + 12] = np.float32(np.nan).tobytes()
    open(wfile, "wb").write(bytes(b))
    r = sh([os.path.join(nanw, "run.sh"), "--data", data, "--steps", "2", "--quiet"])
    check(r.returncode != 0 and f"weight '{name}' is NaN at element 2 at load" in r.stderr and "lower --lr" not in r.stderr
          and "step 1/" not in r.stdout, f"a NaN initial weight is named at load, not blamed on the learning rate: {errors(r)}")
    for what, edit, words in (("an offset past the stage's weights", lambda l: [l[0], "999999999", l[2], l[3]], ["outside stage"]),
                              ("a wrong count", lambda l: [l[0], l[1], str(int(l[2]) + 1), l[3]], ["the manifest says"]),
                              ("a line cut short", lambda l: l[:3], ["expected 'STAGE"]),
                              ("a line missing", lambda l: None, ["no data in model.onnx"])):
        bad, man = copy_pipe("man.pipe")
        lines = [edit(l) if l[3] == name else l for l in man]
        open(os.path.join(bad, "weights", "manifest.txt"), "w").write("".join(" ".join(l) + "\n" for l in lines if l))
        out = os.path.join(tmp, "man.onnx")
        r = sh([os.path.join(bad, "run.sh"), "--data", data, "--steps", "2", "--quiet", "--save", out])
        check(r.returncode == 2 and "manifest.txt" in r.stderr and all(w in r.stderr for w in words) and "step 1/" not in r.stdout
              and not os.path.exists(out) and "Segmentation" not in r.stderr,
              f"--save with {what} in weights/manifest.txt is refused before step 1 (it segfaulted or wrote malformed ONNX): {errors(r)}")
        shutil.rmtree(bad)


def test_large_arena(tmp):
    """A stage arena over 2 GiB builds and starts (it failed to link)."""
    out = os.path.join(tmp, "lenet-16k.pipe")
    r = sh([PIPECC, os.path.join(ROOT, "onnx_models", "lenet.onnx"), "-n", "1", "--batch", "16384", "--devices", DEVICES, "-o", out])
    arena = [l for l in open(os.path.join(out, "stage_0.c")) if l.startswith("#define ARENA_BYTES")] if r.returncode == 0 else []
    if not check(arena and int(arena[0].split()[2].rstrip("L")) > 2 << 30, f"LeNet at -n 1 --batch 16384 plans an arena over 2 GiB: "
                 f"{arena[0].strip() if arena else r.stderr.strip()[-200:]}"):
        return
    r = sh(["make", "-s", "-C", out], timeout=600)
    s = sh([os.path.join(out, "stage_0"), "--blas-core"]) if r.returncode == 0 else r
    check(r.returncode == 0 and s.returncode == 0 and s.stdout.strip(),
          f"its stage builds and starts (stage_0 --blas-core: {s.stdout.strip()}): {(r.stderr + s.stderr).strip()[-300:]}")


def main():
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="pipecc-safety.")
    os.environ.setdefault("PIPECC_CACHE", os.path.join(tmp, "machine.txt"))
    try:
        data = os.path.join(tmp, "mnist")
        r = sh([DATAGEN, "mnist", data, "--n", "1280", "--seed", "1"])
        if not check(r.returncode == 0, f"synthetic MNIST written ({r.stderr.strip()})"):
            return tally.finish()
        # The model's file name holds a newline (issue 34 item 12): every checkpoint below is of such a model.
        mlp = os.path.join(tmp, "ml\np.onnx")
        shutil.copy(os.path.join(ROOT, "onnx_models", "mlp.onnx"), mlp)
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
                               ("Gather indices from the data", test_gather_from_data, (data, tmp)),
                               ("token data", test_token_data, (tmp,)),
                               ("--save's target", test_save_target, (run, data, tmp)),
                               ("clean-up", test_cleanup_keeps_users_files, (run, data, tmp)),
                               ("lock", test_lock, (run, data, tmp, pipe)),
                               ("write failures", test_write_failures, (run, data, tmp, pipe)),
                               ("newline", test_newline_name, (run, data, tmp)),
                               ("buffers", test_buffers, (data, tmp)),
                               ("no hang", test_no_hang, (run, data, tmp)),
                               ("clear refusals", test_clear_refusals, (run, data, tmp, pipe)),
                               ("large arena", test_large_arena, (tmp,))):
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
