"""ONNX's own node conformance tests through pipecc's forward kernels.

Generates the node test cases with Debian's python3-onnx (onnx.backend.test
cmd_tools generate-data, after restoring numpy's removed aliases), keeps every
case whose operators pipecc runs, compiles each with `pipecc --forward-only`,
runs the stage program on the case's inputs and compares with the expected
outputs (rtol = atol = 1e-4 for float32, exact otherwise).

A case pipecc refuses at compile time (one 'pipecc: error:' line, exit 2)
FAILS unless it is pinned in EXPECTED_REFUSALS, case -> a text the error line
must contain (the reason).  A pinned case refused with that text is counted as
a pinned refusal ("refused (pinned) - CASE: REASON"), never as passed; a pinned case refused for
another reason, or one that no longer is refused ("expected refusal no longer
refused: unpin it"), fails.  Integer,
bool and scalar inputs are compiled in as constants: pipecc is a static
compiler, and they hold shapes, axes, indices and exponents; only an input
that nothing but Casts read stays a run-time input of its own type.

  /usr/bin/python3 tests/conformance/run.py [--ops Conv,Gemm] [--write-docs]

A documented deviation (DEVIATIONS) is counted as skipped, with its reason.
Prints per-op counts and ends with "N passed, M failed, K skipped, R refused"
(tests/tally.py).  --write-docs
rewrites docs/operators.md from the results."""
import argparse
import collections
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import numpy as np

warnings.filterwarnings("ignore")  # numpy warns about the aliases onnx's generators still use
for alias, typ in (("float", float), ("int", int), ("bool", bool), ("object", object)):
    if alias not in np.__dict__:
        setattr(np, alias, typ)
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
os.environ["PIPECC"] = PIPECC  # optable reads the same binary

sys.path.insert(0, os.path.join(ROOT, "tests"))
import optable  # noqa: E402
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)

# What pipecc claims comes from its operator table (pipecc --list-ops): every op
# that runs at run time is tested, and "backward" is whether it trains.
OPTABLE = optable.table()
BACKWARD = {op: int(op in optable.trainable_ops(OPTABLE)) for op in optable.run_ops(OPTABLE)}


# Cases where pipecc follows PyTorch on purpose and ONNX's reference differs.
# Reported on their own line, never counted as passed.
DEVIATIONS = {
    "test_batchnorm_epsilon_training_mode": "running_var uses the unbiased batch variance, as PyTorch updates it; ONNX's "
                                            "reference uses the biased one",
    "test_batchnorm_example_training_mode": "running_var uses the unbiased batch variance, as PyTorch updates it; ONNX's "
                                            "reference uses the biased one",
}


# Dropout in training mode with a ratio > 0: ONNX's expected outputs hold numpy's
# random mask, and pipecc draws its own (Philox, keyed by seed, step, node and
# element: README.md says why).  These are checked for what any correct dropout
# gives instead (random_check) and, when that holds, reported as deviations.
RANDOM_MASKS = {"test_training_dropout", "test_training_dropout_default", "test_training_dropout_default_mask",
                "test_training_dropout_mask"}
RANDOM_REASON = "the mask comes from pipecc's generator, not numpy's"


