"""Progress and pictures (issue 38): run.sh's progress on a terminal and piped, and the picture of --log.

LeNet at -n 2 (batch 32, 4 micro-batches) trains a few steps each time:
  * on a terminal (a pty 100 columns wide, read raw and rendered here: a carriage return goes to the
    line's start, ESC[K erases to its end): one progress line, drawn again in place (at least the
    first and the last step's draws, with no newline between them), with its bar, loss, samples/s,
    ETA and the last validation accuracy, never wider than the terminal less one column; the
    validation lines above it; the summary after it.  The same run in tmux (a real terminal
    emulator): the screen holds one progress line, the last step's.  A 44-column terminal gets lines
    of 43 at most.  A run stopped by a NaN ends the line before the error.  --quiet draws nothing.
  * piped: "step N/M  loss ...  samples/s  eta ... s" lines (today's format) on the first step, every
    --log-every K steps and the last: --log-every 5 over 23 steps gives steps 1, 5, 10, 15, 20, 23;
    --log-every 1 every step; the default over 60 steps every 5 (the smallest of 1, 2, 5, 10, 20, ...
    that prints at most 25 lines besides the first and the last); bad values are refused.
  * the picture: --log F.csv writes F.svg.  The expected number of points: on each panel the loss curve
    has one point per step of the log (a step a resumed run logged again counts once), at most 2000 (a
    longer log is drawn through 2000 evenly spaced rows, the first and the last among them); each
    validation curve one point per row of LOG.val.csv (in the time panel, per row whose step the log
    has).  Checked in the SVG (xml.etree), and in headless Chromium: the SVG inlined in an XHTML page
    (an XML parse: a malformed SVG runs no script) whose script counts each polyline's points as the
    browser parsed them and measures its box; a screenshot shows each curve's colour.  A resumed run's
    picture is drawn from the whole log.  tests/plot_probe.c drives runtime/plot.c alone (ASan/UBSan):
    4500 rows drawn through 2000, repeated steps, stray lines, hostile names, a FIFO target.
Run with /usr/bin/python3; about 50 s.  Ends with the tally's line (tests/tally.py)."""
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import tally  # noqa: E402
from test_timeline import decode_png  # noqa: E402  (the PNG decoder its Chromium check uses)

PIPECC = os.path.join(ROOT, "bin", "pipecc")
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
SVGNS = "{http://www.w3.org/2000/svg}"
PROGRESS = re.compile(r"step \d+/\d+")   # a progress line, not the summary's "step time"
STEP_LINE = re.compile(r"^step (\d+)/(\d+)  loss [0-9.]+  [0-9.]+ samples/s  eta [0-9.]+ s$")


def check(cond, what, detail=""):
    """tally's check, with the detail printed only when the check fails."""
    tally.count(bool(cond))
    print(("ok - " if cond else "not ok - ") + what, flush=True)
    if not cond and detail:
        print("   " + str(detail).strip().replace("\n", "\n   ")[:2000], flush=True)
    return cond


def sh(cmd, timeout=300, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, errors="replace", **kw)


def in_pty(cmd, cols=100, timeout=120):
    """cmd run with a pty of cols columns as its terminal: (exit status, everything it wrote, raw)."""
    import fcntl
    import termios
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execv(cmd[0], [str(c) for c in cmd])
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    out, end = b"", time.time() + timeout
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 1)
        if not r:
            continue
        try:
            d = os.read(fd, 65536)
        except OSError:  # EIO: the terminal's last writer is gone
            break
        if not d:
            break
        out += d
    else:
        os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def render(raw):
    """The lines a terminal shows for raw: CR to the line's start, LF to the next line, ESC[K erases to
    the line's end, any other character written over what is at the cursor."""
    lines, cur, col, i = [], [], 0, 0
    while i < len(raw):
        if raw.startswith("\x1b[K", i):
            del cur[col:]
            i += 3
            continue
        c = raw[i]
        if c == "\r":
            col = 0
        elif c == "\n":
            lines.append("".join(cur))
            cur, col = [], 0
        else:
            if col < len(cur):
                cur[col] = c
            else:
                cur.append(c)
            col += 1
        i += 1
    if cur:
        lines.append("".join(cur))
    return lines


def polylines(path):
    """{(panel id, class): (data-rows, data-points, [(x, y), ...])} of an SVG file."""
    root, got = ET.parse(path).getroot(), {}
    for g in root.iter(SVGNS + "g"):
        for p in g.iter(SVGNS + "polyline"):
            pts = [tuple(map(float, xy.split(","))) for xy in p.get("points").split()]
            got[(g.get("id"), p.get("class"))] = (int(p.get("data-rows")), int(p.get("data-points")), pts)
    return got


