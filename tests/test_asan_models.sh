#!/bin/bash
# Every sample model through the ASan/UBSan build of pipecc, all the way
# through code generation: n = 1, 2, 4, 8 under gpipe, 1f1b and zb1, and at
# n = 1, 2, 4 with two chunks per rank under interleaved (m = 8, a multiple of
# n) and zbv (n = 8 would be more stages than the small models' nodes).  Any
# sanitizer report, or a refusal, is a failure.
set -u
cd "$(dirname "$0")/.."
PIPECC=${PIPECC:-bin/pipecc-asan}
T=$(mktemp -d "${TMPDIR:-/tmp}/pipecc-asan.XXXXXX")
trap 'rm -rf "$T"' EXIT
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1
. tests/tally.sh   # t_ok, t_notok, t_finish: the one tally's shell copy
for model in onnx_models/*.onnx; do
  name=$(basename "$model" .onnx)
  for n in 1 2 4 8; do
    kinds="gpipe 1f1b zb1"
    [ $n -le 4 ] && kinds="$kinds interleaved zbv"
    for s in $kinds; do
      if "$PIPECC" "$model" -n $n --schedule $s --microbatches 8 -o "$T/$name.pipe" >/dev/null 2>"$T/err"; then
        t_pass
      else
        t_notok "$name -n $n --schedule $s under ASan/UBSan"
        head -8 "$T/err" | sed 's/^/#   /'
      fi
    done
  done
done
[ $T_FAIL = 0 ] && echo "ok - every sample model compiles clean under ASan/UBSan for n = 1, 2, 4, 8 and every schedule ($T_PASS runs)"
t_finish
