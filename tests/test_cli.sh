#!/bin/bash
# Bad-input cases for the pipecc command line.
#
# Every case must: exit with status exactly 2; write ONE line to stderr, starting with
# "pipecc: error: " and containing the case's key words (file, node, flag, reason); show no
# stack trace or sanitizer report; and create no output directory (neither the -o DIR, nor a
# DIR.tmp-* / DIR.old-* sibling, nor anything in the working directory).
#
#   PIPECC=bin/pipecc-asan bash tests/test_cli.sh      (the default binary is bin/pipecc-asan)
#
# Prints "ok - CASE" / "not ok - CASE: WHY" and ends with "N passed, M failed, K skipped, R refused"
# (tests/tally.sh); exit 1 on failure.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PIPECC=${PIPECC:-$ROOT/bin/pipecc-asan}
case $PIPECC in /*) ;; *) PIPECC=$ROOT/$PIPECC ;; esac
PY=/usr/bin/python3
MODELS=$ROOT/onnx_models
export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1
. "$ROOT/tests/tally.sh"   # the one tally's shell copy

if [ ! -x "$PIPECC" ]; then
  t_notok "setup" "$PIPECC is not built (make asan)"
  t_finish
  exit 1
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/pipecc-cli.XXXXXX")
trap 'chmod -R u+rwx "$T" 2>/dev/null; rm -rf "$T"' EXIT
mkdir -p "$T/models" "$T/out" "$T/run"
# The machine probe cache stays inside the temp dir.
export PIPECC_CACHE=$T/machine.txt

ok() { t_ok "$1"; }
notok() { t_notok "$1" "$2"; }

# Shows pipecc's stderr indented under a failing case.
show() { sed 's/^/    | /' "$1"; }

# The sibling directories an interrupted or failed write may leave next to DIR.
leftovers() { compgen -G "$1.tmp-*"; compgen -G "$1.old-*"; }

NCASE=0
# fail_case NAME KEYWORDS... -- ARGS...
#   Runs "$PIPECC ARGS" in an empty working directory.  In ARGS, @OUT@ stands for a fresh
#   output path that must not come to exist.  A keyword starting with "re:" is an extended
#   regular expression; any other keyword must occur literally in the error line.
fail_case() {
  local name=$1
  shift
  local kws=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do kws+=("$1"); shift; done
  shift
  NCASE=$((NCASE + 1))
  local out=$T/out/case$NCASE
  local args=() a
  for a in "$@"; do args+=("${a//@OUT@/$out}"); done
  local run=$T/run
  rm -rf "$run" && mkdir "$run"
  (cd "$run" && timeout "${CASE_TIMEOUT:-120}" "$PIPECC" "${args[@]}" >"$T/stdout" 2>"$T/stderr")
  local rc=$? why=""
  local lines
  lines=$(wc -l <"$T/stderr")
  local first
  first=$(head -n 1 "$T/stderr")
  if [ $rc -ne 2 ]; then
    why="exit status $rc, expected 2"
  elif grep -qE 'Sanitizer|runtime error:|SUMMARY:|^ *#[0-9]+ 0x|Segmentation|Aborted|core dumped' "$T/stderr"; then
    why="sanitizer report or stack trace on stderr"
  elif [ "$lines" -ne 1 ] || [ -n "$(tail -c 1 "$T/stderr")" ]; then
    why="stderr has $lines newline-terminated lines, expected exactly one"
  elif [[ $first != "pipecc: error: "* ]]; then
    why="stderr does not start with 'pipecc: error: '"
  else
    local k
    for k in "${kws[@]}"; do
      if [[ $k == re:* ]]; then
        grep -qE -- "${k#re:}" <<<"$first" || { why="error line does not match /${k#re:}/"; break; }
      else
        grep -qF -- "$k" <<<"$first" || { why="error line does not contain '$k'"; break; }
      fi
    done
  fi
  if [ -z "$why" ]; then
    if [ -e "$out" ]; then
      why="created the output directory $out"
    elif [ -n "$(leftovers "$out")" ]; then
      why="left $(leftovers "$out" | tr '\n' ' ')"
    elif [ -n "$(ls -A "$run")" ]; then
      why="wrote into the working directory: $(ls -A "$run" | tr '\n' ' ')"
    fi
  fi
  if [ -z "$why" ]; then
    ok "$name"
  else
    notok "$name" "$why"
    echo "    \$ pipecc ${args[*]}   (exit $rc)"
    show "$T/stderr"
  fi
  rm -rf "$out" "$out".tmp-* "$out".old-*
}

# --- broken models --------------------------------------------------------------------
M=$T/models
if ! "$PY" - "$M" <<'EOF'; then
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

out = sys.argv[1]


def save(name, nodes, inputs, outputs, inits, opset=13):
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    with open("%s/%s.onnx" % (out, name), "wb") as f:
        f.write(m.SerializeToString())


def vi(name, dims, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, dims)


def w(name, *shape):
    return numpy_helper.from_array(np.arange(np.prod(shape), dtype=np.float32).reshape(shape) / 10, name)


# 6: an operator pipecc does not support.
save("unsupported", [helper.make_node("Relu", ["x"], ["h"], name="relu0"),
                     helper.make_node("Hardmax", ["h"], ["y"], name="hardmax_node", axis=1)],
     [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], [])
# 7: MatMul with inner dims 3 and 4.
save("matmul_bad", [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm_bad")],
     [vi("x", ["batch", 3])], [vi("y", ["batch", 5])], [w("w", 4, 5)])
# 8: the exported batch (2) baked into a Reshape constant.
save("baked_batch", [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape_baked"),
                     helper.make_node("Relu", ["r"], ["y"], name="relu_after")],
     [vi("x", [2, 12])], [vi("y", [2, 3, 4])],
     [numpy_helper.from_array(np.array([2, 3, 4], dtype=np.int64), "shape")])
# 15: an initializer whose raw_data is shorter than its dims need (12 floats = 48 bytes).
bad = numpy_helper.from_array(np.ones((3, 4), dtype=np.float32), "w_short")
bad.raw_data = bad.raw_data[:40]
save("raw_mismatch", [helper.make_node("MatMul", ["x", "w_short"], ["y"], name="mm")],
     [vi("x", ["batch", 3])], [vi("y", ["batch", 4])], [bad])
# 16: a node reading a tensor nothing defines.
save("undefined_input", [helper.make_node("Relu", ["x"], ["h"], name="relu0"),
                         helper.make_node("Add", ["h", "ghost_tensor"], ["y"], name="add_reader")],
     [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], [])
# 17: a symbolic dimension that is not the batch.
save("symbolic_seq", [helper.make_node("Gather", ["emb", "tokens"], ["y"], name="embed")],
     [vi("tokens", ["batch", "seq"], TensorProto.INT64)], [vi("y", ["batch", "seq", 4])], [w("emb", 10, 4)])
# 18: data inputs the loader cannot fill (it writes float32 images or int64 token ids).
for name, t in (("input_double", TensorProto.DOUBLE), ("input_half", TensorProto.FLOAT16), ("input_int32", TensorProto.INT32)):
    save(name, [helper.make_node("Relu", ["x_in"], ["y"], name="relu0")], [vi("x_in", ["batch", 4], t)], [vi("y", ["batch", 4], t)], [])
# 19: non-finite attributes.
save("gemm_alpha_nan", [helper.make_node("Gemm", ["x", "w"], ["y"], name="gemm_nan", alpha=float("nan"))],
     [vi("x", ["batch", 3])], [vi("y", ["batch", 4])], [w("w", 3, 4)])
# 20: a node name with a newline and a terminal escape, in a model pipecc refuses.
save("name_controls", [helper.make_node("Gemm", ["x", "w"], ["y"], name="evil\nnode\x1b[31m", alpha=float("nan"))],
     [vi("x", ["batch", 3])], [vi("y", ["batch", 4])], [w("w", 3, 4)])
save("leaky_inf", [helper.make_node("LeakyRelu", ["x"], ["y"], name="leaky_inf", alpha=float("inf"))],
     [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], [])
# 22: run-time movement of what only folds: a Slice of int64 token ids, a Cast to double.
ints = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)
save("slice_tokens", [helper.make_node("Slice", ["tokens", "s0", "s1", "ax"], ["t2"], name="slice_ids"),
                      helper.make_node("Gather", ["emb", "t2"], ["y"], name="embed")],
     [vi("tokens", ["batch", 8], TensorProto.INT64)], [vi("y", ["batch", 7, 4])],
     [w("emb", 10, 4), ints("s0", [0]), ints("s1", [-1]), ints("ax", [1])])
save("cast_double", [helper.make_node("Cast", ["x"], ["d"], name="to_double", to=TensorProto.DOUBLE),
                     helper.make_node("Cast", ["d"], ["y"], name="back", to=TensorProto.FLOAT)],
     [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], [])
# 23: what the run-time kernels of Clip and the comparisons cannot do: a bound computed at run time, int64 inputs.
save("clip_runtime_min", [helper.make_node("ReduceMean", ["x"], ["m"], name="mean0", axes=[1]),
                          helper.make_node("Clip", ["x", "m"], ["y"], name="clip_rt")],
     [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], [])
save("less_int64", [helper.make_node("ArgMax", ["x"], ["i"], name="argmax0", axis=1, keepdims=1),
                    helper.make_node("Less", ["i", "two"], ["c"], name="less_i64"),
                    helper.make_node("Where", ["c", "x", "w"], ["y"], name="where0")],
     [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], [w("w", 4), numpy_helper.from_array(np.array(2, dtype=np.int64), "two")])
# 24: recurrent layers pipecc does not run: x [batch, 4 steps, 3] -> Transpose -> LSTM/GRU (hidden 2) -> Y_h.
def rnn(name, op, extra_inputs=(), extra_inits=(), pre=(), **attrs):
    g = 4 if op == "LSTM" else 3
    nodes = list(pre) + [helper.make_node("Transpose", ["x"], ["xt"], name="to_time_major", perm=[1, 0, 2]),
                         helper.make_node(op, ["xt", "W", "R", "B"] + list(extra_inputs), ["", "y"], name="rnn_node",
                                          hidden_size=2, **attrs)]
    save(name, nodes, [vi("x", ["batch", 4, 3])], [vi("y", [1, "batch", 2])],
         [w("W", 1, g * 2, 3), w("R", 1, g * 2, 2), w("B", 1, g * 4)] + list(extra_inits), opset=14)
rnn("lstm_sideways", "LSTM", direction="sideways")
rnn("lstm_clip", "LSTM", clip=1.0)
rnn("gru_relu", "GRU", activations=["Relu", "Tanh"])
rnn("lstm_input_forget", "LSTM", input_forget=1)
rnn("lstm_peepholes", "LSTM", ["", "", "", "P"], [w("P", 1, 6)])
rnn("gru_seq_lens", "GRU", ["seq"], [numpy_helper.from_array(np.full(2, 4, dtype=np.int32), "seq")])
# 25: windows the kernels do not run: a 4-D convolution, an auto_pad ONNX does not define.
save("conv_4d", [helper.make_node("Conv", ["x", "w"], ["c"], name="conv4d", kernel_shape=[2, 2, 2, 2]),
                 helper.make_node("Flatten", ["c"], ["y"], name="flat")],
     [vi("x", ["batch", 1, 3, 3, 3, 3])], [vi("y", ["batch", 32])], [w("w", 2, 1, 2, 2, 2, 2)])
save("pool_autopad_same", [helper.make_node("MaxPool", ["x"], ["y"], name="pool_same", kernel_shape=[2], auto_pad="SAME")],
     [vi("x", ["batch", 2, 6])], [vi("y", ["batch", 2, 6])], [])
# 26 (issue 34, item 3): weights of a type the float32 kernels cannot read: float16 (read past its buffer), float64
# (garbage), int64 (C that does not compile); a Reshape of int64 token ids at run time (likewise).
rng = np.random.default_rng(0)
for name, t in (("mm_half", np.float16), ("mm_double", np.float64), ("mm_int64", np.int64)):
    save(name, [helper.make_node("MatMul", ["x", "w_typed"], ["y"], name="mm_typed")], [vi("x", ["batch", 6])],
         [vi("y", ["batch", 4])], [numpy_helper.from_array((rng.standard_normal((6, 4)) * 3).astype(t), "w_typed")])
save("conv_half", [helper.make_node("Conv", ["x", "k16"], ["c"], name="conv_typed"),
                   helper.make_node("Flatten", ["c"], ["y"], name="flat")],
     [vi("x", ["batch", 1, 4, 4])], [vi("y", ["batch", 18])], [numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float16), "k16")])
save("reshape_tokens", [helper.make_node("Reshape", ["tokens", "flat"], ["t2"], name="reshape_ids"),
                        helper.make_node("Gather", ["emb", "t2"], ["g"], name="embed"),
                        helper.make_node("Reshape", ["g", "back"], ["y"], name="unflat")],
     [vi("tokens", ["batch", 8], TensorProto.INT64)], [vi("y", ["batch", 8, 10])],
     [w("emb", 10, 10), ints("flat", [-1]), ints("back", [-1, 8, 10])])
# 27 (issue 34, item 4): outputs the loss cannot pair with the labels: a feature map, the image itself, one row per
# sequence of a token model (whose labels are one per position), a token input without positions.
save("conv_out", [helper.make_node("Conv", ["x", "k"], ["y"], name="conv0")], [vi("x", ["batch", 1, 28, 28])],
     [vi("y", ["batch", 4, 26, 26])], [w("k", 4, 1, 3, 3)])
save("input_out", [helper.make_node("Identity", ["x"], ["y"], name="same")], [vi("x", ["batch", 1, 28, 28])],
     [vi("y", ["batch", 1, 28, 28])], [])
save("token_rows", [helper.make_node("Gather", ["emb", "tokens"], ["g"], name="embed"),
                    helper.make_node("ReduceMean", ["g"], ["y"], name="pool_seq", axes=[1], keepdims=0)],
     [vi("tokens", ["batch", 6], TensorProto.INT64)], [vi("y", ["batch", 10])], [w("emb", 10, 10)])
save("token_rank1", [helper.make_node("Gather", ["emb", "tokens"], ["y"], name="embed")],
     [vi("tokens", ["batch"], TensorProto.INT64)], [vi("y", ["batch", 10])], [w("emb", 10, 10)])
EOF
  notok "setup" "could not write the broken models with $PY"
  t_finish
  exit 1
fi
echo "this is not an ONNX model" >"$M/notonnx.onnx"
: >"$M/empty.onnx"
size=$(stat -c %s "$MODELS/lenet.onnx")
head -c $((size / 2)) "$MODELS/lenet.onnx" >"$M/truncated.onnx"
printf '# ranks\nrank * flops=10G mem=1G\nlink * bandwidth 10G\n' >"$M/bad_devices.txt"

# --- the cases ------------------------------------------------------------------------
LENET=$MODELS/lenet.onnx
MLP=$MODELS/mlp.onnx

fail_case "1 missing file" "$M/nope.onnx" "No such file" -- "$M/nope.onnx" -n 2 -o @OUT@
fail_case "2 directory as the model" "$M" -- "$M" -o @OUT@
if [ "$(id -u)" -ne 0 ]; then
  cp "$LENET" "$M/noread.onnx" && chmod 000 "$M/noread.onnx"
  fail_case "2 unreadable file (chmod 000)" "$M/noread.onnx" "Permission denied" -- "$M/noread.onnx" -o @OUT@
else
  echo "ok - 2 unreadable file (chmod 000) # SKIP running as root, chmod does not block reads"
fi
fail_case "3 not ONNX (text file)" "$M/notonnx.onnx" "ONNX" -- "$M/notonnx.onnx" -o @OUT@
fail_case "4 empty file" "$M/empty.onnx" "empty" -- "$M/empty.onnx" -o @OUT@
fail_case "5 truncated protobuf" "$M/truncated.onnx" "ONNX" -- "$M/truncated.onnx" -o @OUT@
fail_case "6 unsupported operator" "Hardmax" "hardmax_node" "supported" -- "$M/unsupported.onnx" -o @OUT@
fail_case "7 MatMul inner dims differ" "mm_bad" "MatMul" -- "$M/matmul_bad.onnx" --batch 2 -o @OUT@
fail_case "8 batch baked into a Reshape" "reshape_baked" "Reshape" "batch" -- "$M/baked_batch.onnx" --batch 3 --microbatches 1 -o @OUT@
fail_case "9 -n 0" "-n" "'0'" -- "$MLP" -n 0 -o @OUT@
fail_case "9 -n abc" "-n" "abc" -- "$MLP" -n abc -o @OUT@
fail_case "9 -n larger than the node count" "-n 11" "re:(^|[^0-9])10([^0-9]|$)" "$MLP" -- "$MLP" -n 11 -o @OUT@
fail_case "10 unknown flag" "--bogus" -- "$MLP" --bogus -o @OUT@
fail_case "10 unknown flag, no -o" "--bogus" -- "$MLP" --bogus
fail_case "11 --schedule foo" "--schedule" "foo" -- "$MLP" --schedule foo -o @OUT@
fail_case "11 --batch 0" "--batch" "'0'" -- "$MLP" --batch 0 -o @OUT@
fail_case "11 --batch 10 --microbatches 3" "--batch 10" "--microbatches 3" "divisible" -- "$MLP" --batch 10 --microbatches 3 -o @OUT@
fail_case "11 --mem-limit xyz" "--mem-limit" "xyz" -- "$MLP" --mem-limit xyz -o @OUT@
fail_case "11 --optimizer rmsprop" "--optimizer" "rmsprop" -- "$MLP" --optimizer rmsprop -o @OUT@
fail_case "11 -n without its value" "-n" "value" -- "$MLP" -o @OUT@ -n
fail_case "12 --mem-limit 1K infeasible" "--mem-limit" "at least" -- "$LENET" --mem-limit 1K -o @OUT@
fail_case "12 --mem-limit 1K infeasible, -n 4" "--mem-limit" "at least" -- "$LENET" -n 4 --mem-limit 1K -o @OUT@

# 12: the smallest limit the message states must itself be enough.
mem_fits() {
  local name="12 the stated minimum fits (-n $1)" need num unit
  (cd "$T/run" && timeout 120 "$PIPECC" "$LENET" -n "$1" --mem-limit 1K -o "$T/out/mem" >"$T/stdout" 2>"$T/stderr")
  need=$(grep -oE 'needs [0-9]+ bytes' "$T/stderr" | head -n 1)
  if [ -z "$need" ]; then
    notok "$name" "no 'needs N bytes' figure in the error"
    show "$T/stderr"
    return
  fi
  num=$(awk '{print $2}' <<<"$need")
  unit=""
  (cd "$T/run" && timeout 120 "$PIPECC" "$LENET" -n "$1" --mem-limit "$num$unit" -o "$T/out/mem" >"$T/stdout" 2>"$T/stderr")
  local rc=$?
  if [ $rc -eq 0 ]; then
    ok "$name"
  else
    notok "$name" "the error said '$need', but --mem-limit $num$unit exits $rc"
    show "$T/stderr"
  fi
  rm -rf "$T/out/mem"
}
mem_fits 1
mem_fits 4

fail_case "13 --devices syntax error" "$M/bad_devices.txt:3" -- "$MLP" -n 2 --devices "$M/bad_devices.txt" -o @OUT@
fail_case "13 --devices missing file" "--devices" "$M/no_devices.txt" -- "$MLP" -n 2 --devices "$M/no_devices.txt" -o @OUT@

# Issue 34, items 16 and 18: a devices figure that is not finite, or absurd (flops=1e-300 predicted a step of
# 1e309 s, the stages' watchdog), is refused naming FILE:LINE; NaN and Inf wrote a plan.json that is not JSON.
dev_case() {
  printf '%b' "$2" >"$M/devices_$1.txt"
  fail_case "34 --devices with $3" "$M/devices_$1.txt:$4" "$5" -- "$MLP" -n 2 --devices "$M/devices_$1.txt" -o @OUT@
}
dev_case tiny 'rank * flops=1e-300\nlink * bandwidth=1G\n' "flops=1e-300" 1 "out of range"
dev_case nan 'rank * flops=nan\nlink * bandwidth=1G\n' "flops=nan" 1 "'nan'"
dev_case inf 'rank * flops=inf\nlink * bandwidth=1G\n' "flops=inf" 1 "'inf'"
dev_case huge 'rank * flops=1e300\nlink * bandwidth=1G\n' "flops=1e300" 1 "out of range"
dev_case bw 'rank * flops=10G\nlink * bandwidth=1e-300\n' "bandwidth=1e-300" 2 "out of range"
dev_case lat 'rank * flops=10G\nlink * bandwidth=1G latency=nan\n' "latency=nan" 2 "'nan'"
dev_case latinf 'rank * flops=10G\nlink * bandwidth=1G latency=inf\n' "latency=inf" 2 "'inf'"
dev_case mem 'rank * flops=10G mem=inf\nlink * bandwidth=1G\n' "mem=inf" 1 "'inf'"
dev_case memcpy 'rank * flops=10G\nlink * bandwidth=1G\nmemcpy bandwidth=nan\n' "memcpy bandwidth=nan" 3 "'nan'"
fail_case "34 --mem-limit inf" "--mem-limit" "'inf'" -- "$MLP" --mem-limit inf -o @OUT@

# Issue 34, item 16: a FIFO where pipecc reads or writes a file is refused at once, not waited on (each
# case has 20 s: before, pipecc blocked in open() until something opened the other end).
mkfifo "$T/fifo"
CASE_TIMEOUT=20 fail_case "34 --frozen FIFO (refused, not waited on)" "--frozen $T/fifo" "not a regular file" -- \
  "$LENET" -n 2 --frozen "$T/fifo" -o @OUT@
PIPECC_CACHE=$T/fifo CASE_TIMEOUT=20 fail_case "34 PIPECC_CACHE naming a FIFO (refused, not waited on)" "$T/fifo" \
  "not a regular file" -- "$MLP" -n 2 -o @OUT@

# 14: -o names an existing directory that is not a pipecc output: refused, left as it was.
keep=$T/out/mine
mkdir -p "$keep/sub"
echo "precious" >"$keep/notes.txt"
echo "deep" >"$keep/sub/data.txt"
before=$(cd "$keep" && find . -print0 | sort -z | xargs -0 ls -ld --time-style=+%s 2>&1; cat notes.txt sub/data.txt)
fail_case "14 -o an existing foreign directory (refused)" "$keep" -- "$LENET" -n 2 -o "$keep"
after=$(cd "$keep" 2>/dev/null && find . -print0 | sort -z | xargs -0 ls -ld --time-style=+%s 2>&1; cat notes.txt sub/data.txt)
if [ -d "$keep" ] && [ "$before" = "$after" ]; then
  ok "14 -o an existing foreign directory (kept intact)"
else
  notok "14 -o an existing foreign directory (kept intact)" "the directory or its contents changed"
fi
if [ -n "$(leftovers "$keep")" ]; then
  notok "14 -o an existing foreign directory (no siblings)" "left $(leftovers "$keep" | tr '\n' ' ')"
else
  ok "14 -o an existing foreign directory (no siblings)"
fi

# 14: -o names an existing regular file: refused, the file left as it was.
echo "not a directory" >"$T/out/afile"
fail_case "14 -o an existing regular file (refused)" "$T/out/afile" -- "$LENET" -n 2 -o "$T/out/afile"
if [ "$(cat "$T/out/afile" 2>/dev/null)" = "not a directory" ] && [ -z "$(leftovers "$T/out/afile")" ]; then
  ok "14 -o an existing regular file (kept intact)"
else
  notok "14 -o an existing regular file (kept intact)" "the file changed or a sibling was left"
fi

fail_case "15 raw_data length does not match dims" "$M/raw_mismatch.onnx" "w_short" "raw_data" -- "$M/raw_mismatch.onnx" -o @OUT@
fail_case "16 node reads an undefined tensor" "$M/undefined_input.onnx" "add_reader" "ghost_tensor" -- "$M/undefined_input.onnx" -o @OUT@
fail_case "17 symbolic non-batch input dim" "$M/symbolic_seq.onnx" "tokens" "seq" -- "$M/symbolic_seq.onnx" -o @OUT@
fail_case "18 a double data input" "input_double.onnx" "'x_in'" "double" "float32" -- "$M/input_double.onnx" -o @OUT@
fail_case "18 a float16 data input" "input_half.onnx" "'x_in'" "float16" -- "$M/input_half.onnx" -o @OUT@
fail_case "18 an int32 data input" "input_int32.onnx" "'x_in'" "int32" -- "$M/input_int32.onnx" -o @OUT@
fail_case "19 Gemm alpha NaN" "gemm_nan" "alpha" "NaN" -- "$M/gemm_alpha_nan.onnx" -o @OUT@
fail_case "19 LeakyRelu alpha +Inf" "leaky_inf" "alpha" "Inf" -- "$M/leaky_inf.onnx" -o @OUT@
fail_case "23 Clip with a min computed at run time" "clip_rt" "min" "'m'" "constant" -- "$M/clip_runtime_min.onnx" -o @OUT@
fail_case "23 Less on int64 values computed at run time" "less_i64" "float32" "int64" -- "$M/less_int64.onnx" -o @OUT@
fail_case "20 control characters in a name stay escaped on one line" 'evil\nnode\x1b[31m' -- "$M/name_controls.onnx" -o @OUT@
fail_case "22 Slice of int64 values at run time" "slice_ids" "Slice" "float" "int64" -- "$M/slice_tokens.onnx" -o @OUT@
fail_case "22 Cast to double at run time" "to_double" "Cast" "float64" -- "$M/cast_double.onnx" -o @OUT@
fail_case "24 LSTM direction=sideways" "rnn_node" "LSTM" "sideways" -- "$M/lstm_sideways.onnx" -o @OUT@
fail_case "24 LSTM clip" "rnn_node" "LSTM" "clip" -- "$M/lstm_clip.onnx" -o @OUT@
fail_case "24 GRU activations Relu, Tanh" "rnn_node" "GRU" "activations" -- "$M/gru_relu.onnx" -o @OUT@
fail_case "24 LSTM input_forget=1" "rnn_node" "LSTM" "input_forget" -- "$M/lstm_input_forget.onnx" -o @OUT@
fail_case "24 LSTM peepholes" "rnn_node" "LSTM" "peepholes" -- "$M/lstm_peepholes.onnx" -o @OUT@
fail_case "24 GRU sequence_lens" "rnn_node" "GRU" "sequence_lens" -- "$M/gru_seq_lens.onnx" -o @OUT@
fail_case "25 a 4-D convolution" "conv4d" "Conv" "4 spatial dims" "3-D" -- "$M/conv_4d.onnx" -o @OUT@
fail_case "25 auto_pad SAME (not an ONNX value)" "pool_same" "MaxPool" "auto_pad 'SAME'" -- "$M/pool_autopad_same.onnx" -o @OUT@
fail_case "26 a float16 weight fed to MatMul" "mm_typed" "MatMul" "input 1" "'w_typed'" "float16" "float32" -- "$M/mm_half.onnx" -o @OUT@
fail_case "26 a float64 weight fed to MatMul" "mm_typed" "MatMul" "input 1" "'w_typed'" "float64" "float32" -- "$M/mm_double.onnx" -o @OUT@
fail_case "26 an int64 weight fed to MatMul" "mm_typed" "MatMul" "input 1" "'w_typed'" "int64" "float32" -- "$M/mm_int64.onnx" -o @OUT@
fail_case "26 a float16 kernel fed to Conv" "conv_typed" "Conv" "input 1" "'k16'" "float16" -- "$M/conv_half.onnx" -o @OUT@
fail_case "26 a Reshape of int64 token ids at run time" "reshape_ids" "Reshape" "input 0" "'tokens'" "int64" -- "$M/reshape_tokens.onnx" -o @OUT@
fail_case "27 a feature map as the output" "'y'" "[8,4,26,26]" "labels [8]" "[8,classes]" -- "$M/conv_out.onnx" --batch 8 -o @OUT@
fail_case "27 the input as the output" "'y'" "[4,1,28,28]" "labels [4]" -- "$M/input_out.onnx" --batch 8 --microbatches 2 -o @OUT@
fail_case "27 one row per sequence of a token model" "'y'" "[8,10]" "labels [8,6]" "[8,6,vocab]" -- "$M/token_rows.onnx" --batch 8 -o @OUT@
fail_case "27 a token input without positions" "'tokens'" "[8]" "positions" -- "$M/token_rank1.onnx" --batch 8 -o @OUT@
fail_case "28 --constant names no initializer" "--constant" "'nope'" -- "$MLP" --constant fc1.weight,nope -o @OUT@
fail_case "28 --constant names a graph input" "--constant" "graph input" -- "$M/conv_out.onnx" --constant x -o @OUT@
fail_case "28 --constant with an empty name" "--constant" "empty name" -- "$MLP" --constant fc1.weight, -o @OUT@
fail_case "19 --lr 1e999" "--lr" "1e999" "finite" -- "$MLP" --lr 1e999 -o @OUT@
fail_case "19 --lr inf" "--lr" "inf" "finite" -- "$MLP" --lr inf -o @OUT@
fail_case "19 --momentum nan" "--momentum" "nan" -- "$MLP" --momentum nan -o @OUT@
fail_case "19 --weight-decay 1e39 (overflows a float)" "--weight-decay" "1e39" -- "$MLP" --weight-decay 1e39 -o @OUT@

# --- positive control -----------------------------------------------------------------
good=$T/out/ok.pipe
check_good() {
  local name=$1 rc=$2 why=""
  if [ "$rc" -ne 0 ]; then
    why="exit status $rc"
  elif [ -s "$T/stderr" ]; then
    why="wrote to stderr"
  elif [ ! -s "$good/schedule.txt" ] || [ ! -s "$good/plan.json" ]; then
    why="schedule.txt or plan.json missing or empty"
  elif [ -n "$(leftovers "$good")" ]; then
    why="left $(leftovers "$good" | tr '\n' ' ')"
  elif [ -n "$(find "$good" -name '*.tmp-*')" ]; then
    why="left $(find "$good" -name '*.tmp-*')"
  elif [ -e "$good/marker" ]; then
    why="the old directory's contents survived (merged, not replaced)"
  fi
  if [ -z "$why" ]; then ok "$name"; else notok "$name" "$why"; show "$T/stderr"; fi
}
(cd "$T/run" && timeout 120 "$PIPECC" "$LENET" -n 4 -o "$good" >"$T/stdout" 2>"$T/stderr")
check_good "control: lenet -n 4 -o ok.pipe" $?
touch "$good/stage_9.c"   # a file pipecc writes (an older, wider compile): replaced, not merged
(cd "$T/run" && timeout 120 "$PIPECC" "$LENET" -n 4 -o "$good/" >"$T/stdout" 2>"$T/stderr")
check_good "21 again over the existing ok.pipe, as -o ok.pipe/ (trailing slash; replaced)" $?
if [ -e "$good/stage_9.c" ]; then notok "21 the old output's stage_9.c is gone (replaced, not merged)" "still there"
else ok "21 the old output's stage_9.c is gone (replaced, not merged)"; fi

# 21: files pipecc did not write in its own output directory are never deleted: refused, naming them.
mkdir "$good/ckpt" && echo "days of work" >"$good/ckpt/MANIFEST" && echo "trained" >"$good/trained.onnx"
plan_before=$(cat "$good/plan.json")
fail_case "21 a user's ckpt/ and trained.onnx in the output directory (refused)" "ckpt/" "trained.onnx" \
  "nothing was changed" -- "$LENET" -n 2 -o "$good"
if [ "$(cat "$good/ckpt/MANIFEST" "$good/trained.onnx" 2>/dev/null)" = "days of work
trained" ] && [ "$(cat "$good/plan.json")" = "$plan_before" ] && [ -z "$(leftovers "$good")" ]; then
  ok "21 the user's files and the old output are kept intact"
else
  notok "21 the user's files and the old output are kept intact" "something changed or a sibling was left"
fi
rm -rf "$good/ckpt" "$good/trained.onnx"

# 21: a compile stopped by a signal while it writes leaves no DIR.tmp-PID and the old output intact;
# one killed with -9 leaves it, and the next compile into the same DIR removes it.
for sig in TERM INT HUP KILL; do
  (cd "$T/run" && PIPECC_STOP_AFTER_WRITING=plan.json exec "$PIPECC" "$LENET" -n 2 -o "$good" >"$T/stdout" 2>"$T/stderr") &
  pid=$!
  for _ in $(seq 100); do [ -n "$(leftovers "$good")" ] && break; sleep 0.1; done
  had=$(leftovers "$good")
  kill -s "$sig" "$pid" 2>/dev/null; kill -s CONT "$pid" 2>/dev/null
  wait "$pid"
  rc=$?
  left=$(leftovers "$good")
  if [ -z "$had" ]; then
    notok "21 SIG$sig during the write" "the compile never reached the hook (rc $rc)"; show "$T/stderr"
  elif [ "$(cat "$good/plan.json")" != "$plan_before" ]; then
    notok "21 SIG$sig during the write" "the old output changed"
  elif [ "$sig" = KILL ]; then
    if [ -n "$left" ]; then ok "21 SIGKILL during the write leaves $(basename "$left") and the old output intact"
    else notok "21 SIGKILL during the write" "no temporary left (the hook did not stop in time?)"; fi
  elif [ -n "$left" ] || [ -s "$T/stderr" ] || [ "$rc" -lt 128 ]; then
    notok "21 SIG$sig during the write" "rc $rc, left '$left', stderr: $(head -c 300 "$T/stderr")"
  else
    ok "21 SIG$sig during the write: rc $rc, temporary removed, old output intact"
  fi
done
(cd "$T/run" && timeout 120 "$PIPECC" "$LENET" -n 4 -o "$good" >"$T/stdout" 2>"$T/stderr")
check_good "21 the next compile into ok.pipe removes the killed compile's temporary" $?

# 21: an existing empty directory is used; '.', 'DIR/..' and a missing parent are refused.
mkdir "$T/out/empty"
(cd "$T/run" && timeout 120 "$PIPECC" "$MLP" -n 2 -o "$T/out/empty" >"$T/stdout" 2>"$T/stderr")
if [ $? -eq 0 ] && [ -s "$T/out/empty/plan.json" ] && [ -s "$T/out/empty/.pipecc-output" ]; then
  ok "21 an existing empty directory is used, and marked as pipecc's"
else notok "21 an existing empty directory is used" "$(head -c 300 "$T/stderr")"; fi
fail_case "21 -o . (the working directory)" "-o ." "name the output directory itself" -- "$MLP" -n 2 -o .
fail_case "21 -o DIR/.." "name the output directory itself" -- "$MLP" -n 2 -o "$T/out/empty/.."
fail_case "21 -o under a missing parent" "its parent directory" "$T/out/no-such" -- "$MLP" -n 2 -o "$T/out/no-such/x.pipe"


# --- the docs' operator lists are pipecc's operator table -----------------------------
if PIPECC=$PIPECC $PY "$ROOT/tests/optable.py" --check >"$T/stdout" 2>&1; then
  ok "README.md and docs/operators.md list the ops of pipecc --list-ops"
else
  notok "README.md and docs/operators.md list the ops of pipecc --list-ops" "tests/optable.py --check failed"
  show "$T/stdout"
fi

t_finish
