"""bin/pipecc-trace and the SVG timeline (compiler/timeline.c).

Writes synthetic runtime traces (Chrome trace-event JSON) from Python, draws them
with the ASan/UBSan build of pipecc-trace, and checks the SVG with xml.etree:
one box or tick per action, rank rows, the legend, the title, --step, byte-for-
byte determinism.  Then hostile inputs: each is refused with one line
"pipecc-trace: error: FILE: ..." naming a byte offset or event index, exit 2,
and no output file (nor a leftover temporary); a few hundred mutated traces run
clean under the sanitizers.  A chunked trace (format version 2, pipecc
--chunks: each span's chunk and stage) is drawn with each span's chunk, a
lighter shade for chunk 1 and a key of each rank's stages, and says them on
stdout; a version 1 trace (no version, no chunks) draws as before; a newer
version or a bad chunk or stage is refused.  Last, a real browser: headless
Chromium renders the SVG to a PNG, which is decoded here (zlib + numpy) and
checked for size and content.
Run with /usr/bin/python3.
  PIPECC_TRACE=bin/pipecc-trace   the tool to test (default: the ASan build)
  TIMELINE_PNG=DIR                 keep the rendered PNGs in DIR"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, os.environ.get("PIPECC_TRACE", "bin/pipecc-trace-asan"))
ENV = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
SVG = "{http://www.w3.org/2000/svg}"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


def check(cond, what, detail=""):
    tally.count(cond)
    print(("ok - " if cond else "not ok - ") + what, flush=True)
    if not cond and detail:
        print("   " + str(detail).strip().replace("\n", "\n   ")[:2000])
    return cond


def run(*args, timeout=60):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=ENV, timeout=timeout,
                          errors="replace")


def make_trace(nranks=4, m=8, steps=2, tf=100.0, tb=200.0, origin=1.7e15):
    """A 1F1B run as the runtime traces it: per rank, F/B boxes, zero-width
    SEND/RECV posts, SEND_GRAD/RECV_GRAD, a wait, an UPDATE; thread names."""
    ev = []
    for r in range(nranks):
        ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r} (stage {r})"}})
    t_step = 0.0
    for s in range(steps):
        end = 0.0
        for r in range(nranks):
            t = t_step + r * tf
            slot = 0

            def x(name, cat, t0, dur, mb=None):
                nonlocal slot
                args = {"step": s, "kind": cat, "slot": slot}
                if mb is not None:
                    args["mb"] = mb
                ev.append({"name": name, "cat": cat, "ph": "X", "ts": origin + t0, "dur": dur, "pid": 0, "tid": r,
                           "args": args})
                slot += 1

            warm = min(nranks - 1 - r, m)
            f = b = 0
            for _ in range(warm):
                if r > 0:
                    x(f"RECV{f}", "RECV", t, 0.0, f)
                x(f"F{f}", "F", t, tf, f)
                if r < nranks - 1:
                    x(f"SEND{f}", "SEND", t + tf, 0.0, f)
                t += tf
                f += 1
            if r > 0:
                x("wait", "wait", t, 37.5, -1)
                t += 37.5
            while b < m:
                if f < m:
                    x(f"F{f}", "F", t, tf, f)
                    t += tf
                    f += 1
                if r < nranks - 1:
                    x(f"RECV_GRAD{b}", "RECV_GRAD", t, 12.5, b)
                    t += 12.5
                x(f"B{b}", "B", t, tb, b)
                if r > 0:
                    x(f"SEND_GRAD{b}", "SEND_GRAD", t + tb, 0.0, b)
                t += tb
                b += 1
            x("UPDATE", "UPDATE", t, 150.0)
            end = max(end, t + 150.0)
        t_step = end + 50.0
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def make_chunked_trace(steps=1, m=4, tf=100.0, tb=200.0):
    """Interleaved over 2 ranks of 2 chunks as the runtime traces it (format 2): rank r runs stages r and r + 2;
    per micro-batch F and B of each chunk (named F3@1 for chunk 1), a RECV of chunk 1, a wait in chunk 1's F,
    and each rank's UPDATE, the whole rank's (chunk -1, stage -1)."""
    ev = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r} (stages {r} and {r + 2})"}}
          for r in range(2)]
    for s in range(steps):
        for r in range(2):
            t = s * 10000.0 + r * tf

            def x(cat, t0, dur, mb, c):
                name = cat if mb < 0 or cat == "wait" else f"{cat}{mb}" + (f"@{c}" if c > 0 else "")
                ev.append({"name": name, "cat": cat, "ph": "X", "ts": t0, "dur": dur, "pid": 0, "tid": r,
                           "args": {"step": s, "mb": mb, "kind": cat, "slot": 0, "chunk": c, "stage": r + 2 * c if c >= 0 else -1}})
            for mb in range(m):
                for c in (0, 1):
                    if c:
                        x("RECV", t, 0.0, mb, c)
                    if c and mb == 1:
                        x("wait", t, 20.0, mb, c)
                        t += 20.0
                    x("F", t, tf, mb, c)
                    x("B", t + tf, tb, mb, c)
                    t += tf + tb
            x("UPDATE", t, 150.0, -1, -1)
    return {"otherData": {"pipecc_trace_version": 2}, "traceEvents": ev, "displayTimeUnit": "ms"}


def chunked(tmp):
    """A version 2 trace of --chunks 2: drawn with each span's chunk and stage, chunk 1 lighter, labelled 3@1, a key
    and a stdout line of each rank's stages; a version 1 trace draws without; bad versions, chunks and stages refused."""
    trace = make_chunked_trace()
    src, out = os.path.join(tmp, "chunked.json"), os.path.join(tmp, "chunked.svg")
    with open(src, "w") as f:
        json.dump(trace, f)
    r = run(TOOL, src, "-o", out)
    if not check(r.returncode == 0 and not r.stderr, "a chunked trace (version 2) is drawn", r.stderr):
        return
    check(r.stdout.splitlines()[-1:] == ["pipecc-trace: 2 chunks a rank: rank 0 runs stages 0 and 2; rank 1 runs stages 1 and 3"],
          "chunked: stdout says which stages each rank ran", r.stdout)
    root = ET.parse(out).getroot()
    sp = spans_of(root)
    tags = {(el.get("data-rank"), el.get("data-chunk"), el.get("data-stage")) for el in sp if el.get("data-kind") != "UPDATE"}
    check(len(sp) == n_x(trace) and tags == {("0", "0", "0"), ("0", "1", "2"), ("1", "0", "1"), ("1", "1", "3")} and
          all(el.get("data-chunk") is None for el in sp if el.get("data-kind") == "UPDATE"),
          "chunked: every span carries its chunk and stage (UPDATE, the whole rank's, none)", tags)
    fills = {(el.get("data-kind"), el.get("data-chunk")): el.get("fill") for el in sp if el.get("class") == "span"}
    check(fills.get(("F", "0")) == "#4e79a7" and fills.get(("F", "1")) == "#afc3d7" and fills.get(("B", "1")) not in (None, "#59a14f"),
          "chunked: chunk 1's boxes are a lighter shade of their kind's colour", fills)
    mbs = {el.text for el in root.iter(SVG + "text") if el.get("class") == "mb"}
    check({"3@1", "3"} <= mbs and not any(t.endswith("@0") for t in mbs), "chunked: boxes labelled 3@1 (chunk 1) and 3 (chunk 0)", mbs)
    key = [el.text for el in root.iter(SVG + "text") if el.get("class") == "rank-stages"]
    check(key == ["rank 0 runs stages 0 and 2;", "rank 1 runs stages 1 and 3"], "chunked: the key names each rank's stages", key)
    title = root.find(f"{SVG}text[@id='title']")
    check(title is not None and title.text == "chunked.json: measured, step 0, 2 chunks a rank", "chunked: the title says 2 chunks a rank",
          title is not None and title.text)
    # Version 1, said or not: no chunks, drawn as always.
    old = make_trace(nranks=2, m=2, steps=1)
    old["otherData"] = {"pipecc_trace_version": 1, "note": "Chrome's metadata beside ours"}
    with open(src, "w") as f:
        json.dump(old, f)
    r = run(TOOL, src, "-o", out)
    data = open(out).read() if r.returncode == 0 else ""
    check(r.returncode == 0 and "data-chunk" not in data and 'id="chunks"' not in data and len(r.stdout.splitlines()) == 1,
          "a version 1 trace draws without chunks", r.stderr)
    os.unlink(src), os.unlink(out)
    good = json.dumps(trace)
    ev = json.dumps(trace["traceEvents"][5])

    def event(**args):
        e = json.loads(ev)
        e["args"].update(args)
        return good.replace(ev, json.dumps(e), 1).encode()
    for what, content, where in [
        ("a newer trace format (version 3)", good.replace('"pipecc_trace_version": 2', '"pipecc_trace_version": 3').encode(),
         "trace format version 3 is newer than this pipecc-trace reads (1 to 2)"),
        ("a version that is a string", good.replace('"pipecc_trace_version": 2', '"pipecc_trace_version": "2"').encode(), "is a string"),
        ("a version 0", good.replace('"pipecc_trace_version": 2', '"pipecc_trace_version": 0').encode(), "expected at least 1"),
        ("chunk 64", event(chunk=64), "event 5"),
        ("chunk -2", event(chunk=-2), "event 5"),
        ("a fractional chunk", event(chunk=0.5), "event 5"),
        ("a stage that is a string", event(stage="2"), "event 5"),
    ]:
        refused(tmp, what, content, where)