def random_check(path, files, got):
    """A Dropout's outputs (got: name -> array) against its input: kept values
    x / (1 - ratio) (rtol 1e-6), dropped ones 0, the mask output saying which,
    the kept fraction within 5 sigma of 1 - ratio.  Returns (status, detail)."""
    m = onnx.load(path)
    node = m.graph.node[0]
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    x = numpy_helper.to_array(onnx.load_tensor(files[node.input[0]]))
    ratio = float(consts[node.input[1]]) if len(node.input) > 1 and node.input[1] else 0.5
    y = got[node.output[0]]
    has_mask = len(node.output) > 1 and node.output[1] in got
    kept = got[node.output[1]].astype(bool) if has_mask else y != 0
    scale = np.float32(1) / np.float32(1 - ratio)
    frac, sigma = kept.mean(), np.sqrt(ratio * (1 - ratio) / kept.size)
    if not np.allclose(y[kept], x[kept] * scale, rtol=1e-6, atol=0) or np.any(y[~kept] != 0):
        return "fail", "outputs are not x / (1 - ratio) where kept and 0 where dropped"
    if abs(frac - (1 - ratio)) > 5 * sigma:
        return "fail", f"kept {frac:.3f} of the values, expected {1 - ratio:.3f} +- {5 * sigma:.3f}"
    return "deviation", (f"{RANDOM_REASON}: checked that kept values are x / (1 - ratio), dropped ones 0"
                         + (" as the mask output says" if has_mask else "") + f", {frac:.2f} kept (expected {1 - ratio:.2f})")


# Cases pipecc refuses at compile time on purpose: case -> a text its
# 'pipecc: error:' line must contain.  Keep this honest: a case that starts to
# compile fails until it is unpinned.
_NO_DATA = "the graph has no data inputs"   # every input is an integer tensor, compiled in as a constant
_LAST_AXIS = "only the last axis trains so far"
_FLOAT_ONLY = "on float32 only (its kernels have no other element type)"
_IN_TYPE = "graph input 'input' has an unsupported element type"   # bfloat16, string
_CAST_RT = "runs only at compile time (at run time: float32 <-> int64"
EXPECTED_REFUSALS = {
    # Integer data (uint8/int32/int64): only float32 runs at training time.
    "test_add_uint8": _NO_DATA, "test_div_uint8": _NO_DATA, "test_mul_uint8": _NO_DATA, "test_sub_uint8": _NO_DATA,
    "test_maxpool_2d_uint8": _NO_DATA, "test_pow_types_int32_int32": _NO_DATA, "test_pow_types_int64_int64": _NO_DATA,
    "test_edge_pad": _NO_DATA, "test_reflect_pad": _NO_DATA, "test_where_long_example": _NO_DATA,
    "test_pow_types_float32_int32": _FLOAT_ONLY, "test_pow_types_float32_int64": _FLOAT_ONLY,
    "test_pow_types_float32_uint32": _FLOAT_ONLY, "test_pow_types_float32_uint64": _FLOAT_ONLY,
    "test_pow_types_int32_float32": _FLOAT_ONLY, "test_pow_types_int64_float32": _FLOAT_ONLY,
    # Softmax / LogSoftmax on an axis other than the last.
    "test_logsoftmax_axis_0": _LAST_AXIS, "test_logsoftmax_axis_1": _LAST_AXIS,
    "test_softmax_axis_0": _LAST_AXIS, "test_softmax_axis_1": _LAST_AXIS,
    # Gather other than an embedding lookup (axis 0 of a float table, int64 indices).
    "test_gather_1": "only float tables indexed by int64 on axis 0", "test_gather_2d_indices": "only float tables indexed by int64 on axis 0",
    # Opset 1 models.
    "test_globalaveragepool": "opset 1 is outside the range", "test_globalaveragepool_precomputed": "opset 1 is outside the range",
    # Sequence / optional graph inputs.
    "test_identity_opt": "is not a tensor (sequences, maps and optionals", "test_identity_sequence": "is not a tensor (sequences, maps and optionals",
    # MaxPool's Indices output, column-major indices.
    "test_maxpool_with_argmax_2d_precomputed_pads": "is not computed by pipecc's kernel",
    "test_maxpool_with_argmax_2d_precomputed_strides": "storage_order=1",
    # Integer / float16 / float64 data and integer or bool comparisons: compiled in as constants and folded.
    **{f"test_{op}_{t}": _NO_DATA for op in ("max", "min")
       for t in ("float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")},
    "test_clip_default_int8_inbounds": _NO_DATA, "test_clip_default_int8_max": _NO_DATA, "test_clip_default_int8_min": _NO_DATA,
    "test_equal": _NO_DATA, "test_equal_bcast": _NO_DATA,
    # Opset 1 and 6 models (Not, HardSigmoid): their later opsets have the same semantics.
    "test_not_2d": "opset 1 is outside the range", "test_not_3d": "opset 1 is outside the range",
    "test_not_4d": "opset 1 is outside the range",
    "test_hardsigmoid": "opset 6 is outside the range", "test_hardsigmoid_default": "opset 6 is outside the range",
    "test_hardsigmoid_example": "opset 6 is outside the range",
    # Zero-sized tensors: the batch axis of size 0 is read as the dynamic batch (32).
    "test_reshape_allowzero_reordered": "to a shape of 0 elements",
    "test_split_zero_size_splits": "split sizes add up to 0",
    "test_slice_start_out_of_bounds": "pipecc does not run empty tensors",
    # Cast: the input stays a run-time input of its own type (prepare); pipecc runs bool,
    # int32, int64, float16 -> float32 and float32 -> int64/float32; it makes no double or
    # float16 values and reads no bfloat16 or string input.
    "test_cast_DOUBLE_to_FLOAT": _CAST_RT, "test_cast_DOUBLE_to_FLOAT16": _CAST_RT,
    "test_cast_FLOAT16_to_DOUBLE": _CAST_RT, "test_cast_FLOAT_to_DOUBLE": _CAST_RT,
    "test_cast_FLOAT_to_FLOAT16": _CAST_RT,
    "test_castlike_DOUBLE_to_FLOAT_expanded": _CAST_RT, "test_castlike_DOUBLE_to_FLOAT16_expanded": _CAST_RT,
    "test_castlike_FLOAT16_to_DOUBLE_expanded": _CAST_RT, "test_castlike_FLOAT_to_DOUBLE_expanded": _CAST_RT,
    "test_castlike_FLOAT_to_FLOAT16_expanded": _CAST_RT,
    "test_cast_FLOAT_to_BFLOAT16": "cast to element type 16 is not supported",
    "test_castlike_FLOAT_to_BFLOAT16_expanded": "cast to element type 16 is not supported",
    "test_cast_FLOAT_to_STRING": "cast to element type 8 is not supported",
    "test_castlike_FLOAT_to_STRING_expanded": "has unsupported element type 8",
    "test_cast_BFLOAT16_to_FLOAT": _IN_TYPE, "test_castlike_BFLOAT16_to_FLOAT_expanded": _IN_TYPE,
    "test_cast_STRING_to_FLOAT": _IN_TYPE, "test_castlike_STRING_to_FLOAT_expanded": _IN_TYPE,
    # LSTM peepholes (input P): not exported by torch, not implemented.
    "test_lstm_with_peepholes": "peepholes (input P) are not supported",
}


