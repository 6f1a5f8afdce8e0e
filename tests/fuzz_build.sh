#!/bin/bash
# What pipecc accepts always builds: the fuzzer keeps every input that went
# through code generation (FUZZ_KEEP_DIR); for a bounded sample of them, any
# that bin/pipecc accepts must give stage programs that compile.
#   bash tests/fuzz_build.sh KEEP_DIR [MAX]      (default MAX 6)
set -u
cd "$(dirname "$0")/.."
keep=$1 max=${2:-6}
T=$(mktemp -d "${TMPDIR:-/tmp}/pipecc-fuzzbuild.XXXXXX")
trap 'rm -rf "$T"' EXIT
. tests/tally.sh   # the one tally's shell copy
tried=0
# find, not a glob: a long fuzz run keeps tens of thousands of inputs, past the argument limit
for f in $(find "$keep" -maxdepth 1 -name 'accepted-*.onnx' 2>/dev/null | sort | head -n "$max"); do
  tried=$((tried + 1))
  scheds=(gpipe 1f1b zb1)
  for s in ${scheds[$((tried % 3))]}; do  # one schedule per input, in turn: the suite stays short
    out=$T/$(basename "$f" .onnx).$s.pipe
    if ! bin/pipecc "$f" -n 2 --batch 4 --microbatches 2 --schedule $s --devices tests/devices_equal.txt -o "$out" \
         >/dev/null 2>"$T/err"; then
      # the CLI keeps symbolic dims the fuzzer sized: a refusal is allowed here (counted as one, never a pass)
      t_refused "$(basename "$f") ($s)" "$(head -1 "$T/err" | cut -c1-200)"
      continue
    fi
    if make -s -C "$out" >"$T/build.log" 2>&1; then t_pass; else
      t_notok "$f ($s)" "pipecc accepted it but the stage programs do not build"
      tail -15 "$T/build.log" | sed 's/^/#   /'
      cp "$f" "${TMPDIR:-/tmp}/" 2>/dev/null
    fi
  done
done
echo "# $tried accepted fuzz inputs: $T_PASS builds, $T_REFUSED refusals by the command line"
[ $T_FAIL = 0 ] && [ $T_PASS -gt 0 ] && echo "ok - every accepted fuzz input that pipecc compiles also builds ($T_PASS builds)"
[ $T_PASS = 0 ] && echo "# no accepted fuzz input compiled: nothing was built (t_finish fails a suite that passed nothing)"
t_finish
