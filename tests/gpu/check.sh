#!/bin/bash
# tests/gpu/check.sh - every GPU check, in one run on a machine with an NVIDIA GPU (docs/cuda.md).
#
#   make gpu-prepare              # here, without a GPU: builds .gpu/ (tests/gpu/prepare.py)
#   tests/gpu/check.sh OUT_DIR [PART...]   # there, from the repository root, with .gpu/ carried along
#
# PARTs (default: all but profile): kernels parity features sanitizer bench profile.
# That machine has the CUDA libraries and Python with PyTorch and onnx, but no Open MPI: Debian's
# packages (.gpu/debs) are unpacked into a folder of their own, never into /.  Results, all in OUT_DIR:
#   env.txt       the GPU, driver, CUDA and PyTorch versions
#   kernels.txt   every GPU kernel against its CPU kernel (bin/gpu-kernels)
#   parity.txt    training parity, bit-identity across n, the memory plan (tests/gpu/parity.py)
#   features.txt  pipefb, async, checkpoint and resume, --val on the GPU (tests/gpu/features.py)
#   bench.txt     one stage's step against PyTorch eager, fp32 / tf32 / bf16 (tests/gpu/bench.py)
#   profile.txt   (profile) Nsight Compute's time per kernel over one GPT-2-small fp32 step
#   check.log     everything printed
# Exit status: 0 when every part passed.  Each part runs under its own time limit (8 minutes in all).
set -u
OUTDIR=${1:?usage: tests/gpu/check.sh OUT_DIR [PART...]}
shift
PARTS=" ${*:-kernels parity features sanitizer bench} "
part() { [[ $PARTS == *" $1 "* ]]; }
mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/check.log") 2>&1
cd "$(dirname "$0")/../.."
G=.gpu
[ -d $G ] || [ ! -f .gpucarry/gpu.tar.xz ] || tar -xJf .gpucarry/gpu.tar.xz
[ -x $G/bin/gpu-kernels ] || { echo "check.sh: $G/bin/gpu-kernels is missing: run make gpu-prepare first (on any machine with nvcc)"; exit 2; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvidia-smi | sed -n 3p
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  uname -r; nproc
} >"$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"

# Open MPI from Debian's packages, relocated (OPAL_PREFIX), on shared memory only.
M=/tmp/pipecc-ompi
if [ ! -x $M/usr/bin/mpirun ]; then
  mkdir -p $M
  for f in $G/debs/*.deb; do dpkg -x "$f" $M; done
fi
export OPAL_PREFIX=$M/usr PATH=$M/usr/bin:$PATH
export LD_LIBRARY_PATH=$PWD/$G/lib:$M/usr/lib/x86_64-linux-gnu:$M/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# cuBLAS where the toolkit is, else PyTorch's own copy.
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; p = nvidia.__path__[0]; print(" ".join(os.path.join(p, x, "lib") for x in os.listdir(p)))' 2>/dev/null); do
  [ -d "$d" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# PMIx finds its own plugins there, not another PMIx's the machine may have.
export PMIX_INSTALL_PREFIX=$M/usr PMIX_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_osc=^ucx OMPI_MCA_plm_rsh_agent=false
mpirun --version | head -1 || echo "check.sh: mpirun does not start"

rc=0
if part kernels; then
  echo "== kernels"
  timeout 150 $G/bin/gpu-kernels "$OUTDIR/kernels.txt" >"$OUTDIR/kernels_cases.txt" 2>&1 || rc=1
  tail -n 100 "$OUTDIR/kernels.txt" 2>/dev/null || tail -n 30 "$OUTDIR/kernels_cases.txt"
  grep -E "over 1e-5|DIFFER" "$OUTDIR/kernels_cases.txt" | head -40
fi
if part parity; then
  echo "== training parity"
  PYTHONUNBUFFERED=1 timeout 300 python3 tests/gpu/parity.py $G/plans $G/data $G/meta.json "$OUTDIR" || rc=1
fi
if part features; then
  echo "== the runtime's features: pipefb, async, checkpoint and resume, --val"
  PYTHONUNBUFFERED=1 timeout 120 python3 tests/gpu/features.py $G/plans $G/features $G/data $G/meta.json "$OUTDIR" || rc=1
fi
part sanitizer && {
echo "== compute-sanitizer (memcheck and synccheck) on two stage programs, 2 steps each"
for p in gpt_n1 lenet_n1; do
  d=$G/plans/$p
  data=$G/data/$(case $p in gpt*) echo tokens.bin ;; *) echo mnist ;; esac)
  for tool in memcheck synccheck; do
    if timeout 120 mpirun --oversubscribe -n 1 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 20 \
         "$d/stage_0" --data "$data" --steps 2 --quiet --blas-kernels "$("$d/stage_0" --blas-core)" --freeze-dir /tmp/fz-$p \
         >"$OUTDIR/sanitizer_${p}_$tool.txt" 2>&1; then
      echo "ok - compute-sanitizer --tool $tool: $p, 2 steps: $(grep -o 'ERROR SUMMARY: [0-9]* errors' "$OUTDIR/sanitizer_${p}_$tool.txt" | tail -1)"
    else
      echo "not ok - compute-sanitizer --tool $tool: $p"; tail -n 25 "$OUTDIR/sanitizer_${p}_$tool.txt"; rc=1
    fi
  done
done
cat "$OUTDIR"/sanitizer_*.txt >"$OUTDIR/sanitizer.txt" 2>/dev/null
}
if part bench; then
  echo "== bench"
  if [ -d $G/bench ]; then
    PYTHONUNBUFFERED=1 timeout 150 python3 tests/gpu/bench.py $G/bench $G/data "$OUTDIR" || rc=1
  else
    echo "check.sh: no $G/bench (make gpu-prepare builds it)"; rc=1
  fi
fi
if part profile; then
  # One GPT-2-small fp32 step under Nsight Compute: each kernel's time, summed by name (where the step goes).
  echo "== profile"
  d=$G/bench/gpt2_small_fp32
  [ -f $d/weights/stage_0.bin ] || python3 -c "import json, numpy as np; n = json.load(open('$d/bench.json'))['weights_bytes'] // 4; (np.random.default_rng(0).standard_normal(n, dtype=np.float32) * np.float32(0.02)).tofile('$d/weights/stage_0.bin')"
  timeout 150 mpirun --oversubscribe -n 1 ncu --metrics gpu__time_duration.sum --print-summary per-kernel --csv \
    $d/stage_0 --data $G/data/tokens_gpt2.bin --steps 1 --quiet --blas-kernels "$($d/stage_0 --blas-core)" --freeze-dir /tmp/fz-prof \
    >"$OUTDIR/profile_raw.csv" 2>"$OUTDIR/profile_err.txt" || { echo "not ok - ncu"; tail -5 "$OUTDIR/profile_err.txt"; }
  python3 tests/gpu/profile_sum.py "$OUTDIR/profile_raw.csv" >"$OUTDIR/profile.txt" && head -30 "$OUTDIR/profile.txt"
fi
exit $rc
