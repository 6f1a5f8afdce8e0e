"""Writes the small seed models the loader fuzzer starts from (tests/fuzz_seeds/).

Small seeds keep libFuzzer's mutations near valid protobuf: each exercises a
different part of the loader and the shape rules.  Run with /usr/bin/python3."""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "fuzz_seeds")
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)


def save(name, nodes, inputs, outputs, inits, opset=13):
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    with open(os.path.join(out, name + ".onnx"), "wb") as f:
        f.write(m.SerializeToString())


def w(name, *shape):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])
save("gemm", [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])],
     [x], [y], [w("w", 2, 4), w("b", 2)])

img = helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 1, 6, 6])
out_t = helper.make_tensor_value_info("o", TensorProto.FLOAT, None)
save("conv", [helper.make_node("Conv", ["img", "k"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
              helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], ceil_mode=1),
              helper.make_node("Flatten", ["p"], ["o"])],
     [img], [out_t], [w("k", 3, 1, 3, 3)])

tok = helper.make_tensor_value_info("t", TensorProto.INT64, ["batch", 3])
shape = numpy_helper.from_array(np.array([-1, 3, 2, 2], dtype=np.int64), "shape")
save("shapes", [helper.make_node("Gather", ["emb", "t"], ["e"]),
                helper.make_node("Shape", ["e"], ["s"]),
                helper.make_node("Constant", [], ["idx"], value=numpy_helper.from_array(np.array(1, dtype=np.int64))),
                helper.make_node("Gather", ["s", "idx"], ["d1"], axis=0),
                helper.make_node("Unsqueeze", ["d1", "ax"], ["d1u"]),
                helper.make_node("Reshape", ["e", "shape"], ["r"]),
                helper.make_node("Transpose", ["r"], ["tr"], perm=[0, 2, 1, 3]),
                helper.make_node("Slice", ["tr", "st", "en", "ax"], ["sl"]),
                helper.make_node("Softmax", ["sl"], ["o"], axis=-1)],
     [tok], [out_t], [w("emb", 10, 4), shape,
                      numpy_helper.from_array(np.array([0], dtype=np.int64), "ax"),
                      numpy_helper.from_array(np.array([0], dtype=np.int64), "st"),
                      numpy_helper.from_array(np.array([1], dtype=np.int64), "en")])

h = helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", 3, 4])
save("layernorm", [helper.make_node("LayerNormalization", ["h", "g", "bb"], ["n"], axis=-1),
                   helper.make_node("ReduceMean", ["n"], ["m"], axes=[1], keepdims=0),
                   helper.make_node("Split", ["m", "sp"], ["a", "b2"], axis=1),
                   helper.make_node("Concat", ["b2", "a"], ["o"], axis=1)],
     [h], [out_t], [w("g", 4), w("bb", 4), numpy_helper.from_array(np.array([1, 3], dtype=np.int64), "sp")], opset=17)
# The chains compiler/fuse.c makes one node of, and a near miss of each (a decomposed norm without
# scale whose Div feeds an Add: the form that once crashed the matcher).
xf = helper.make_tensor_value_info("xf", TensorProto.FLOAT, ["batch", 3, 4])
c = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.float32), name)  # noqa: E731
ln = [helper.make_node("ReduceMean", ["xf"], ["m1"], axes=[-1]), helper.make_node("Sub", ["xf", "m1"], ["d"]),
      helper.make_node("Pow", ["d", "two"], ["p"]), helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
      helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
      helper.make_node("Div", ["d", "sd"], ["nn"]), helper.make_node("Mul", ["nn", "g"], ["ns"]),
      helper.make_node("Add", ["ns", "bb"], ["l"])]
lin = [helper.make_node("MatMul", ["l", "wl"], ["mm"]), helper.make_node("Add", ["bl", "mm"], ["h1"])]
gelu = [helper.make_node("Div", ["h1", "rt2"], ["q"]), helper.make_node("Erf", ["q"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["h1", "e1"], ["ge"]),
        helper.make_node("Mul", ["ge", "half"], ["gl"])]
res = [helper.make_node("Add", ["gl", "xf"], ["r"]), helper.make_node("Relu", ["r"], ["rr"])]
bare = [helper.make_node("ReduceMean", ["rr"], ["m2"], axes=[-1]), helper.make_node("Sub", ["rr", "m2"], ["d2"]),
        helper.make_node("Pow", ["d2", "two"], ["p2"]), helper.make_node("ReduceMean", ["p2"], ["v2"], axes=[-1]),
        helper.make_node("Add", ["v2", "eps"], ["ve2"]), helper.make_node("Sqrt", ["ve2"], ["sd2"]),
        helper.make_node("Div", ["d2", "sd2"], ["n2"]), helper.make_node("Add", ["n2", "bb"], ["o"])]
save("fusion", ln + lin + gelu + res + bare, [xf], [out_t],
     [c("two", 2.0), c("eps", 1e-5), c("rt2", 1.4142135), c("one", 1.0), c("half", 0.5), w("g", 4), w("bb", 4),
      w("wl", 4, 4), w("bl", 4)])
print("wrote seeds to", out)