def n_x(trace, step=None):
    return sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and (step is None or e["args"]["step"] == step))


def spans_of(root):
    return [el for el in root.iter() if el.get("class") in ("span", "tick")]


def leftovers(d, keep=()):
    return sorted(f for f in os.listdir(d) if f not in keep)


def main():
    tmp = tempfile.mkdtemp(prefix="pipecc-timeline.")
    try:
        body(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tally.finish()


def body(tmp):
    if not check(os.access(TOOL, os.X_OK), f"{os.path.relpath(TOOL, ROOT)} is built"):
        return
    trace = make_trace()
    src = os.path.join(tmp, "run.json")
    with open(src, "w") as f:
        json.dump(trace, f, indent=1)

    # ---- A good trace, all steps.
    out = os.path.join(tmp, "all.svg")
    r = run(TOOL, src, "-o", out)
    check(r.returncode == 0 and not r.stderr and os.path.exists(out), "a good trace is drawn (exit 0, nothing on stderr)",
          r.stderr)
    if not os.path.exists(out):
        return
    data = open(out, "rb").read()
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        check(False, "the SVG parses as XML", e)
        return
    check(root.tag == SVG + "svg", "the SVG parses as XML, root <svg> in the SVG namespace")
    sp = spans_of(root)
    check(len(sp) == n_x(trace), f"one box or tick per X event ({len(sp)} of {n_x(trace)})")
    kinds = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            kinds[e["cat"]] = kinds.get(e["cat"], 0) + 1
    got = {}
    for el in sp:
        got[el.get("data-kind")] = got.get(el.get("data-kind"), 0) + 1
    check(got == kinds, "per-kind counts match the trace", f"{got} vs {kinds}")
    zero = sum(1 for e in trace["traceEvents"] if e["ph"] == "X" and e["dur"] == 0)
    ticks = [el for el in sp if el.get("class") == "tick"]
    check(len(ticks) >= zero and all(el.tag == SVG + "line" for el in ticks),
          f"zero-width posts are drawn as ticks ({len(ticks)} ticks, {zero} zero-width events)")
    check(all(el.find(SVG + "title") is not None for el in sp), "every action has a tooltip")
    rows = [el.text for el in root.iter(SVG + "text") if el.get("class") == "rank"]
    check(rows == [f"rank {k}" for k in range(4)], "rank rows labelled rank 0 .. rank 3", rows)
    legend = root.find(f".//{SVG}g[@id='legend']")
    lk = [el.get("data-kind") for el in legend.iter(SVG + "rect")] if legend is not None else []
    order = ["F", "B", "I", "W", "SEND", "RECV", "SEND_GRAD", "RECV_GRAD", "UPDATE", "wait"]
    check(lk == [k for k in order if k in kinds], "the legend lists the kinds present, in order", lk)
    fills = {}
    for el in sp:
        fills.setdefault(el.get("data-kind"), set()).add(el.get("fill") or el.get("stroke"))
    check(all(len(v) == 1 for v in fills.values()) and len({min(v) for v in fills.values()}) == len(fills),
          "one distinct colour per kind", fills)
    title = root.find(f"{SVG}text[@id='title']")
    check(title is not None and title.text == "run.json: measured, steps 0 to 1", "title names the file and steps",
          title is not None and title.text)
    axis = root.find(f".//{SVG}text[@id='axis-label']")
    check(axis is not None and "(ms)" in axis.text, "the time axis has units (ms)", axis is not None and axis.text)
    labels = [el.text for el in root.iter(SVG + "text") if el.get("class") == "tick-label"]
    check(len(labels) >= 4 and labels[0] in ("0", "0.0"), "the axis has tick labels from 0", labels)
    mbs = [el.text for el in root.iter(SVG + "text") if el.get("class") == "mb"]
    check(len(mbs) >= 2 * 8 * 4 * 2 and set(mbs) == {str(k) for k in range(8)},
          f"micro-batch numbers are written in the boxes ({len(mbs)})")
    check(b"<script" not in data and b"href" not in data, "no scripts or external references")
    r2 = run(TOOL, src, "-o", out + "2")
    check(r2.returncode == 0 and open(out + "2", "rb").read() == data, "the same trace gives the same bytes")
    check(leftovers(tmp) == ["all.svg", "all.svg2", "run.json"], "no temporary files left", leftovers(tmp))

    # ---- Default output name, --step.
    r = run(TOOL, src)
    check(r.returncode == 0 and os.path.exists(os.path.join(tmp, "run.svg")), "default output: run.json -> run.svg",
          r.stderr)
    one = os.path.join(tmp, "one.svg")
    r = run(TOOL, src, "-o", one, "--step", "1")
    ok = r.returncode == 0 and os.path.exists(one)
    if check(ok, "--step 1 draws", r.stderr):
        root1 = ET.parse(one).getroot()
        sp1 = spans_of(root1)
        check(len(sp1) == n_x(trace, 1) and all(el.get("data-step") == "1" for el in sp1),
              f"--step 1: only step 1's {n_x(trace, 1)} actions")
        t1 = root1.find(f"{SVG}text[@id='title']")
        check(t1 is not None and t1.text == "run.json: measured, step 1", "--step 1: the title says step 1",
              t1 is not None and t1.text)
    for f in ("all.svg2", "run.svg", "one.svg"):
        os.unlink(os.path.join(tmp, f))

    # ---- Chromium.
    browser(tmp, out)

    # ---- Refused inputs.
    good = json.dumps(trace)
    ev0 = trace["traceEvents"][4]  # an X event

    def with_event(mut):
        t = json.loads(good)
        e = json.loads(json.dumps(ev0))
        mut(e)
        t["traceEvents"].insert(5, e)
        return json.dumps(t)

    def drop(k, args=False):
        def f(e):
            del (e["args"] if args else e)[k]
        return f

    def setk(k, v, args=False):
        def f(e):
            (e["args"] if args else e)[k] = v
        return f

    bad = [
        ("truncated JSON", good[: len(good) // 2].encode(), "byte"),
        ("truncated inside a string", good[:60].encode(), "byte"),
        ("ts is a string", with_event(setk("ts", "12.5")).encode(), "event 5"),
        ("negative dur", with_event(setk("dur", -1.0)).encode(), "event 5"),
        ("unknown cat", with_event(setk("cat", "FWD")).encode(), "event 5"),
        ("args.kind differs from cat", with_event(setk("kind", "B", True)).encode(), "event 5"),
        ("missing tid", with_event(drop("tid")).encode(), "event 5"),
        ("missing args.step", with_event(drop("step", True)).encode(), "event 5"),
        ("missing args.mb on an F", with_event(drop("mb", True)).encode(), "event 5"),
        ("fractional tid", with_event(setk("tid", 1.5)).encode(), "event 5"),
        ("tid too large", with_event(setk("tid", 100000)).encode(), "event 5"),
        ("huge ts", with_event(setk("ts", 1e300)).encode(), "event 5"),
        ("number out of double range", good.replace('"dur": 100.0', '"dur": 1e999', 1).encode(), "byte"),
        ("NaN literal", good.replace('"dur": 100.0', '"dur": NaN', 1).encode(), "byte"),
        ("unsupported ph", with_event(setk("ph", "B")).encode(), "event 5"),
        ("an event that is not an object", good.replace('"traceEvents": [', '"traceEvents": [7, ', 1).encode(),
         "event 0"),
        ("duplicate key", good.replace('"ph": "X"', '"ph": "X", "ph": "X"', 1).encode(), "event"),
        ("traceEvents not an array", b'{"traceEvents": {}}', "byte"),
        ("no traceEvents", b'{"displayTimeUnit": "ms"}', "byte"),
        ("no X events", b'{"traceEvents": []}', "byte 16: no \"X\""),
        ("trailing garbage", (good + " x").encode(), "byte"),
        ("top level is an array", b'[{"traceEvents": []}]', "byte 0"),
        ("deep nesting", b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b', "traceEvents": []}', "byte"),
        ("invalid UTF-8 in a string", good.replace('"F0"', '"F\udcff"', 1).encode("utf-8", "surrogateescape"), "byte"),
        ("lone surrogate escape", good.replace('"F0"', '"\\ud800"', 1).encode(), "byte"),
        ("control character in a string", good.replace('"F0"', '"F\t0"', 1).encode(), "byte"),
        ("leading zero", good.replace('"tid": 1', '"tid": 01', 1).encode(), "byte"),
        ("single quotes", good.replace('"cat"', "'cat'", 1).encode(), "byte"),
        ("empty file", b"", "byte 0"),
        ("non-JSON file (a PNG)", b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "byte 0"),
    ]
    for what, content, where in bad:
        refused(tmp, what, content, where)
    # --step with no events, a missing file, a directory.
    refused(tmp, "--step beyond the trace", good.encode(), "no events for step 7 in", extra=["--step", "7"])
    miss = os.path.join(tmp, "missing.json")
    r = run(TOOL, miss, "-o", os.path.join(tmp, "m.svg"))
    check(r.returncode == 2 and r.stderr.startswith(f"pipecc-trace: error: {miss}: cannot open")
          and r.stderr.count("\n") == 1 and leftovers(tmp) == ["all.svg", "run.json"],
          "refused: a missing file", r.stderr)
    r = run(TOOL, tmp, "-o", os.path.join(tmp, "m.svg"))
    check(r.returncode == 2 and "not a regular file" in r.stderr, "refused: a directory", r.stderr)
    r = run(TOOL, src, "--step", "-1")
    check(r.returncode == 2 and r.stderr.startswith("pipecc-trace: error: --step"), "refused: --step -1", r.stderr)
    r = run(TOOL, src, "-o", os.path.join(tmp, "no", "such", "dir.svg"))
    check(r.returncode == 2 and "cannot write" in r.stderr and leftovers(tmp) == ["all.svg", "run.json"],
          "refused: an output in a missing directory", r.stderr)
    # An error leaves an existing output alone.
    keep = os.path.join(tmp, "keep.svg")
    open(keep, "w").write("old")
    bp = os.path.join(tmp, "bad.json")
    open(bp, "w").write(good[:100])
    r = run(TOOL, bp, "-o", keep)
    check(r.returncode == 2 and open(keep).read() == "old", "a refused trace leaves an existing output untouched")
    os.unlink(keep)
    os.unlink(bp)

    # ---- Chunks (trace format 2).
    chunked(tmp)

    # ---- Mutations under the sanitizers: exit 0 or 2, never a crash or report.
    rng = random.Random(7)
    small = json.dumps(make_trace(nranks=2, m=2, steps=1)).encode()
    mp, mo = os.path.join(tmp, "mut.json"), os.path.join(tmp, "mut.svg")
    bad_runs = []
    n_ok = n_refused = 0
    for i in range(250):
        b = bytearray(small)
        op = i % 5
        if op == 0:
            b = b[: rng.randrange(len(b))]
        elif op == 1:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 2:
            p = rng.randrange(len(b))
            b[p:p] = rng.choice([b"-", b"1e308", b"9" * 30, b"\\u", b'"', b"[", b"{", b",", b"null", b"\xc3"])
        elif op == 3:
            p, q = sorted(rng.randrange(len(b)) for _ in range(2))
            del b[p:q]
        else:
            s = b.decode()
            s = s.replace(rng.choice(['"ts": ', '"dur": ', '"tid": ', '"step": ', '"mb": ']),
                          rng.choice(['"ts": -', '"dur": "', '"tid": 1e9', '"step": 0.5', '"mb": -2', '"x": ']), 1)
            b = bytearray(s.encode())
        open(mp, "wb").write(bytes(b))
        r = run(TOOL, mp, "-o", mo)
        if r.returncode == 0 and os.path.exists(mo) and not r.stderr:
            n_ok += 1
            try:
                ET.parse(mo)
            except ET.ParseError as e:
                bad_runs.append((i, "bad XML", str(e)))
            os.unlink(mo)
        elif r.returncode == 2 and r.stderr.startswith(f"pipecc-trace: error: {mp}: ") \
                and r.stderr.count("\n") == 1 and not os.path.exists(mo):
            n_refused += 1
        else:
            bad_runs.append((i, r.returncode, r.stderr[-1500:]))
    os.unlink(mp)
    check(not bad_runs and leftovers(tmp) == ["all.svg", "run.json"],
          f"250 mutated traces: {n_ok} drawn, {n_refused} refused with one error line, no sanitizer report",
          bad_runs[:3])


def refused(tmp, what, content, where, extra=()):
    p = os.path.join(tmp, "bad.json")
    o = os.path.join(tmp, "bad.svg")
    with open(p, "wb") as f:
        f.write(content)
    r = run(TOOL, p, "-o", o, *extra)
    prefix = f"pipecc-trace: error: {p}: "
    ok = (r.returncode == 2 and r.stderr.startswith(prefix) and r.stderr.count("\n") == 1
          and where in r.stderr[len(prefix):] and not os.path.exists(o) and not r.stdout
          and leftovers(tmp) == ["all.svg", "bad.json", "run.json"])
    check(ok, f"refused: {what}: {r.stderr.strip()[len(prefix):][:110]}",
          f"rc {r.returncode}, stderr {r.stderr!r}, files {leftovers(tmp)}")
    os.unlink(p)


# ---- PNG decoding (RFC 2083), enough for Chromium's screenshots.
def decode_png(path):
    d = open(path, "rb").read()
    assert d[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    i, idat, hdr = 8, b"", None
    while i < len(d):
        n, t = struct.unpack(">I4s", d[i:i + 8])
        if t == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", d[i + 8:i + 21])
        elif t == b"IDAT":
            idat += d[i + 8:i + 8 + n]
        elif t == b"IEND":
            break
        i += 12 + n
    w, h, depth, ctype, _, _, interlace = hdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0, f"unsupported PNG {hdr}"
    bpp = 3 if ctype == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * bpp)
    img = np.zeros((h, w * bpp), dtype=np.uint8)
    prev = np.zeros(w * bpp, dtype=np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 255
        elif f in (1, 3, 4):
            cur = np.zeros_like(line)
            pv = prev.tolist()
            ln = line.tolist()
            c = [0] * len(ln)
            for x in range(len(ln)):
                a = c[x - bpp] if x >= bpp else 0
                if f == 1:
                    p = a
                elif f == 3:
                    p = (a + pv[x]) >> 1
                else:
                    b_, cc = pv[x], pv[x - bpp] if x >= bpp else 0
                    pa, pb, pc = abs(b_ - cc), abs(a - cc), abs(a + b_ - 2 * cc)
                    p = a if pa <= pb and pa <= pc else b_ if pb <= pc else cc
                c[x] = (ln[x] + p) & 255
            cur = np.array(c, dtype=np.int32)
        else:
            raise ValueError(f"bad filter {f}")
        img[y] = cur
        prev = cur
    return img.reshape(h, w, bpp)[:, :, :3]


def browser(tmp, svg):
    chromium = shutil.which("chromium")
    if not check(chromium is not None, "chromium is installed (make deps)"):
        return
    png = os.path.join(tmp, "shot.png")
    prof = os.path.join(tmp, "chromium-profile")
    try:
        r = run(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={prof}",
                f"--screenshot={png}", "--window-size=1400,600", "file://" + svg, timeout=120)
    except subprocess.TimeoutExpired:
        check(False, "headless chromium renders the SVG (timed out after 120 s)")
        return
    shutil.rmtree(prof, ignore_errors=True)
    if not check(r.returncode == 0 and os.path.exists(png), "headless chromium renders the SVG to a PNG",
                 r.stderr[-1500:]):
        return
    keep = os.environ.get("TIMELINE_PNG")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(png, os.path.join(keep, "timeline.png"))
    try:
        img = decode_png(png)
    except Exception as e:  # noqa: BLE001 - report any decoding problem as a failure
        check(False, "the PNG decodes", e)
        return
    os.unlink(png)
    h, w, _ = img.shape
    check((w, h) == (1400, 600), f"the screenshot is 1400x600 ({w}x{h})")
    flat = img.reshape(-1, 3)
    colours = {tuple(c) for c in np.unique(flat, axis=0)}
    nonwhite = float(np.mean(np.any(flat < 245, axis=1)))
    check(len(colours) > 20 and nonwhite > 0.05, f"not blank: {len(colours)} colours, {nonwhite:.0%} non-white")

    def has(hexc, tol=2):
        c = np.array([int(hexc[i:i + 2], 16) for i in (1, 3, 5)])
        return int(np.sum(np.all(np.abs(flat.astype(int) - c) <= tol, axis=1)))

    f_px, b_px, u_px = has("#4e79a7"), has("#59a14f"), has("#8e6bb0")
    check(f_px > 2000 and b_px > 4000 and u_px > 200,
          f"the boxes are painted in their colours (F {f_px} px, B {b_px} px, UPDATE {u_px} px)")
    # Each rank's row has paint in it: B boxes on every row.
    rows = [int(np.sum(np.all(np.abs(img[y0:y0 + 28].reshape(-1, 3).astype(int) - [0x59, 0xa1, 0x4f]) <= 2, axis=1)))
            for y0 in (56 + 36 * k for k in range(4))]
    check(all(n > 500 for n in rows), f"every rank row has B boxes ({rows} px)")


if __name__ == "__main__":
    sys.exit(main())
