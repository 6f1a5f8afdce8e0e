#!/usr/bin/python3
"""Building what pipecc generates (issue 15): how long `make -j2` takes on each torchvision model's stage
programs, and how much disk the generated directory takes against the ONNX file (weights once).

  /usr/bin/python3 bench/buildtime.py [--models a,b] [--n 1,4] [--out bench/buildtime.md]

Each model is exported once (torchvision, 10 classes, training mode, opset 14, batch 8 of 3x32x32 images; VGG at 224x224, which its pooling needs) into
bench/work/buildtime/, compiled with `pipecc -n N --batch 8 --microbatches 1` (an export's Reshape may hold its batch of 8), and built with `make -j2` from clean (libpiperun's objects
included, as a user's first build has them); the wall time is the user's wait.  Target: under 15 s on 2 cores.
Writes a markdown table (stdout, and --out)."""
import argparse
import datetime
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORK = os.path.join(HERE, "work", "buildtime")
PIPECC = os.path.join(ROOT, "bin", "pipecc")
MODELS = ["resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "densenet121", "googlenet", "vgg11_bn",
          "shufflenet_v2_x0_5", "squeezenet1_1", "mnasnet0_5", "regnet_y_400mf", "convnext_tiny"]
TARGET_S = 15.0


def export(name, path):
    import torch
    import torchvision
    kw = {"num_classes": 10}
    if name == "googlenet":
        kw.update(aux_logits=False, init_weights=True)
    if name.startswith("efficientnet") or name.startswith("convnext"):
        kw.update(stochastic_depth_prob=0.0)  # a training-mode export cannot hold torch's Bernoulli draws
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)(**kw)
    m.train()
    side = 224 if name.startswith("vgg") else 32  # VGG's 7x7 adaptive pool needs a 224 input to export
    x = torch.randn(8, 3, side, side)
    torch.onnx.export(m, x, path, opset_version=14, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=["input"], output_names=["logits"])


def du(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            p = os.path.join(d, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--n", default="1")
    ap.add_argument("--out", default=os.path.join(HERE, "buildtime.md"))
    a = ap.parse_args()
    os.makedirs(WORK, exist_ok=True)
    rows = []
    for name in a.models.split(","):
        onnx_path = os.path.join(WORK, name + ".onnx")
        if not os.path.exists(onnx_path):
            try:
                export(name, onnx_path)
            except Exception as e:  # noqa: BLE001
                rows.append((name, "-", f"export failed: {str(e)[:120]}", "", "", "", ""))
                continue
        for n in [int(x) for x in a.n.split(",")]:
            out = os.path.join(WORK, f"{name}_n{n}.pipe")
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.time()
            r = subprocess.run([PIPECC, onnx_path, "-n", str(n), "--batch", "8", "--microbatches", "1", "-o", out],
                               capture_output=True, text=True)
            tc = time.time() - t0
            if r.returncode:
                rows.append((name, n, "pipecc: " + (r.stderr.strip().splitlines() or ["?"])[-1][:160], "", "", "", ""))
                continue
            t0 = time.time()
            b = subprocess.run(["make", "-j2"], cwd=out, capture_output=True, text=True)
            tb = time.time() - t0
            lines = sum(1 for f in os.listdir(out) if f.startswith("stage_") and f.endswith(".c")
                        for _ in open(os.path.join(out, f)))
            size, osize = du(out) - du(os.path.join(out, "build")), os.path.getsize(onnx_path)
            note = "" if b.returncode == 0 else "make failed: " + b.stderr.strip()[-160:]
            rows.append((name, n, f"{tb:.1f}", "yes" if b.returncode == 0 and tb < TARGET_S else "NO", f"{tc:.2f}",
                         f"{lines}", f"{size / 2**20:.1f} / {osize / 2**20:.1f} MiB" + (f" ({note})" if note else "")))
            print(rows[-1], flush=True)
            shutil.rmtree(out, ignore_errors=True)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = open("/proc/loadavg").read().split()[:3]
    md = [f"# Building the generated stages (bench/buildtime.py, {now}, load average {' '.join(load)})", "",
          f"`pipecc MODEL -n N --batch 8 --microbatches 1`, then `make -j2` from clean on this 2-core machine "
          f"(libpiperun included). Target: every torchvision model's build under {TARGET_S:.0f} s.", "",
          "| model | n | make -j2 s | < 15 s? | pipecc s | stage C lines | generated dir (no build/) / ONNX file |",
          "|---|---|---|---|---|---|---|"]
    md += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    text = "\n".join(md) + "\n"
    print(text)
    with open(a.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
