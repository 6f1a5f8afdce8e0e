#!/usr/bin/python3
"""pipecc benchmarks: `make bench` (or /usr/bin/python3 bench/bench.py).

Writes bench/results.md and bench/results.csv; scratch files go to bench/work/.
Every command runs with a timeout; a case that fails becomes an ERROR row, never a crash.
Each pipecc figure is measured in the same invocation as the figure it is compared with, the two
alternating (pipecc, reference, pipecc, reference, ... BENCH_REPEATS rounds, best median kept).

Environment: BENCH_REPEATS (default 4), BENCH_QUICK=1 (fewer steps, for trying the script out),
BENCH_SKIP (comma list of sections to skip: single,pipeline,memcurve,pipefb,async,freeze,replicas,compiler), BENCH_PIPE_MODELS (comma list:
only these pipeline models), BENCH_MS (comma list of micro-batch counts, default 4,8), BENCH_N4_MS (comma list of the
micro-batch counts that also run at n = 4, default 8; empty: none), BENCH_N4_REPEATS (rounds with the n = 4 runs,
default 2), BENCH_SINGLE_MODELS (comma list: only these
single-stage models).
See bench/README.md for what each row means.
"""
import collections
import csv
import datetime
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

import svgplot

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORK = os.path.join(HERE, "work")
PY = "/usr/bin/python3"
PIPECC = os.path.join(ROOT, "bin", "pipecc")
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
PROBE = os.path.join(ROOT, "bin", "pipecc-probe")
# The kernel-time cache this run fills and plans from (docs/cost.md): its own file, made afresh, so
# every prediction below comes from this run's measurements of this code.
KCACHE = os.path.join(HERE, "work", "kernels.txt")
REPEATS = max(1, int(os.environ.get("BENCH_REPEATS", "4")))
QUICK = os.environ.get("BENCH_QUICK") == "1"
SKIP = set(filter(None, os.environ.get("BENCH_SKIP", "").split(",")))
T0 = time.time()

# ---------------------------------------------------------------- configuration
# (model, batch, pipecc steps, torch steps, data kind).  Sizes chosen so every run takes seconds.
# resnet18 (torchvision, 32x32 input, 10 classes) and gpt2blk (the GPT class at d = 768, 12 heads, T = 128,
# 2 blocks, vocabulary 256) are bench/bench_models.py's, exported into bench/work/models at bench time;
# their steps take about 0.3-0.5 s on one core, hence the few steps.
SINGLE = [
    ("mlp", 64, 400, 300, "mnist"),
    ("lenet", 64, 200, 150, "mnist"),
    ("resnet", 32, 25, 30, "cifar"),
    ("gpt", 8, 150, 60, "tokens"),
    ("resnet18", 32, 15, 10, "cifar"),
    ("gpt2blk", 4, 15, 10, "tokens256"),
]
if os.environ.get("BENCH_SINGLE_MODELS"):
    SINGLE = [c for c in SINGLE if c[0] in os.environ["BENCH_SINGLE_MODELS"].split(",")]
SINGLE_RATIO = 0.8        # issue 15: pipecc -n 1 at most 0.8x PyTorch eager's step time, 1 thread
SGEMM_FRACTION = 0.6      # issue 15: at least 60% of the single-core SGEMM rate on these models
SGEMM_MODELS = ("mlp", "gpt2blk")
SGEMM_N = 2048            # the square SGEMM bench/sgemm_rate.c times
SPEEDUP_N2 = 1.8          # issue 15: n = 2 at least 1.8x n = 1 at m = 8
STEP_TOL, BUBBLE_TOL = 0.10, 0.15   # issue 15: predicted step within 10%, predicted bubble within 15% of measured
# Pipeline cases: (model, batch, pipecc steps, torch Pipe steps, data kind); m in MS, both schedules.
PIPE = [
    ("lenet", 256, 80, 30, "mnist"),
    ("gpt", 32, 60, 30, "tokens"),
]
MS = [int(x) for x in os.environ.get("BENCH_MS", "4,8").split(",") if x]
N4_MS = [int(x) for x in os.environ.get("BENCH_N4_MS", "8").split(",") if x]   # these m also run at n = 4
N4_REPEATS = max(1, min(REPEATS, int(os.environ.get("BENCH_N4_REPEATS", "2"))))   # in the first rounds only: time
if os.environ.get("BENCH_PIPE_MODELS"):
    PIPE = [c for c in PIPE if c[0] in os.environ["BENCH_PIPE_MODELS"].split(",")]
