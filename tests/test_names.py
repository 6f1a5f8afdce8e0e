"""Hostile names: a model whose node and tensor names try to break out of the
generated C (an end of comment followed by code, quotes and backslashes in
strings, newlines) or collide with identifiers the stage program uses (main,
forward, arena, slot, k_gemm, offset -> the labels field), in a file whose own
name holds quotes.  pipecc must compile it, the stages must build and train
(2 ranks, 3 steps, the loss falling as with plain names), and nothing the
names carry may run.  Run with /usr/bin/python3; prints ok / not ok lines."""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


def check(cond, what):
    tally.count(cond)
    print(("ok - " if cond else "not ok - ") + what)
    return cond


def model(names, path):
    """An MLP on 28x28 images: Flatten -> Gemm -> Relu -> Gemm, plus a row of a trained table picked by a
    Gather (whose kernel takes its node's name as a string, for its bounds check; index -1, the last row),
    tensors named from `names`."""
    rng = np.random.default_rng(0)
    x, flat, h, r, y = names["x"], names["flat"], names["h"], names["r"], names["y"]
    w1, b1, w2, b2 = names["w1"], names["b1"], names["w2"], names["b2"]
    inits = [numpy_helper.from_array((rng.standard_normal((784, 32)) * 0.05).astype(np.float32), w1),
             numpy_helper.from_array(np.zeros(32, np.float32), b1),
             numpy_helper.from_array((rng.standard_normal((32, 10)) * 0.1).astype(np.float32), w2),
             numpy_helper.from_array(np.zeros(10, np.float32), b2),
             numpy_helper.from_array((rng.standard_normal((3, 10)) * 0.1).astype(np.float32), names["bt"]),
             numpy_helper.from_array(np.array([-1], np.int64), names["gi"])]
    nodes = [helper.make_node("Flatten", [x], [flat], name=names["n0"]),
             helper.make_node("Gemm", [flat, w1, b1], [h], name=names["n1"]),
             helper.make_node("Relu", [h], [r], name=names["n2"]),
             helper.make_node("Gemm", [r, w2, b2], [names["y0"]], name=names["n3"]),
             helper.make_node("Gather", [names["bt"], names["gi"]], [names["g"]], axis=0, name=names["n4"]),
             helper.make_node("Add", [names["y0"], names["g"]], [y], name=names["n5"])]
    g = helper.make_graph(nodes, "names", [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", 1, 28, 28])],
                          [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["batch", 10])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def train(path, out, data, env):
    r = subprocess.run([PIPECC, path, "-n", "2", "--batch", "16", "--microbatches", "4", "--devices", DEVICES, "-o", out],
                       capture_output=True, text=True, env=env, cwd=os.path.dirname(path))
    if r.returncode:
        return None, "pipecc: " + r.stderr.strip()
    r = subprocess.run(["make", "-s", "-C", out], capture_output=True, text=True, env=env, cwd=os.path.dirname(path))
    if r.returncode:
        return None, "build: " + (r.stderr or r.stdout).strip()[-800:]
    log = out + ".csv"
    r = subprocess.run([os.path.join(out, "run.sh"), "--data", data, "--steps", "3", "--log", log, "--quiet",
                        "--save", out + ".onnx"],
                       capture_output=True, text=True, env=env, timeout=300, cwd=os.path.dirname(path))
    if r.returncode:
        return None, "run: " + (r.stderr or r.stdout).strip()[-800:]
    with open(log) as f:
        return [float(line.split(",")[1]) for line in f.read().splitlines()[1:]], ""


def code_only(src):
    """C source with comments, string and character literals removed (what the compiler runs)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src[i] in "\"'":
            q, i = src[i], i + 1
            while i < n and src[i] != q:
                i += 2 if src[i] == "\\" else 1
            i += 1
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


def main():
    tmp = tempfile.mkdtemp(prefix="pipecc-names.")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PIPECC_CACHE=os.path.join(tmp, "machine.txt"))
    try:
        pwned = os.path.join(tmp, "pwned")
        data = os.path.join(tmp, "mnist")
        subprocess.run([DATAGEN, "mnist", data, "--n", "256"], check=True, capture_output=True)
        plain = {k: k for k in ("x", "flat", "h", "r", "y", "w1", "b1", "w2", "b2", "n0", "n1", "n2", "n3", "y0", "bt", "gi", "g", "n4", "n5")}
        inject = f'*/ int pwn = system("touch {pwned}"); /*'
        hostile = {
            "x": "main", "flat": "forward", "h": "arena", "r": "slot", "y": "offset",
            "w1": "k_gemm", "b1": 'quote"back\\slash??=', "w2": "line\nbreak " + inject, "b2": "0 starts with a digit",
            "n0": inject, "n1": "n\"1\\", "n2": "backward\n#include <nothing.h>", "n3": "??/\n" + inject,
            "y0": "y0", "bt": "table \"??/", "gi": "gi", "g": "g", "n4": f'"); system("touch {pwned}"); ("??/', "n5": "n5",
        }
        base = os.path.join(tmp, "plain.onnx")
        model(plain, base)
        want, err = train(base, os.path.join(tmp, "plain.pipe"), data, env)
        check(want is not None, f"the plain-named model trains ({err})")
        # The model's file name and the output directory carry shell code and newlines too; run from tmp,
        # so pwned lands there.  run.sh and the Makefile name the model in a comment, on one line.
        evil = os.path.join(tmp, 'evil "name"\ntouch pwned\n$(touch pwned) `touch pwned`.onnx')
        evil_out = os.path.join(tmp, "evil $(touch pwned) `touch pwned`\n;touch pwned.pipe")
        model(hostile, evil)
        got, err = train(evil, evil_out, data, env)
        for f in ("run.sh", "Makefile"):
            a, b = (os.path.join(d, f) for d in (os.path.join(tmp, "plain.pipe"), evil_out))
            na = len(open(a).read().splitlines()) if os.path.exists(a) else -1
            nb = len(open(b).read().splitlines()) if os.path.exists(b) else -2
            check(na == nb, f"{f} names the model path with newlines on one line ({nb} lines, the plain one {na})")
        check(got is not None, f"the hostile-named model compiles, builds and trains ({err})")
        check(got is not None and want is not None and got == want,
              f"its losses are the plain model's, bit for bit ({got} vs {want})")
        if got is not None and want is not None:
            a = {t.name: numpy_helper.to_array(t) for t in onnx.load(os.path.join(tmp, "plain.pipe.onnx")).graph.initializer}
            b = {t.name: numpy_helper.to_array(t) for t in onnx.load(evil_out + ".onnx").graph.initializer}
            same = all(np.array_equal(a[k], b[hostile[k]]) for k in ("w1", "b1", "w2", "b2", "bt"))
            check(same and set(b) == {hostile[k] for k in ("w1", "b1", "w2", "b2", "bt", "gi")},
                  "--save writes the trained weights back under their hostile names (a newline in one included)")
        check(not os.path.exists(pwned), "nothing a name carries ran (no " + pwned + ")")
        gen = [os.path.join(evil_out, f"stage_{s}.c") for s in range(2)]
        src = "".join(open(f).read() for f in gen if os.path.exists(f))
        check(bool(src) and "system(" not in code_only(src), "the injected call is only ever inside a comment or a string")
    finally:
        if not tally.failed: shutil.rmtree(tmp, ignore_errors=True)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
