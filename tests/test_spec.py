#!/usr/bin/python3
"""The stage spec's messages: plan.json and the stage programs state the same ones, and they pair up.

Each stage's spec (compiler/spec.c) gives every value it receives or sends per micro-batch a peer rank
and a tag (its number among the values between the two ranks).  plan.json states them
(stage_plans[s].messages) and the C renderer prints them into stage_<s>.c's RECV and SEND tables.
For every sample model at n = 2 and 4, direct and relayed routes (and pipefb, and two chunks per rank
under interleaved and zbv, where a rank's program is its stages' joined and plan.json's "ranks" state its
messages; a value between two chunks of one rank is sent to the rank itself), this checks:
  * plan.json's messages are the programs' tables, value by value (name, bytes, peer, tag);
  * every send from s to p has exactly one receive on p from s with the same value, bytes and tag, and
    the other way round (so no message can be posted without its match);
  * the tags between two ranks are 0..k-1, each once.
PIPECC overrides the pipecc binary.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import tally  # noqa: E402

PIPECC = os.environ.get("PIPECC", os.path.join(ROOT, "bin", "pipecc"))
MODELS = {"lenet": "--batch 32 --microbatches 4", "gpt": "--batch 8 --microbatches 4", "resnet": "--batch 8 --microbatches 2",
          "densenet": "--batch 8 --microbatches 2", "inception": "--batch 8 --microbatches 2", "mlp": "--batch 32 --microbatches 4"}
ROW = re.compile(r'^\s*\{"((?:[^"\\]|\\.)*)", (\d+), [^,]+, [^,]+, (PR_FROM_\w+), -?\d+, \d+, \{[^}]*\}, \d, (-?\d+), (\d+), (\d+)\},$')


def table(src, name):
    """The rows of `static const PrValue NAME[]` in a stage program: (value, bytes, peer, tag)."""
    m = re.search(r"static const PrValue %s\[\] = \{\n(.*?)\n\};" % name, src, re.S)
    if not m:
        return []
    rows = []
    for line in m.group(1).split("\n"):
        r = ROW.match(line)
        if not r:
            raise ValueError(f"unparsed {name} row: {line!r}")
        rows.append((r.group(1), int(r.group(2)), int(r.group(4)), int(r.group(5))))
    return rows


def check_plan(tag, out):
    plan = json.load(open(os.path.join(out, "plan.json")))
    stages = plan.get("ranks", plan["stage_plans"])  # with chunks a program is a rank's
    msgs = [s.get("messages") for s in stages]
    tally.check(all(m is not None for m in msgs), f"{tag}: plan.json states every stage's messages")
    if any(m is None for m in msgs):
        return
    for s, m in enumerate(msgs):
        src = open(os.path.join(out, f"stage_{s}.c")).read()
        for d, key, peer in (("recv", "RECV", "from"), ("send", "SEND", "to")):
            want = [(v["value"], v["bytes"], v[peer], v["tag"]) for v in m[d]]
            got = table(src, key)
            tally.check(want == got, f"{tag}: stage {s}'s {key} table is plan.json's {d} messages ({len(got)} values)"
                        + ("" if want == got else f": {want} != {got}"))
    pairs = 0
    for s, m in enumerate(msgs):
        for v in m["send"]:
            p = v["to"]
            if p < 0:
                continue
            match = [w for w in msgs[p]["recv"] if w["from"] == s and w["tag"] == v["tag"]]
            ok = len(match) == 1 and match[0]["value"] == v["value"] and match[0]["bytes"] == v["bytes"]
            tally.check(ok, f"{tag}: stage {s} sends '{v['value']}' to {p} with tag {v['tag']}, and {p} receives it from {s} with that tag"
                        + ("" if ok else f" (its receives: {msgs[p]['recv']})"))
            pairs += 1
        for v in m["recv"]:
            p = v["from"]
            if p < 0:
                continue
            ok = sum(1 for w in msgs[p]["send"] if w["to"] == s and w["tag"] == v["tag"] and w["value"] == v["value"]) == 1
            tally.check(ok, f"{tag}: stage {s}'s receive of '{v['value']}' from {p} (tag {v['tag']}) has its send")
        for d, peer in (("recv", "from"), ("send", "to")):
            by = {}
            for v in m[d]:
                if v[peer] >= 0:
                    by.setdefault(v[peer], []).append(v["tag"])
            for p, tags in by.items():
                tally.check(sorted(tags) == list(range(len(tags))), f"{tag}: stage {s}'s {d} tags with rank {p} are 0..{len(tags) - 1}, each once")
    tally.check(pairs > 0 or len(stages) == 1, f"{tag}: the plan has messages between ranks ({pairs} sends)")


def main():
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        env.setdefault("PIPECC_CACHE", os.path.join(tmp, "machine.txt"))
        cases = []
        for model, flags in MODELS.items():
            for n in (2, 4):
                for route in ("direct", "relay"):
                    cases.append((f"{model} n={n} {route}", model, flags.split() + ["-n", str(n), "--route", route]))
        cases.append(("lenet n=4 pipefb", "lenet", MODELS["lenet"].split() + ["-n", "4", "--schedule", "pipefb"]))
        cases.append(("gpt n=4 zb1", "gpt", MODELS["gpt"].split() + ["-n", "4", "--schedule", "zb1"]))
        for model in ("lenet", "gpt", "resnet"):
            for n in (2, 4):
                for sched in ("interleaved", "zbv"):
                    cases.append((f"{model} n={n} {sched}", model, MODELS[model].replace("--microbatches 2", "--microbatches 4").split()
                                  + ["-n", str(n), "--schedule", sched]))
        for tag, model, flags in cases:
            out = os.path.join(tmp, tag.replace(" ", "_").replace("=", ""))
            r = subprocess.run([PIPECC, os.path.join(ROOT, "onnx_models", model + ".onnx"), *flags, "-o", out], env=env,
                               capture_output=True, text=True)
            tally.check(r.returncode == 0, f"{tag}: compiles ({r.stderr.strip()[-300:]})")
            if r.returncode == 0:
                check_plan(tag, out)
    tally.finish()


if __name__ == "__main__":
    main()