def terminal_checks(T, run, data):
    log = os.path.join(T, "tty.csv")
    rc, raw = in_pty([run, "--data", data, "--steps", "20", "--val", data, "--val-every", "10", "--log", log])
    screen = render(raw)
    prog = [ln for ln in screen if PROGRESS.match(ln)]
    draws = [d for d in re.split(r"[\r\n]", raw) if PROGRESS.match(d)]
    ends = re.findall(r"\rstep \d+/20[^\r\n]*\x1b\[K(?=(\r\n|\r|$))", raw)   # what follows each draw
    check(rc == 0 and len(prog) == 1 and prog[0].startswith("step 20/20 ") and screen[screen.index(prog[0]) + 1].startswith("done: 20 steps"),
          "on a terminal: one progress line, the last step's, just above the summary", f"rc {rc}, progress lines {prog}")
    check(len(draws) >= 3 and len(ends) == len(draws) and ends.count("\r\n") == 1 and ends[-1] == "\r\n",
          f"... drawn again in place: {len(draws)} draws, each begun by a carriage return, none ended by a newline but the last",
          f"{ends} {raw[:600]!r}")
    line = prog[0] if prog else ""
    check(re.match(r"^step 20/20 \[#+\] loss [0-9.]+  [0-9.]+ samples/s  eta .+  val acc [0-9.]+%$", line) is not None,
          "... with a bar, the loss, samples/s, the ETA and the last validation accuracy", line)
    check(all(len(d.replace("\x1b[K", "")) <= 99 for d in draws), "... no draw wider than the 100-column terminal less one column",
          max(draws, key=len, default=""))
    vals = [ln for ln in screen if ln.startswith("validation after step")]
    check([v.split(":")[0] for v in vals] == ["validation after step 10", "validation after step 20"] and screen.index(vals[-1]) < screen.index(line),
          "... the validation lines stay above it, each on its own line", vals)
    check(set(re.findall(r"\x1b\[?.", raw)) <= {"\x1b[K"}, "... no escape but erase-to-end-of-line")
    rc, raw = in_pty([run, "--data", data, "--steps", "5"], cols=44)
    draws = [d.replace("\x1b[K", "") for d in re.split(r"[\r\n]", raw) if PROGRESS.match(d)]
    check(rc == 0 and draws and all(len(d) <= 43 for d in draws), "a 44-column terminal: every draw 43 columns at most (the bar left out)",
          draws[-1:])
    rc, raw = in_pty([run, "--data", data, "--steps", "5", "--quiet"])
    check(rc == 0 and "step " not in raw and "done:" not in raw, "--quiet on a terminal: no progress, no summary", repr(raw[:300]))
    rc, raw = in_pty([run, "--data", data, "--steps", "30", "--lr", "1e6"])
    screen = render(raw)
    errs = [ln for ln in screen if "error:" in ln]
    check(rc != 0 and errs and all(ln.startswith("piperun: stage ") for ln in errs),
          "a run stopped by a NaN: the progress line is ended (or erased) before the error, which starts its own line", errs)


def tmux_check(T, run, data):
    if not check(shutil.which("tmux") is not None, "tmux is installed (make deps)"):
        return
    sock, out = f"pipecc-progress-{os.getpid()}", os.path.join(T, "tmux.txt")
    cmd = f"{run} --data {data} --steps 20 --val {data} --val-every 10; echo EXIT=$?; sleep 120"
    r = sh(["tmux", "-L", sock, "-f", "/dev/null", "new-session", "-d", "-x", "100", "-y", "40", "-s", "t", cmd], timeout=30)
    screen, end = "", time.time() + 90
    try:
        while r.returncode == 0 and time.time() < end and "EXIT=" not in screen:
            time.sleep(0.5)
            screen = sh(["tmux", "-L", sock, "capture-pane", "-p", "-t", "t"], timeout=30).stdout
    finally:
        sh(["tmux", "-L", sock, "kill-server"], timeout=30)
    with open(out, "w") as f:
        f.write(screen)
    lines = screen.splitlines()
    prog = [ln for ln in lines if re.match(r"step \d+/20", ln)]
    check("EXIT=0" in screen and len(prog) == 1 and prog[0].startswith("step 20/20 [") and "val acc" in prog[0]
          and sum(ln.startswith("validation after step") for ln in lines) == 2,
          "in tmux: the screen holds one progress line (step 20/20, its bar, the validation accuracy) below the validation lines",
          screen[-1500:])


