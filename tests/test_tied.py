"""Tied weights: one initializer read by several nodes, in one stage or many.

1. A GPT whose output head is its token embedding (lm_head.weight is
   wte.weight, as GPT-2 ties them), exported from torch in training mode:
   pipecc trains it at n = 1, 2 and 4 - at n = 4 the embedding's Gather is on
   stage 0 and the head on stage 3, each keeping a copy - with PyTorch's
   losses and weights, and the three runs give bit-identical weights.  The
   listing and plan.json name the tie.
2. The same GPT untied, exported in eval mode with constant folding: torch's
   exporter merges the equal LayerNorm weights (all ones) and biases (all
   zeros) into one initializer each, read through Identity nodes by every
   LayerNorm - a tie the model never had.  pipecc warns naming it; trained as
   the file says (one shared weight), its first step's gradient matches a
   float64 evaluation of the same ONNX graph, and n = 1, 2 and 4 give
   bit-identical weights; with --untie each use gets its own copy and the
   losses and weights are PyTorch's for the original model.

Run with /usr/bin/python3."""
import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
B, M, T, V, STEPS, LR = 8, 4, 32, 64, 8, 0.05
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)



def initial_weights(pipe):
    """The initial value of each initializer the stages hold, from weights/manifest.txt and the stages'
    weights files (the generated model.onnx keeps no copy of them), shaped as the model's tensors."""
    m = onnx.load(os.path.join(pipe, "model.onnx"))
    dims = {t.name: tuple(t.dims) for t in m.graph.initializer}
    out = {}
    with open(os.path.join(pipe, "weights", "manifest.txt")) as f:
        for line in f:
            if line.startswith("#"):
                continue
            stage, off, cnt, name = line.rstrip("\n").split(" ", 3)
            name = re.sub(r"%([0-9A-F]{2})", lambda g: chr(int(g.group(1), 16)), name)
            w = np.fromfile(os.path.join(pipe, "weights", f"stage_{stage}.bin"), np.float32, count=int(cnt), offset=int(off))
            out[name] = w.reshape(dims.get(name, (int(cnt),)))
    return out

def check(cond, what):
    tally.count(cond)
    print(("ok - " if cond else "not ok - ") + what)
    return cond


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


EX = load("export", os.path.join(ROOT, "onnx_models", "export.py"))
PAR = load("parity", os.path.join(ROOT, "tests", "test_parity.py"))


class TiedGPT(EX.GPT):
    """GPT-2's tie: the output head multiplies by the token embedding."""

    def __init__(self):
        super().__init__(vocab_size=V, block_size=T, n_layer=2)
        torch.nn.init.normal_(self.wte.weight, std=0.02)  # GPT-2's init keeps the tied logits small
        self.lm_head.weight = self.wte.weight


def export(model, path, train):
    model.train(train)
    x = torch.randint(0, V, (2, T))
    torch.onnx.export(model, (x,), path, opset_version=17, do_constant_folding=not train,
                      training=torch.onnx.TrainingMode.TRAINING if train else torch.onnx.TrainingMode.EVAL,
                      input_names=["tokens"], output_names=["logits"],
                      dynamic_axes={"tokens": {0: "batch"}, "logits": {0: "batch"}})


def torch_losses(model, tok):
    """STEPS SGD steps over llm.c-style batches, M micro-batches each, as pipecc's loader cuts them."""
    torch.set_num_threads(1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    nb, mb, want = (len(tok) - 1) // (B * T), B // M, []
    for s in range(STEPS):
        start, total = (s % nb) * B * T, 0.0
        opt.zero_grad()
        for k in range(M):
            lo = start + k * mb * T
            x = torch.from_numpy(tok[lo:lo + mb * T].reshape(mb, T))
            y = torch.from_numpy(tok[lo + 1:lo + 1 + mb * T].reshape(mb, T))
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)) * (mb / B)
            loss.backward()
            total += loss.item()
        opt.step()
        want.append(total)
    return want


