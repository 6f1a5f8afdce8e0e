#!/usr/bin/python3
"""Builds, on a machine without a GPU, everything tests/gpu/check.sh runs on one (make gpu-prepare):

  .gpu/bin/gpu-kernels       every GPU kernel against its CPU kernel
  .gpu/plans/<case>/         each case of cases.py compiled with --target cuda and built (stage programs,
                             run.sh, plan.json, weights): the same plans the CPU target trains
  .gpu/data/                 the data sets (MNIST IDX, CIFAR-10 batches, a token file)
  .gpu/cpu_losses.json       each model's per-step losses from the CPU target (n = 1), the reference the
                             GPU's must match
  .gpu/lib/libpiperun-cuda.so  the CUDA runtime the plans' stage programs link
  .gpucarry/gpu.tar.xz       all of .gpu/, compressed: what travels to the GPU machine
  .gpu/debs/                 Debian's Open MPI and protobuf-c, unpacked on the GPU machine (it has none)

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
    """The data sets in .gpu/data (--force: prepare run again writes the same bytes over its own files)."""
    d = os.path.join(OUT, "data")
    os.makedirs(d, exist_ok=True)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import test_parity  # noqa: E402  (its MNIST-format data set: bars whose place depends on the label)
    imgs, labels = test_parity.make_dataset(32 * 10, seed=0)
    test_parity.write_dataset(os.path.join(d, "mnist"), imgs, labels)
    run([os.path.join(ROOT, "bin", "piperun-data"), "cifar", os.path.join(d, "cifar"), "--n", "320", "--seed", "3", "--force"])
    run([os.path.join(ROOT, "bin", "piperun-data"), "tokens", os.path.join(d, "tokens.bin"), "--n", "20000", "--vocab", "64", "--seed", "5", "--force"])
    return {"mnist": os.path.join(d, "mnist"), "cifar": os.path.join(d, "cifar"), "tokens": os.path.join(d, "tokens.bin")}


def compile_plan(dst, model, n, sched, flags, target="cuda"):
    path, _, batch, mb, lr, _ = cases.MODELS[model]
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
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
    """gpt and resnet at n = 2: the unlimited plan's busiest arena, then a plan limited to half of it, or,
    where no plan fits half (weights, gradients and optimizer state alone may not), to the leanest plan
    pipecc says there is (every stashed value it can move, moved)."""
    import re
    made = []
    for m in cases.OFFLOAD_MODELS:
        free = os.path.join(OUT, "plans", f"{m}_1f1b_n2")
        with open(os.path.join(free, "plan.json")) as f:
            arenas = [s["arena_bytes"] for s in json.load(f)["stage_plans"]]
        # pipecc's choice (recompute where no peer has room), and the values through host memory to a file.
        for suffix, flags in (("", ()), ("_file", ("--offload", "file:/tmp"))):
            tag = f"{m}_offload{suffix}_n2"
            dst = os.path.join(OUT, "plans", tag)
            limit, note = max(arenas) // 2, "half the busiest arena"
            for _ in range(2):
                r = subprocess.run([PIPECC, os.path.join(ROOT, cases.MODELS[m][0]), "-n", "2", "--schedule", "1f1b", "--batch",
                                    str(cases.MODELS[m][2]), "--microbatches", str(cases.MODELS[m][3]), "--lr", str(cases.MODELS[m][4]),
                                    "--devices", DEVICES, "--target", "cuda", "--mem-limit", str(limit), *flags, "-o", dst],
                                   capture_output=True, text=True, env=ENV)
                lean = re.search(r"the leanest plan needs (\d+) bytes", r.stderr)
                if r.returncode == 0 or not lean:
                    break
                print(f"prepare: {tag}: half the arena ({limit} bytes) does not fit: {r.stderr.strip()}")
                limit, note = int(lean.group(1)), "the leanest plan (half does not fit)"
            if r.returncode:
                print(f"prepare: {tag}: pipecc refused --mem-limit {limit}: {r.stderr.strip()}")
                continue
            run(["make", "-s", "-j2", "-C", dst])
            made.append({"tag": tag, "model": m, "limit": limit, "limit_is": note, "arenas_unlimited": arenas})
    return made


# Open MPI and what it loads, and protobuf-c, as Debian packages (the GPU machine has neither, nor a registry).
OMPI_DEBS = ("openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 "
             "libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libnuma1 libpsm2-2 libpsm-infinipath1 "
             "libmunge2 libatomic1 libudev1 ibverbs-providers libprotobuf-c1").split()


def fetch_debs():
    d = os.path.join(OUT, "debs")
    os.makedirs(d, exist_ok=True)
    have = {f.split("_")[0] for f in os.listdir(d) if f.endswith(".deb")}
    want = [p for p in OMPI_DEBS if p not in have]
    if want:
        run(["apt-get", "download", *want], cwd=d)


# The bench (bench.py): one stage, one micro-batch per step, in each precision.
BENCH = {
    # tag: (onnx, batch, seq, vocab, data)
    "gpt": ("onnx_models/gpt.onnx", 64, 32, 64, "tokens.bin"),
    "resnet": ("onnx_models/resnet.onnx", 64, 1, 10, "cifar"),
    "gpt2_small": ("onnx_models/large/gpt2_small.onnx", 4, 1024, 50257, "tokens_gpt2.bin"),
}


def bench_plans():
    """.gpu/bench/<model>_<precision>/ with bench.json; GPT-2 small's weights (500 MB) stay behind, bench.py
    makes random ones there.  Needs onnx_models/large/ (make models) for GPT-2 small, else it is skipped."""
    run([os.path.join(ROOT, "bin", "piperun-data"), "tokens", os.path.join(OUT, "data", "tokens_gpt2.bin"), "--n", "60000", "--vocab",
         "50257", "--seed", "7", "--force"])
    for name, (path, batch, seq, vocab, data) in BENCH.items():
        if not os.path.exists(os.path.join(ROOT, path)):
            print(f"prepare: bench {name}: {path} is missing (make models): skipped")
            continue
        for prec in ("fp32", "tf32", "bf16"):
            dst = os.path.join(OUT, "bench", f"{name}_{prec}")
            if os.path.exists(dst):
                shutil.rmtree(dst)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            run([PIPECC, os.path.join(ROOT, path), "-n", "1", "--batch", str(batch), "--microbatches", "1", "--lr", "1e-4",
                 "--target", "cuda", "--precision", prec, "-o", dst])
            run(["make", "-s", "-j2", "-C", dst])
            plan = json.load(open(os.path.join(dst, "plan.json")))
            sp = plan["stage_plans"][0]
            wbytes = os.path.getsize(os.path.join(dst, "weights", "stage_0.bin"))
            if wbytes > (8 << 20):
                os.remove(os.path.join(dst, "weights", "stage_0.bin"))
            json.dump({"model": name, "precision": prec, "batch": batch, "seq": seq, "vocab": vocab, "data": data,
                       "flops_per_step": float(sp["fwd_flops"] + sp["bwd_flops"]), "weights_bytes": wbytes},
                      open(os.path.join(dst, "bench.json"), "w"))
            print(f"prepare: bench {name} {prec}")


def feature_plans(data):
    """features.py's plans (.gpu/features/) and its CPU references: lenet's async run and its --val."""
    feat = os.path.join(OUT, "features")
    compile_plan(os.path.join(feat, "gpt_pipefb_n2"), "gpt", 2, "pipefb", ())
    compile_plan(os.path.join(feat, "lenet_async_n2"), "lenet", 2, "async", ("--staleness", "1"))
    ref = os.path.join(ROOT, "build", "gpu-cpu-ref")
    compile_plan(os.path.join(ref, "lenet_async"), "lenet", 2, "async", ("--staleness", "1"), target="cpu")
    log = os.path.join(ref, "lenet_async.csv")
    run([os.path.join(ref, "lenet_async", "run.sh"), "--data", data["mnist"], "--steps", "10", "--quiet", "--log", log])
    out = {"lenet_async_cpu": [float(r["loss"]) for r in csv.DictReader(open(log))]}
    log = os.path.join(ref, "lenet_val.csv")
    run([os.path.join(ref, "lenet", "run.sh"), "--data", data["mnist"], "--steps", "10", "--quiet", "--log", log, "--val", data["mnist"],
         "--val-every", "5"])
    rows = list(csv.DictReader(open(log + ".val.csv")))
    out["lenet_val_cpu"] = [float(r["val_loss"]) for r in rows]
    out["lenet_val_acc_cpu"] = [float(r["val_accuracy"]) for r in rows]
    return out


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
    # The CUDA runtime the plans link (one shared library in the object cache), beside them.
    os.makedirs(os.path.join(OUT, "lib"), exist_ok=True)
    libs = [os.path.join(dp, f) for dp, _, fs in os.walk(ENV["PIPERUN_OBJ_CACHE"]) for f in fs if f == "libpiperun-cuda.so"]
    shutil.copy(max(libs, key=os.path.getmtime), os.path.join(OUT, "lib", "libpiperun-cuda.so"))
    bench_plans()
    meta = {"offload": offload_plans(), "cpu_losses": cpu_losses(data)}
    meta["features"] = feature_plans(data)
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    # One compressed file to carry (the device tool's working tree is limited to 64 MiB).
    carry = os.path.join(ROOT, ".gpucarry")
    os.makedirs(carry, exist_ok=True)
    run(["sh", "-c", f"tar -C {ROOT} -cf - .gpu | xz -T2 -3 > {carry}/gpu.tar.xz.tmp && mv {carry}/gpu.tar.xz.tmp {carry}/gpu.tar.xz"])
    print(f"prepare: done; {os.path.getsize(os.path.join(carry, 'gpu.tar.xz')) >> 20} MiB in .gpucarry/gpu.tar.xz")


if __name__ == "__main__":
    main()