# zb1 (ZB-H1) runs beside 1f1b: its throughput and measured bubble land in the same tables.
SCHEDULES = ["gpipe", "1f1b", "zb1"]
PIPE_THREADS = 2          # torch Pipe gets as many cores as pipecc -n 2 uses
LR = {"mlp": 0.05, "lenet": 0.05, "resnet": 0.02, "gpt": 0.05, "resnet18": 0.02, "gpt2blk": 0.02}
if QUICK:
    SINGLE = [(m, b, min(s, max(20, s // 5)), min(t, max(10, t // 5)), d) for m, b, s, t, d in SINGLE]
    PIPE = [(m, b, max(15, s // 4), max(8, t // 3), d) for m, b, s, t, d in PIPE]

TIMEOUT_COMPILE, TIMEOUT_BUILD, TIMEOUT_RUN, TIMEOUT_TORCH = 120, 300, 180, 240

rows = []           # CSV rows
md_sections = []    # (title, markdown text)
targets = []        # (target, measured, met)


def log(msg):
    print(f"[bench {time.time() - T0:6.1f}s] {msg}", flush=True)


def add_row(section, case, metric, value, unit="", target="", met="", note=""):
    if value is None:
        value = "n/a"
    elif isinstance(value, float):
        value = f"{value:.6g}"
    rows.append({"section": section, "case": case, "metric": metric, "value": value, "unit": unit,
                 "target": target, "met": met, "note": note})


def fmt(x, spec=".2f", na="n/a"):
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return na
    return format(x, spec)


def yes(ok):
    return "n/a" if ok is None else ("yes" if ok else "NO")


# ---------------------------------------------------------------- processes
class CmdError(Exception):
    pass


def kill_group(p, wait):
    """Ends p's process group (SIGTERM, then SIGKILL), waiting up to 5 s after each with wait(timeout)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return None
        try:
            return wait(5)
        except subprocess.TimeoutExpired:
            continue
    return None


def run_cmd(cmd, timeout, cwd=ROOT, env=None, check=True):
    """Run cmd in its own process group; on timeout kill that group.  Returns (rc, out, err, secs)."""
    t = time.time()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(p, lambda t: p.communicate(timeout=t))
        raise CmdError(f"timed out after {timeout} s: {' '.join(cmd)[:200]}")
    secs = time.time() - t
    if check and p.returncode != 0:
        lines = ((err or "") + "\n" + (out or "")).strip().splitlines()
        tail = [ln for ln in lines if "error" in ln.lower() and "mpirun" not in ln.lower()][:2] or lines[-3:]
        raise CmdError(f"exit {p.returncode}: {' '.join(cmd)[:160]}: {' | '.join(tail)[:400]}")
    return p.returncode, out, err, secs


def first_line(cmd):
    try:
        _, out, err, _ = run_cmd(cmd, 30, check=False)
        return ((out or err).strip().splitlines() or ["?"])[0].strip()
    except Exception as e:  # noqa: BLE001
        return f"? ({e})"


class HwmPoller(threading.Thread):
    """Polls /proc for the stage processes of one run and keeps each one's VmHWM (peak RSS)."""

    def __init__(self, exes):
        super().__init__(daemon=True)
        self.exes = {os.path.realpath(e): k for k, e in exes.items()}
        self.hwm, self.seen, self.stop = {}, set(), threading.Event()

    def run(self):
        pids = {}
        while not self.stop.is_set():
            if len(self.seen) < len(self.exes):
                for d in os.listdir("/proc"):
                    if d.isdigit() and d not in pids:
                        try:
                            k = self.exes.get(os.readlink(f"/proc/{d}/exe"))
                        except OSError:
                            continue
                        if k is not None:
                            pids[d] = k
                            self.seen.add(k)
            for pid, k in list(pids.items()):
                try:
                    with open(f"/proc/{pid}/status") as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                self.hwm[k] = max(self.hwm.get(k, 0), int(line.split()[1]) * 1024)
                except OSError:
                    del pids[pid]
            self.stop.wait(0.02)


# ---------------------------------------------------------------- pipecc
MODELS_DIR = os.path.join(WORK, "models")   # bench/bench_models.py's exports


def model_path(model):
    import bench_models
    if model in bench_models.MODELS:
        return bench_models.path_of(model, MODELS_DIR)
    return os.path.join(ROOT, "onnx_models", f"{model}.onnx")


def export_bench_models(names):
    """Exports bench_models.py's models (resnet18, gpt2blk) into bench/work/models (a few seconds)."""
    if names:
        run_cmd([PY, os.path.join(HERE, "bench_models.py"), MODELS_DIR] + list(names), 300)


def compile_plan(model, n, batch, m, sched, out, extra=()):
    cmd = [PIPECC, model_path(model), "-n", str(n), "--batch", str(batch),
           "--microbatches", str(m), "--schedule", sched, "--lr", str(LR[model]), "-o", out] + list(extra)
    run_cmd(cmd, TIMEOUT_COMPILE)
    with open(os.path.join(out, "plan.json")) as f:
        return json.load(f)


def build_pipe(model, n, batch, m, sched):
    d = os.path.join(WORK, f"{model}_n{n}_b{batch}_m{m}_{sched}.pipe")
    plan = compile_plan(model, n, batch, m, sched, d, [])
    run_cmd(["make", "-s", "-j2", "-C", d], TIMEOUT_BUILD)
    return d, plan


def probe_kernels(model, n, batch, m, data, extra=()):
    """Fills the kernel cache (KCACHE) with pipecc's own kernels' times at this plan's micro-batch shapes:
    `pipecc-probe --kernels` (a --profile build at -n n, 16 steps, 3 runs, the fastest kept; docs/cost.md),
    as a user would once per machine.  The plans made afterwards are predicted from it.  extra: more
    pipecc flags (--conv gemm: im2col's convolution times, which a plan under a memory limit may use)."""
    run_cmd([PROBE, "--kernels", model_path(model), "-n", str(n), "--batch", str(batch), "--microbatches", str(m),
             "--data", data, *extra], TIMEOUT_BUILD + TIMEOUT_RUN)


def step_flops(plan):
    return sum(s["fwd_flops"] + s["bwd_flops"] for s in plan["stage_plans"]) * plan["microbatches"]


SUMMARY_RE = re.compile(r"step time ([\d.]+) ms measured, ([\d.]+) ms predicted; bubble ([-\d.]+)% measured")


def run_pipe(d, plan, data, steps):
    """Train `steps` steps; returns per-step times (from the log), the summary and peak RSS per stage."""
    n = plan["stages"]
    logf = d.rstrip("/") + ".log.csv"  # beside the directory: pipecc refuses to recompile over files it did not write
    if os.path.exists(logf):
        os.remove(logf)
    poll = HwmPoller({k: os.path.join(d, f"stage_{k}") for k in range(n)})
    poll.start()
    try:
        _, out, _, secs = run_cmd([os.path.join(d, "run.sh"), "--data", data, "--steps", str(steps), "--log", logf],
                                  TIMEOUT_RUN)
    finally:
        poll.stop.set()
        poll.join(2)
    B = plan["batch"]
    with open(logf) as f:
        dts = [B / float(r["samples_per_s"]) for r in csv.DictReader(f)]
    if len(dts) != steps:
        raise CmdError(f"log has {len(dts)} steps, expected {steps}")
    warm = max(5, steps // 5)
    res = {"dts": dts, "median_s": statistics.median(dts[warm:]), "wall_s": secs, "hwm": poll.hwm, "stages": {}}
    m = SUMMARY_RE.search(out)
    if not m:
        raise CmdError("no summary line in the run's output")
    res["summary_step_s"], res["summary_pred_s"], res["bubble"] = float(m.group(1)) / 1e3, float(m.group(2)) / 1e3, float(m.group(3)) / 100
    tab = out[out.find("stage  compute_s"):].splitlines()[1:1 + n]
    for line in tab:
        f = line.split()
        res["stages"][int(f[0])] = {"compute_s": float(f[1]), "wait_s": float(f[2]), "other_s": float(f[3]),
                                    "arena": int(float(f[4])), "predicted": int(float(f[5]))}
    return res


# ---------------------------------------------------------------- torch
_KERNELS = []


def blas_kernels():
    """The OpenBLAS kernels the stage programs pin (`pipecc --blas-kernels`, runtime/blas_core.h), for PyTorch too:
    torch's own OpenBLAS picks its kernels when it loads and falls back to the oldest ("Prescott", 2-4x slower on
    this Xeon) on a CPU newer than it knows; tests/zoo/run.py does the same.  None if pipecc cannot say."""
    if not _KERNELS:
        k = os.environ.get("OPENBLAS_CORETYPE") or None
        if not k:
            try:
                _, out, _, _ = run_cmd([PIPECC, "--blas-kernels"], 30)
                k = out.strip() or None
            except Exception:  # noqa: BLE001
                k = None
        _KERNELS.append(k)
    return _KERNELS[0]


def torch_env(threads=1):
    """The environment of a PyTorch child process: `threads` OpenMP threads, the stages' BLAS kernels."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MASTER_ADDR="127.0.0.1", GLOG_minloglevel="2")
    if blas_kernels():
        env["OPENBLAS_CORETYPE"] = blas_kernels()
    return env


def torch_run(args, timeout=TIMEOUT_TORCH):
    env = torch_env(1)
    env.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
    _, out, _, _ = run_cmd([PY, os.path.join(HERE, "torch_bench.py")] + args, timeout, env=env)
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise CmdError("torch_bench printed no result")


def best(results):
    ok = [r for r in results if isinstance(r, dict)]
    if not ok:
        raise CmdError(next((str(r) for r in results), "no result"))
    key = "median_s" if "median_s" in ok[0] else "step_s"
    return min(ok, key=lambda r: r[key])


def attempt(fn, *a):
    try:
        return fn(*a)
    except Exception as e:  # noqa: BLE001
        log(f"  error: {e}")
        return CmdError(str(e))


def torch_split(model, plan):
    """Where to cut the torch layer list so it matches pipecc's 2-stage cut (exact for mlp/lenet,
    the nearest block boundary for gpt)."""
    s0, s1 = plan["stage_plans"][0], plan["stage_plans"][1]
    nodes, cut = s0["nodes"] + s1["nodes"], len(s0["nodes"])
    if model in ("mlp", "lenet"):
        return cut, f"exact (after {s0['last_node']})"
    starts = []  # node index where each torch layer starts: embedding, blocks..., head
    for j in range(64):
        idx = next((i for i, nm in enumerate(nodes) if nm.startswith(f"/blocks.{j}/")), None)
        if idx is None:
            break
        starts.append(idx)
    starts.append(next(i for i, nm in enumerate(nodes) if "ln_f" in nm))
    k = min(range(len(starts)), key=lambda i: abs(starts[i] - cut))
    exact = starts[k] == cut
    return k + 1, ("exact" if exact else f"nearest block boundary (pipecc cuts after {s0['last_node']})")


# ---------------------------------------------------------------- sections
def machine_info():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    blas = first_line(["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", "libopenblas0-pthread"])
    if blas.startswith("?") or "no packages" in blas:
        blas = first_line(["sh", "-c", "dpkg-query -W -f '${Package} ${Version}\\n' 'libopenblas0*' | grep -v ' $' | head -1"])
    dirty = first_line(["sh", "-c", "git status --porcelain -- . ':!bench' | wc -l"])
    return [
        ("date", datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")),
        ("machine", f"{platform.node()}, {platform.machine()}, Linux {platform.release()}"),
        ("CPU model", f"{cpu} ({os.cpu_count()} logical CPUs), {mem} RAM"),
        ("load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("torch", first_line([PY, "-c", "import torch; print(torch.__version__)"])),
        ("onnx", first_line([PY, "-c", "import onnx; print(onnx.__version__)"])),
        ("Open MPI", first_line(["mpirun", "--version"])),
        ("OpenBLAS", blas),
        ("OpenBLAS kernels (stage programs and PyTorch)", f"{blas_kernels() or '? (pipecc --blas-kernels failed)'}: "
         "OPENBLAS_CORETYPE for every PyTorch run, as runtime/blas_core.h pins it for the stages"),
        ("clang (stage programs)", first_line(["clang", "--version"])),
        ("cc (pipecc itself)", first_line(["cc", "--version"])),
        ("pipecc commit", first_line(["git", "rev-parse", "--short", "HEAD"]) + f" ({dirty} files modified outside bench/)"),
        ("machine figures pipecc planned with", "see plan.json `machine` (probe cached in ~/.cache/pipecc/machine.txt)"),
    ]


def make_data():
    # --force: a bench run again writes the same data over its own files in work/
    os.makedirs(os.path.join(WORK, "data"), exist_ok=True)
    paths = {"mnist": os.path.join(WORK, "data", "mnist"), "cifar": os.path.join(WORK, "data", "cifar"),
             "tokens": os.path.join(WORK, "data", "tokens.bin"), "tokens256": os.path.join(WORK, "data", "tokens256.bin")}
    run_cmd([DATAGEN, "mnist", paths["mnist"], "--n", "12800", "--seed", "1", "--force"], 120)
    run_cmd([DATAGEN, "cifar", paths["cifar"], "--n", "5000", "--seed", "1", "--force"], 120)
    run_cmd([DATAGEN, "tokens", paths["tokens"], "--n", "200000", "--seed", "1", "--force"], 120)
    run_cmd([DATAGEN, "tokens", paths["tokens256"], "--n", "200000", "--vocab", "256", "--seed", "1", "--force"], 120)
    return paths


Sgemm = collections.namedtuple("Sgemm", "rate kernels peak")


def sgemm_rate():
    """The single-core SGEMM rate (GFLOP/s): bench/sgemm_rate.c, built here against the OpenBLAS the stages link,
    with their kernels (runtime/blas_core.h), an N = SGEMM_N square product, best of 5 calls; and the core's FMA
    peak (GFLOP/s, 0 if not measured).  An Sgemm."""
    exe = os.path.join(WORK, "sgemm_rate")
    src = os.path.join(HERE, "sgemm_rate.c")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        run_cmd(["cc", "-O2", src, "-o", exe, "-lopenblas"], 120)
    _, out, _, _ = run_cmd([exe, str(SGEMM_N), "5"], 120)
    mt = re.search(r"kernels=(\S+) best_gflops=([\d.]+) .*fma_peak_gflops=([\d.]+)", out)
    if not mt:
        raise CmdError(f"sgemm_rate printed {out.strip()[:200]!r}")
    return Sgemm(float(mt.group(2)), mt.group(1), float(mt.group(3)))


def section_single(data, mem_rows, pred_rows):
    sec = "1_single_stage"
    lines = ["| model | batch | pipecc ms/step | PyTorch ms/step | pipecc samples/s | PyTorch samples/s | "
             f"pipecc GFLOP/s | PyTorch GFLOP/s | pipecc % of SGEMM | GFLOP/s that {SINGLE_RATIO}x needs (% of FMA peak) | "
             f"ratio pipecc/PyTorch (time) | met (<= {SINGLE_RATIO})? |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    import bench_models
    extra = [m for m, *_ in SINGLE if m in bench_models.MODELS]
    export_err = None
    if extra:
        log(f"single stage: export {', '.join(extra)} into {os.path.relpath(MODELS_DIR, ROOT)}")
        try:
            export_bench_models(extra)
        except Exception as e:  # noqa: BLE001
            log(f"  error: {e}")
            export_err = f"export: {e}"
    # The SGEMM rate: measured before and after the cases (the larger kept), so a busy moment does not lower it.
    sgemm = []

    def measure_sgemm():
        try:
            sgemm.append(sgemm_rate())
        except Exception as e:  # noqa: BLE001
            log(f"  error: sgemm: {e}")
    measure_sgemm()
    cases = []   # (model, B, pipecc GFLOP/s) for the SGEMM targets, filled below
    need = {}    # line index: the GFLOP/s at SINGLE_RATIO x PyTorch's step, against the FMA peak below
    for model, B, steps, tsteps, kind in SINGLE:
        case = f"{model} B={B}"
        log(f"single stage: {case}")
        try:
            if export_err and model in extra:
                raise CmdError(export_err)
            # The kernels' times at this plan's shapes, as a user would take them once per machine
            # (pipecc-probe --kernels, one rank as the run below): the plan's prediction is made from them.
            probe_kernels(model, 1, B, 1, data[kind])
            d, plan = build_pipe(model, 1, B, 1, "1f1b")
            flops = step_flops(plan)
            pr, tr = [], []
            for _ in range(REPEATS):
                pr.append(attempt(run_pipe, d, plan, data[kind], steps))
                tr.append(attempt(torch_run, ["eager", "--model", model, "--batch", str(B), "--steps", str(tsteps),
                                              "--warmup", str(max(5, tsteps // 5)), "--threads", "1", "--lr", str(LR[model])]))
            p = t = None
            try:
                p = best(pr)
            except CmdError as e:
                add_row(sec, case, "pipecc", "ERROR", note=str(e))
            try:
                t = best(tr)
            except CmdError as e:
                add_row(sec, case, "pytorch", "ERROR", note=str(e))
            ps = p["median_s"] if p else None
            ts = t["step_s"] if t else None
            ratio = ps / ts if p and t else None
            add_row(sec, case, "step_flops", float(flops), "FLOP", note="sum of fwd_flops+bwd_flops over stages x microbatches (plan.json)")
            if p:
                add_row(sec, case, "pipecc_step_time", ps * 1e3, "ms", note=f"median of steps after warm-up, best of {REPEATS}")
                add_row(sec, case, "pipecc_samples_per_s", B / ps, "samples/s")
                add_row(sec, case, "pipecc_gflops", flops / ps / 1e9, "GFLOP/s")
                mem_rows.append((f"{model} n=1 B={B}", plan, p))
                pred_rows.append((f"{model} n=1 B={B} M=1", plan, p))
                cases.append((model, B, flops / ps / 1e9, len(lines)))
            if t:
                add_row(sec, case, "pytorch_step_time", ts * 1e3, "ms", note="torch eager CPU, set_num_threads(1)")
                add_row(sec, case, "pytorch_samples_per_s", B / ts, "samples/s")
                add_row(sec, case, "pytorch_gflops", flops / ts / 1e9, "GFLOP/s")
                need[len(lines)] = (case, flops / (SINGLE_RATIO * ts) / 1e9)
            ok = None if ratio is None else ratio <= SINGLE_RATIO
            if ratio is not None:
                add_row(sec, case, "ratio_pipecc_over_pytorch_time", ratio, "x", f"<= {SINGLE_RATIO}", yes(ok))
                targets.append((f"single stage {case}: pipecc step time <= {SINGLE_RATIO}x PyTorch", f"{ratio:.2f}x", yes(ok)))
            lines.append(f"| {model} | {B} | {fmt(ps and ps * 1e3, na='ERROR')} | {fmt(ts and ts * 1e3, na='ERROR')} | "
                         f"{fmt(ps and B / ps, '.0f', 'ERROR')} | {fmt(ts and B / ts, '.0f', 'ERROR')} | "
                         f"{fmt(ps and flops / ps / 1e9, na='ERROR')} | {fmt(ts and flops / ts / 1e9, na='ERROR')} | "
                         f"@SGEMM@ | @NEED@ | {fmt(ratio)} | {yes(ok)} |")
        except Exception as e:  # noqa: BLE001
            log(f"  error: {e}")
            add_row(sec, case, "case", "ERROR", note=str(e))
            lines.append(f"| {model} | {B} | ERROR: {str(e)[:200]} |||||||||||")
    measure_sgemm()
    rate = max(r.rate for r in sgemm) if sgemm else None
    kernels = sgemm[0].kernels if sgemm else "?"
    peak = max(r.peak for r in sgemm) if sgemm else 0
    if peak:
        add_row(sec, "fma peak", "fma_peak_gflops", peak, "GFLOP/s",
                note="bench/sgemm_rate.c: register-only FMA chains in the widest vectors, 1 core, the larger of "
                     f"{len(sgemm)} measurements: no kernel passes it")
    for li, (case, gf) in need.items():
        lines[li] = lines[li].replace("@NEED@", f"{gf:.1f}" + (f" ({100 * gf / peak:.0f}%)" if peak else ""))
        if peak:
            add_row(sec, case, "gflops_needed_over_fma_peak", gf / peak, "fraction",
                    note=f"FLOPs / ({SINGLE_RATIO} x PyTorch's step) over the FMA peak: above 1, no kernel reaches the target")
    if rate:
        add_row(sec, f"sgemm N={SGEMM_N}", "sgemm_gflops", rate, "GFLOP/s",
                note=f"bench/sgemm_rate.c: cblas_sgemm {SGEMM_N}x{SGEMM_N}x{SGEMM_N}, 1 thread, OpenBLAS {kernels} kernels, "
                     f"best of 5 calls; the larger of {len(sgemm)} measurements ({', '.join(f'{r.rate:.1f}' for r in sgemm)})")
    else:
        add_row(sec, f"sgemm N={SGEMM_N}", "sgemm_gflops", "ERROR", note="bench/sgemm_rate.c failed (see the log)")
    for model, B, gf, li in cases:
        pct = gf / rate if rate else None
        lines[li] = lines[li].replace("@SGEMM@", fmt(pct and 100 * pct, ".0f") + ("%" if pct else ""))
        if model in SGEMM_MODELS:
            ok = None if pct is None else pct >= SGEMM_FRACTION
            add_row(sec, f"{model} B={B}", "pipecc_gflops_over_sgemm", pct, "fraction", f">= {SGEMM_FRACTION}", yes(ok),
                    note="pipecc GFLOP/s (plan.json FLOPs) / the SGEMM rate of this run")
            targets.append((f"single stage {model} B={B}: pipecc GFLOP/s >= {SGEMM_FRACTION:.0%} of single-core SGEMM "
                            f"(N = {SGEMM_N}, 1 thread, this run)",
                            f"{gf:.1f} of {fmt(rate, '.1f')} GFLOP/s = {fmt(pct and 100 * pct, '.0f')}%", yes(ok)))
    lines = [ln.replace("@SGEMM@", "n/a").replace("@NEED@", "n/a") for ln in lines]
    md_sections.append(("1. Single-stage step time (forward + backward + SGD), pipecc `-n 1` (M=1) vs PyTorch eager, 1 thread",
                        "\n".join(lines) + "\n\nStep time: median over the steps after warm-up (pipecc: from the `--log` CSV, "
                        "B / samples_per_s per step; PyTorch: time.perf_counter around zero_grad + forward + cross-entropy + "
                        f"backward + SGD step), best of {REPEATS} alternating runs. GFLOP/s uses pipecc's FLOP count "
                        "(plan.json fwd_flops + bwd_flops over the stages x micro-batches) for both. "
                        f"% of SGEMM: pipecc's GFLOP/s over the single-core SGEMM rate measured in this run, "
                        f"{fmt(rate, '.1f')} GFLOP/s (bench/sgemm_rate.c: cblas_sgemm of {SGEMM_N}x{SGEMM_N} matrices, one "
                        f"thread, OpenBLAS {kernels} kernels as the stages run them, best of 5 calls, measured before and after "
                        f"the cases, the larger kept); target >= {SGEMM_FRACTION:.0%} on {' and '.join(SGEMM_MODELS)}. "
                        f"GFLOP/s that {SINGLE_RATIO}x needs: the FLOPs over {SINGLE_RATIO} x PyTorch's step, beside "
                        f"the core's FMA peak, {fmt(peak or None, '.1f')} GFLOP/s (bench/sgemm_rate.c: independent "
                        "register-only FMAs in the widest vectors; no kernel passes it), so a share near or past 100% "
                        "says the target asks more than this core can do. "
                        "resnet18 = torchvision.models.resnet18(num_classes=10) on 32x32 CIFAR-format images; gpt2blk = the "
                        "sample GPT's class at GPT-2-small width (d = 768, 12 heads, T = 128), 2 blocks, vocabulary 256 "
                        "(bench/bench_models.py; both exported into bench/work/models at bench time, same weights on both sides)."))


def section_pipeline(data, mem_rows, pred_rows, bubble_rows):
    sec = "2_pipeline"
    lines = ["| model | schedule | m | batch | pipecc -n 2 samples/s | pipecc -n 1 (M=1) samples/s | pipecc -n 1 (M=m) samples/s | "
             f"torch Pipe samples/s | -n 2 / -n 1 | bound (bubble, micro-batches) | -n 2 / torch Pipe | met (>= 3)? |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines4 = ["| model | schedule | m | batch | pipecc -n 4 samples/s | pipecc -n 2 samples/s | pipecc -n 1 (M=1) samples/s | "
              "-n 4 / -n 1 | -n 4 / -n 2 |", "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    thr = {}   # model -> {"n1": samples/s, (sched, m): {n: samples/s}, ("torch", m): samples/s}: the plots
    for model, B, steps, tsteps, kind in PIPE:
        log(f"pipeline: {model} B={B}: -n 1 baseline")
        base = None
        try:
            probe_kernels(model, 1, B, 1, data[kind])   # one rank: the baseline runs alone
            d1, plan1 = build_pipe(model, 1, B, 1, "1f1b")
        except Exception as e:  # noqa: BLE001
            d1 = plan1 = None
            add_row(sec, f"{model} B={B} n=1 M=1", "case", "ERROR", note=str(e))
        for m in MS:
            log(f"pipeline: {model} B={B} m={m}: pipecc-probe --kernels -n 2")
            try:
                # Two ranks, both cores busy, as the pipelines run; the n = 4 plans share these shapes.
                probe_kernels(model, 2, B, m, data[kind])
            except Exception as e:  # noqa: BLE001
                log(f"  error: probe: {e}")
                add_row(sec, f"{model} B={B} m={m}", "probe", "ERROR", note=str(e))
            built, built4 = {}, {}
            for sched in SCHEDULES:
                try:
                    built[sched] = build_pipe(model, 2, B, m, sched)
                except Exception as e:  # noqa: BLE001
                    log(f"  error: {e}")
                    built[sched] = CmdError(str(e))
                if m in N4_MS:   # n = 4 (more ranks than cores here: they share them), same profile
                    try:
                        built4[sched] = build_pipe(model, 4, B, m, sched)
                    except Exception as e:  # noqa: BLE001
                        log(f"  error: {e}")
                        built4[sched] = CmdError(str(e))
            try:
                d1m, plan1m = build_pipe(model, 1, B, m, "1f1b")
            except Exception as e:  # noqa: BLE001
                d1m = plan1m = None
            plan2 = next((v[1] for v in built.values() if isinstance(v, tuple)), None)
            split, split_note = (torch_split(model, plan2) if plan2 else (None, ""))
            if plan2 and split is not None:
                notes.append(f"{model} m={m}: torch cut after layer {split} of its flat layer list, {split_note}")
            best_n2 = None   # (ratio, schedule): the target is the best schedule's (see the section's text)
            res = {s: [] for s in SCHEDULES}
            res4 = {s: [] for s in built4}
            r1, r1m, rt = [], [], []
            for rnd in range(REPEATS):
                for sched in SCHEDULES:
                    if isinstance(built[sched], tuple):
                        res[sched].append(attempt(run_pipe, built[sched][0], built[sched][1], data[kind], steps))
                    if isinstance(built4.get(sched), tuple) and rnd < N4_REPEATS:
                        res4[sched].append(attempt(run_pipe, built4[sched][0], built4[sched][1], data[kind], steps))
                if d1:
                    r1.append(attempt(run_pipe, d1, plan1, data[kind], steps))
                if d1m:
                    r1m.append(attempt(run_pipe, d1m, plan1m, data[kind], steps))
                if split is not None:
                    rt.append(attempt(torch_run, ["pipe", "--model", model, "--batch", str(B), "--chunks", str(m),
                                                  "--split", str(split), "--steps", str(tsteps), "--warmup", "5",
                                                  "--threads", str(PIPE_THREADS), "--lr", str(LR[model])]))
            p1 = attempt(best, r1) if r1 else CmdError("-n 1 build failed")
            p1m = attempt(best, r1m) if r1m else CmdError("-n 1 M=m build failed")
            pt = attempt(best, rt) if rt else CmdError("no torch split")
            if base is None and isinstance(p1, dict):
                base = p1
                pred_rows.append((f"{model} n=1 B={B} M=1", plan1, p1))
                mem_rows.append((f"{model} n=1 B={B} M=1", plan1, p1))
            sps1 = B / p1["median_s"] if isinstance(p1, dict) else None
            sps1m = B / p1m["median_s"] if isinstance(p1m, dict) else None
            spst = B / pt["step_s"] if isinstance(pt, dict) else None
            tm = thr.setdefault(model, {"B": B})
            if sps1:
                tm["n1"] = sps1
            tm[("torch", m)] = spst
            for name, v, err in (("pipecc_n1_M1", sps1, p1), ("pipecc_n1_Mm", sps1m, p1m), ("torch_pipe", spst, pt)):
                if v is None:
                    add_row(sec, f"{model} B={B} m={m}", f"{name}_samples_per_s", "ERROR", note=str(err))
                else:
                    add_row(sec, f"{model} B={B} m={m}", f"{name}_samples_per_s", v, "samples/s",
                            note=f"torch Pipe, chunks={m}, checkpoint=never, {PIPE_THREADS} threads" if name == "torch_pipe" else "")
            for sched in SCHEDULES:
                case = f"{model} B={B} m={m} {sched}"
                if isinstance(built[sched], CmdError):
                    add_row(sec, case, "pipecc_n2", "ERROR", note=str(built[sched]))
                    lines.append(f"| {model} | {sched} | {m} | {B} | ERROR: {str(built[sched])[:200]} ||||||||")
                    continue
                plan = built[sched][1]
                p2 = attempt(best, res[sched])
                if not isinstance(p2, dict):
                    add_row(sec, case, "pipecc_n2", "ERROR", note=str(p2))
                    lines.append(f"| {model} | {sched} | {m} | {B} | ERROR: {str(p2)[:200]} ||||||||")
                    continue
                sps2 = B / p2["median_s"]
                r_1 = sps2 / sps1 if sps1 else None
                r_t = sps2 / spst if spst else None
                okt = None if r_t is None else r_t >= 3.0
                bound = n2_bound(plan, sched, sps1, sps1m)
                add_row(sec, case, "pipecc_n2_samples_per_s", sps2, "samples/s")
                if r_1 is not None:
                    add_row(sec, case, "speedup_n2_over_n1", r_1, "x", note=f"bound {fmt(bound)}")
                    if m >= 8 and (best_n2 is None or r_1 > best_n2[0]):
                        best_n2 = (r_1, sched)
                if r_t is not None:
                    add_row(sec, case, "speedup_n2_over_torch_pipe", r_t, "x", ">= 3", yes(okt))
                    targets.append((f"pipeline {case}: -n 2 >= 3x torch Pipe", f"{r_t:.2f}x", yes(okt)))
                lines.append(f"| {model} | {sched} | {m} | {B} | {sps2:.0f} | {fmt(sps1, '.0f', 'ERROR')} | {fmt(sps1m, '.0f', 'ERROR')} | "
                             f"{fmt(spst, '.0f', 'ERROR')} | {fmt(r_1)} | {fmt(bound)} | {fmt(r_t)} | {yes(okt)} |")
                p1f1b = attempt(best, res["1f1b"]) if sched == "zb1" and res.get("1f1b") else None
                if isinstance(p1f1b, dict):
                    add_row(sec, case, "zb1_over_1f1b_samples_per_s", sps2 / (B / p1f1b["median_s"]), "x",
                            note=f"measured bubble zb1 {p2['bubble']:.3f} vs 1f1b {p1f1b['bubble']:.3f}")
                mem_rows.append((f"{model} n=2 B={B} m={m} {sched}", plan, p2))
                pred_rows.append((f"{model} n=2 B={B} m={m} {sched}", plan, p2))
                bubble_rows.append((f"{model} n=2 B={B} m={m} {sched}", plan, p2))
                tm.setdefault((sched, m), {})[2] = sps2
            if best_n2 is not None:
                ok1 = best_n2[0] >= SPEEDUP_N2
                add_row(sec, f"{model} B={B} m={m}", "speedup_n2_over_n1_best", best_n2[0], "x", f">= {SPEEDUP_N2}", yes(ok1),
                        note=f"best schedule: {best_n2[1]}")
                targets.append((f"pipeline {model} B={B} m={m}: -n 2 >= {SPEEDUP_N2}x -n 1 (the best schedule)",
                                f"{best_n2[0]:.2f}x ({best_n2[1]})", yes(ok1)))
            for sched in built4:
                case = f"{model} B={B} m={m} {sched}"
                p4 = built4[sched] if isinstance(built4[sched], CmdError) else attempt(best, res4[sched])
                if not isinstance(p4, dict):
                    add_row(sec, case, "pipecc_n4", "ERROR", note=str(p4))
                    lines4.append(f"| {model} | {sched} | {m} | {B} | ERROR: {str(p4)[:200]} |||||")
                    continue
                plan4 = built4[sched][1]
                sps4 = B / p4["median_s"]
                sps2 = tm.get((sched, m), {}).get(2)
                add_row(sec, case, "pipecc_n4_samples_per_s", sps4, "samples/s",
                        note=f"n = 4 ranks on {os.cpu_count()} cores")
                if sps1:
                    add_row(sec, case, "speedup_n4_over_n1", sps4 / sps1, "x")
                lines4.append(f"| {model} | {sched} | {m} | {B} | {sps4:.0f} | {fmt(sps2, '.0f', 'ERROR')} | "
                              f"{fmt(sps1, '.0f', 'ERROR')} | {fmt(sps1 and sps4 / sps1)} | {fmt(sps2 and sps4 / sps2)} |")
                mem_rows.append((f"{model} n=4 B={B} m={m} {sched}", plan4, p4))
                pred_rows.append((f"{model} n=4 B={B} m={m} {sched}", plan4, p4))
                bubble_rows.append((f"{model} n=4 B={B} m={m} {sched}", plan4, p4))
                tm.setdefault((sched, m), {})[4] = sps4
    plots = pipeline_plots(thr)
    md_sections.append(("2. Pipeline throughput: pipecc `-n 2` vs `-n 1` vs torch GPipe (`torch.distributed.pipeline.sync.Pipe`)",
                        "\n".join(lines) + "\n\n"
                        f"samples/s = batch / median step time (after warm-up), best of {REPEATS} alternating runs. "
                        "`-n 1 (M=1)` is the single-stage baseline the ratio uses (whole batch at once); `-n 1 (M=m)` runs the same "
                        "micro-batches without a pipeline, which separates the cost of smaller micro-batches from the pipeline's gain. "
                        f"torch Pipe: 2 nn.Sequential partitions, chunks=m, checkpoint='never' (pipecc does not recompute), "
                        f"torch.set_num_threads({PIPE_THREADS}) (the cores pipecc -n 2 uses); on CPU Pipe runs every partition "
                        "on one worker thread, so it gets no pipeline overlap, only intra-op threads. torch Pipe is GPipe only: the "
                        "same figure is used for every pipecc schedule; zb1 is the zero-bubble ZB-H1 schedule (backward split into "
                        "input- and weight-gradient halves, W's deferred into the bubble).  Bound: the most -n 2 / -n 1 a "
                        "schedule can reach, 2 x (1 - its ideal bubble) x (-n 1 (M=m) / -n 1 (M=1)), with GPipe's and 1F1B's "
                        "ideal bubble (p-1)/(m+p-1) and ZB-H1's from the plan's own stage times at the medians "
                        "(plan.json bubble_at_medians, which also counts the imbalance of the cut): at m = 8 GPipe and 1F1B "
                        f"cannot reach {SPEEDUP_N2}x unless smaller micro-batches run faster, so the target "
                        f"(n = 2 at least {SPEEDUP_N2}x n = 1 at m = 8) is judged on the best schedule.\n\n" + "\n".join(f"- {n}" for n in dict.fromkeys(notes))
                        + (f"\n\nn = 4 (m in {N4_MS}, the same profile as n = 2, in the first {N4_REPEATS} of the alternating "
                           f"rounds, best kept; {os.cpu_count()} cores here, so 4 ranks share them: reported, no target):\n\n" + "\n".join(lines4) if len(lines4) > 2 else "")
                        + "".join(f"\n\n![{t}]({os.path.basename(f)})" for f, t in plots)))


def n2_bound(plan, sched, sps1, sps1m):
    """The most -n 2 / -n 1 (M=1) schedule `sched` can reach: two ranks busy all but its ideal bubble, each
    at the -n 1 (M=m) rate.  GPipe and 1F1B: plan.json ideal_bubble, (p-1)/(m+p-1); ZB-H1: the plan's own
    simulated bubble at the median stage times (it has no closed form once W fills the drain)."""
    if not sps1 or not sps1m:
        return None
    bub = plan.get("bubble_at_medians") if sched == "zb1" else plan.get("ideal_bubble")
    return None if bub is None else 2 * (1 - bub) * sps1m / sps1


def pipeline_plots(thr):
    """bench/pipeline_<model>.svg: samples/s against the number of stages n (1, 2, 4), one line per schedule and m
    (n = 1 is the -n 1 (M = 1) baseline), torch Pipe at n = 2 and linear scaling from n = 1 for reference.
    Returns [(path, title)] of the plots written."""
    out = []
    for model, tm in thr.items():
        series = []
        n1 = tm.get("n1")
        for m in MS:
            for sched in SCHEDULES:
                pts = tm.get((sched, m), {})
                if not pts:
                    continue
                series.append({"name": f"{sched} m={m}", "points": [(1, n1)] + sorted(pts.items()),
                               "dash": None if m == max(MS) else "4,3"})
        tp = [(2, tm.get(("torch", m))) for m in MS if tm.get(("torch", m))]
        if tp:
            series.append({"name": "torch Pipe (n = 2)", "points": tp, "line": False, "color": "#7f7f7f", "marker": "cross"})
        if not series or not n1:
            continue
        nmax = max(n for s in series for n, _ in s["points"])
        ymax = 1.15 * max(y for s in series for _, y in s["points"] if y)   # the linear line may leave the plot
        series.append({"name": "linear from n = 1", "points": [(1, n1), (nmax, n1 * nmax)], "size": 0, "dash": "2,3",
                       "color": "#999"})
        path = os.path.join(HERE, f"pipeline_{model}.svg")
        title = f"{model}, B = {tm['B']}: throughput against pipeline stages"
        try:
            svgplot.plot(path, series, title=title, xlabel="pipeline stages n (MPI ranks)", ylabel="samples/s",
                         xlim=(0.8, nmax + 0.2), ylim=(0, ymax),
                         notes=[f"median step after warm-up, best of {REPEATS} alternating runs ({N4_REPEATS} at n = 4; section 2); n = 1: "
                                f"-n 1 --microbatches 1; this machine has {os.cpu_count()} cores, so n = 4 ranks share them."])
            out.append((path, title))
        except Exception as e:  # noqa: BLE001
            log(f"  error: plot {path}: {e}")
    return out


def section_bubble(bubble_rows, pred_rows):
    sec = "3_bubble_prediction"
    lines = ["| case | measured bubble | analytic (p-1)/(m+p-1) | plan.json bubble (with imbalance) | measured / analytic | "
             f"plan / measured | met (plan within {BUBBLE_TOL:.0%})? |",
             "|---|---|---|---|---|---|---|"]
    for case, plan, r in bubble_rows:
        p, m = plan["stages"], plan["microbatches"]
        ana = (p - 1) / (m + p - 1)
        meas, pb = r["bubble"], plan["bubble"]
        rel = meas / ana if ana else None
        prel = pb / meas if meas > 0 else None
        ok = abs(pb - meas) <= BUBBLE_TOL * max(meas, 1e-9)   # as bench/predict.py: relative to the measured bubble
        add_row(sec, case, "bubble_measured", meas, "fraction", note="runtime summary: 1 - sum(compute)/(p x wall), whole run")
        add_row(sec, case, "bubble_analytic", ana, "fraction")
        add_row(sec, case, "bubble_plan", pb, "fraction")
        add_row(sec, case, "bubble_measured_over_analytic", rel, "x")
        add_row(sec, case, "bubble_plan_over_measured", prel, "x", f"within {BUBBLE_TOL:.0%} of measured", yes(ok))
        targets.append((f"bubble {case}: predicted (plan.json) within {BUBBLE_TOL:.0%} of measured",
                        f"{pb:.3f} vs {meas:.3f} ({fmt(prel)}x; analytic {ana:.3f})", yes(ok)))
        lines.append(f"| {case} | {meas:.3f} | {ana:.3f} | {pb:.3f} | {fmt(rel)} | {fmt(prel)} | {yes(ok)} |")
    lines += ["", "| case | node costs | predicted step ms (plan.json) | measured median ms | measured mean ms (summary) | "
              f"predicted / measured | met (within {STEP_TOL:.0%})? |",
              "|---|---|---|---|---|---|---|"]
    seen = set()
    pts = {}   # series name -> [(measured ms, predicted ms)] for the plot
    for case, plan, r in pred_rows:
        if case in seen:
            continue
        seen.add(case)
        pred, meas = plan["predicted_step_time_s"], r["median_s"]
        ratio = pred / meas
        ok = abs(pred - meas) <= STEP_TOL * meas
        add_row(sec, case, "step_predicted", pred * 1e3, "ms")
        add_row(sec, case, "step_measured_median", meas * 1e3, "ms")
        add_row(sec, case, "step_measured_mean", r["summary_step_s"] * 1e3, "ms", note="runtime summary, whole run")
        add_row(sec, case, "step_predicted_over_measured", ratio, "x", f"within {STEP_TOL:.0%} of measured", yes(ok))
        targets.append((f"prediction {case}: within {STEP_TOL:.0%} of measured step",
                        f"{pred * 1e3:.2f} vs {meas * 1e3:.2f} ms ({ratio:.2f}x)", yes(ok)))
        costs = bool(plan.get("machine", {}).get("costs"))
        cached = plan.get("machine", {}).get("kernel_cache", {}).get("nodes_from_cache", 0)
        how = ("measured (--costs)" if costs else
               f"kernel cache ({cached} of {cached + plan['machine']['kernel_cache']['nodes_from_flops']} nodes)" if cached
               else "FLOPs / probed rate")
        lines.append(f"| {case} | {how} | {pred * 1e3:.2f} | {meas * 1e3:.2f} | {r['summary_step_s'] * 1e3:.2f} | {ratio:.2f} | {yes(ok)} |")
        key = f"n = {plan['stages']}, " + ("--costs" if costs else "kernel cache" if cached else "FLOP model")
        pts.setdefault(key, []).append((meas * 1e3, pred * 1e3))
    plot = prediction_plot(pts)
    md_sections.append(("3. Bubble and step time: measured vs analytic / predicted", "\n".join(lines) + "\n\n"
                        "Measured bubble = the runtime summary's 1 - (sum of stage compute) / (stages x wall time) over the "
                        "whole run: it counts imbalance, MPI waits and the optimizer step as bubble. The plan's bubble is the "
                        "compiler's simulation with its own (unequal) stage times; the analytic (p-1)/(m+p-1) is shown for "
                        f"reference. Met = |plan bubble - measured| <= {BUBBLE_TOL:.0%} of measured; |predicted step - "
                        f"measured| <= {STEP_TOL:.0%} of measured (issue 15; bench/predict.py, `make bench-predict`, has the "
                        "full n x schedule matrix against the same targets). Node costs: every plan of sections 1 and 2 is "
                        "predicted from the kernel cache (bench/work/kernels.txt, made afresh by this run), which "
                        "`pipecc-probe --kernels` fills at the plan's batch and micro-batches before it is planned, as a user "
                        "would once per machine (16 steps, 3 runs, the fastest run's per-node medians; docs/cost.md): at -n 1 "
                        "for the single-stage plans, at -n 2 (both cores busy, as the pipelines run) for the n = 2, n = 4 and "
                        "n = 1 (M = m) plans."
                        + (f"\n\n![{plot[1]}]({os.path.basename(plot[0])})" if plot else "")))


def prediction_plot(pts):
    """bench/prediction.svg: every (measured, predicted) step time of section 3, log-log, with the +-10% band."""
    vals = [v for p in pts.values() for q in p for v in q if v > 0]
    if not vals:
        return None
    lo, hi = min(vals) / 1.3, max(vals) * 1.3
    series = [{"name": k, "points": sorted(v), "line": False} for k, v in sorted(pts.items())]
    series.append({"name": "predicted = measured", "points": [(lo, lo), (hi, hi)], "size": 0, "dash": "5,3", "color": "#333"})
    series.append({"name": f"+{STEP_TOL:.0%}", "points": [(lo, lo * (1 + STEP_TOL)), (hi, hi * (1 + STEP_TOL))], "size": 0,
                   "dash": "2,3", "color": "#999"})
    series.append({"name": f"-{STEP_TOL:.0%}", "points": [(lo, lo * (1 - STEP_TOL)), (hi, hi * (1 - STEP_TOL))], "size": 0,
                   "dash": "2,3", "color": "#999"})
    path = os.path.join(HERE, "prediction.svg")
    title = "predicted against measured step time (section 3)"
    try:
        svgplot.plot(path, series, title=title, xlabel="measured median step, ms (log scale)",
                     ylabel="predicted step (plan.json), ms (log scale)", xlim=(lo, hi), ylim=(lo, hi), xlog=True, ylog=True,
                     notes=[f"every pipecc run of sections 1 and 2 (n = 1, 2, 4); target: within {STEP_TOL:.0%} "
                            "(between the dotted lines)."])
    except Exception as e:  # noqa: BLE001
        log(f"  error: plot {path}: {e}")
        return None
    return path, title


def section_memory(mem_rows):
    sec = "4_memory"
    lines = ["| case | stage | peak RSS (VmHWM) MiB | arena MiB | predicted MiB | arena / predicted | RSS - arena MiB |",
             "|---|---|---|---|---|---|---|"]
    seen = set()
    for case, plan, r in mem_rows:
        if case in seen:
            continue
        seen.add(case)
        for k in range(plan["stages"]):
            s = r["stages"].get(k)
            h = r["hwm"].get(k)
            if not s:
                continue
            ratio = s["arena"] / s["predicted"] if s["predicted"] else None
            add_row(sec, f"{case} stage {k}", "peak_rss", h if h is not None else "n/a", "bytes",
                    note="VmHWM of the stage process, polled from /proc while it ran")
            add_row(sec, f"{case} stage {k}", "arena_bytes", s["arena"], "bytes")
            add_row(sec, f"{case} stage {k}", "predicted_bytes", s["predicted"], "bytes")
            add_row(sec, f"{case} stage {k}", "arena_over_predicted", ratio, "x")
            mib = 2 ** 20
            lines.append(f"| {case} | {k} | {fmt(h and h / mib, '.1f')} | {s['arena'] / mib:.2f} | {s['predicted'] / mib:.2f} | "
                         f"{fmt(ratio)} | {fmt(h and (h - s['arena']) / mib, '.1f')} |")
    md_sections.append(("4. Peak memory per stage", "\n".join(lines) + "\n\n"
                        "Peak RSS: VmHWM from /proc/<pid>/status of each stage process, polled every 20 ms while it runs "
                        "(includes Open MPI, OpenBLAS and libc; `RSS - arena` is that fixed overhead plus anything outside the "
                        "arena). arena = the stage's static arena (bytes its program allocates for weights, gradients, "
                        "stashed activations, messages, workspace); predicted = the partitioner's memory model (plan.json "
                        "stage memory total). No target was set for these: they are reported."))


def section_compiler():
    sec = "6_compiler"
    model = os.path.join(ROOT, "onnx_models", "large", "gpt2_small.onnx")
    try:
        if not os.path.exists(model):
            log("compiler: onnx_models/large/gpt2_small.onnx missing: make models")
            run_cmd(["make", "-C", ROOT, "models"], 600)
        size = os.path.getsize(model)
        out = os.path.join(WORK, "gpt2_small_plan.pipe")
        use_time = os.access("/usr/bin/time", os.X_OK)
        times, rss = [], []
        # The first run reads the file into the page cache as the machine left it (this VM's DAMON reclaims
        # idle page cache, so after the other sections that is often from disk): reported, not counted.
        for _ in range(4):
            cmd = [PIPECC, model, "-n", "8", "--plan-only", "-o", out]
            if use_time:
                _, _, err, _ = run_cmd(["/usr/bin/time", "-f", "BENCHTIME %e %M"] + cmd, 300)
                mt = re.search(r"BENCHTIME ([\d.]+) (\d+)", err)
                times.append(float(mt.group(1)))
                rss.append(int(mt.group(2)) * 1024)
            else:  # a fresh python whose only child is pipecc, so RUSAGE_CHILDREN is pipecc's
                code = ("import resource,subprocess,sys,time;t=time.time();subprocess.run(sys.argv[1:],check=True,"
                        "stdout=subprocess.DEVNULL);print('BENCHTIME',time.time()-t,resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
                _, o, _, _ = run_cmd([PY, "-c", code] + cmd, 300)
                mt = re.search(r"BENCHTIME ([\d.]+) (\d+)", o)
                times.append(float(mt.group(1)))
                rss.append(int(mt.group(2)) * 1024)
        first, times = times[0], times[1:]
        t_med, t_min, peak = statistics.median(times), min(times), max(rss)
        ratio = peak / size
        ok_t, ok_m = t_med < 1.0, ratio < 1.3   # issue 15: under 1 s, peak under 1.3x the file
        with open(os.path.join(out, "plan.json")) as f:
            plan = json.load(f)
        add_row(sec, "gpt2_small -n 8 --plan-only", "onnx_file_size", size, "bytes")
        add_row(sec, "gpt2_small -n 8 --plan-only", "time_median", t_med, "s", "< 1 s", yes(ok_t),
                note=f"3 runs: {', '.join(f'{x:.2f}' for x in times)}, after a first run of {first:.2f} s "
                     f"({'GNU time' if use_time else 'getrusage'})")
        add_row(sec, "gpt2_small -n 8 --plan-only", "time_first_run", first, "s", note="page cache as the earlier sections left it")
        add_row(sec, "gpt2_small -n 8 --plan-only", "time_min", t_min, "s")
        add_row(sec, "gpt2_small -n 8 --plan-only", "peak_rss", peak, "bytes")
        add_row(sec, "gpt2_small -n 8 --plan-only", "peak_rss_over_onnx_size", ratio, "x", "< 1.3", yes(ok_m))
        targets.append(("compiler: gpt2_small -n 8 --plan-only < 1 s",
                        f"{t_med:.2f} s (median of 3 after a first run of {first:.2f} s, min {t_min:.2f})", yes(ok_t)))
        targets.append(("compiler: peak RSS < 1.3x ONNX file size", f"{peak / 2**20:.0f} MiB = {ratio:.2f}x of {size / 2**20:.0f} MiB", yes(ok_m)))
        md_sections.append(("6. The compiler: `bin/pipecc onnx_models/large/gpt2_small.onnx -n 8 --plan-only`",
                            "| ONNX file | nodes | parameters | time s (median of 3) | runs | first run s | peak RSS MiB | peak / file size | met (< 1 s)? | met (< 1.3x)? |\n"
                            "|---|---|---|---|---|---|---|---|---|---|\n"
                            f"| {size / 2**20:.0f} MiB | {plan.get('nodes')} | {plan.get('parameters'):,} | {t_med:.2f} | "
                            f"{', '.join(f'{x:.2f}' for x in times)} | {first:.2f} | {peak / 2**20:.0f} | {ratio:.2f} | {yes(ok_t)} | {yes(ok_m)} |\n\n"
                            f"Measured with {'GNU time (`/usr/bin/time -f %e %M`)' if use_time else 'getrusage(RUSAGE_CHILDREN)'}; "
                            "wall time, reading the file included.  The first run finds the page cache as the earlier sections "
                            "left it (on this VM, DAMON reclaims idle page cache, so often the file comes from disk); it is "
                            "shown, and the target is the median of the 3 runs after it, with the file cached."))
    except Exception as e:  # noqa: BLE001
        log(f"  error: {e}")
        add_row(sec, "gpt2_small -n 8 --plan-only", "case", "ERROR", note=str(e))
        md_sections.append(("6. The compiler", f"ERROR: {e}"))


# ---------------------------------------------------------------- output
def tree_stamp():
    """mtimes of what the measured programs are built from, to notice a rebuild during the run."""
    paths = [PIPECC] + sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, "runtime")) for f in fs)
    return {p: os.path.getmtime(p) for p in paths if os.path.isfile(p)}


def write_outputs(info, stamp0):
    with open(os.path.join(HERE, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["section", "case", "metric", "value", "unit", "target", "met", "note"])
        w.writeheader()
        w.writerows(rows)
    out = ["# pipecc benchmark results", "",
           f"Written by `make bench` (bench/bench.py) in {time.time() - T0:.0f} s. "
           "Every figure is from this one invocation; the machine may have been shared, see the load averages.", "",
           "| | |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in info]
    out += [f"| load average at end | {' '.join(f'{x:.2f}' for x in os.getloadavg())} |", "",
            "Configuration: " + "; ".join(f"{m} B={b}: pipecc {s} steps, PyTorch {t} steps" for m, b, s, t, _ in SINGLE)
            + "; pipeline " + "; ".join(f"{m} B={b}: pipecc {s} steps, torch Pipe {t} steps" for m, b, s, t, _ in PIPE)
            + f"; m in {MS} (n = 2), {N4_MS} (n = 4); {REPEATS} alternating repeats, best median kept; warm-up = max(5, steps/5) steps. "
            "Synthetic data from bin/piperun-data (MNIST/CIFAR-10/token formats) for pipecc, random tensors for PyTorch.", "",
            "## Targets", "", "| target | measured | met? |", "|---|---|---|"]
    out += [f"| {t} | {m} | {ok} |" for t, m, ok in targets]
    met = sum(1 for t in targets if t[2] == "yes")
    changed = [os.path.relpath(p, ROOT) for p, t in tree_stamp().items() if stamp0.get(p) != t]
    if changed:
        out += ["", f"**Warning:** {', '.join(changed)} changed while the benchmark ran (someone rebuilt pipecc or edited "
                "the runtime): figures from before and after the change are mixed. Run `make bench` again on a quiet tree."]
    out += ["", f"{met} of {len(targets)} targets met. Errors: {sum(1 for r in rows if r['value'] == 'ERROR')}.", ""]
    for title, body in md_sections:
        out += [f"## {title}", "", body, ""]
    errs = [r for r in rows if r["value"] == "ERROR"]
    if errs:
        out += ["## Errors", ""] + [f"- {r['section']} / {r['case']} / {r['metric']}: {r['note']}" for r in errs] + [""]
    with open(os.path.join(HERE, "results.md"), "w") as f:
        f.write("\n".join(out))


def main():
    os.makedirs(WORK, exist_ok=True)
    if os.path.exists(KCACHE):
        os.remove(KCACHE)
    os.environ["PIPECC_KERNEL_CACHE"] = KCACHE
    log(f"pipecc bench: repeats={REPEATS}{' QUICK' if QUICK else ''}; scratch in {WORK}")
    info = machine_info()
    stamp0 = tree_stamp()
    for tool in (PIPECC, DATAGEN):
        if not os.access(tool, os.X_OK):
            log(f"{tool} missing: make all")
            try:
                run_cmd(["make", "-C", ROOT, "all"], 600)
            except Exception as e:  # noqa: BLE001
                add_row("setup", "make all", "case", "ERROR", note=str(e))
    mem_rows, pred_rows, bubble_rows = [], [], []
    try:
        data = make_data()
    except Exception as e:  # noqa: BLE001
        add_row("setup", "data", "case", "ERROR", note=str(e))
        data = None
    if data and "single" not in SKIP:
        section_single(data, mem_rows, pred_rows)
    if data and "pipeline" not in SKIP:
        section_pipeline(data, mem_rows, pred_rows, bubble_rows)
    if bubble_rows or pred_rows:
        section_bubble(bubble_rows, pred_rows)
    if mem_rows:
        section_memory(mem_rows)
    if data and "memcurve" not in SKIP:
        import memcurve   # section 5: --mem-limit with offload / recompute vs torch checkpointing
        memcurve.section_memcurve(sys.modules[__name__], data)
    if data and "pipefb" not in SKIP:
        import fbbench   # section 7: --schedule pipefb against 1f1b and 1f1b with peer offload
        fbbench.section_fb(sys.modules[__name__], data)
    if data and "async" not in SKIP:
        import asyncbench   # section 8: --schedule async against 1f1b and zb1; exposed communication
        asyncbench.section_async(sys.modules[__name__], data)
    if data and "freeze" not in SKIP:
        import freezebench   # section 9: time to accuracy with --freeze auto against no freezing and torch Pipe
        freezebench.section_freeze(sys.modules[__name__], data)
    if "replicas" not in SKIP:
        import replicabench   # section 10: 4 ranks as stages or replicas, beside torch DDP; --ranks 4's choice
        replicabench.section_replicas(sys.modules[__name__])
    if "compiler" not in SKIP:
        log("compiler: gpt2_small -n 8 --plan-only")
        section_compiler()
    write_outputs(info, stamp0)
    log(f"wrote bench/results.md and bench/results.csv ({len(targets)} targets, "
        f"{sum(1 for t in targets if t[2] == 'yes')} met)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
