#!/usr/bin/python3
"""Regenerates the pictures and lists of docs/schedules.md (`make docs-schedules`).

pipecc itself plans every schedule (`--plan-only`) on a model of near-unit costs: a chain of 16 identical
Gemm layers (128 x 128, built here with the onnx package into a scratch folder), micro-batches of 64 rows,
n = 4 ranks, m = 8 micro-batches, on a described machine (a machine file through PIPECC_CACHE: 50 GFLOP/s a rank,
8 cores so that no ranks share one, links and copies at 1000 GB/s so that messages take next to nothing), with
the kernel cache off.  Every stage then has the same forward time and a backward twice as long, its input- and
weight-gradient halves equal: the unit-time model of the schedules' comments (F = I = W = 1, B = 2).  With
--chunks 2 the same 16 layers make 8 stages of 2 layers.

Writes, for each schedule KIND: docs/schedules/KIND.svg (the plan's timeline.svg, compiler/timeline.c) and
docs/schedules/KIND.txt (the plan's schedule.txt from its "schedule" section on: the unit-time grid and every
rank's action list); and docs/schedules/table.md (predicted bubble, closed form, micro-batches in flight per
rank, ring slots).  Needs bin/pipecc (make all)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PIPECC = os.path.join(ROOT, "bin", "pipecc")
N, M, LAYERS, D, MB = 4, 8, 16, 128, 64
KINDS = [("gpipe", []), ("1f1b", []), ("zb1", []), ("interleaved", ["--chunks", "2"]), ("zbv", ["--chunks", "2"]),
         ("pipefb", []), ("async", ["--staleness", "1"])]


def chain_model(path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "input"
    for i in range(LAYERS):
        inits.append(numpy_helper.from_array((rng.standard_normal((D, D)) * 0.05).astype(np.float32), f"fc{i}.weight"))
        inits.append(numpy_helper.from_array(np.zeros(D, np.float32), f"fc{i}.bias"))
        y = "logits" if i == LAYERS - 1 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [y], name=f"/fc{i}/Gemm", transB=1))
        x = y
    g = helper.make_graph(nodes, "chain16", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", D])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", D])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="docs/schedules/gen.py")
    onnx.checker.check_model(m)
    onnx.save(m, path)


def closed_form(kind):
    """The balanced pipeline's bubble in unit time, where the schedule's comment gives one."""
    n, m = N, M
    return {"gpipe": ((n - 1) / (m + n - 1), "(n-1)/(m+n-1)"), "1f1b": ((n - 1) / (m + n - 1), "(n-1)/(m+n-1)"),
            "zb1": ((n - 1) / (3 * m + n - 1), "(n-1)/(3m+n-1)"), "interleaved": ((n - 1) / (2 * m + n - 1), "(n-1)/(Vm+n-1)"),
            "zbv": ((n - 1) / (6 * m + n - 1), "~(n-1)/(6m+n-1)")}.get(kind, (None, "none"))


def in_flight(actions):
    """Peak micro-batch chunks a rank holds stashed activations for: from the forward (F; on a PipeFB backward rank
    the RECV_STASH) to the last action that reads them (B, or W; on a PipeFB forward rank the SEND_STASH)."""
    open_, peak, last = set(), 0, {}
    for k, a in enumerate(actions):
        if a["kind"] in ("B", "W", "SEND_STASH"):
            last[(a.get("chunk", 0), a["mb"])] = k
    for k, a in enumerate(actions):
        key = (a.get("chunk", 0), a["mb"])
        if a["kind"] in ("F", "RECV_STASH"):
            open_.add(key)
            peak = max(peak, len(open_))
        if last.get(key) == k:
            open_.discard(key)
    return peak


def main():
    if not os.path.exists(PIPECC):
        sys.exit(f"{PIPECC} is missing: make all first")
    kernels = subprocess.run([PIPECC, "--blas-kernels"], capture_output=True, text=True, check=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "chain16.onnx")
        chain_model(model)
        mach = os.path.join(tmp, "machine.txt")
        with open(mach, "w") as f:   # the machine cache's format (compiler/cost.c); its blas line must be this machine's
            f.write(f"# docs/schedules/gen.py: a described machine\n# blas kernels: {kernels}\nrank * flops=50G\n"
                    "link * bandwidth=1000G latency=0us\nmemcpy bandwidth=1000G\nhost cores=8\n")
        env = dict(os.environ, PIPECC_CACHE=mach, PIPECC_KERNEL_CACHE="off")
        for kind, extra in KINDS:
            out = os.path.join(tmp, f"{kind}.pipe")
            cmd = [PIPECC, "chain16.onnx", "-n", str(N), "--batch", str(MB * M), "--microbatches", str(M), "--schedule", kind,
                   "-o", out, "--plan-only"] + extra
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)   # the model named without its scratch folder
            if r.returncode:
                sys.exit(f"{' '.join(cmd)}: {r.stderr.strip()}")
            shutil.copyfile(os.path.join(out, "timeline.svg"), os.path.join(HERE, f"{kind}.svg"))
            with open(os.path.join(out, "schedule.txt")) as f:
                text = f.read()
            with open(os.path.join(HERE, f"{kind}.txt"), "w") as f:
                f.write(f"# pipecc chain16.onnx -n {N} --batch {MB * M} --microbatches {M} --schedule {kind} {' '.join(extra)}"
                        " --plan-only (docs/schedules/gen.py): its schedule.txt from the schedule on\n")
                f.write(text[text.index("\nschedule (") + 1:])
            with open(os.path.join(out, "plan.json")) as f:
                plan = json.load(f)
            if plan.get("ranks"):
                lists = [rk["actions"] for rk in plan["ranks"]]
                by_rank = [[s for s in range(len(plan["stage_plans"])) if s in rk["stages"]] for rk in plan["ranks"]]
            else:
                lists = [sp["actions"] for sp in plan["stage_plans"]]
                by_rank = [[s] for s in range(len(lists))]
            sp = plan["stage_plans"]
            slots = ["+".join(str(sp[s]["nslots"]) for s in stages) for stages in by_rank]
            cf, form = closed_form(kind)
            rows.append((kind, plan["predicted_step_time_s"], plan["bubble"], cf, form, [in_flight(a) for a in lists], slots,
                         plan.get("fill_drain_s")))
    lines = [f"Generated by `make docs-schedules` (docs/schedules/gen.py): chain16 (16 equal Gemm layers), n = {N} ranks, "
             f"m = {M}, F : I : W = 1 : 1 : 1 per stage (B = I + W), messages free; interleaved and zbv at --chunks 2 (8 stages "
             "of 2 layers, so each chunk's F is half a 1-chunk stage's).  In flight: the most micro-batches (chunks: "
             "micro-batch chunks) a rank holds stashed activations for, from the lists (F to its B, or to its W; PipeFB: "
             "F to SEND_STASH on a forward rank, RECV_STASH to B on a backward rank).  "
             "Ring slots: plan.json `nslots` of the rank's stages (in flight + 1 for the receive posted ahead, where the "
             "rank receives).", "",
             "| schedule | predicted step | plan's bubble | closed form | in flight per rank (rank 0..3) | forward ring slots per rank |",
             "|---|---|---|---|---|---|"]
    for kind, step, bub, cf, form, fl, slots, fd in rows:
        extra = f" (steady state; fill and drain once per run: {1e3 * fd:.3f} ms)" if fd else ""
        lines.append(f"| {kind} | {1e3 * step:.3f} ms | {100 * bub:.1f}%{extra} | "
                     + (f"{form} = {100 * cf:.1f}%" if cf is not None else "none") + f" | {', '.join(map(str, fl))} | {', '.join(slots)} |")
    with open(os.path.join(HERE, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
