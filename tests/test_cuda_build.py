#!/usr/bin/python3
"""The GPU path compiles and links on a machine without a GPU (make test; no GPU runs here).

  test_cuda_build.py          every sample model at n = 2 (1f1b), pipecc --target cuda, built with nvcc:
                              the CUDA runtime, its kernels and every stage program; plus bin/gpu-kernels
                              (every GPU kernel's check against its CPU kernel) links
  test_cuda_build.py --all    the full matrix (make test-cuda-build): every schedule that trains
                              (gpipe, 1f1b, zb1, pipefb, async) at n = 1, 2, 4, and --precision tf32, bf16

Checked per plan: pipecc succeeds, make succeeds, every stage program is there, each is a CUDA program
(it links libpiperun-cuda and calls the GPU's kernels), and the generated source calls kc_ kernels only.
Without nvcc (neither on PATH nor at /usr/local/cuda/bin) every case is a counted skip."""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402

PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
MODELS = sorted(glob.glob(os.path.join(ROOT, "onnx_models", "*.onnx")))
# Plans pipecc refuses for every target, with the reason (the CPU suites pin the same refusals).
PINNED = {("resnet", "async"): "async does not version such state yet"}


def nvcc():
    return shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")


def build(tmp, env, model, n, sched, flags=()):
    name = os.path.basename(model)[:-5]
    tag = f"{name} n={n} {sched}{' ' + ' '.join(flags) if flags else ''}"
    out = os.path.join(tmp, re.sub(r"[^A-Za-z0-9_.-]", "_", tag) + ".pipe")
    r = subprocess.run([PIPECC, model, "-n", str(n), "--schedule", sched, "--devices", DEVICES, "--target", "cuda", *flags, "-o", out],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        tally.pinned_refusal(f"{tag}: pipecc --target cuda", r.stderr.strip()[-400:], PINNED.get((name, sched)))
        return
    tally.check(True, f"{tag}: pipecc --target cuda")
    r = subprocess.run(["make", "-s", "-j2", "-C", out], capture_output=True, text=True, env=env)
    if not tally.check(r.returncode == 0, f"{tag}: the CUDA stage programs build", (r.stdout + r.stderr).strip()[-1500:]):
        return
    progs = sorted(glob.glob(os.path.join(out, "stage_*[0-9]")))
    tally.check(len(progs) == n, f"{tag}: {len(progs)} stage programs, {n} expected")
    srcs = [open(p + ".c").read() for p in progs]
    calls = [set(re.findall(r"\b(kc?)_[a-z0-9_A-Z]+\(", s)) for s in srcs]
    tally.check(all(c <= {"kc"} and c for c in calls), f"{tag}: the stage sources call the GPU's kernels (kc_*) only")
    nm = subprocess.run(["sh", "-c", f"ldd {progs[0]} 2>/dev/null"], capture_output=True, text=True).stdout
    tally.check("libpiperun-cuda.so" in nm, f"{tag}: stage_0 links the CUDA runtime (libpiperun-cuda.so)")
    shutil.rmtree(out, ignore_errors=True)


def main():
    full = "--all" in sys.argv
    if not nvcc():
        for m in MODELS:
            tally.skip(f"{os.path.basename(m)}: CUDA build", "no nvcc on PATH or at /usr/local/cuda/bin")
        return tally.finish()
    tmp = tempfile.mkdtemp(prefix="pipecc-cuda-build.")
    env = dict(os.environ, PIPECC_CACHE=os.path.join(tmp, "machine.txt"),
               PIPERUN_OBJ_CACHE=os.environ.get("PIPERUN_OBJ_CACHE", os.path.join(ROOT, "build", "objcache")))
    r = subprocess.run(["make", "-s", "-C", ROOT, "bin/gpu-kernels"], capture_output=True, text=True)
    tally.check(r.returncode == 0, "bin/gpu-kernels (every GPU kernel against its CPU kernel) builds", (r.stdout + r.stderr)[-1500:])
    for m in MODELS:
        if not full:
            build(tmp, env, m, 2, "1f1b")
            continue
        for n in (1, 2, 4):
            for s in ("gpipe", "1f1b", "zb1") + (("pipefb", "async") if n > 1 else ()):
                build(tmp, env, m, n, s)
        for p in ("tf32", "bf16"):
            build(tmp, env, m, 2, "1f1b", ("--precision", p))
    shutil.rmtree(tmp, ignore_errors=True)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
