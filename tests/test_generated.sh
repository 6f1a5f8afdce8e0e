#!/bin/bash
# generated/ must be exactly what the compiler writes today: regenerate the
# sample LeNet (n=4, 1F1B) beside it and compare every file.  After changing
# the emitter, run `make generated` and commit the result.
set -u
cd "$(dirname "$0")/.."
out=generated/lenet.pipe.check
rm -rf "$out"
trap 'rm -rf "$out"' EXIT
pass=0 fail=0
if ! bin/pipecc onnx_models/lenet.onnx -n 4 --batch 64 --microbatches 8 --schedule 1f1b --lr 0.1 \
     --devices tests/devices_equal.txt -o "$out" >/dev/null; then
  echo "not ok - pipecc failed to regenerate the sample"
  echo "0 passed, 1 failed"
  exit 1
fi
for f in $(cd generated/lenet.pipe && git ls-files . 2>/dev/null || find . -type f); do
  if cmp -s "generated/lenet.pipe/$f" "$out/$f"; then pass=$((pass + 1)); else
    echo "not ok - generated/lenet.pipe/$f differs from what pipecc writes now (run 'make generated')"
    diff -u "generated/lenet.pipe/$f" "$out/$f" 2>/dev/null | head -20
    fail=$((fail + 1))
  fi
done
# Nothing the compiler writes may be missing from generated/.
for f in $(cd "$out" && find . -type f | sed 's|^\./||'); do
  if [ ! -f "generated/lenet.pipe/$f" ]; then echo "not ok - generated/lenet.pipe/$f is missing"; fail=$((fail + 1)); fi
done
[ $fail = 0 ] && echo "ok - generated/lenet.pipe matches the compiler's output ($pass files)"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
