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
pass=0 fail=0 refused=0 tried=0
# find, not a glob: a long fuzz run keeps tens of thousands of inputs, past the argument limit
for f in $(find "$keep" -maxdepth 1 -name 'accepted-*.onnx' 2>/dev/null | sort | head -n "$max"); do
  tried=$((tried + 1))
  scheds=(gpipe 1f1b zb1)
  for s in ${scheds[$((tried % 3))]}; do  # one schedule per input, in turn: the suite stays short
    out=$T/$(basename "$f" .onnx).$s.pipe
    if ! bin/pipecc "$f" -n 2 --batch 4 --microbatches 2 --schedule $s --devices tests/devices_equal.txt -o "$out" \
         >/dev/null 2>"$T/err"; then
      refused=$((refused + 1))  # the CLI keeps symbolic dims the fuzzer sized; a refusal is allowed here
      continue
    fi
    if make -s -C "$out" >"$T/build.log" 2>&1; then pass=$((pass + 1)); else
      echo "not ok - $f ($s): pipecc accepted it but the stage programs do not build"
      tail -15 "$T/build.log" | sed 's/^/#   /'
      cp "$f" "${TMPDIR:-/tmp}/" 2>/dev/null
      fail=$((fail + 1))
    fi
  done
done
echo "# $tried accepted fuzz inputs: $pass builds, $refused refusals by the command line"
[ $fail = 0 ] && [ $pass -gt 0 ] && echo "ok - every accepted fuzz input that pipecc compiles also builds ($pass builds)"
[ $pass = 0 ] && [ $fail = 0 ] && { echo "not ok - no accepted fuzz input compiled: nothing was built"; fail=1; }
echo "$pass passed, $fail failed"
[ $fail = 0 ]
