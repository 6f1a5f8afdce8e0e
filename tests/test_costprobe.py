"""The op probe (compiler/opcost.c, tools/probe_ops.c; docs/cost.md, "The op probe").

--quick (make test; a few seconds, nothing timed): with a machine cache and an op cache written here
(a synthetic grid under this machine's identity, so the probe does not run):
  - a one-Gemm model's forward is exactly the grid's time at a measured shape (batch 16 and 256 rows),
    grows with the rows in between (monotone), lies between its neighbours, and beyond the grid grows
    linearly with the work; the listing and plan.json say the nodes came from the op probe;
  - a malformed line in the cache is ignored (the node still costs from the grid);
  - --conv auto follows the grid: on LeNet, a grid where im2col is faster for conv1's shape and oneDNN
    for conv2's runs conv1 as im2col + GEMM (ConvShape lib 0 in stage_0.c) and conv2 through oneDNN
    (lib 1), the listing's convolution line names conv1, plan.json says "mixed"; -n 2 chooses alike;
    --conv dnnl and PIPECC_OPS_CACHE=off keep oneDNN everywhere;
  - --devices plans ignore the op cache;
  - the update is held to its bytes over the memory's rate (`stream`), with the gradients' zeroing, and a
    weight from far memory (far@gemm) costs its bytes in the share the working set lies past 16 MiB.
The full run (make test-costprobe) adds: the real probe on a fresh cache (its time, under 60 s, the
families it writes), --conv auto's choice for grid shapes against the measured faster one, and LeNet
trained with a mixed choice at -n 1 and -n 2 to bit-identical weights.
Run with /usr/bin/python3."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import onnx
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
check = tally.check


def run(cmd, env=None, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, **kw)


def identity():
    """machine_identity (cost.c) as pipecc computes it from the machine cache written by machine_file."""
    cpu = "unknown"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and ":" in line:
            cpu = line.split(":", 1)[1].strip()
            break
    blas = os.environ.get("OPENBLAS_CORETYPE") or run([PIPECC, "--blas-kernels"]).stdout.strip() or "default"
    ident = f"cpu={cpu};cores=2;blas={blas}".replace(" ", "_").replace("\t", "_")
    ident = "".join(c if 0x21 <= ord(c) <= 0x7e else "?" for c in ident)
    return ident.rstrip("_"), blas


def machine_file(path, blas):
    with open(path, "w") as f:
        f.write(f"# test machine\n# blas kernels: {blas}\nrank * flops=100G\nlink * bandwidth=5G latency=2us\n"
                "memcpy bandwidth=10G\nhost cores=2\n")


def gemm_time(M, N, K):
    return 1e-9 * M * N * K ** 0.5  # any smooth, increasing function: the grid's own values are checked


def synthetic_grid(ident, extra=""):
    lines = ["pipecc-ops 3", "machine other-machine", "o gemm 16 16 16 1 9 9 9", f"machine {ident}"]
    for M in (16, 256):
        for N in (16, 256):
            for K in (16, 256):
                t = gemm_time(M, N, K)
                lines.append(f"o gemm {M} {N} {K} 1 {t:.6g} {2 * t:.6g} {3 * t:.6g}")
    # convolutions: im2col faster below 4 input channels, oneDNN from 4 on (LeNet: conv1 1 -> 6, conv2 6 -> 16)
    for impl in ("onednn", "im2col"):
        for cin in (1, 16):
            for cout in (4, 16):
                for k in (3, 5):
                    for P in (1000, 100000):
                        t = 1e-10 * cin * cout * k * k * P * (2 if (impl == "im2col") == (cin >= 4) else 1)
                        lines.append(f"o conv@{impl} {cin} {cout} {k} {P} {t:.6g} {t:.6g} {t:.6g}")
    for fam in ("relu", "maxpool", "binary"):
        lines += [f"o {fam} 1000 1 1 1 1e-6 2e-6 0", f"o {fam} 1000000 1 1 1 1e-3 2e-3 0"]
    lines.append("probe 1.5")
    return "\n".join(lines) + "\n" + extra


def gemm_model(path, K, N):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", K])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", N])
    w = helper.make_tensor("w", TensorProto.FLOAT, [N, K], [0.01] * (N * K))
    node = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1, name="fc")
    m = helper.make_model(helper.make_graph([node], "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(m, path)


def plan(env, model, out, *extra, n=1, batch=16):
    r = run([PIPECC, model, "-n", str(n), "--batch", str(batch), "--microbatches", "1", "--plan-only", "-o", out, *extra], env=env)
    if r.returncode:
        return None, r
    with open(os.path.join(out, "plan.json")) as f:
        return json.load(f), r


def gemm_cases(tmp, env):
    model = os.path.join(tmp, "gemm.onnx")
    gemm_model(model, 256, 16)
    fwd = {}
    for B in (16, 32, 64, 128, 256, 512, 1024):
        p, r = plan(env, model, os.path.join(tmp, f"g{B}.pipe"), batch=B)
        if not check(p is not None, f"a one-Gemm model plans at batch {B}", r.stderr[-300:]):
            return
        fwd[B] = p["stage_plans"][0]["fwd_time_s"]
    for B in (16, 256):
        want = gemm_time(B, 16, 256)
        check(abs(fwd[B] / want - 1) < 1e-5, f"the forward at a measured shape (M={B}) is the grid's time", f"{fwd[B]} vs {want}")
    check(all(fwd[a] < fwd[b] for a, b in zip(sorted(fwd), sorted(fwd)[1:])), "the Gemm's time grows with its rows", str(fwd))
    check(abs(fwd[1024] / fwd[256] - 4) < 1e-6, "beyond the grid the time grows linearly with the work", str(fwd))
    listing = open(os.path.join(tmp, "g16.pipe", "schedule.txt")).read()
    check("from the op probe's grid" in listing, "the listing says the node came from the op probe", listing[:600])
    check(p["machine"].get("op_probe", {}).get("nodes_from_probe") == 1, "plan.json counts it", str(p["machine"]))


def conv_cases(tmp, env):
    lenet = os.path.join(ROOT, "onnx_models", "lenet.onnx")
    out = os.path.join(tmp, "l1.pipe")
    r = run([PIPECC, lenet, "-n", "1", "--batch", "16", "--microbatches", "1", "-o", out], env=env)
    if not check(r.returncode == 0, "LeNet plans with --conv auto on the grid", r.stderr[-300:]):
        return
    listing = open(os.path.join(out, "schedule.txt")).read()
    conv_line = next((line for line in listing.splitlines() if line.strip().startswith("convolution")), "")
    check("1 through oneDNN, 1 as im2col + GEMM" in conv_line and "/conv1/Conv" in conv_line,
          "the listing says conv1 runs as im2col + GEMM, conv2 through oneDNN", conv_line)
    plan_j = json.load(open(os.path.join(out, "plan.json")))
    check(plan_j.get("convolutions") == "mixed", "plan.json: convolutions mixed", str(plan_j.get("convolutions")))
    libs = re.findall(r"static const ConvShape CONV_\d+ = \{([^}]*)\}", open(os.path.join(out, "stage_0.c")).read())
    flags = [int(s.split(",")[-2]) for s in libs]
    check(flags == [0, 1], "stage_0.c: conv1's ConvShape.lib is 0, conv2's 1", str(flags))
    out2 = os.path.join(tmp, "l2.pipe")
    r = run([PIPECC, lenet, "-n", "2", "--batch", "16", "--microbatches", "2", "-o", out2], env=env)
    src = "".join(open(os.path.join(out2, f"stage_{k}.c")).read() for k in range(2)) if r.returncode == 0 else ""
    flags2 = [int(s.split(",")[-2]) for s in re.findall(r"static const ConvShape CONV_\d+ = \{([^}]*)\}", src)]
    check(flags2 == [0, 1], "-n 2 chooses alike (the shape and the machine decide, not n)", str(flags2))
    for what, extra, e in (("--conv dnnl", ["--conv", "dnnl"], env), ("PIPECC_OPS_CACHE=off", [], dict(env, PIPECC_OPS_CACHE="off")),
                           ("--devices", ["--devices", os.path.join(ROOT, "tests", "devices_equal.txt")], env)):
        p, r = plan(e, lenet, os.path.join(tmp, "lx.pipe"), *extra)
        check(p is not None and p.get("convolutions") == "onednn", f"{what}: every convolution through oneDNN",
              r.stderr[-300:] if p is None else str(p.get("convolutions")))
        if what == "--devices" and p is not None:
            check("op_probe" not in p["machine"], "--devices: nothing from the op probe", str(p["machine"]))


def update_cases(tmp, env, ident):
    """The optimizer's update and the loss from the grid's sgd and xent families, when it has them."""
    model = os.path.join(tmp, "gemm.onnx")
    base, r = plan(env, model, os.path.join(tmp, "u0.pipe"))
    if not check(base is not None, "the one-Gemm model plans", r.stderr[-300:]):
        return
    check(base["machine"].get("op_probe", {}).get("aux_from_probe") == 0, "a grid without sgd and xent costs neither", str(base["machine"]))
    steps = []
    for k in (1, 2):  # k ns a float for the update, k ns a logit for the loss
        env2 = dict(env, PIPECC_OPS_CACHE=os.path.join(tmp, f"ops_upd{k}.txt"))
        with open(env2["PIPECC_OPS_CACHE"], "w") as f:
            f.write(synthetic_grid(ident, f"o sgd 100 100 1 1 {k}e-7 0 0\no sgd 1000000 1000000 1 1 {k}e-3 0 0\n"
                                          f"o xent 100 16 1 1 {k}e-7 0 0\no xent 1000000 16 1 1 {k}e-3 0 0\n"))
        p, r = plan(env2, model, os.path.join(tmp, f"u{k}.pipe"))
        if not check(p is not None, f"the one-Gemm model plans on a grid with sgd and xent ({k} ns)", r.stderr[-300:]):
            return
        check(p["machine"].get("op_probe", {}).get("aux_from_probe") == 2, "plan.json: the update and the loss from the op probe",
              str(p["machine"]))
        steps.append(p["predicted_step_time_s"])
    want = 256 * 16 * 1e-9 + 16 * 16 * 1e-9  # the weight's 4096 floats; the loss over [16, 16] logits
    check(abs((steps[1] - steps[0]) / want - 1) < 0.01, "the step grows by the grid's update and loss", f"{steps} vs {want}")
    listing = open(os.path.join(tmp, "u1.pipe", "schedule.txt")).read()
    check("2 from the op\n               probe" in listing, "the listing says so", listing[:900])
    # The memory's rate (`stream`, 1 GB/s at every working set) holds the update to its bytes: 16 a float for
    # SGD (the finite check, weight and gradient read, weight written) over the 1 ns the grid says, and the
    # gradient's zeroing, 8 bytes a float, on top.
    env3 = dict(env, PIPECC_OPS_CACHE=os.path.join(tmp, "ops_stream.txt"))
    with open(env3["PIPECC_OPS_CACHE"], "w") as f:
        f.write(synthetic_grid(ident, "o sgd 100 100 1 1 1e-7 0 0\no sgd 1000000 1000000 1 1 1e-3 0 0\n"
                                      "o xent 100 16 1 1 1e-7 0 0\no xent 1000000 16 1 1 1e-3 0 0\n"
                                      "o stream 1000 1 1 1 1e-6 0 0\no stream 1000000000 1 1 1 1 0 0\n"))
    p, r = plan(env3, model, os.path.join(tmp, "u3.pipe"))
    if check(p is not None, "the one-Gemm model plans on a grid with the memory's rate", r.stderr[-300:]):
        want = 4096 * (16 + 8 - 1) * 1e-9
        check(abs((p["predicted_step_time_s"] - steps[0]) / want - 1) < 0.01,
              "the update is held to its bytes over the memory's rate, with the gradient's zeroing",
              f"{p['predicted_step_time_s']} - {steps[0]} vs {want}")


def far_cases(tmp, env, ident):
    """A weight from far memory (far@FAMILY) costs its bytes' part of the probe's extra in the share the
    stage's working set lies past 16 MiB, by its place in logs up to the stream grid's largest (1e9 here)."""
    import math
    model = os.path.join(tmp, "big.onnx")
    gemm_model(model, 2048, 2048)  # 16 MiB of weights: with their gradients a working set of 32 MiB
    base = "o stream 1000 1 1 1 1e-6 0 0\no stream 1000000000 1 1 1 1 0 0\n"
    far = "o far@gemm 1000000 1 1 1 1e-3 2e-3 3e-3\no far@gemm 100000000 1 1 1 0.1 0.2 0.3\n"  # 1, 2, 3 ns a byte
    steps = []
    for k, extra in enumerate((base, base + far)):
        e = dict(env, PIPECC_OPS_CACHE=os.path.join(tmp, f"ops_far{k}.txt"))
        with open(e["PIPECC_OPS_CACHE"], "w") as f:
            f.write(synthetic_grid(ident, extra))
        p, r = plan(e, model, os.path.join(tmp, f"far{k}.pipe"))
        if not check(p is not None, f"a Gemm of 16 MiB of weights plans {'with' if k else 'without'} far@gemm", r.stderr[-300:]):
            return
        steps.append(p["predicted_step_time_s"])
    W, MiB = 2048 * 2048 * 4, 1 << 20
    lo, hi = (math.log(ws / (16 * MiB)) / math.log(1e9 / (16 * MiB)) for ws in (2 * W, 2 * W + MiB))
    got = (steps[1] - steps[0]) / (W * 4e-9)  # the forward's 1 ns and the weight gradient's 3 (x has no gradient)
    check(lo * 0.99 <= got <= hi * 1.01, f"far@gemm adds the weight's bytes in the working set's share ({got:.3f}, {lo:.3f}-{hi:.3f})")


def quick(tmp):
    ident, blas = identity()
    env = dict(os.environ, PIPECC_CACHE=os.path.join(tmp, "machine.txt"), PIPECC_KERNEL_CACHE="off",
               PIPECC_OPS_CACHE=os.path.join(tmp, "ops.txt"))
    machine_file(env["PIPECC_CACHE"], blas)
    with open(env["PIPECC_OPS_CACHE"], "w") as f:
        f.write(synthetic_grid(ident, "o gemm 16 16 x 1 1 1 1\no bad\n"))
    gemm_cases(tmp, env)
    update_cases(tmp, env, ident)
    far_cases(tmp, env, ident)
    conv_cases(tmp, env)
    return env


def full(tmp):
    env = dict(os.environ, PIPECC_CACHE=os.path.join(tmp, "full", "machine.txt"), PIPECC_KERNEL_CACHE="off",
               PIPECC_OPS_CACHE=os.path.join(tmp, "full", "ops.txt"))
    os.makedirs(os.path.join(tmp, "full"))
    t0 = time.time()
    p, r = plan(env, os.path.join(ROOT, "onnx_models", "resnet.onnx"), os.path.join(tmp, "r.pipe"), batch=8)
    secs = time.time() - t0
    check(p is not None and "probed in" in r.stderr, "the first plan runs the op probe", r.stderr[-300:])
    check(secs < 90, f"the probe and the plan took {secs:.1f} s (under 90)")
    text = open(env["PIPECC_OPS_CACHE"]).read() if os.path.exists(env["PIPECC_OPS_CACHE"]) else ""
    fams = set(re.findall(r"^o (\S+) ", text, re.M))
    want = {"gemm", "conv@onednn", "conv@im2col", "dwconv@onednn", "dwconv@im2col", "relu", "gelu", "binary", "softmax",
            "layernorm", "batchnorm", "maxpool", "avgpool", "copy", "sgd", "sgdm", "adam", "xent", "stream"}
    check(want <= fams, "the cache has every family", str(sorted(fams)))
    print(f"# op probe: {secs:.1f} s for the probe and one plan; {len(text.splitlines())} lines")
    # the choice at grid shapes: a one-conv model of 4 images of 32x32 (P = 4096)
    pts = {}
    for m in re.finditer(r"^o conv@(\w+) (\d+) (\d+) (\d+) 4096 (\S+) (\S+) (\S+)$", text, re.M):
        pts.setdefault(tuple(int(x) for x in m.group(2, 3, 4)), {})[m.group(1)] = sum(float(x) for x in m.group(5, 6, 7))
    for (cin, cout, k), t in sorted(pts.items())[::5]:
        path = os.path.join(tmp, f"c{cin}_{cout}_{k}.onnx")
        conv_model(path, cin, cout, k)
        p, r = plan(env, path, os.path.join(tmp, "c.pipe"), batch=4)
        got = p and p.get("convolutions")
        want = "mixed" if t["im2col"] < t["onednn"] else "onednn"
        check(got == want, f"--conv auto at {cin}->{cout} {k}x{k}: {want} (measured {t['onednn']:.3g} s oneDNN, {t['im2col']:.3g} s im2col)",
              str(got))


def conv_model(path, cin, cout, k):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", cin, 32, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", cout * 32 * 32])
    w = helper.make_tensor("w", TensorProto.FLOAT, [cout, cin, k, k], [0.01] * (cout * cin * k * k))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[k // 2] * 4, name="conv"),
             helper.make_node("Flatten", ["c"], ["y"], name="flat")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 13)]), path)


def main():
    tmp = tempfile.mkdtemp(prefix="pipecc-costprobe.")
    try:
        quick(tmp)
        if "--quick" not in sys.argv:
            full(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tally.finish()


if __name__ == "__main__":
    main()
