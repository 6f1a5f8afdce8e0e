#!/bin/bash
# The whole test suite (make test).  Each suite ends with the tally's line
# (tests/tally.py, tests/tally.sh, tests/check.h): "N passed, M failed, K
# skipped, R refused" (the old "N passed, M failed" reads as 0 skipped, 0
# refused); this script adds them up and prints the total last.  A suite that
# exits non-zero, prints no tally, or passes nothing counts as a failure.
#   FUZZ_SECONDS=15   how long the loader fuzzer runs (default 15; make fuzz runs the long one)
set -u
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
T=$(mktemp -d "${TMPDIR:-/tmp}/pipecc-test.XXXXXX")
trap 'rm -rf "$T"' EXIT
export PIPECC_CACHE=$T/machine.txt
export PIPERUN_OBJ_CACHE=$T/rt  # libpiperun objects built once for every plan the suites build (templates/Makefile.in)
export PIPECC_KERNEL_CACHE=$T/kernels.txt  # the kernel-time cache (docs/cost.md): empty, so plans are the FLOP model's
export PIPECC_OPS_CACHE=off  # the op probe (docs/cost.md): not run, so plans stay the FLOP model's and --conv auto takes oneDNN
                             # (tests/test_costprobe.py sets its own)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

total_pass=0 total_fail=0 total_skip=0 total_refused=0
timings=()
# tally_line OUTPUT-FILE: "P F K R" from the last tally line, or nothing when there is none.
tally_line() {
  sed -n -E -e 's/^([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped, ([0-9]+) refused$/\1 \2 \3 \4/p' \
            -e 's/^([0-9]+) passed, ([0-9]+) failed$/\1 \2 0 0/p' "$1" | tail -1
}
# count NAME RC OUTPUT-FILE SECONDS: a finished suite into the totals.
count() {
  local name=$1 rc=$2 out=$3
  timings+=("$4 s  $name")
  local p=0 f=0 k=0 r=0 counts
  counts=$(tally_line "$out")
  [ -n "$counts" ] && read -r p f k r <<<"$counts"
  # A suite that crashed, printed no tally or passed nothing counts as a failure.
  if [ -z "$counts" ]; then echo "not ok - $name: printed no tally (rc $rc)"; f=$((f + 1))
  elif [ "$p" = 0 ]; then echo "not ok - $name: passed nothing"; [ "$f" = 0 ] && f=1
  fi
  if [ "$rc" != 0 ] && [ "$f" = 0 ]; then echo "not ok - $name: exited $rc with no failure counted"; f=1; fi
  total_pass=$((total_pass + p))
  total_fail=$((total_fail + f))
  total_skip=$((total_skip + k))
  total_refused=$((total_refused + r))
}