def compile_run(tmp, tag, path, n, steps, extra=()):
    """pipecc -n n, build, train; (stderr of pipecc, losses, saved initializers) or None."""
    out = os.path.join(tmp, f"{tag}.{n}.pipe")
    r = subprocess.run([PIPECC, path, "-n", str(n), "--batch", str(B), "--microbatches", str(M), "--lr", str(LR),
                        "--devices", DEVICES, "-o", out, *extra], capture_output=True, text=True)
    if not check(r.returncode == 0, f"{tag} n={n}: pipecc compiles it ({r.stderr.strip()[-300:]})"):
        return None
    b = subprocess.run(["make", "-s", "-C", out], capture_output=True, text=True)
    if not check(b.returncode == 0, f"{tag} n={n}: the stages build ({b.stderr.strip()[-300:]})"):
        return None
    log, saved = os.path.join(tmp, f"{tag}.{n}.csv"), os.path.join(tmp, f"{tag}.{n}.onnx")
    x = subprocess.run([os.path.join(out, "run.sh"), "--data", TOKENS, "--steps", str(steps), "--quiet", "--log", log,
                        "--save", saved], capture_output=True, text=True, timeout=600)
    if not check(x.returncode == 0, f"{tag} n={n}: trains ({x.stderr.strip()[-300:]})"):
        return None
    losses = [float(row["loss"]) for row in csv.DictReader(open(log))]
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(saved).graph.initializer}
    return r.stderr, losses, inits, out


def rel_err(got, want):
    return max((abs(a - b) / abs(b) for a, b in zip(got, want)), default=float("inf")) if len(got) == len(want) else float("inf")


def tied_gpt(tmp, tok):
    torch.manual_seed(0)
    path = os.path.join(tmp, "tied.onnx")
    export(TiedGPT(), path, train=True)
    om = onnx.load(path)
    readers = [n.name for n in om.graph.node if "wte.weight" in n.input]
    if not check(len(readers) == 2, f"the export keeps one tied initializer wte.weight, read by 2 nodes ({readers})"):
        return
    torch.manual_seed(0)
    model = TiedGPT()
    mapping, _ = PAR.load_weights_from_onnx(model, om)
    want = torch_losses(model, tok)
    expect = PAR.expected_initializers(om, model, mapping)
    print(f"# tied GPT: torch losses {want[0]:.4f} -> {want[-1]:.4f}")
    runs = {}
    for n in (1, 2, 4):
        got = compile_run(tmp, "tied", path, n, STEPS)
        if got is None:
            continue
        _, losses, inits, out = got
        e = rel_err(losses, want)
        check(e < 1e-4, f"tied n={n}: per-step losses within 1e-4 relative of PyTorch (max {e:.2e})")
        w = max(float(np.abs(inits[k].astype(np.float64) - expect[k]).max()) for k in mapping)
        check(w < 1e-4, f"tied n={n}: weights within 1e-4 of PyTorch, the tied embedding included (max {w:.2e})")
        runs[n] = inits
        if n == 4:
            ties = json.load(open(os.path.join(out, "plan.json")))["ties"]
            stages = sorted(r["stage"] for t in ties if t["weight"] == "wte.weight" for r in t["readers"])
            check(stages == [0, 3], f"tied n=4: plan.json names the tie, read on stages 0 and 3 ({stages})")
            text = open(os.path.join(out, "schedule.txt")).read()
            check("'wte.weight'" in text and "copies on 2 stages" in text, "tied n=4: the listing names the tie and its copies")
    bit_identical(runs, "tied: n = 1, 2 and 4 give bit-identical weights")


def bit_identical(runs, what):
    if len(runs) < 2:
        return check(False, f"{what}: not checked, only {len(runs)} run(s) succeeded (at least 2 needed)")
    first = next(iter(runs.values()))
    same = all(r.keys() == first.keys() and all(np.array_equal(r[k], first[k]) for k in first) for r in runs.values())
    return check(same, what)


def graph_gradient(path, tok, names):
    """d loss / d initializer for the first step, by a float64 evaluation of the ONNX graph itself
    (tests/test_gradcheck.py's interpreter of ONNX ops in torch)."""
    gc = load("gradcheck", os.path.join(ROOT, "tests", "test_gradcheck.py"))
    m = onnx.load(path)
    nodes = []
    for n in m.graph.node:  # Constant nodes become initializers: the interpreter runs compute ops
        if n.op_type == "Constant":
            t = onnx.helper.get_attribute_value(n.attribute[0])
            t.name = n.output[0]
            m.graph.initializer.append(t)
        else:
            nodes.append(n)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    env = {t.name: gc.to_torch(numpy_helper.to_array(t)) for t in m.graph.initializer}
    for k in names:
        env[k].requires_grad_(True)
    mb = B // M
    for k in range(M):
        x = torch.from_numpy(tok[k * mb * T:(k + 1) * mb * T].reshape(mb, T))
        y = torch.from_numpy(tok[k * mb * T + 1:(k + 1) * mb * T + 1].reshape(mb, T))
        logits = gc.run_graph(m, dict(env, tokens=x))["logits"]
        (F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)) * (mb / B)).backward()
    return {k: env[k].grad.numpy() for k in names}


