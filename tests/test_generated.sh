#!/bin/bash
# generated/ must be exactly what the compiler writes today: regenerate each
# sample (LeNet at n=4: 1F1B, and async with staleness 1) beside it and
# compare every file.  After changing the emitter, run `make generated` and
# commit the result.
set -u
cd "$(dirname "$0")/.."
. tests/tally.sh   # t_pass, t_notok, t_finish: the one tally's shell copy
flags=(-n 4 --batch 64 --microbatches 8 --lr 0.1 --devices tests/devices_equal.txt)
check() { # NAME SCHEDULE-FLAGS...
  local name=$1 dir=generated/$1 out=generated/$1.check
  shift
  rm -rf "$out"
  if ! bin/pipecc onnx_models/lenet.onnx "${flags[@]}" "$@" -o "$out" >/dev/null; then
    t_notok "pipecc failed to regenerate $dir"
    return
  fi
  local n0=$T_PASS f0=$T_FAIL
  for f in $(cd "$dir" && git ls-files . 2>/dev/null || find . -type f); do
    if cmp -s "$dir/$f" "$out/$f"; then t_pass; else
      t_notok "$dir/$f differs from what pipecc writes now (run 'make generated')"
      diff -u "$dir/$f" "$out/$f" 2>/dev/null | head -20
    fi
  done
  # Nothing the compiler writes may be missing from generated/.
  for f in $(cd "$out" && find . -type f | sed 's|^\./||'); do
    if [ ! -f "$dir/$f" ]; then t_notok "$dir/$f is missing"; fi
  done
  rm -rf "$out"
  [ $T_FAIL = $f0 ] && echo "ok - $dir matches the compiler's output ($((T_PASS - n0)) files)"
}
check lenet.pipe --schedule 1f1b
check lenet_async.pipe --schedule async --staleness 1
t_finish
