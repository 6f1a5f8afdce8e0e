"""The optimizer state and the gradients leave the arena (issue 37): pipecc --offload-optimizer file:DIR.

For each case - a model, n, a schedule, an optimizer - the plain plan is compiled and trained
first.  The case's limit is the least one pipecc names when it refuses --mem-limit 1K with only
these moves allowed (--offload none --recompute none): everything that can leave must.  A case
whose least limit is not under the busiest plain arena is skipped, saying so.  The case checks that:
  - pipecc plans under the limit, plan.json says which stages keep their state or gradients in a
    file (memory_plan.optimizer_in_file_bytes, gradients_in_file), their updates stream them
    (k_sgd_stream / k_adam_stream), the gradients move where there is no state (k_grad_fetch,
    k_grad_put), and every arena (ARENA_BYTES) is at most the limit;
  - the trained losses and the saved weights are bit-identical to the plain plan's over 3 steps
    (on the same convolutions: a plan that fits only with im2col is compared with --conv gemm's);
  - the deep MLP: a checkpoint after step 2 resumed to step 3 gives the same weights and loss again
    (the state is written from the file and read back into it), and a directory that fills up stops
    the job naming the file, leaving nothing behind (as root).
Refusals: host and peer (not yet), a directory that is not one, the schedules with no memory plan
(async, pipefb, chunks), --target cuda, and a limit under what moving can reach names the smallest
limit that fits, which then plans.

For the issue's deep MLP with plain SGD it must be at most 60% of
the busiest plain arena (its gradients come in 96-row bands).

A case that cannot be planned is a failure.  --quick (make test) runs the deep MLP of the issue (16
Linear layers of width 384) with AdamW at n = 4 under zb1 (state, gradients in bands, checkpoint and
resume, a full disk); with no flag (make test-optstate) every sample model and the deep MLP at n = 2
and 4, 1f1b and zb1, SGD with momentum, AdamW and SGD without state (--models=a,b: those alone).  Run
with /usr/bin/python3."""
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
STEPS = 3
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402
import test_memory as tm  # noqa: E402  (its check, run, arenas and train: one copy of each)
from test_memory import arenas, check, run  # noqa: E402

DATA = {"mlp": "mnist", "lenet": "mnist", "resnet": "cifar", "gpt": "tokens", "gpt_opset17": "tokens", "densenet": "cifar",
        "inception": "cifar", "deep_mlp": "npz"}
OPTIMIZERS = {"sgd": ["--optimizer", "sgd", "--momentum", "0.9"], "adamw": ["--optimizer", "adamw", "--lr", "0.001"],
              "sgd0": ["--optimizer", "sgd"]}  # sgd0: no state, only the gradients can leave


def deep_mlp(tmp):
    """The issue's MLP: 16 Linear layers of width 384 with ReLUs between, and its data (512 samples, 384 classes)."""
    import numpy as np
    import torch
    torch.manual_seed(0)
    layers = []
    for i in range(16):
        layers.append(torch.nn.Linear(384, 384))
        if i < 15:
            layers.append(torch.nn.ReLU())
    path = os.path.join(tmp, "deep_mlp.onnx")
    torch.onnx.export(torch.nn.Sequential(*layers), torch.randn(4, 384), path, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "b"}, "y": {0: "b"}}, opset_version=14)
    rng = np.random.default_rng(0)
    np.savez(os.path.join(tmp, "deep_mlp.npz"), x=rng.standard_normal((512, 384)).astype(np.float32),
             y=rng.integers(0, 384, 512).astype(np.int64))
    return path


def model_path(model, tmp):
    return os.path.join(tmp, "deep_mlp.onnx") if model == "deep_mlp" else os.path.join(ROOT, "onnx_models", model + ".onnx")


def compile_plan(model, n, sched, opt, out, tmp, extra=()):
    return run([PIPECC, model_path(model, tmp), "-n", str(n), "--schedule", sched, "--batch", "32", "--microbatches", "8",
                "--devices", DEVICES, "-o", out, *OPTIMIZERS[opt], *extra])


