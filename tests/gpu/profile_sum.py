#!/usr/bin/python3
"""Sums Nsight Compute's per-kernel summary (ncu --print-summary per-kernel --csv, metric
gpu__time_duration.sum) into one line per kernel: total time, calls, share of the step.  Prints the
rows it could not read rather than guess.   profile_sum.py NCU_CSV"""
import csv
import io
import sys

text = open(sys.argv[1], errors="replace").read()
start = next((m for m in (text.find('"Process ID"'), text.find('"ID"')) if m >= 0), -1)
rows = list(csv.DictReader(io.StringIO(text[start:]))) if start >= 0 else []
if not rows:
    print("profile_sum: no CSV table in the ncu output; its first lines:")
    print("\n".join(text.splitlines()[:20]))
    sys.exit(1)
keys = rows[0].keys()
name_k = "Kernel Name" if "Kernel Name" in keys else next((k for k in keys if "Name" in k and "Metric" not in k and "Process" not in k), None)
calls_k = next((k for k in keys if "Invocations" in k), None)
avg_k = next((k for k in keys if k.strip().lower() in ("average", "avg")), None)
unit_k = next((k for k in keys if "Unit" in k), None)
scale = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1.0, "s": 1.0}
tot = {}
for r in rows:
    if "gpu__time_duration" not in r.get("Metric Name", "gpu__time_duration"):
        continue
    try:
        t = float(r[avg_k].replace(",", "")) * scale.get(r.get(unit_k, "ns"), 1e-9) * int(r[calls_k])
    except (KeyError, ValueError, TypeError):
        continue
    name = r[name_k].split("(")[0][:90]
    c, s = tot.get(name, (0, 0.0))
    tot[name] = (c + int(r[calls_k]), s + t)
all_s = sum(s for _, s in tot.values())
print(f"{'kernel':90} {'calls':>6} {'ms':>9} {'share':>6}")
for name, (c, s) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
    print(f"{name:90} {c:6d} {s * 1e3:9.3f} {s / all_s:6.1%}")
print(f"{'total (kernels only, serialised by ncu)':90} {sum(c for c, _ in tot.values()):6d} {all_s * 1e3:9.3f}")
