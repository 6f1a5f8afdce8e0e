"""Loader paths the sample files do not take: initializers in ONNX external-data
files (how models over 2 GB keep their weights), in typed fields (float_data,
int64_data) instead of raw_data, and with value_info present.  Each variant must
give exactly the plan the original gives; broken external data must be an error
naming the initializer.  Run with /usr/bin/python3."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


def check(cond, what):
    tally.count(cond)
    print(("ok - " if cond else "not ok - ") + what)
    return cond


def plan(path, out):
    r = subprocess.run([PIPECC, path, "-n", "4", "--batch", "8", "--devices", DEVICES, "-o", out, "--plan-only"],
                       capture_output=True, text=True)
    if r.returncode:
        return None, r.stderr.strip()
    p = json.load(open(os.path.join(out, "plan.json")))
    p.pop("model")
    return p, ""


def shapes(path):
    r = subprocess.run([PIPECC, path, "--batch", "8", "--dump-shapes"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else r.stderr


def main():
    tmp = tempfile.mkdtemp(prefix="pipecc-loader.")
    os.environ["PIPECC_CACHE"] = os.path.join(tmp, "machine.txt")
    for name in ("lenet", "resnet", "gpt"):
        src = os.path.join(ROOT, "onnx_models", name + ".onnx")
        want, err = plan(src, os.path.join(tmp, name + ".pipe"))
        want_shapes = shapes(src)
        check(want is not None, f"{name}: original plans ({err})")

        ext_dir = os.path.join(tmp, name + "_ext")
        os.makedirs(ext_dir)
        m = onnx.load(src)
        ext = os.path.join(ext_dir, "model.onnx")
        onnx.save_model(m, ext, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
                        size_threshold=0)
        got, err = plan(ext, os.path.join(tmp, name + "_ext.pipe"))
        check(got == want and shapes(ext) == want_shapes, f"{name}: external-data weights give the same plan ({err})")

        m = onnx.load(src)
        for i, t in enumerate(m.graph.initializer):
            arr = numpy_helper.to_array(t)
            typed = onnx.helper.make_tensor(t.name, t.data_type, arr.shape, arr.flatten().tolist(), raw=False)
            m.graph.initializer[i].CopyFrom(typed)
        check(not any(t.HasField("raw_data") for t in m.graph.initializer), f"{name}: typed-field copy has no raw_data")
        typed_path = os.path.join(tmp, name + "_typed.onnx")
        onnx.save(m, typed_path)
        got, err = plan(typed_path, os.path.join(tmp, name + "_typed.pipe"))
        check(got == want and shapes(typed_path) == want_shapes, f"{name}: typed-field initializers give the same plan ({err})")

        vi_path = os.path.join(tmp, name + "_vi.onnx")
        onnx.save(onnx.shape_inference.infer_shapes(onnx.load(src)), vi_path)
        got, err = plan(vi_path, os.path.join(tmp, name + "_vi.pipe"))
        check(got == want, f"{name}: with value_info the plan is the same ({err})")

    # Broken or hostile external data: outside the folder (by name, by a
    # symlinked file, by a symlinked folder), missing, too short, an offset
    # that overflows, a FIFO (which would block a reader forever).
    base = os.path.join(tmp, "lenet_ext")
    outside = os.path.join(tmp, "outside")
    os.makedirs(outside, exist_ok=True)
    with open(os.path.join(base, "weights.bin"), "rb") as f:
        blob = f.read()
    with open(os.path.join(outside, "weights.bin"), "wb") as f:
        f.write(blob)  # a file of the right size, so only confinement can refuse it

    def link_file(d):
        os.symlink(os.path.join(outside, "weights.bin"), os.path.join(base, "linked.bin"))
        d.update(location="linked.bin")

    def link_dir(d):
        os.symlink(outside, os.path.join(base, "linkdir"))
        d.update(location="linkdir/weights.bin")

    def fifo(d):
        os.mkfifo(os.path.join(base, "fifo.bin"))
        d.update(location="fifo.bin")

    for label, edit, words in (
        ("a location outside the model's folder", lambda d: d.update(location="../weights.bin"), "leaves the model's folder"),
        ("a symlink in the folder to a file outside it", link_file, "outside the model's folder"),
        ("a symlinked folder that leads outside", link_dir, "outside the model's folder"),
        ("a FIFO as the data file", fifo, "not a regular file"),
        ("a missing data file", lambda d: d.update(location="nope.bin"), "cannot open external data"),
        ("an offset past the end", lambda d: d.update(offset="99999999"), "shorter than"),
        ("the largest offset (offset + length overflows)", lambda d: d.update(offset=str(2**63 - 1)), "shorter than"),
        ("an offset past 64 bits", lambda d: d.update(offset="99999999999999999999"), "bad external offset"),
    ):
        m = onnx.load(os.path.join(base, "model.onnx"), load_external_data=False)
        t = m.graph.initializer[0]
        entries = {e.key: e.value for e in t.external_data}
        edit(entries)
        del t.external_data[:]
        for k, v in entries.items():
            t.external_data.add(key=k, value=v)
        bad = os.path.join(base, "bad.onnx")
        with open(bad, "wb") as f:
            f.write(m.SerializeToString())
        out = os.path.join(tmp, "bad.pipe")
        try:
            r = subprocess.run([PIPECC, bad, "-o", out], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            check(False, f"external data with {label}: pipecc hung (killed after 60 s)")
            continue
        check(r.returncode == 2 and words in r.stderr and t.name in r.stderr and not os.path.exists(out),
              f"external data with {label}: exit 2 naming '{t.name}' ({r.stderr.strip()})")

    # The model itself as a FIFO: refused at once, not a blocked read.
    fifo_model = os.path.join(tmp, "fifo.onnx")
    os.mkfifo(fifo_model)
    try:
        r = subprocess.run([PIPECC, fifo_model, "-o", os.path.join(tmp, "fifo.pipe")], capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and "not a regular file" in r.stderr, f"a FIFO as the model: exit 2 ({r.stderr.strip()})")
    except subprocess.TimeoutExpired:
        check(False, "a FIFO as the model: pipecc hung (killed after 60 s)")
    # An empty run-time tensor (a Split part of size 0) used to divide by zero
    # in the Softmax rule (found by the fuzzer): refused, naming the node and tensor.
    from onnx import helper, TensorProto
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((6, 6), np.float32), "w")
    consts = [numpy_helper.from_array(np.array([6, 0], np.int64), "parts")]
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                           helper.make_node("Split", ["h", "parts"], ["full", "sl"], name="empty_split", axis=1),
                           helper.make_node("Softmax", ["sl"], ["y"], name="sm", axis=-1)],
                          "g", [x], [y], [w] + consts)
    empty = os.path.join(tmp, "empty.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), empty)
    r = subprocess.run([PIPECC, empty, "--batch", "8", "-o", os.path.join(tmp, "empty.pipe")], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 2 and "'sl' is empty" in r.stderr and "pipecc: error:" in r.stderr
          and not os.path.exists(os.path.join(tmp, "empty.pipe")),
          f"an empty run-time tensor is refused naming it ({r.stderr.strip()})")
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