def train(out, data, tmp, tag):
    """Trains 3 steps (test_memory's train): (losses, saved model bytes, stdout) or None."""
    got = tm.train(out, data, tmp, tag)
    return got and (got[0], got[1], got[3])


def stage_facts(out):
    """Per stage of plan.json: (arena, optimizer state in the arena, state in a file, staging bytes)."""
    plan = json.load(open(os.path.join(out, "plan.json")))
    got = []
    for st in plan["stage_plans"]:
        mp = st.get("memory_plan") or {}
        got.append((st["arena_bytes"], st["memory"]["optimizer"], mp.get("optimizer_in_file_bytes", 0), mp.get("optimizer_staging_bytes", 0)))
    return got


def resumed(out, data, tmp, tag, plain_losses, plain_model):
    """Two steps with a checkpoint, then resumed to the third: the plain plan's weights and last loss."""
    ck = os.path.join(tmp, tag + ".ckpt")
    log1, log2, saved = (os.path.join(tmp, tag + s) for s in (".r1.csv", ".r2.csv", ".r.onnx"))
    a = run([os.path.join(out, "run.sh"), "--data", data, "--steps", "2", "--checkpoint", ck, "--checkpoint-every", "2", "--log", log1,
             "--timeout", "120"], timeout=600)
    if not check(a.returncode == 0, f"{tag}: 2 steps with a checkpoint" + ("" if a.returncode == 0 else f" ({(a.stderr or a.stdout).strip()[-300:]})")):
        return
    b = run([os.path.join(out, "run.sh"), "--data", data, "--steps", "3", "--resume", ck, "--log", log2, "--save", saved,
             "--timeout", "120"], timeout=600)
    if not check(b.returncode == 0, f"{tag}: resumed to step 3" + ("" if b.returncode == 0 else f" ({(b.stderr or b.stdout).strip()[-300:]})")):
        return
    losses = [r["loss"] for r in csv.DictReader(open(log1))] + [r["loss"] for r in csv.DictReader(open(log2))]
    check(losses[-1:] == plain_losses[-1:] and open(saved, "rb").read() == plain_model,
          f"{tag}: checkpointed at step 2 and resumed, the plain plan's step-3 loss and weights ({losses[-1:]} vs {plain_losses[-1:]})")


def frozen(plain, out, data, tmp, tag):
    """A freeze event after step 2 (the first 2 layers): its checkpoint writes the state from the file, the re-planned
    program continues; 4 steps give the plain plan's weights and losses."""
    got = []
    for d, name in ((plain, "plain"), (out, "moved")):
        log, saved = os.path.join(tmp, f"fz.{name}.csv"), os.path.join(tmp, f"fz.{name}.onnx")
        x = run([os.path.join(d, "run.sh"), "--data", data, "--steps", "4", "--freeze-at", "2:2", "--log", log, "--save", saved,
                 "--timeout", "120"], timeout=600)
        if not check(x.returncode == 0, f"{tag}: a freeze event after step 2 ({name})" + ("" if x.returncode == 0 else f" ({(x.stderr or x.stdout).strip()[-300:]})")):
            return
        got.append(([r["loss"] for r in csv.DictReader(open(log))], open(saved, "rb").read()))
    check(got[0] == got[1], f"{tag}: with a freeze event the plain plan's losses and weights ({got[1][0][-1:]} vs {got[0][0][-1:]})")