def op_list():
    return sorted(BACKWARD)


def generate(out):
    from onnx.backend.test.cmd_tools import main as gen
    argv = sys.argv
    sys.argv = ["cmd_tools", "generate-data", "-o", out]
    try:
        gen()
    finally:
        sys.argv = argv
    return os.path.join(out, "node")


def prepare(case_dir, work):
    """The model with integer/bool inputs made constants; returns (model path,
    {recv name: input file}, [expected outputs by name])."""
    m = onnx.load(os.path.join(case_dir, "model.onnx"))
    data = os.path.join(case_dir, "test_data_set_0")
    inputs = [numpy_helper.to_array(onnx.load_tensor(os.path.join(data, f"input_{i}.pb"))) for i in range(len(m.graph.input))]
    outputs = {o.name: numpy_helper.to_array(onnx.load_tensor(os.path.join(data, f"output_{i}.pb")))
               for i, o in enumerate(m.graph.output)}
    keep, files = [], {}
    # A Cast's input is data whatever its type: it stays a run-time input.
    cast_only = {vi.name for vi in m.graph.input
                 if all(n.op_type == "Cast" for n in m.graph.node if vi.name in n.input)
                 and any(vi.name in n.input for n in m.graph.node)}
    for i, vi in enumerate(m.graph.input):
        if (inputs[i].dtype != np.float32 and vi.name not in cast_only) or inputs[i].ndim == 0:
            m.graph.initializer.append(numpy_helper.from_array(inputs[i], vi.name))
        else:
            keep.append(vi)
            files[vi.name] = os.path.join(data, f"input_{i}.pb")
    del m.graph.input[:]
    m.graph.input.extend(keep)
    path = os.path.join(work, "model.onnx")
    onnx.save(m, path)
    return path, files, outputs