def piped_checks(T, run, data):
    def steps_printed(*flags, steps):
        r = sh([run, "--data", data, "--steps", str(steps), *flags])
        lines = [ln for ln in r.stdout.splitlines() if PROGRESS.match(ln)]
        ok = r.returncode == 0 and all(STEP_LINE.match(ln) and ln.endswith(" s") for ln in lines) and "\x1b" not in r.stdout
        return (ok, [int(STEP_LINE.match(ln).group(1)) for ln in lines if STEP_LINE.match(ln)], r)
    ok, got, r = steps_printed("--log-every", "5", steps=23)
    check(ok and got == [1, 5, 10, 15, 20, 23], "piped, --log-every 5 over 23 steps: lines for steps 1, 5, 10, 15, 20, 23, in today's format",
          f"{got} {r.stderr[-300:]}")
    ok, got, r = steps_printed("--log-every", "1", steps=7)
    check(ok and got == list(range(1, 8)), "piped, --log-every 1: every step's line", got)
    log = os.path.join(T, "piped.csv")
    ok, got, r = steps_printed("--log", log, "--val", data, "--val-every", "20", "--shuffle", "--lr", "0.1", steps=60)
    check(ok and got == [1] + list(range(5, 61, 5)) and "done: 60 steps" in r.stdout,
          "piped, by default over 60 steps: steps 1, 5, 10, ..., 60 (every 5: at most 25 lines besides the first and the last)", got)
    for bad, why in (("0", "expected a whole number from 1"), ("1.5", "expected a whole number from 1"), ("x", "expected a whole number from 1")):
        r = sh([run, "--data", data, "--steps", "3", "--log-every", bad])
        check(r.returncode == 2 and f"--log-every '{bad}': {why}" in r.stderr and "step 1/" not in r.stdout,
              f"--log-every {bad} is refused, naming the flag", r.stderr.strip()[:200])
    r = sh([run, "--data", data, "--steps", "3", "--progress", "color"])
    check(r.returncode == 2 and "--progress 'color': expected lines, tty or tty:COLUMNS" in r.stderr, "--progress color is refused",
          r.stderr.strip()[:200])
    return log


def svg_checks(T, log):
    svg = log[:-4] + ".svg"
    if not check(os.path.exists(svg), "--log F.csv wrote F.svg"):
        return
    rows = len(open(log).read().splitlines()) - 1
    vrows = len(open(log + ".val.csv").read().splitlines()) - 1
    p = polylines(svg)
    want = {(g, c): n for g in ("by-step", "by-time") for c, n in (("loss", rows), ("val-loss", vrows), ("val-accuracy", vrows))}
    got = {k: (v[0], v[1], len(v[2])) for k, v in p.items()}
    check(rows == 60 and vrows == 3 and got == {k: (n, n, n) for k, n in want.items()},
          "the SVG: on each panel a loss curve of one point per log row (60) and validation curves of one point per LOG.val.csv row (3)",
          got)
    xs = [x for x, _ in p.get(("by-step", "loss"), (0, 0, []))[2]]
    check(len(xs) == 60 and all(a < b for a, b in zip(xs, xs[1:])), "... the loss against step runs left to right")
    chromium_checks(T, svg, want)


