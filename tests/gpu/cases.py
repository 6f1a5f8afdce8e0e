"""The GPU check's cases, shared by prepare.py (here: compiles and builds them) and parity.py (on the GPU
machine: runs them and compares).  Each case is one plan: a sample model, -n, a schedule and flags.
Also load_module, which the GPU scripts use to reach onnx_models/export.py and tests/test_parity.py."""
import importlib.util


def load_module(path, name):
    """The Python file at path as a module named name (a script, not a package member)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MODELS = {
    # name: (onnx, data kind, batch, micro-batches, lr, steps)
    "mlp": ("onnx_models/mlp.onnx", "mnist", 32, 4, 0.05, 10),
    "lenet": ("onnx_models/lenet.onnx", "mnist", 32, 4, 0.05, 10),
    # The sample ResNet on small micro-batches amplifies rounding (tests/test_parity_models.py): lr 0.002.
    "resnet": ("onnx_models/resnet.onnx", "cifar", 32, 4, 0.002, 10),
    "gpt": ("onnx_models/gpt.onnx", "tokens", 8, 4, 0.05, 10),
}
SCHEDULES = ("gpipe", "1f1b", "zb1")


# Virtual stages: two chunks per rank (the rank's chunks joined into one GPU program), at n = 2.
CHUNKED = ("interleaved", "zbv")


def parity_cases():
    """(tag, model, n, schedule, extra pipecc flags): n = 1 once, n = 2 and 4 under every schedule, and n = 2
    with two chunks per rank under interleaved and zbv."""
    out = []
    for m in MODELS:
        out.append((f"{m}_n1", m, 1, "1f1b", ()))
        for n in (2, 4):
            for s in SCHEDULES:
                out.append((f"{m}_{s}_n{n}", m, n, s, ()))
        for s in CHUNKED:
            out.append((f"{m}_{s}_n2", m, 2, s, ()))
    return out


# The memory plan on the GPU: these models at n = 2 with the busiest stage limited to half its arena.
OFFLOAD_MODELS = ("gpt", "resnet")