def lib_cflags():
    """What the generated Makefile adds when the machine has oneDNN (convolutions through it) and liburing
    (a file offload's copies)."""
    return (["-DPR_DNNL"] if os.path.exists("/usr/include/dnnl.h") else []) + \
        (["-DPR_URING"] if os.path.exists("/usr/include/liburing.h") else [])


def lib_ldlibs():
    """The libraries build_runtime's objects need beyond OpenBLAS and protobuf-c (as the generated Makefile)."""
    return (["-ldnnl", "-lgomp"] if os.path.exists("/usr/include/dnnl.h") else []) + \
        (["-luring"] if os.path.exists("/usr/include/liburing.h") else [])


def build_runtime(work):
    """Compiles libpiperun once; each case then only compiles its stage file."""
    probe = os.path.join(work, "probe")
    m = os.path.join(ROOT, "onnx_models", "mlp.onnx")
    subprocess.run([PIPECC, m, "-o", probe, "--forward-only", "--plan-only"], capture_output=True)
    subprocess.run([PIPECC, m, "-o", probe, "--forward-only"], check=True, capture_output=True)
    # In the probe's own build/ (not a shared PIPERUN_OBJ_CACHE): the objects are listed from there.
    env = {k: v for k, v in os.environ.items() if k != "PIPERUN_OBJ_CACHE"}
    subprocess.run(["make", "-s", "-C", probe, "runtime"], check=True, capture_output=True, env=env)
    objs = sorted(f for f in os.listdir(os.path.join(probe, "build")) if f.endswith(".o"))
    return [os.path.join(probe, "build", f) for f in objs]