def full_disk(out, data, tmp, tag):
    tiny = os.path.join(tmp, "tiny")
    os.makedirs(tiny, exist_ok=True)
    if os.geteuid() != 0:
        tally.skip(f"{tag}: a full directory stops the job", "the full-disk case needs root to mount a tmpfs")
        return
    if not check(run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", tiny]).returncode == 0, f"{tag}: a one-page tmpfs mounts"):
        return
    try:
        x = run([os.path.join(out, "run.sh"), "--data", data, "--steps", str(STEPS), "--offload-dir", tiny, "--timeout", "60"], timeout=300)
        msg = (x.stderr + x.stdout).strip()
        check(x.returncode != 0 and "moving the optimizer state failed: writing " + tiny + "/pipecc-optstate-" in msg
              and "No space left on device" in msg and not os.listdir(tiny),
              f"{tag}: a full directory stops the job naming the optimizer state's file, nothing left behind (rc {x.returncode}: {msg[-300:]!r})")
    finally:
        run(["umount", tiny])


def case(model, n, sched, opt, tmp, data, store, deep=False):
    tag = f"{model} n={n} {sched} {opt}"
    base = os.path.join(tmp, f"{model}.{n}.{sched}.{opt}")
    r = compile_plan(model, n, sched, opt, base + ".plain", tmp)
    if not check(r.returncode == 0, f"{tag}: the plain plan compiles ({r.stderr.strip()[-300:]})"):
        return
    facts = stage_facts(base + ".plain")
    busiest = max(a for a, _, _, _ in facts)
    # The least limit every stage can reach with its state and gradients in a file: pipecc names it when refusing 1K.
    flags = ["--offload", "none", "--recompute", "none", "--offload-optimizer", "file:" + store]
    r = compile_plan(model, n, sched, opt, base + ".low", tmp, ["--mem-limit", "1K", *flags])
    m = re.search(r"at least (\d+)K", r.stderr)
    if not check(r.returncode != 0 and m is not None, f"{tag}: --mem-limit 1K is refused naming the least limit ({r.stderr.strip()[-200:]!r})"):
        return
    lim = int(m.group(1)) * 1024
    if model == "deep_mlp" and opt == "sgd0":  # the case: its busiest stage at 60% of the plain arena
        check(lim <= 0.6 * busiest, f"{tag}: the least limit that plans is at most 60% of the busiest plain arena "
                                    f"({lim} = {100 * lim / busiest:.1f}% of {busiest})")
    if lim >= busiest:
        tally.skip(f"{tag}: the state and gradients in a file", f"moving them cannot take the busiest plain arena ({busiest}) lower "
                   f"(the least limit is {lim}: the busiest stage holds little of them)")
        return
    out = base + ".opt"
    r = compile_plan(model, n, sched, opt, out, tmp, ["--mem-limit", str(lim), *flags])
    if not check(r.returncode == 0, f"{tag}: plans under --mem-limit {lim} with --offload-optimizer ({r.stderr.strip()[-300:]})"):
        return
    got = stage_facts(out)
    moved = [k for k, (_, _, f, _) in enumerate(got) if f > 0]
    ar = arenas(out)
    check(all(a <= lim for a in ar), f"{tag}: every arena fits the limit ({ar} <= {lim})")
    conv = json.load(open(os.path.join(out, "plan.json"))).get("convolutions")
    if not moved:
        # The least limit may be met by another cut or by im2col's convolutions (no memory beside the arena) alone:
        # then a plain plan on those kernels fits it too, and nothing had to move.
        alt = base + ".alt"
        r = compile_plan(model, n, sched, opt, alt, tmp, ["--mem-limit", str(lim), "--offload", "none", "--recompute", "none"] +
                         (["--conv", "gemm"] if conv == "im2col" else []))
        if check(r.returncode == 0, f"{tag}: nothing moved, so the limit {lim} plans without --offload-optimizer "
                                    f"({conv} convolutions; {r.stderr.strip()[-200:]})"):
            tally.skip(f"{tag}: the state and gradients in a file", f"the least limit ({lim}) is met by the cut and {conv} "
                       "convolutions alone, nothing moves")
        return
    check(all(got[k][1] == 0 for k in moved), f"{tag}: plan.json says stages {moved} keep their optimizer state or gradients in a file")
    plan = json.load(open(os.path.join(out, "plan.json")))
    grads = [k for k, st in enumerate(plan["stage_plans"]) if (st.get("memory_plan") or {}).get("gradients_in_file")]
    text = "".join(open(os.path.join(out, f"stage_{k}.c")).read() for k in moved)
    step, stream = ("k_adam_step(", "k_adam_stream(") if opt == "adamw" else ("k_sgd_step(", "k_sgd_stream(")
    # Every update of a moved stage streams, except (without state) a weight whose gradient stays in the arena (a tied one's).
    left = [g for g in re.findall(re.escape(step) + r"\w+, (\w+),", text) if "#define SIZE_" + g + " " not in text]
    check(stream in text and (step not in text if opt != "sgd0" else not left),
          f"{tag}: the moved stages' updates stream from the file" + (f" (not: {left[:3]})" if left else ""))
    gtext = "".join(open(os.path.join(out, f"stage_{k}.c")).read() for k in grads)
    check(opt != "sgd0" or (grads and "k_grad_fetch(" in gtext and "k_grad_put(" in gtext),
          f"{tag}: the gradients leave too where there is no state (stages {grads} fetch and put them)")
    # A plan that fits its limit only with im2col + GEMM convolutions (pipecc falls back to them when oneDNN's memory beside
    # the arena does not fit) is compared with a plain plan on the same kernels.
    if conv != json.load(open(os.path.join(base + ".plain", "plan.json"))).get("convolutions"):
        r = compile_plan(model, n, sched, opt, base + ".plain", tmp, ["--conv", "gemm"] if conv == "im2col" else [])
        if not check(r.returncode == 0, f"{tag}: the plain plan compiles with {conv} convolutions ({r.stderr.strip()[-300:]})"):
            return
    p = train(base + ".plain", data, tmp, tag.replace(" ", ".") + ".plain")
    q = train(out, data, tmp, tag.replace(" ", ".") + ".opt")
    if not p or not q:
        return
    check(p[0] == q[0] and p[1] == q[1], f"{tag}: bit-identical losses and weights with the state in a file ({q[0][-1:]} vs {p[0][-1:]})")
    if deep:
        resumed(out, data, tmp, tag.replace(" ", "."), p[0], p[1])
        frozen(base + ".plain", out, data, tmp, tag)
        full_disk(out, data, tmp, tag)


def gpt_target(tmp, data, store):
    """The issue's GPT case: AdamW at n = 4 (1f1b, B = 32, m = 8) with its busiest stage at 40% of the plain arena,
    the activations and the weights' side in files: plans, every arena under, bit-identical."""
    tag = "gpt n=4 1f1b adamw at 40%"
    base = os.path.join(tmp, "gpt40")
    r = compile_plan("gpt", 4, "1f1b", "adamw", base + ".plain", tmp)
    if not check(r.returncode == 0, f"{tag}: the plain plan compiles ({r.stderr.strip()[-300:]})"):
        return
    busiest = max(arenas(base + ".plain"))
    lim = int(0.4 * busiest)
    r = compile_plan("gpt", 4, "1f1b", "adamw", base + ".moved", tmp, ["--mem-limit", str(lim), "--offload", "file:" + store,
                                                                      "--offload-optimizer", "file:" + store])
    if not check(r.returncode == 0, f"{tag}: plans under --mem-limit {lim} ({r.stderr.strip()[-300:]})"):
        return
    ar = arenas(base + ".moved")
    check(all(a <= lim for a in ar), f"{tag}: every arena fits ({ar} <= {lim}, the busiest {100 * max(ar) / busiest:.1f}% of {busiest})")
    p = train(base + ".plain", data, tmp, "gpt40.plain")
    q = train(base + ".moved", data, tmp, "gpt40.moved")
    if p and q:
        check(p[0] == q[0] and p[1] == q[1], f"{tag}: bit-identical losses and weights ({q[0][-1:]} vs {p[0][-1:]})")


def refusals(tmp, store):
    lenet = os.path.join(ROOT, "onnx_models", "lenet.onnx")
    cases = [
        (["--offload-optimizer", "host"], "--offload-optimizer host: not supported yet"),
        (["--offload-optimizer", "peer"], "--offload-optimizer peer: not supported yet"),
        (["--offload-optimizer", "disk"], "--offload-optimizer 'disk': expected none or file:DIR"),
        (["--offload-optimizer", "file:" + os.path.join(tmp, "nowhere")], "not a writable directory"),
        (["--offload-optimizer", "file:" + store, "--schedule", "async"], "--schedule async: not supported yet"),
        (["--offload-optimizer", "file:" + store, "--schedule", "pipefb"], "--schedule pipefb: not supported yet"),
        (["--offload-optimizer", "file:" + store, "--schedule", "interleaved"], "--schedule interleaved or zbv: stages of several chunks"),
        (["--offload-optimizer", "file:" + store, "--target", "cuda"], "--target cuda: the GPU streams nothing"),
    ]
    for extra, want in cases:
        out = os.path.join(tmp, "refused")
        r = run([PIPECC, lenet, "-n", "2", "--optimizer", "adamw", "-o", out, *extra])
        check(r.returncode == 2 and want in r.stderr and not os.path.exists(out),
              f"refused: {' '.join(extra[:2])}{' ' + ' '.join(extra[2:]) if extra[2:] else ''} (rc {r.returncode}: {r.stderr.strip()[-200:]!r})")
    # What would take an impossible limit lower: the flag that moves more, or the region that stays.
    r = run([PIPECC, lenet, "-n", "2", "--optimizer", "adamw", "--mem-limit", "1K", "-o", os.path.join(tmp, "low0")])
    check(r.returncode != 0 and "--offload-optimizer file:DIR would move its gradients and optimizer state" in r.stderr,
          f"--mem-limit 1K without --offload-optimizer: the error says it would move the gradients and state ({r.stderr.strip()[-160:]!r})")
    r = run([PIPECC, lenet, "-n", "2", "--optimizer", "adamw", "--mem-limit", "1K", "--offload", "file:" + store, "--offload-optimizer",
             "file:" + store, "-o", os.path.join(tmp, "low1")])
    check(r.returncode != 0 and re.search(r"the fullest stage holds weights [0-9.]+ [KM]iB.*: to go lower its [a-z ]+ would have to move", r.stderr),
          f"--mem-limit 1K with every move: the error says what the fullest stage holds and what would have to move ({r.stderr.strip()[-200:]!r})")
    # A limit under what moving the state reaches: the error names the smallest that fits, which then plans.
    out = os.path.join(tmp, "low")
    r = run([PIPECC, lenet, "-n", "2", "--optimizer", "adamw", "--mem-limit", "1K", "--offload", "none", "--recompute", "none",
             "--offload-optimizer", "file:" + store, "-o", out])
    m = re.search(r"at least (\d+)K", r.stderr)
    if check(r.returncode != 0 and m is not None and not os.path.exists(out), f"--mem-limit 1K is refused naming the smallest limit ({r.stderr.strip()[-200:]!r})"):
        r2 = run([PIPECC, lenet, "-n", "2", "--optimizer", "adamw", "--mem-limit", m.group(1) + "K", "--offload", "none", "--recompute",
                  "none", "--offload-optimizer", "file:" + store, "-o", out])
        check(r2.returncode == 0, f"the limit it named, {m.group(1)}K, plans ({r2.stderr.strip()[-200:]})")


def main():
    quick = "--quick" in sys.argv
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    os.environ.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    with tempfile.TemporaryDirectory(prefix="pipecc-optstate-") as tmp:
        store = os.path.join(tmp, "store")
        os.makedirs(store)
        deep_mlp(tmp)
        data = {"npz": os.path.join(tmp, "deep_mlp.npz")}
        for kind in ("mnist", "cifar"):
            data[kind] = os.path.join(tmp, kind)
            run([DATAGEN, kind, data[kind], "--n", "512"])
        data["tokens"] = os.path.join(tmp, "tokens.bin")
        run([DATAGEN, "tokens", data["tokens"], "--n", "20000"])
        refusals(tmp, store)
        if quick:
            cases = [("deep_mlp", 4, "zb1", "adamw")]
        else:
            only = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--models=")), list(DATA))
            cases = [(m, n, s, o) for m in DATA if m in only for n in (2, 4) for s in ("1f1b", "zb1") for o in OPTIMIZERS]
        for model, n, sched, opt in cases:
            case(model, n, sched, opt, tmp, data[DATA[model]], store, deep=(model == "deep_mlp"))
        if not quick and "gpt" in only:
            gpt_target(tmp, data["tokens"], store)
        check(not os.listdir(store), f"nothing is left in the store directory ({os.listdir(store)})")
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
