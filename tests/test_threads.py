"""pipecc --threads T: each rank computes on T threads (runtime/par.c, runtime/gemm.c; docs/kernels.md,
"Threads").

  - bad values (0, 257, a word) are refused naming the flag, and nothing is written;
  - a plan on 2 threads says so: the listing's machine line, plan.json's machine.threads_per_rank, each
    stage's THREADS constant, run.sh leaving mpirun's binding off; the FLOP model's rate is twice the
    one-thread plan's, and each rank stays unpinned;
  - the MLP, the GPT and LeNet train on 2 threads with weights bit-identical to 1 thread at n = 1, and
    at n = 2 (1f1b, zb1) bit-identical to n = 1 on 2 threads: the kernels split only over independent
    outputs, and gemm.c's bands give the bits of one thread (docs/kernels.md, "Threads");
  - the run says it computed on 2 threads;
  - a profile taken on 2 threads says `threads 2`, and a one-thread plan with --costs of it does not merge
    it into the kernel cache (the listing says why).
About 60 s.  Run with /usr/bin/python3."""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)
import test_trace as tt  # noqa: E402  (its paths, check() with the tally, and sh())

ROOT, PIPECC, DATAGEN = tt.ROOT, tt.PIPECC, tt.DATAGEN
check, sh = tt.check, tt.sh
STEPS = 6
MODELS = {"mlp": ("mnist", 64), "gpt": ("tokens", 16), "lenet": ("mnist", 64)}


def compile_(tmp, tag, model, *flags):
    out = os.path.join(tmp, f"{tag}.pipe")
    batch = MODELS[model][1]
    r = sh([PIPECC, os.path.join(ROOT, "onnx_models", f"{model}.onnx"), "--batch", str(batch), "-o", out, *flags])
    if not check(r.returncode == 0, f"{tag}: compiled ({r.stderr.strip()[-300:]})"):
        return None
    r = sh(["make", "-s", "-j2", "-C", out], timeout=600)
    return out if check(r.returncode == 0, f"{tag}: built ({r.stderr.strip()[-300:]})") else None


def train(tag, out, data, *extra):
    """Trains STEPS steps and saves the model; the saved file's bytes, and run.sh's output."""
    saved = os.path.join(out, "trained.onnx")
    r = sh([os.path.join(out, "run.sh"), "--data", data, "--steps", str(STEPS), "--no-shuffle", "--save", saved, *extra])
    if not check(r.returncode == 0, f"{tag}: trained {STEPS} steps ({r.stderr.strip()[-300:]})"):
        return None, ""
    return open(saved, "rb").read(), r.stdout


def refusals(tmp):
    for bad in ("0", "257", "two"):
        out = os.path.join(tmp, f"bad{bad}.pipe")
        r = sh([PIPECC, os.path.join(ROOT, "onnx_models", "mlp.onnx"), "--threads", bad, "-o", out])
        check(r.returncode == 2 and f"pipecc: error: --threads '{bad}'" in r.stderr and not os.path.exists(out),
              f"--threads {bad}: refused naming the flag, nothing written ({r.stderr.strip()[:200]})")


def plan_says(tmp):
    outs = {}
    for t in (1, 2):
        out = os.path.join(tmp, f"plan{t}.pipe")
        r = sh([PIPECC, os.path.join(ROOT, "onnx_models", "gpt.onnx"), "-n", "2", "--batch", "16", "--threads", str(t), "-o", out])
        if not check(r.returncode == 0, f"gpt -n 2 --threads {t}: compiled ({r.stderr.strip()[-200:]})"):
            return
        outs[t] = (json.load(open(os.path.join(out, "plan.json"))), open(os.path.join(out, "schedule.txt")).read(),
                   [open(os.path.join(out, f"stage_{s}.c")).read() for s in range(2)], open(os.path.join(out, "run.sh")).read())
    (p1, l1, s1, r1), (p2, l2, s2, r2) = outs[1], outs[2]
    check(p2["machine"]["threads_per_rank"] == 2 and p1["machine"]["threads_per_rank"] == 1,
          f"plan.json machine.threads_per_rank: {p1['machine']['threads_per_rank']} and {p2['machine']['threads_per_rank']}")
    check("each rank computes on 2 threads (--threads)" in l2 and "--threads" not in l1.split("node costs")[0],
          "the listing's machine lines name the threads on 2 threads only")
    check(all("enum { THREADS = 2 };" in s for s in s2) and all("enum { THREADS = 1 };" in s for s in s1),
          "each stage program's THREADS is the plan's")
    check(all("enum { PIN_CORE = 0, PIN_CORES = 0 }; /* a rank of several threads: not pinned */" in s for s in s2),
          "a rank of several threads is not pinned")
    check("if [ 2 -gt 1 ]" in r2 and "--bind-to none" in r2 and "if [ 1 -gt 1 ]" in r1, "run.sh unbinds the ranks of a 2-thread plan only")
    rate = [float(re.search(r"rank 0: ([0-9.]+) GFLOP/s", x).group(1)) for x in (l1, l2)]
    check(abs(rate[1] / rate[0] - 2) < 0.01, f"the FLOP model's rate on 2 threads is twice one thread's ({rate[0]} -> {rate[1]} GFLOP/s)")