def chromium_checks(T, svg, want):
    chromium = shutil.which("chromium")
    if not check(chromium is not None, "chromium is installed (make deps)"):
        return
    body = open(svg).read().split("?>", 1)[1]
    page = os.path.join(T, "count.xhtml")
    script = ("var r={};document.querySelectorAll('polyline').forEach(function(p){var b=p.getBBox();"
              "r[p.closest('g').id+' '+p.getAttribute('class')]=[p.points.numberOfItems,b.width,b.height];});"
              "var o=document.createElementNS('http://www.w3.org/1999/xhtml','pre');o.id='counts';"
              "o.textContent=JSON.stringify(r);document.body.appendChild(o);")
    with open(page, "w") as f:
        f.write(f'<html xmlns="http://www.w3.org/1999/xhtml"><body>{body}<script>//<![CDATA[\n{script}\n//]]></script></body></html>')
    prof = os.path.join(T, "chromium-profile")
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={prof}"]
    try:
        r = sh(flags + ["--dump-dom", "file://" + page], timeout=120)
    except subprocess.TimeoutExpired:
        check(False, "headless chromium loads the picture (timed out after 120 s)")
        return
    m = re.search(r'<pre id="counts">(.*?)</pre>', r.stdout)
    counts = json.loads(m.group(1)) if m else {}
    got = {tuple(k.split(" ")): v[0] for k, v in counts.items()}
    check(got == want and all(v[1] > 0 for v in counts.values()),
          "headless Chromium parses the SVG (as XML) with the expected number of points on every curve, each curve of some width",
          f"{counts} {r.stderr[-300:]}")
    png = os.path.join(T, "plot.png")
    r = sh(flags + [f"--screenshot={png}", "--window-size=1000,450", "file://" + svg], timeout=120)
    if not check(r.returncode == 0 and os.path.exists(png), "headless Chromium renders the picture to a PNG", r.stderr[-500:]):
        return
    flat = decode_png(png).reshape(-1, 3)

    def px(hexc):
        c = np.array([int(hexc[i:i + 2], 16) for i in (1, 3, 5)])
        return int(np.sum(np.all(np.abs(flat - c) <= 24, axis=1)))
    n = {c: px(c) for c in ("#4e79a7", "#f28e2b", "#59a14f")}
    check(n["#4e79a7"] > 300 and n["#f28e2b"] > 50 and n["#59a14f"] > 50,
          "... the screenshot shows the loss (blue), the validation loss (orange) and accuracy (green)", n)


def resume_check(T, run, data):
    ck, log = os.path.join(T, "ck"), os.path.join(T, "resumed.csv")
    a = sh([run, "--data", data, "--steps", "8", "--checkpoint", ck, "--checkpoint-every", "5", "--log", log, "--quiet"])
    b = sh([run, "--data", data, "--steps", "12", "--resume", ck, "--log", log, "--quiet"])
    steps = [int(ln.split(",")[0]) for ln in open(log).read().splitlines()[1:]] if os.path.exists(log) else []
    p = polylines(log[:-4] + ".svg") if os.path.exists(log[:-4] + ".svg") else {}
    rows, pts, xy = p.get(("by-step", "loss"), (0, 0, []))
    xs = [x for x, _ in xy]
    check(a.returncode == 0 and b.returncode == 0 and steps == list(range(1, 9)) + list(range(6, 13)) and rows == pts == 12
          and all(u < v for u, v in zip(xs, xs[1:])),
          "a resumed run's picture is drawn from the whole log: steps 1..8 then 6..12 appended, 12 points left to right (the resumed rows replace 6..8)",
          f"{steps} rows {rows} points {pts} {a.stderr[-200:]} {b.stderr[-200:]}")