def run_case(name, case_dir, work, rt_obj):
    """Returns (status, detail): status in pass / fail / unsupported."""
    os.makedirs(work)
    try:
        path, files, expected = prepare(case_dir, work)
    except Exception as e:
        # Sequence/optional-typed cases: pipecc's loader must refuse them clearly.
        r = subprocess.run([PIPECC, os.path.join(case_dir, "model.onnx"), "--plan-only", "-o", os.path.join(work, "p")],
                           capture_output=True, text=True)
        if r.returncode == 2 and r.stderr.startswith("pipecc: error:") and len(r.stderr.strip().splitlines()) == 1:
            return "unsupported", r.stderr.strip().replace(case_dir + "/", "")
        return "fail", f"could not prepare ({e}) and pipecc did not refuse the model: {r.stderr.strip()[:200]}"
    out = os.path.join(work, "prog")
    r = subprocess.run([PIPECC, path, "-n", "1", "--forward-only", "-o", out], capture_output=True, text=True)
    if r.returncode == 2 and r.stderr.startswith("pipecc: error:") and len(r.stderr.strip().splitlines()) == 1:
        return "unsupported", r.stderr.strip().replace(path + ": ", "")
    if r.returncode:
        return "fail", f"pipecc exit {r.returncode}: {r.stderr.strip()[:300]}"
    runtime = os.path.join(ROOT, "runtime")
    cc = ["mpicc", "-O1", "-w", "-I" + runtime, "-I" + os.path.join(ROOT, "build", "gen"), "-D_GNU_SOURCE",
          os.path.join(out, "stage_0.c"), *rt_obj, "-o", os.path.join(out, "stage_0"), "-lopenblas", "-lprotobuf-c", "-lm", "-lpthread"]
    cc[1:1] = lib_cflags()
    cc += lib_ldlibs()
    r = subprocess.run(cc, capture_output=True, text=True, env=dict(os.environ, OMPI_CC="clang"))
    if r.returncode:
        return "fail", "the generated program does not compile: " + r.stderr.strip()[:300]
    plan = json.load(open(os.path.join(out, "plan.json")))["stage_plans"][0]
    ind, outd = os.path.join(work, "in"), os.path.join(work, "out")
    os.makedirs(ind), os.makedirs(outd)
    for k, v in enumerate(plan["recv"]):
        if v["name"] not in files:
            return "fail", f"the program reads '{v['name']}', which is not a float input"
        os.symlink(files[v["name"]], os.path.join(ind, f"input_{k}.pb"))
    r = subprocess.run([os.path.join(out, "stage_0"), ind, outd], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PIPERUN_DIR=out))
    if r.returncode:
        return "fail", f"the program failed ({r.returncode}): {r.stderr.strip()[:300]}"
    sends = plan["send"]
    if name in RANDOM_MASKS:
        got = {v["name"]: np.fromfile(os.path.join(outd, f"{k}.bin"), dtype=expected[v["name"]].dtype).reshape(expected[v["name"]].shape)
               for k, v in enumerate(sends) if v["name"] in expected}
        return random_check(path, files, got)
    for k, v in enumerate(sends):
        want = expected.get(v["name"])
        if want is None:
            continue
        got = np.fromfile(os.path.join(outd, f"{k}.bin"), dtype=want.dtype).reshape(want.shape) if want.size else want
        if want.dtype == np.float32:
            ok = np.allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
        else:
            ok = np.array_equal(got, want)
        if not ok:
            err = float(np.nanmax(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if want.size else 0
            return "fail", f"output '{v['name']}' differs (max abs error {err:.3g})"
    missing = [n for n in expected if n not in {v["name"] for v in sends}]
    if missing:
        return "fail", f"outputs not produced: {missing}"
    return "pass", ""


def write_docs(results):
    lines = ["# Operators pipecc supports", "", optable.BEGIN, optable.operators_block(OPTABLE), optable.END, "",
             "## Conformance", "",
             "Generated by `tests/conformance/run.py --write-docs` from ONNX's node conformance tests (python3-onnx "
             f"{onnx.__version__}) for every op the table says runs at run time.  *Conformance*: cases passed / cases "
             "run for the op; *unsupported* cases are refused at compile time with a clear message (listed below the "
             "table).", "",
             "| operator | backward | conformance | unsupported |", "|---|---|---|---|"]
    by_op = collections.defaultdict(list)
    for name, op, status, detail in results:
        by_op[op].append((name, status, detail))
    for op in op_list():
        cases = by_op.get(op, [])
        p = sum(s == "pass" for _, s, _ in cases)
        run = sum(s not in ("unsupported",) for _, s, _ in cases)
        u = sum(s == "unsupported" for _, s, _ in cases)
        lines.append(f"| {op} | {'yes' if BACKWARD[op] else 'no'} | {p}/{run} | {u} |")
    lines += ["", "## Documented deviations", ""]
    for name, op, status, detail in results:
        if status == "deviation":
            lines.append(f"- `{name}` ({op}): {detail}")
    if any(name in RANDOM_MASKS for name, _, _, _ in results):
        lines += ["", "Dropout's masks are pipecc's own, neither numpy's (ONNX's expected outputs) nor PyTorch's: "
                  "PyTorch's generator and the order of its draws depend on the device and the kernel, and a pipeline "
                  "needs masks that do not depend on where a micro-batch runs.  pipecc keys Philox4x32-10 by `--seed`, "
                  "the step, the node and the element's place in the step's batch (README.md, Training a model)."]
    lines += ["", "## Cases refused at compile time", ""]
    for name, op, status, detail in results:
        if status == "unsupported":
            lines.append(f"- `{name}` ({op}): {detail}")
    open(os.path.join(ROOT, "docs", "operators.md"), "w").write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", help="comma-separated ops to test (default: all pipecc claims)")
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    ops = set(args.ops.split(",")) if args.ops else set(op_list())
    tmp = tempfile.mkdtemp(prefix="pipecc-conformance.")
    os.environ["PIPECC_CACHE"] = os.path.join(tmp, "machine.txt")
    node_dir = generate(os.path.join(tmp, "data"))
    rt_obj = build_runtime(tmp)
    results = []
    seen, refusal_failures = set(), []
    todo = []
    for name in sorted(os.listdir(node_dir)):
        case = os.path.join(node_dir, name)
        m = onnx.load(os.path.join(case, "model.onnx"))
        used = {n.op_type for n in m.graph.node}
        if not used or not used <= set(op_list()) or not used & ops:
            continue
        todo.append((name, case, m.graph.node[0].op_type if len(used) == 1 else sorted(used & ops)[0]))
    # Two cases at a time (each compiles and runs its own program in its own directory); the first alone,
    # so that one pipecc writes the machine cache the others read.  Results are reported in case order.
    def one(t):
        return run_case(t[0], t[1], os.path.join(tmp, "cases", t[0]), rt_obj)
    outcomes = [one(todo[0])] if todo else []
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        outcomes += list(pool.map(one, todo[1:]))
    for (name, case, op), (status, detail) in zip(todo, outcomes):
        seen.add(name)
        if status == "fail" and name in DEVIATIONS:
            status, detail = "deviation", f"{DEVIATIONS[name]} ({detail})"
        results.append((name, op, status, detail))
        pinned = EXPECTED_REFUSALS.get(name)
        if status == "fail":
            tally.fail(f"{name} ({op})", detail)
        elif status == "unsupported":   # pinned with its reason: counted as refused; otherwise a failure
            if not tally.pinned_refusal(f"{name} ({op})", detail, pinned):
                refusal_failures.append(name)
        elif pinned is not None:   # a stale pin fails (a pass under it is not counted as passed)
            refusal_failures.append(name)
            tally.fail(f"{name} ({op})", f"expected refusal no longer refused: unpin it (now: {status}"
                       + (f", {detail}" if detail else "") + ")")
        elif status == "pass":
            tally.count(True)
        elif status == "deviation":   # a documented deviation: neither passed nor failed, said with its reason
            tally.skip(f"{name} ({op})", f"documented deviation: {detail}")
        else:
            tally.fail(f"{name} ({op})", f"unknown status {status!r}: {detail}")
    if not args.ops:
        for name in sorted(set(EXPECTED_REFUSALS) - seen):
            refusal_failures.append(name)
            tally.fail(name, "pinned in EXPECTED_REFUSALS but no such case ran: unpin it")
    counts = collections.Counter(s for _, _, s, _ in results)
    per_op = collections.defaultdict(collections.Counter)
    for _, op, s, _ in results:
        per_op[op][s] += 1
    for op in sorted(per_op):
        c = per_op[op]
        print(f"# {op:20s} {c['pass']}/{c['pass'] + c['fail']} passed, {c['unsupported']} refused at compile time")
    print(f"conformance: {counts['pass']} passed of {counts['pass'] + counts['fail'] + counts['deviation']} cases run for the "
          f"supported ops, {counts['fail']} failures, {counts['deviation']} documented deviations (PyTorch semantics, random masks), "
          f"{counts['unsupported']} refused with a clear compile-time error")
    print(f"# pinned refusals: {tally.refused_pinned} of {len(EXPECTED_REFUSALS)} pinned cases refused as expected "
          f"(not counted as passed); {len(refusal_failures)} refusal failures (unpinned, wrong reason, or stale pins)")
    if args.write_docs:
        write_docs(results)
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