# Suites run TEST_JOBS at a time (default 2; 1 runs them one after another, printing as they go):
# a suite leaves a core idle much of its time (Python and torch starting, mpirun launching, a rank
# waiting for its peer), and the suites share nothing but the runtime's object cache, which is built
# for it (each writes its objects under a temporary name and renames them).  A suite running
# alongside prints its output in one piece when it ends, under its "== NAME" line.  `solo` runs a
# suite with nothing beside it: those that time something (a watchdog, a planning-time limit, a
# progress line's redraws, the order two ranks' lines arrive in), and one that reads what another
# wrote (the fuzzer's accepted inputs).
JOBS=${TEST_JOBS:-2}
running=()
declare -A job_name job_out job_t0
njobs=0
# reap: waits for one running suite and counts it.
reap() {
  local pid rc
  wait -n -p pid "${running[@]}"
  rc=$?
  local keep=() q
  for q in "${running[@]}"; do [ "$q" != "$pid" ] && keep+=("$q"); done
  running=(${keep[@]+"${keep[@]}"})
  echo "== ${job_name[$pid]}"
  cat "${job_out[$pid]}"
  count "${job_name[$pid]}" "$rc" "${job_out[$pid]}" "$((SECONDS - job_t0[$pid]))"
}
drain() { while [ ${#running[@]} -gt 0 ]; do reap; done; }
solo() {
  drain
  local name=$1
  shift
  echo "== $name"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$T/out.txt"
  count "$name" "${PIPESTATUS[0]}" "$T/out.txt" "$((SECONDS - t0))"
}
suite() {
  if [ "$JOBS" -le 1 ]; then solo "$@"; return; fi
  while [ ${#running[@]} -ge "$JOBS" ]; do reap; done
  local name=$1
  shift
  njobs=$((njobs + 1))
  "$@" > "$T/suite.$njobs.txt" 2>&1 &
  running+=($!)
  job_name[$!]=$name job_out[$!]=$T/suite.$njobs.txt job_t0[$!]=$SECONDS
}

fuzz() {
  . tests/tally.sh   # a fresh tally: suite runs fuzz in a subshell (its pipe), so nothing leaks into run.sh
  local secs=${FUZZ_SECONDS:-15}
  mkdir -p "$T/corpus" "$T/accepted"
  if FUZZ_KEEP_DIR=$T/accepted bin/fuzz_loader -max_total_time="$secs" -rss_limit_mb=4096 -artifact_prefix="$T/" "$T/corpus" \
       tests/fuzz_seeds > "$T/fuzz.log" 2>&1; then
    t_ok "the fuzzer ran $secs s through loading, planning and code generation without a crash, leak or sanitizer report"
    grep -E "DONE" "$T/fuzz.log" | tail -1
  else
    tail -30 "$T/fuzz.log"
    t_notok "the loader fuzzer found a problem (reproduce: bin/fuzz_loader $T/crash-*)"
  fi
  t_finish
}

# The suites that time something run first, one at a time (solo).
solo "listings on every sample model" env PIPECC=bin/pipecc $PY tests/test_listing.py
solo "run.sh answers by itself: --help, usage errors, an unbuilt or stale directory before mpirun; a failed rank's own line first (each word for word, with its exit status)" $PY tests/test_runsh.py
solo "training runs: demo loss, checkpoint/resume, killed rank, NaN, bad data" $PY tests/test_train.py
solo "failures are safe: checkpoint crashes at every point, corrupt/foreign checkpoints, early errors, watchdog, NaN" $PY tests/test_safety.py
solo "progress and pictures: one line updated in place on a terminal (a pty, tmux), --log-every lines piped, --quiet, the loss picture F.svg with the expected points in headless Chromium, runtime/plot.c alone (ASan build)" $PY tests/test_progress.py
# The rest, the longest first, TEST_JOBS at a time.
suite "the GPU path builds without a GPU: every sample model's CUDA stage programs at n = 2 compile and link with nvcc, and bin/gpu-kernels links" env PIPECC=bin/pipecc $PY tests/test_cuda_build.py
suite "gradient check per op: PyTorch autograd and finite differences in float64" $PY tests/test_gradcheck.py
suite "NumPy data: lenet and gpt train on .npz and .npy arrays with the same losses as the same data in IDX and token files, every mismatch refused naming file and array, 1800 damaged files under ASan/UBSan" $PY tests/test_npy.py
suite "ONNX node conformance through the forward kernels" $PY tests/conformance/run.py
suite "training parity with PyTorch, bit-identity across n and schedules" env PIPECC=bin/pipecc $PY tests/test_parity.py --ci
suite "Split into K and Concat of K (K = 2..16) trained against PyTorch, n = 1 and 2" $PY tests/test_split_concat.py
suite "ResNet training parity with PyTorch (BatchNorm, residuals), n = 1 and 4" $PY tests/test_parity_models.py
suite "element-wise, comparison and reduction ops train bit-identically across -n 1, 3, 4 and schedules (bool and int64 tensors across cuts)" $PY tests/test_ops_across_stages.py
suite "tied weights: a GPT with its head tied to its embedding, n = 1, 2, 4, and an export that merged LayerNorm weights, n = 1, 4, against PyTorch" $PY tests/test_tied.py
suite "memory plan: offload to a peer or a file, recompute, bit-identical under --mem-limit, compiled by the ASan build (make test-memory: every model, n, schedule)" env PIPECC=bin/pipecc-asan $PY tests/test_memory.py --quick
suite "memory plan: the optimizer state in a file (--offload-optimizer), bit-identical, checkpoints, a full disk, compiled by the ASan build (make test-optstate: every model, n, schedule, optimizer)" env PIPECC=bin/pipecc-asan $PY tests/test_optstate.py --quick
suite "data-parallel replicas (--replicas): mlp and lenet at (S, R) = (1, 2), (2, 2) against PyTorch on the global batch within 1e-5, bit-identical across S and runs, a checkpoint resumed, refusals (ASan build; the whole matrix: make test-replicas)" env PIPECC=bin/pipecc-asan $PY tests/test_replicas.py --quick
suite "virtual stages: interleaved and zbv, two chunks per rank, bit-identical to -n 1 (lenet at n = 2 and 4, gpt at n = 2), a local copy between a rank's chunks, --val, refusals (the whole matrix: make test-chunks)" env PIPECC=bin/pipecc $PY tests/test_chunks.py --ci
suite "zb1's and zbv's two layouts of what W reads (--split-layout): each stage the smaller, the late values reached through wslot, late and hold bit-identical to -n 1 (lenet n = 2; the whole set: make test-late)" env PIPECC=bin/pipecc $PY tests/test_late.py --ci
suite "PipeFB: forward ranks and backward ranks, bit-identical to -n 1 (lenet, gpt at n = 2, 4), the forward ranks' arena, bad flags (ASan build; the whole matrix: make test-pipefb)" env PIPECC=bin/pipecc-asan $PY tests/test_pipefb.py --quick
suite "model zoo subset: torchvision resnet18 against PyTorch within its float32 spread, n = 1 and 4 (make zoo: the rest)" $PY tests/zoo/run.py --quick
suite "--threads: a rank on 2 threads (par.c, gemm.c): bits equal to 1 thread and across n, plan, listing, run.sh, profiles, refusals (ASan build)" env PIPECC=bin/pipecc-asan $PY tests/test_threads.py
suite "LSTM and GRU exported from torch.nn, trained against PyTorch, n = 1 and 2, 1F1B and ZB-H1, bit-identical" $PY tests/test_rnn.py
suite "Slice, Expand, Tile, Cast at run time: a torch.nn model trained against PyTorch, n = 1 and 2" $PY tests/test_movement.py
suite "frozen layers: --frozen and run.sh --freeze-at (a freeze event re-plans and continues) against PyTorch with requires_grad=False, a re-plan killed and resumed, hostile --frozen files (ASan build; the whole suite: make test-freeze)" env PIPECC=bin/pipecc-asan $PY tests/test_freeze.py --quick
suite "Dropout: Philox masks, keep rate and scaling, training against PyTorch fed pipecc's masks, bit-identity across n and schedules" env PIPECC=bin/pipecc $PY tests/test_dropout.py
suite "fuzzing the loader through code generation" fuzz
suite "the op probe: its grid's times exact at measured shapes, monotone between, --conv auto per convolution by the grid, the listing says so (synthetic cache; the real probe: make test-costprobe)" env PIPECC=bin/pipecc $PY tests/test_costprobe.py --quick
suite "measured node costs: pipecc --profile, run.sh --profile, --costs (hostile profiles refused), the kernel cache and pipecc-probe --kernels (hostile caches warned about) (ASan build)" env PIPECC=bin/pipecc-asan $PY tests/test_profile.py
suite "make install into a temporary prefix: LeNet compiled, built and trained at n = 2 by the installed tools with the checkout hidden; DESTDIR, a moved install, make uninstall (tests/test_install.sh --cuda: the CUDA runtime too)" bash tests/test_install.sh
suite "async: a pipeline that never drains, against a PyTorch simulation of its staleness rule (mlp, lenet, gpt; K = 1, 2), n = 2 and 4 bit-identical, refusals (ASan build; the whole matrix: make test-async)" env PIPECC=bin/pipecc-asan $PY tests/test_async.py --quick
suite "hostile names: escaped in comments and strings, prefixed identifiers, --save keeps them" $PY tests/test_names.py
suite "data loading and piperun-data (ASan build)" $PY tests/test_data.py
suite "the tally itself (tests/tally.py): planted failures, skips, refusals and empty suites" $PY tests/tally.py --self-test
suite "partitioner: DP vs brute force" bin/test_partition
suite "partitioner: downset DP vs brute force, and against the fixed order on the sample models" bin/test_dagpart
suite "schedules: action lists, validator, planted mistakes" bin/test_schedule
suite "units" bin/test_units
suite "sources: no include cycle between modules, no function over 120 lines (planted trees fail), kernels.def against the kernels' prototypes with planted mismatches" $PY tests/test_includes.py
suite "stage specs: plan.json's messages are the stage programs' RECV and SEND tables, and every send pairs with its receive (peer, tag, bytes) on every sample model, n = 2 and 4, direct and relayed" env PIPECC=bin/pipecc $PY tests/test_spec.py
suite "run-time kernels (Gelu, LeakyRelu, Concat, views, Cast, unary maths, Max/Min, comparisons, ReduceMax, ArgMax, Philox and Dropout) against double references, and the same bits on 3 threads (ASan build)" bin/test_kernels
for set in $(bin/test_kernels --kernel-sets); do
  suite "the same bits on 1 and 3 threads (every splitting kernel, pr_sgemm's bands) under OpenBLAS's $set kernels (ASan build)" \
    env OPENBLAS_CORETYPE="$set" bin/test_kernels --threads-only
done
suite "shapes vs onnx.shape_inference (ASan build)" env PIPECC=bin/pipecc-asan $PY tests/test_shapes.py
suite "bad input (ASan build)" env PIPECC=bin/pipecc-asan bash tests/test_cli.sh
suite "every sample model through code generation (ASan/UBSan build), n = 1..8, every schedule" bash tests/test_asan_models.sh
suite "constant folding of exported shape arithmetic (ASan build)" env PIPECC=bin/pipecc-asan $PY tests/test_fold.py
suite "loader: external data, typed fields, value_info (ASan build)" env PIPECC=bin/pipecc-asan $PY tests/test_loader.py
suite "generated/ is what the compiler writes" bash tests/test_generated.sh
suite "run traces: one span per executed action, 4 ranks, every schedule" env PIPECC=bin/pipecc $PY tests/test_trace.py
suite "ranks pinned to cores when they outnumber them: the plan's pairing, PIN_CORE, the run's CPUs, --no-pin and mpirun's binding (ASan build)" env PIPECC=bin/pipecc-asan $PY tests/test_pin.py
suite "--schedule auto: each candidate's figures are --schedule KIND's, the kept one follows the rule and writes KIND's directory byte for byte, under a memory limit too (ASan build)" env PIPECC=bin/pipecc-asan $PY tests/test_schedule_auto.py
suite "two hosts (network namespaces joined by a veth pair): a 4-stage job gives the bits of one host" bash tests/test_two_hosts.sh
suite "timeline renderer: timeline_svg called directly (ASan build)" bin/test_timeline
suite "pipecc-trace: trace JSON to SVG, hostile traces, headless Chromium (ASan build)" $PY tests/test_timeline.py
# It builds what the fuzzer accepted: after the fuzzer (and everything else) has ended.
solo "what the fuzzer got through code generation builds" bash tests/fuzz_build.sh "$T/accepted" 6
drain

echo
echo "time per suite (the whole run: $SECONDS s):"
printf '  %s\n' "${timings[@]}" | cut -c1-110
echo "total: $total_pass passed, $total_fail failed, $total_skip skipped, $total_refused refused (pinned)"
[ "$total_fail" = 0 ]
