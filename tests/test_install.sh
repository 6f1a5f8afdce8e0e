#!/bin/bash
# make install and make uninstall (issue 38; docs/install.md).
#
# Installs into a temporary PREFIX, then hides the checkout (a private mount namespace with an empty
# tmpfs over it: unshare --mount, as root) and, with the installed tools alone, compiles LeNet at
# -n 2 (the first plan runs the installed pipecc-probe), builds its stages against the installed
# runtime, writes data with the installed piperun-data, trains 8 steps with run.sh, draws the trace
# with the installed pipecc-trace, trains with a freeze event (run.sh re-plans with the installed
# pipecc), and asks for --target cuda, which an install without nvcc refuses.
# Then: no text the compiler wrote names the checkout; a DESTDIR-staged install lands under DESTDIR
# only and its tree still works once moved (and, its runtime removed, pipecc says it cannot find one,
# as it does for a PIPECC_RUNTIME that is not one); installing again replaces the earlier install's files;
# make uninstall removes exactly what install put there (a file of someone else's stays), and refuses
# a second time and a manifest that reaches outside PREFIX.
#
#   tests/test_install.sh          the install without the CUDA runtime (NVCC=): about 20 s, 8 s once the
#                                  runtime is built (build/install/cpu keeps it)
#   tests/test_install.sh --cuda   with it where nvcc is: libpiperun-cuda.so installed, and LeNet's
#                                  --target cuda stages built and linked against it (nvcc builds the
#                                  runtime once, about 100 s on 2 cores; no GPU is needed)
# Where no mount namespace can be made (not root, or no unshare), the checks that need the checkout
# hidden are counted as skipped, with the reason, and the rest still run.
#
# Prints "ok - ..." / "not ok - ..." and ends with "N passed, M failed, K skipped, R refused"
# (tests/tally.sh); exit 1 on failure.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
unset PIPECC_RUNTIME  # the installed pipecc must find its runtime itself
. "$ROOT/tests/tally.sh"
T=$(mktemp -d /tmp/pipecc-install.XXXXXX)
trap 'rm -rf "$T"' EXIT
case $T/ in "$ROOT"/*) t_notok "setup" "the temporary directory $T lies inside the checkout $ROOT, which the test hides"; t_finish; exit 1 ;; esac
PREFIX=$T/prefix
WORK=$T/work
mkdir -p "$WORK" "$T/log"
cp "$ROOT/onnx_models/lenet.onnx" "$WORK/"
show() { sed 's/^/    | /' "$1" | tail -n "${2:-15}"; }

# ---- install ----
CUDA=0 NVCC_ARG=(NVCC=)
if [ "${1:-}" = --cuda ]; then
  if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then CUDA=1 NVCC_ARG=()
  else t_skip "the CUDA runtime's install" "no nvcc on PATH or at /usr/local/cuda/bin"; fi
else
  t_skip "the CUDA runtime's install (libpiperun-cuda.so, --target cuda stages linked against it)" \
    "make test-install-cuda (tests/test_install.sh --cuda) checks it where nvcc is (nvcc builds the runtime in about 100 s)"
fi
minstall() { make -s -j2 --no-print-directory -C "$ROOT" "$@" ${NVCC_ARG[@]+"${NVCC_ARG[@]}"}; }
t0=$SECONDS
if minstall install PREFIX="$PREFIX" >"$T/log/install.txt" 2>&1; then
  t_ok "make install PREFIX=$PREFIX ($((SECONDS - t0)) s): $(tail -n 1 "$T/log/install.txt")"
else
  t_notok "make install PREFIX=$PREFIX" "exit status $?"
  show "$T/log/install.txt"
  t_finish
  exit 1
fi
missing=
for f in bin/pipecc bin/pipecc-probe bin/pipecc-opprobe bin/pipecc-trace bin/piperun-data; do [ -x "$PREFIX/$f" ] || missing+=" $f"; done
for f in piperun.h kernels.h cpu/gemm.h actions.def onnx.pb-c.h libpiperun.a prebuilt-cpu.mk; do
  [ -f "$PREFIX/lib/pipecc/runtime/$f" ] || missing+=" lib/pipecc/runtime/$f"
done
[ -z "$missing" ] && t_ok "the four tools in PREFIX/bin, the runtime's headers, libpiperun.a and prebuilt-cpu.mk in PREFIX/lib/pipecc/runtime" ||
  t_notok "the installed layout" "missing:$missing"
MAN=$PREFIX/lib/pipecc/MANIFEST
listed=$(sed -n 's/^file //p' "$MAN" | sort)
found=$(cd "$PREFIX" && find . -type f ! -path ./lib/pipecc/MANIFEST | sed 's|^\./||' | sort)
[ -n "$listed" ] && [ "$listed" = "$found" ] && t_ok "MANIFEST lists every file under PREFIX ($(wc -l <<<"$listed") files)" ||
  t_notok "MANIFEST against the files under PREFIX" "$(diff <(echo "$listed") <(echo "$found") | head -5 | tr '\n' ' ')"
if [ $CUDA = 1 ]; then
  [ -x "$PREFIX/lib/pipecc/runtime/libpiperun-cuda.so" ] && [ -f "$PREFIX/lib/pipecc/runtime/prebuilt-cuda.mk" ] &&
    [ -f "$PREFIX/lib/pipecc/runtime/cuda/kernels.h" ] && t_ok "libpiperun-cuda.so, prebuilt-cuda.mk and the CUDA headers installed" ||
    t_notok "the CUDA runtime installed" "$(ls "$PREFIX/lib/pipecc/runtime" | tr '\n' ' ')"
else
  [ -e "$PREFIX/lib/pipecc/runtime/libpiperun-cuda.so" ] && t_notok "NVCC= installs no CUDA runtime" "libpiperun-cuda.so is there" ||
    t_pass
fi

# ---- the installed tools, with the checkout out of reach ----
# Each step's exit status goes to $T/steps ("NAME STATUS"), its output to $T/log/NAME.txt.
cat >"$T/inner.sh" <<'EOF'
set -u
cd "$WORK"
export PIPECC_CACHE=$T/machine.txt PIPECC_KERNEL_CACHE=$T/kernels.txt
step() { local name=$1; shift; "$@" >"$T/log/$name.txt" 2>&1; echo "$name $?" >>"$T/steps"; }
step hidden test -z "$(ls -A "$ROOT")"
step pipecc "$PREFIX/bin/pipecc" lenet.onnx -n 2 --batch 64 --microbatches 4 --lr 0.1 -o lenet.pipe
step make make -s -C lenet.pipe
step data "$PREFIX/bin/piperun-data" mnist mnist --n 512 --seed 1
step train lenet.pipe/run.sh --data mnist --steps 8 --log loss.csv --trace run.json --save trained.onnx --quiet
step trace "$PREFIX/bin/pipecc-trace" run.json -o run.svg
step freeze lenet.pipe/run.sh --data mnist --steps 6 --freeze-at 3:1 --log freeze.csv --quiet
step cuda "$PREFIX/bin/pipecc" lenet.onnx -n 2 --target cuda -o cuda.pipe
[ "$CUDA" = 1 ] && step cudamake make -s -C cuda.pipe
[ "$CUDA" = 1 ] && step cudaldd sh -c 'ldd cuda.pipe/stage_0 | grep -F "$PREFIX/lib/pipecc/runtime/libpiperun-cuda.so"'
EOF
hidden=
if [ "$(id -u)" != 0 ]; then hidden="not root: a private mount over the checkout needs CAP_SYS_ADMIN"
elif ! command -v unshare >/dev/null; then hidden="no unshare(1) on this machine"
elif ! unshare --mount --propagation private true 2>"$T/log/unshare.txt"; then hidden="unshare --mount failed: $(head -c 200 "$T/log/unshare.txt")"
fi
if [ -n "$hidden" ]; then
  for c in "the checkout is hidden" "the installed pipecc plans LeNet" "its stages build" "piperun-data" "run.sh trains" \
           "pipecc-trace" "--freeze-at re-plans" "--target cuda"; do t_skip "$c" "$hidden"; done
else
  t0=$SECONDS
  ROOT=$ROOT T=$T WORK=$WORK PREFIX=$PREFIX CUDA=$CUDA unshare --mount --propagation private \
    bash -c 'mount -t tmpfs -o size=1m pipecc-hidden "$ROOT" && exec bash "$T/inner.sh"' >"$T/log/unshare.txt" 2>&1
  echo "# the installed tools with the checkout hidden: $((SECONDS - t0)) s"
  status() { sed -n "s/^$1 //p" "$T/steps" 2>/dev/null; }
  expect() { # NAME WHAT [STATUS]: the step exited with STATUS (0)
    local rc
    rc=$(status "$1")
    if [ "$rc" = "${3:-0}" ]; then t_ok "$2"; else
      t_notok "$2" "exit status ${rc:-none, expected ${3:-0}}"
      show "$T/log/$1.txt"; [ -s "$T/log/unshare.txt" ] && show "$T/log/unshare.txt" 5
    fi
  }
  expect hidden "the checkout is hidden: $ROOT is an empty tmpfs"
  expect pipecc "the installed pipecc plans LeNet at -n 2"
  expect make "its stages build against the installed runtime"
  expect data "the installed piperun-data writes MNIST (512 samples)"
  expect train "run.sh trains 8 steps"
  expect trace "the installed pipecc-trace draws the run's trace"
  expect freeze "run.sh --freeze-at 3:1 re-plans with the installed pipecc, rebuilds and trains on"
  [ "$(wc -l <"$WORK/freeze.csv" 2>/dev/null)" = 7 ] && grep -qx "PIPERUN ?= $PREFIX/lib/pipecc/runtime" "$WORK/lenet.frozen1.pipe/Makefile" &&
    t_pass || t_notok "the re-planned directory names the install and the run logged 6 steps" "$(ls "$WORK" | tr '\n' ' ')"
  if [ $CUDA = 1 ]; then
    expect cuda "the installed pipecc plans LeNet for --target cuda"
    expect cudamake "its CUDA stages build with no nvcc run: the installed libpiperun-cuda.so"
    expect cudaldd "stage_0 loads PREFIX/lib/pipecc/runtime/libpiperun-cuda.so"
  else
    expect cuda "--target cuda is refused: this install has no CUDA runtime" 2
    grep -q "nvcc was not found when pipecc was installed" "$T/log/cuda.txt" && t_pass ||
      t_notok "--target cuda's refusal says why" "$(head -c 300 "$T/log/cuda.txt")"
    [ ! -e "$WORK/cuda.pipe" ] && t_pass || t_notok "--target cuda's refusal wrote no directory" "$WORK/cuda.pipe exists"
  fi
  grep -q "measured by pipecc-probe" "$T/machine.txt" 2>/dev/null && t_ok "the first plan ran the installed pipecc-probe (the MPI link measured)" ||
    t_notok "the installed pipecc-probe measured the link" "$(cat "$T/machine.txt" 2>/dev/null | head -3 | tr '\n' ' ')"
  # The loss: 8 finite rows starting near ln 10 (LeNet at its initial weights guesses uniformly).
  if /usr/bin/python3 - "$WORK/loss.csv" <<'PY'
import csv, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
loss = [float(r["loss"]) for r in rows]
ok = len(loss) == 8 and all(math.isfinite(x) for x in loss) and abs(loss[0] - math.log(10)) < 0.2
print(f"# losses: {' '.join(f'{x:.4f}' for x in loss)}")
sys.exit(0 if ok else 1)
PY
  then t_ok "the loss CSV: 8 finite steps, the first near ln 10"; else t_notok "the loss CSV" "$(head -c 400 "$WORK/loss.csv" 2>/dev/null)"; fi
  [ -s "$WORK/trained.onnx" ] && [ -s "$WORK/run.svg" ] && t_pass || t_notok "--save and pipecc-trace wrote their files"
  # The generated directory names the installed runtime and pipecc by absolute path, compiled no runtime
  # of its own, and no text in it names the checkout.
  mk=$WORK/lenet.pipe/Makefile
  grep -qx "PIPERUN ?= $PREFIX/lib/pipecc/runtime" "$mk" && grep -qx 'include $(PIPERUN)/prebuilt-$(DEVICE).mk' "$mk" &&
    grep -qx "pipecc_bin='$PREFIX/bin/pipecc'" "$WORK/lenet.pipe/run.sh" &&
    t_ok "the Makefile links PREFIX/lib/pipecc/runtime's library; run.sh re-plans with PREFIX/bin/pipecc" ||
    t_notok "the generated Makefile and run.sh name the install" "$(grep -E '^PIPERUN|^include' "$mk" | tr '\n' ' ')"
  [ ! -e "$WORK/lenet.pipe/build" ] && t_pass || t_notok "the stage build compiled no runtime objects of its own" "lenet.pipe/build exists"
  named=$(grep -rIl -F "$ROOT" "$WORK/lenet.pipe" "$WORK/lenet.frozen1.pipe")
  [ -z "$named" ] && t_ok "no text file of the generated directory names the checkout $ROOT" ||
    t_notok "the generated directory names the checkout" "$named"
fi

# ---- DESTDIR: staged under DESTDIR only; the tree works wherever it is unpacked ----
STAGE=$T/stage FAKE=/opt/pipecc-install-test-$$
if [ -e "$FAKE" ]; then t_skip "DESTDIR staging" "$FAKE exists already"; else
  if minstall install DESTDIR="$STAGE" PREFIX="$FAKE" >"$T/log/destdir.txt" 2>&1 && [ -x "$STAGE$FAKE/bin/pipecc" ] && [ ! -e "$FAKE" ] &&
     [ -f "$STAGE$FAKE/lib/pipecc/MANIFEST" ] && ! grep -q "$STAGE" "$STAGE$FAKE/lib/pipecc/MANIFEST"; then
    t_ok "make install DESTDIR=STAGE PREFIX=$FAKE writes under STAGE alone, its MANIFEST relative to PREFIX"
  else t_notok "make install DESTDIR=STAGE" "$(tail -n 3 "$T/log/destdir.txt" | tr '\n' ' ')"; fi
  cp -a "$STAGE$FAKE" "$T/moved"
  export PIPECC_CACHE=$T/machine.txt
  if (cd "$WORK" && "$T/moved/bin/pipecc" lenet.onnx -n 2 -o moved.pipe >/dev/null 2>"$T/log/moved.txt") &&
     grep -qx "PIPERUN ?= $T/moved/lib/pipecc/runtime" "$WORK/moved.pipe/Makefile"; then
    t_ok "the staged tree moved elsewhere: its pipecc finds the runtime beside it"
  else t_notok "the staged tree moved elsewhere" "$(head -c 300 "$T/log/moved.txt")"; fi
  # Where no runtime is found (an install's runtime gone; PIPECC_RUNTIME naming something else): one
  # error line before any planning, exit status 2, no directory.
  rm -f "$T/moved/lib/pipecc/runtime/prebuilt-cpu.mk"
  lost() { # WHAT MESSAGE ENV...: pipecc run with ENV
    local what=$1 msg=$2 rc
    shift 2
    (cd "$WORK" && env "$@" "$T/moved/bin/pipecc" lenet.onnx -n 2 -o lost.pipe >/dev/null 2>"$T/log/lost.txt"); rc=$?
    [ $rc = 2 ] && [ "$(wc -l <"$T/log/lost.txt")" = 1 ] && grep -qF "pipecc: error: $msg" "$T/log/lost.txt" && [ ! -e "$WORK/lost.pipe" ] &&
      t_ok "$what: exit status 2, one line naming where pipecc looked, no directory" ||
      t_notok "$what" "exit status $rc: $(head -c 300 "$T/log/lost.txt")"
  }
  lost "the install's runtime removed" "cannot find pipecc's runtime: neither $T/moved/bin/../lib/pipecc/runtime"
  lost "PIPECC_RUNTIME naming a directory that is no runtime" "PIPECC_RUNTIME=$T: not pipecc's runtime" PIPECC_RUNTIME="$T"
  if minstall uninstall DESTDIR="$STAGE" PREFIX="$FAKE" >"$T/log/destdir-un.txt" 2>&1 && [ -z "$(find "$STAGE$FAKE" -mindepth 1)" ]; then
    t_ok "make uninstall DESTDIR=STAGE PREFIX=$FAKE empties the staged prefix"
  else t_notok "make uninstall DESTDIR=STAGE" "$(find "$STAGE$FAKE" -mindepth 1 | head -5 | tr '\n' ' ')"; fi
fi

# ---- installing again replaces the earlier install's files ----
echo "stale" >"$PREFIX/lib/pipecc/runtime/stale.h"
echo "file lib/pipecc/runtime/stale.h" >>"$MAN"
if minstall install PREFIX="$PREFIX" >"$T/log/again.txt" 2>&1 && [ ! -e "$PREFIX/lib/pipecc/runtime/stale.h" ] &&
   [ -z "$(sort "$MAN" | uniq -d)" ] && [ -f "$PREFIX/lib/pipecc/runtime/libpiperun.a" ]; then
  t_ok "make install over an earlier install removes that one's files (a planted stale header) and lists each entry once"
else t_notok "make install over an earlier install" "$(tail -n 3 "$T/log/again.txt" | tr '\n' ' ')"; fi

# ---- uninstall ----
echo "not pipecc's" >"$PREFIX/bin/someone-else"
if minstall uninstall PREFIX="$PREFIX" >"$T/log/uninstall.txt" 2>&1; then
  left=$(cd "$PREFIX" && find . -mindepth 1 | sed 's|^\./||' | sort | tr '\n' ' ')
  [ "$left" = "bin bin/someone-else " ] && t_ok "make uninstall removes every file and directory install made; bin/ stays for a file of someone else's" ||
    t_notok "make uninstall leaves only what is not pipecc's" "left: $left"
  grep -q "kept $PREFIX/bin" "$T/log/uninstall.txt" && t_pass || t_notok "make uninstall says which directory it kept" "$(cat "$T/log/uninstall.txt")"
else
  t_notok "make uninstall PREFIX=$PREFIX" "$(tail -n 3 "$T/log/uninstall.txt" | tr '\n' ' ')"
fi
if minstall uninstall PREFIX="$PREFIX" >"$T/log/again-un.txt" 2>&1; then t_notok "a second make uninstall fails" "it succeeded"
else grep -q "no pipecc is installed under $PREFIX" "$T/log/again-un.txt" && t_ok "a second make uninstall fails: nothing is installed there" ||
  t_notok "a second make uninstall says why" "$(cat "$T/log/again-un.txt")"; fi
# A manifest that names a file outside PREFIX: refused before anything is removed.
EVIL=$T/evil
mkdir -p "$EVIL/lib/pipecc" "$EVIL/bin"
echo keep >"$T/outside" && echo mine >"$EVIL/bin/pipecc"
printf 'file bin/pipecc\nfile ../outside\n' >"$EVIL/lib/pipecc/MANIFEST"
if minstall uninstall PREFIX="$EVIL" >"$T/log/evil.txt" 2>&1; then t_notok "a manifest reaching outside PREFIX is refused" "make uninstall succeeded"
elif [ -f "$T/outside" ] && [ -f "$EVIL/bin/pipecc" ] && grep -q "not a path inside PREFIX" "$T/log/evil.txt"; then
  t_ok "a manifest reaching outside PREFIX (../outside) is refused, and nothing is removed"
else t_notok "a manifest reaching outside PREFIX" "$(cat "$T/log/evil.txt")"; fi
if minstall install PREFIX=relative/path >"$T/log/rel.txt" 2>&1; then t_notok "a relative PREFIX is refused" "make install succeeded"
else grep -q "must be an absolute path" "$T/log/rel.txt" && t_ok "a relative PREFIX is refused, saying why" || t_notok "a relative PREFIX's refusal" "$(tail -n 2 "$T/log/rel.txt")"; fi
t_finish