def bits(tmp, data):
    for model, (kind, _) in MODELS.items():
        d = data[kind]
        out = compile_(tmp, f"{model}_n1_t1", model, "-n", "1", "--microbatches", "2")
        base = train(f"{model} n=1 T=1", out, d)[0] if out else None
        runs = {}
        for n, sched in ((1, "1f1b"), (2, "1f1b"), (2, "zb1")):
            out = compile_(tmp, f"{model}_n{n}_{sched}_t2", model, "-n", str(n), "--microbatches", "2", "--schedule", sched, "--threads", "2")
            if not out:
                continue
            w, stdout = train(f"{model} n={n} {sched} T=2", out, d)
            runs[(n, sched)] = w
            check("each rank computes on 2 threads (pipecc --threads)" in stdout, f"{model} n={n} {sched}: the run says it computed on 2 threads")
        one = runs.get((1, "1f1b"))
        check(base is not None and one is not None and base == one, f"{model}: weights on 2 threads bit-identical to 1 thread (n = 1)")
        for key in ((2, "1f1b"), (2, "zb1")):
            w = runs.get(key)
            check(one is not None and w is not None and w == one,
                  f"{model}: weights at n = {key[0]} {key[1]} on 2 threads bit-identical to n = 1 on 2 threads")


def profile(tmp, data):
    out = compile_(tmp, "prof_t2", "mlp", "-n", "1", "--threads", "2", "--profile")
    if not out:
        return
    prof = os.path.join(tmp, "mlp_t2.prof")
    r = sh([os.path.join(out, "run.sh"), "--data", data["mnist"], "--steps", "8", "--profile", prof])
    if not check(r.returncode == 0 and os.path.exists(prof), f"a 2-thread profile written ({r.stderr.strip()[-200:]})"):
        return
    check("\nthreads 2\n" in open(prof).read(), "the profile says it was taken on 2 threads")
    o1 = os.path.join(tmp, "costs_t1.pipe")
    r = sh([PIPECC, os.path.join(ROOT, "onnx_models", "mlp.onnx"), "--batch", "64", "--costs", prof, "--plan-only", "-o", o1])
    ok = r.returncode == 0
    listing = open(os.path.join(o1, "schedule.txt")).read() if ok else ""
    check(ok and "measured on 2 threads per rank, not the plan's 1 (--threads)" in listing,
          f"a one-thread plan does not merge a 2-thread profile into the kernel cache, and says why ({r.stderr.strip()[-200:]})")
    o2 = os.path.join(tmp, "costs_t2.pipe")
    r = sh([PIPECC, os.path.join(ROOT, "onnx_models", "mlp.onnx"), "--batch", "64", "--threads", "2", "--costs", prof, "--plan-only", "-o", o2])
    listing = open(os.path.join(o2, "schedule.txt")).read() if r.returncode == 0 else ""
    check(r.returncode == 0 and "not the plan's" not in listing, "a 2-thread plan merges it")


def main():
    tmp = tempfile.mkdtemp(prefix="pipecc-threads.")
    os.environ.setdefault("PIPECC_CACHE", os.path.join(tmp, "machine.txt"))
    data = {"mnist": os.path.join(tmp, "mnist"), "tokens": os.path.join(tmp, "tokens.bin")}
    sh([DATAGEN, "mnist", data["mnist"], "--n", "512"])
    sh([DATAGEN, "tokens", data["tokens"], "--n", "20000"])
    refusals(tmp)
    plan_says(tmp)
    bits(tmp, data)
    profile(tmp, data)
    return tally.finish()   # the one tally: what the imported suite's helpers counted is in it


if __name__ == "__main__":
    sys.exit(main())