def merged_gpt(tmp, tok):
    torch.manual_seed(0)
    path = os.path.join(tmp, "merged.onnx")
    model = EX.GPT(vocab_size=V, block_size=T, n_layer=2)
    export(model, path, train=False)
    om = onnx.load(path)
    inits = {t.name: numpy_helper.to_array(t) for t in om.graph.initializer}
    shared = [k for k in inits if sum(k in n.input for n in om.graph.node) > 1 and inits[k].dtype == np.float32 and inits[k].size > 1]
    if not check(len(shared) >= 2, f"the eval-mode export merges the LayerNorms' equal weights ({shared})"):
        return
    runs = {}
    for n in (1, 4):   # n = 2 as well for the tied GPT above; here 1 and 4 keep make test within its time
        got = compile_run(tmp, "merged", path, n, 1 if n == 1 else STEPS)
        if got is None:
            continue
        err, _, trained, _ = got
        if n == 1:
            warned = "pipecc: warning:" in err and all(f"'{k}'" in err for k in shared) and "--untie" in err
            check(warned, f"merged: pipecc warns about each merged weight and names --untie ({err.strip()[:200]})")
            ref = graph_gradient(path, tok, shared)
            for k in shared:
                g = (inits[k].astype(np.float64) - trained[k]) / LR
                e = float(np.abs(g - ref[k]).max() / max(np.abs(ref[k]).max(), 1e-12))
                check(e < 1e-3, f"merged n=1: the gradient of the shared '{k}' is the float64 graph's (rel {e:.2e})")
            got = compile_run(tmp, "merged", path, 1, STEPS)
            if got is None:
                continue
            trained = got[2]
        runs[n] = trained
    bit_identical(runs, "merged: n = 1 and 4 give bit-identical weights")

    # --untie: each reader its own copy - the model torch trained.
    init_state = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    want = torch_losses(model, tok)
    state = {k: v.detach().numpy() for k, v in model.named_parameters()}
    runs = {}
    for n in (1, 4):
        got = compile_run(tmp, "untied", path, n, STEPS, extra=("--untie",))
        if got is None:
            continue
        err, losses, trained, _ = got
        check("pipecc: warning:" not in err, f"untied n={n}: no tie is left to warn about ({err.strip()[:120]})")
        e = rel_err(losses, want)
        check(e < 1e-4, f"untied n={n}: per-step losses within 1e-4 relative of PyTorch's untied model (max {e:.2e})")
        saved = onnx.load(os.path.join(tmp, f"untied.{n}.onnx"))
        matched = {name: (key, False) for name in trained for key in [torch_key(saved, name, state)] if key in state}
        # What the exporter folded (Linear weights transposed, wpe gathered at arange(T)): by initial value.
        initial = initial_weights(os.path.join(tmp, f"untied.{n}.pipe"))
        taken = {key for key, _ in matched.values()}
        for name, v in initial.items():
            for key, p in init_state.items():
                for tr in (False, True):
                    q = p.T if tr else p
                    if name not in matched and key not in taken and v.shape == q.shape and np.array_equal(v, q):
                        matched[name] = (key, tr)
                        taken.add(key)
        w = max(float(np.abs(trained[name].astype(np.float64) - (state[key].T if tr else state[key])).max())
                for name, (key, tr) in matched.items())
        got_keys = {key for key, _ in matched.values()}
        check(len(got_keys) == len(state) and w < 1e-4,
              f"untied n={n}: every torch parameter has its own trained copy ({len(got_keys)} of {len(state)}, "
              f"missing {sorted(set(state) - got_keys)}), "
              f"within 1e-4 (max {w:.2e})")
        runs[n] = trained
    bit_identical(runs, "untied: n = 1 and 4 give bit-identical weights")


def torch_key(model, name, params):
    """The torch parameter an initializer of the exported GPT holds: its own name, or for a merged one
    (or a copy --untie made) the output an Identity gives it, or the LayerNorm scope that reads it."""
    for n in model.graph.node:
        if name in n.input:
            if n.op_type == "Identity":
                return n.output[0]
            if n.op_type == "LayerNormalization" and name not in params:
                scope = n.name.strip("/").rsplit("/", 1)[0].replace("/", ".")
                return scope + (".weight" if list(n.input).index(name) == 1 else ".bias")
    return name