def probe_checks(T):
    """runtime/plot.c alone under ASan/UBSan (tests/plot_probe.c)."""
    probe = os.path.join(T, "plot_probe")
    mpi = sh(["mpicc", "--showme:compile"]).stdout.split()
    r = sh(["clang", "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined", "-Wall",
            "-Wextra", "-Werror", "-march=native", "-D_GNU_SOURCE", *mpi, "-I" + os.path.join(ROOT, "runtime"),
            "-I" + os.path.join(ROOT, "build", "gen"), os.path.join(ROOT, "runtime", "plot.c"), os.path.join(ROOT, "tests", "plot_probe.c"),
            "-lm", "-o", probe])
    if not check(r.returncode == 0, "tests/plot_probe.c builds with runtime/plot.c under ASan/UBSan, warning-free", r.stderr[-800:]):
        return
    names = {"a/F.csv": "a/F.svg", "F.txt": "F.txt.svg", "F": "F.svg", "d.csv/F": "d.csv/F.svg", ".csv": ".csv.svg"}
    got = {k: sh([probe, "name", k]).stdout.strip() for k in names}
    check(got == names, "the picture's name: F.csv -> F.svg, any other name gets .svg appended", got)
    d = os.path.join(T, "probe")
    os.makedirs(d)
    log, val, svg = (os.path.join(d, n) for n in ("long.csv", "long.csv.val.csv", "long.svg"))
    with open(log, "w") as f:
        f.write("step,loss,samples_per_s,time_s\n" + "".join(f"{s},{2.0 / s:.6f},100.0,{0.01 * s:.4f}\n" for s in range(1, 4501)))
    with open(val, "w") as f:
        f.write("step,val_loss,val_accuracy\n" + "".join(f"{s},{1.0 / s:.6f},{s / 4500:.4f}\n" for s in range(100, 4501, 100)))
    r = sh([probe, "draw", log, val, svg])
    p = polylines(svg) if r.returncode == 0 else {}
    loss = p.get(("by-step", "loss"), (0, 0, []))
    check(r.returncode == 0 and (loss[0], loss[1], len(loss[2])) == (4500, 2000, 2000) and p.get(("by-time", "loss"), (0, 0))[1] == 2000
          and p.get(("by-step", "val-accuracy"), (0, 0))[1] == 45,
          "4500 rows: each loss curve drawn through 2000 of them (data-rows 4500), the 45 validation rows whole", r.stderr[-300:])
    if loss[2]:
        check(abs(loss[2][0][0] - 80) < 0.1 and abs(loss[2][-1][0] - 440) < 0.1, "... the first and the last row among them (the panel's edges)",
              (loss[2][0], loss[2][-1]))
    with open(log, "w") as f:
        f.write("step,loss,samples_per_s,time_s\n1,2,1,0.1\n2,1.9,1,0.2\ngarbage\n3,nan,1,0.3\n3,1.8,1\n3,1.7,1,0.3,9\n"
                "3,1.8,1,0.3\n4,1.7,1,0.4\n5,1.6,1,0.5\n"   # the first run, then a resumed one from step 3
                "step,loss,samples_per_s,time_s\n3,1.75,1,0.35\n4,1.65,1,0.45\n")
    r = sh([probe, "draw", log, "-", svg])
    p = polylines(svg) if r.returncode == 0 else {}
    check(r.returncode == 0 and p.get(("by-step", "loss"), (0, 0))[:2] == (4, 4) and ("by-step", "val-loss") not in p,
          "stray lines (a header again, garbage, NaN, short and long rows) are passed over; a step logged again replaces the rows from it on "
          "(4 points); no validation file, no validation curves", f"{r.stderr[-300:]} {list(p.items())[:1]}")
    hostile = os.path.join(d, 'a&<b>"\x01\xe9.csv')
    shutil.copy(log, hostile)
    r = sh([probe, "draw", hostile, "-", os.path.join(d, "hostile.svg")])
    try:
        title = ET.parse(os.path.join(d, "hostile.svg")).getroot().find(SVGNS + "title").text
    except (ET.ParseError, OSError, AttributeError) as e:
        title = repr(e)
    check(r.returncode == 0 and title == 'a&<b>"???.csv', "a hostile log name is escaped in the picture, which parses as XML", title)
    fifo = os.path.join(d, "fifo.svg")
    os.mkfifo(fifo)
    r = sh([probe, "draw", log, "-", fifo])
    check(r.returncode == 1 and "exists and is not a regular file" in r.stderr and os.path.exists(fifo) and not os.path.isfile(fifo),
          "a FIFO where the picture goes is refused with a message and left as it is", r.stderr.strip())
    r = sh([probe, "draw", log, "-", os.path.join(d, "missing", "x.svg")])
    check(r.returncode == 1 and "cannot write the loss picture" in r.stderr and "No such file or directory" in r.stderr,
          "a picture that cannot be written says so and why", r.stderr.strip())
    check(not [f for f in os.listdir(d) if ".tmp-" in f], "no temporary file left behind", os.listdir(d))


def main():
    T = tempfile.mkdtemp(prefix="pipecc-progress.")
    os.environ.setdefault("PIPECC_CACHE", os.path.join(T, "machine.txt"))
    os.environ.setdefault("PIPERUN_OBJ_CACHE", os.path.join(T, "rt"))
    try:
        probe_checks(T)
        data, pipe = os.path.join(T, "mnist"), os.path.join(T, "lenet.pipe")
        r = sh([DATAGEN, "mnist", data, "--n", "2048", "--seed", "1"])
        r2 = sh([DATAGEN, "mnist", data, "--test", "--n", "256", "--seed", "2"])
        if not check(r.returncode == 0 and r2.returncode == 0, "synthetic MNIST and a held-out set written", r.stderr + r2.stderr):
            return tally.finish()
        r = sh([PIPECC, os.path.join(ROOT, "onnx_models", "lenet.onnx"), "-n", "2", "--batch", "32", "--microbatches", "4", "-o", pipe])
        if r.returncode == 0:
            r = sh(["make", "-s", "-j2", "-C", pipe], timeout=600)
        if not check(r.returncode == 0, "lenet compiled for 2 stages and built", r.stderr[-800:]):
            return tally.finish()
        run = os.path.join(pipe, "run.sh")
        terminal_checks(T, run, data)
        tmux_check(T, run, data)
        log = piped_checks(T, run, data)
        svg_checks(T, log)
        resume_check(T, run, data)
    finally:
        shutil.rmtree(T, ignore_errors=True)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
