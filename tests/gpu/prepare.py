#!/usr/bin/python3
"""Builds, on a machine without a GPU, everything tests/gpu/check.sh runs on one (make gpu-prepare):

  .gpu/bin/gpu-kernels       every GPU kernel against its CPU kernel
  .gpu/plans/<case>/         each case of cases.py compiled with --target cuda and built (stage programs,
                             run.sh, plan.json, weights): the same plans the CPU target trains
  .gpu/data/                 the data sets (MNIST IDX, CIFAR-10 batches, a token file)
  .gpu/cpu_losses.json       each model's per-step losses from the CPU target (n = 1), the reference the
                             GPU's must match
  .gpu/debs/                 Debian's Open MPI, unpacked on the GPU machine (it has none)

The plans' builds share one object cache (PIPERUN_OBJ_CACHE), so the runtime compiles once."""
import csv
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import cases  # noqa: E402

OUT = os.path.join(ROOT, ".gpu")
PIPECC = os.path.join(ROOT, "bin", "pipecc")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           PIPERUN_OBJ_CACHE=os.path.join(ROOT, "build", "objcache-gpu"), PIPECC_CACHE=os.path.join(ROOT, "build", "machine-gpu.txt"))


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, **kw)
    if r.returncode:
        sys.exit(f"prepare: {' '.join(cmd)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def make_data():
    d = os.path.join(OUT, "data")
    os.makedirs(d, exist_ok=True)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import test_parity  # noqa: E402  (its MNIST-format data set: bars whose place depends on the label)
    imgs, labels = test_parity.make_dataset(32 * 10, seed=0)
    test_parity.write_dataset(os.path.join(d, "mnist"), imgs, labels)
    run([os.path.join(ROOT, "bin", "piperun-data"), "cifar", os.path.join(d, "cifar"), "--n", "320", "--seed", "3"])
    run([os.path.join(ROOT, "bin", "piperun-data"), "tokens", os.path.join(d, "tokens.bin"), "--n", "20000", "--vocab", "64", "--seed", "5"])
    return {"mnist": os.path.join(d, "mnist"), "cifar": os.path.join(d, "cifar"), "tokens": os.path.join(d, "tokens.bin")}


def compile_plan(dst, model, n, sched, flags, target="cuda"):
    path, _, batch, mb, lr, _ = cases.MODELS[model]
    if os.path.exists(dst):
        shutil.rmtree(dst)
    run([PIPECC, os.path.join(ROOT, path), "-n", str(n), "--schedule", sched, "--batch", str(batch), "--microbatches", str(mb),
         "--lr", str(lr), "--devices", DEVICES, "--target", target, *flags, "-o", dst])
    run(["make", "-s", "-j2", "-C", dst])
    shutil.rmtree(os.path.join(dst, "build"), ignore_errors=True)


def cpu_losses(data):
    """Each model's losses on the CPU target, n = 1: the reference (-n does not change the CPU's bits)."""
    out = {}
    for m, (path, kind, batch, mb, lr, steps) in cases.MODELS.items():
        dst = os.path.join(ROOT, "build", "gpu-cpu-ref", m)
        compile_plan(dst, m, 1, "1f1b", (), target="cpu")
        log = os.path.join(dst, "log.csv")
        run([os.path.join(dst, "run.sh"), "--data", data[kind], "--steps", str(steps), "--quiet", "--log", log])
        out[m] = [float(r["loss"]) for r in csv.DictReader(open(log))]
        print(f"prepare: {m}: CPU losses {out[m][0]:.6f} .. {out[m][-1]:.6f}")
    return out


def offload_plans():
    """gpt and resnet at n = 2: the unlimited plan's busiest arena, then a plan limited to half of it."""
    made = []
    for m in cases.OFFLOAD_MODELS:
        free = os.path.join(OUT, "plans", f"{m}_1f1b_n2")
        with open(os.path.join(free, "plan.json")) as f:
            arenas = [s["arena_bytes"] for s in json.load(f)["stage_plans"]]
        limit = max(arenas) // 2
        tag = f"{m}_offload_n2"
        dst = os.path.join(OUT, "plans", tag)
        r = subprocess.run([PIPECC, os.path.join(ROOT, cases.MODELS[m][0]), "-n", "2", "--schedule", "1f1b", "--batch",
                            str(cases.MODELS[m][2]), "--microbatches", str(cases.MODELS[m][3]), "--lr", str(cases.MODELS[m][4]),
                            "--devices", DEVICES, "--target", "cuda", "--mem-limit", str(limit), "-o", dst],
                           capture_output=True, text=True, env=ENV)
        if r.returncode:
            print(f"prepare: {tag}: pipecc refused --mem-limit {limit}: {r.stderr.strip()}")
            continue
        run(["make", "-s", "-j2", "-C", dst])
        shutil.rmtree(os.path.join(dst, "build"), ignore_errors=True)
        made.append({"tag": tag, "model": m, "limit": limit, "arenas_unlimited": arenas})
    return made


# Open MPI and what it loads, as Debian packages (the GPU machine has no Open MPI and no registry).
OMPI_DEBS = ("openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 "
             "libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libnuma1 libpsm2-2 libpsm-infinipath1 "
             "libmunge2 libatomic1 libudev1 ibverbs-providers").split()


def fetch_debs():
    d = os.path.join(OUT, "debs")
    os.makedirs(d, exist_ok=True)
    have = {f.split("_")[0] for f in os.listdir(d) if f.endswith(".deb")}
    want = [p for p in OMPI_DEBS if p not in have]
    if want:
        run(["apt-get", "download", *want], cwd=d)


def main():
    os.makedirs(OUT, exist_ok=True)
    fetch_debs()
    run(["make", "-s", "-j2", "bin/pipecc", "bin/piperun-data", "bin/gpu-kernels"], cwd=ROOT)
    os.makedirs(os.path.join(OUT, "bin"), exist_ok=True)
    shutil.copy(os.path.join(ROOT, "bin", "gpu-kernels"), os.path.join(OUT, "bin", "gpu-kernels"))
    data = make_data()
    only = sys.argv[1:]
    for tag, m, n, s, flags in cases.parity_cases():
        if only and m not in only:
            continue
        compile_plan(os.path.join(OUT, "plans", tag), m, n, s, flags)
        print(f"prepare: built {tag}")
    meta = {"offload": offload_plans(), "cpu_losses": cpu_losses(data)}
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("prepare: done")


if __name__ == "__main__":
    main()