def forward_without_slot(tmp):
    """A stage whose forward reads only a weight it shares with another stage (a fuzz input): its
    program uses no ring slot, and must still build under -Werror."""
    path = os.path.join(ROOT, "tests", "fuzz_seeds", "tied-weight-forward-without-slot")
    out = os.path.join(tmp, "noslot.pipe")
    r = subprocess.run([PIPECC, path, "-n", "2", "--batch", "4", "--microbatches", "2", "--schedule", "zb1",
                        "--devices", DEVICES, "-o", out], capture_output=True, text=True)
    if check(r.returncode == 0, f"a stage that only reads a shared weight compiles ({r.stderr.strip()[-200:]})"):
        b = subprocess.run(["make", "-s", "-C", out], capture_output=True, text=True)
        check(b.returncode == 0, f"... and its stage programs build ({b.stderr.strip()[-300:]})")


def untied_fused_bn(tmp):
    """Two BatchNormalizations reading one merged scale initializer (an exporter's merge), each
    followed by a Relu that fuse.c joins to it: with --untie each gets its own copy, and the trained
    model is written back (the packer matches the fused node to the file's BatchNormalization)."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(7)

    def init(name, a):
        return numpy_helper.from_array(np.asarray(a, dtype=np.float32), name)
    ch = 4
    inits = [init("w1", rng.normal(0, 0.3, (ch, 1, 3, 3))), init("w2", rng.normal(0, 0.3, (ch, ch, 3, 3))),
             init("ones", np.ones(ch)), init("b1", np.zeros(ch)), init("b2", np.zeros(ch)),
             init("m1", np.zeros(ch)), init("v1", np.ones(ch)), init("m2", np.zeros(ch)), init("v2", np.ones(ch)),
             init("wh", rng.normal(0, 0.05, (10, ch * 28 * 28))), init("bh", np.zeros(10))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "ones", "b1", "m1", "v1"], ["n1"], training_mode=1),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c2", "ones", "b2", "m2", "v2"], ["n2"], training_mode=1),
             helper.make_node("Relu", ["n2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "wh", "bh"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "bnrelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, 1, 28, 28])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, 10])], inits)
    path = os.path.join(tmp, "bnrelu.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), path)
    mnist = os.path.join(tmp, "mnist")
    if not os.path.exists(mnist):
        subprocess.run([DATAGEN, "mnist", mnist, "--n", "512", "--seed", "2"], check=True, capture_output=True)
    out = os.path.join(tmp, "bnrelu.pipe")
    r = subprocess.run([PIPECC, path, "-n", "1", "--batch", str(B), "--microbatches", "2", "--devices", DEVICES, "--untie",
                        "-o", out], capture_output=True, text=True)
    if not check(r.returncode == 0, f"untied fused BN: pipecc compiles it ({r.stderr.strip()[-300:]})"):
        return
    listing = open(os.path.join(out, "schedule.txt")).read()
    check("2 fused into another" in listing, "untied fused BN: both Relus are fused into their BatchNormalization")
    if not check(subprocess.run(["make", "-s", "-C", out], capture_output=True).returncode == 0, "untied fused BN: the stage builds"):
        return
    saved = os.path.join(tmp, "bnrelu.trained.onnx")
    x = subprocess.run([os.path.join(out, "run.sh"), "--data", mnist, "--steps", "3", "--quiet", "--save", saved],
                       capture_output=True, text=True, timeout=600)
    if check(x.returncode == 0, f"untied fused BN: trains and saves ({x.stderr.strip()[-300:]})"):
        m = onnx.load(saved)
        scales = [n.input[1] for n in m.graph.node if n.op_type == "BatchNormalization"]
        check(len(set(scales)) == 2, f"untied fused BN: the saved model's two BatchNormalizations read their own scales ({scales})")


def main():
    global TOKENS
    tmp = tempfile.mkdtemp(prefix="pipecc-tied.")
    os.environ["PIPECC_CACHE"] = os.path.join(tmp, "machine.txt")
    os.environ["OMPI_ALLOW_RUN_AS_ROOT"] = os.environ["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    TOKENS = os.path.join(tmp, "tokens.bin")
    subprocess.run([DATAGEN, "tokens", TOKENS, "--n", "20000", "--vocab", str(V), "--seed", "5"], check=True, capture_output=True)
    tok = np.fromfile(TOKENS, dtype=np.uint16).astype(np.int64)
    tied_gpt(tmp, tok)
    merged_gpt(tmp, tok)
    forward_without_slot(tmp)
    untied_fused_bn(tmp)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
