#!/usr/bin/python3
"""A tiny dependency-free SVG plot writer (lines and markers, axes with ticks, legend).

    from svgplot import plot
    plot("out.svg", [{"name": "peer", "points": [(100, 1.0), (75, 1.02)]},
                     {"name": "torch", "points": [(100, 1.0), (40, 1.3)], "line": False}],
         title="GPT", xlabel="memory, % of plain", ylabel="step time / plain",
         regions=[{"x": (0, 50), "y": (None, 1.10), "label": "target"}],   # None: the plot's edge
         hlines=[(1.0, "plain")], vlines=[(50, "")], notes=["file 35%: infeasible"])

A series is a dict: name, points [(x, y), ...] (None values are skipped), optional color,
marker (circle, square, triangle, diamond, cross, plus), size (the marker's radius, default 4.5;
give series that may share points decreasing sizes so each stays visible), line (default True:
joined in the order given), dash (an SVG dasharray).  Axis ranges come from the data (and the reference lines and
regions), widened to nice tick values, unless xlim / ylim are given.  xlog / ylog: a logarithmic
axis (values <= 0 are skipped; ticks at 1, 2, 5 x 10^k, or at the decades over a wide range;
xlim / ylim, lines and regions are given in data units).  The file is written atomically.  Run this file to draw a demo: `python3 bench/svgplot.py /tmp/demo.svg`.
"""
import math
import os
import sys
import textwrap
from xml.sax.saxutils import escape

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f"]
MARKERS = ["circle", "square", "triangle", "diamond", "cross", "plus"]


def nice_step(span, n=6):
    """A step of 1, 2, 2.5 or 5 x 10^k giving about n ticks over span."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / n
    k = 10 ** math.floor(math.log10(raw))
    for f in (1, 2, 2.5, 5, 10):
        if raw <= f * k:
            return f * k
    return 10 * k


def ticks(lo, hi, n=6):
    """Nice tick values covering [lo, hi]; returns (lo', hi', [ticks])."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = nice_step(hi - lo, n)
    a = math.floor(lo / step + 1e-9) * step
    b = math.ceil(hi / step - 1e-9) * step
    count = int(round((b - a) / step))
    return a, b, [a + i * step for i in range(count + 1)]


def fmt_tick(v, step):
    if abs(v) < step * 1e-6:
        v = 0.0
    decimals = max(0, -int(math.floor(math.log10(step) + 1e-9))) if step < 1 else 0
    if decimals and abs(step * 10 ** decimals - round(step * 10 ** decimals)) > 1e-6:
        decimals += 1
    return f"{v:.{decimals}f}"


def log_ticks(lo, hi):
    """Ticks for a log axis over [lo, hi] (log10 units): 1, 2, 5 x 10^k when it spans at most 3
    decades, else the decades.  Returns (lo', hi', [ticks in log10 units])."""
    if hi < lo:
        lo, hi = hi, lo
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    a, b = math.floor(lo + 1e-9), math.ceil(hi - 1e-9)
    mult = (1, 2, 5) if b - a <= 3 else (1,)
    cand = [k + math.log10(f) for k in range(a, b + 1) for f in mult]
    below = [t for t in cand if t <= lo + 1e-9]
    above = [t for t in cand if t >= hi - 1e-9]
    lo2, hi2 = (max(below) if below else a), (min(above) if above else b)
    return lo2, hi2, [t for t in cand if lo2 - 1e-9 <= t <= hi2 + 1e-9]


def log_label(t):
    v = 10 ** t
    return f"{v:.0f}" if v >= 1 else f"{v:.{max(1, -math.floor(t + 1e-9))}f}".rstrip("0").rstrip(".")


def marker_svg(kind, x, y, color, r=4.5):
    if kind == "square":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" fill="{color}" stroke="white" stroke-width="0.8"/>'
    if kind == "triangle":
        return (f'<polygon points="{x:.1f},{y - r * 1.2:.1f} {x - r * 1.1:.1f},{y + r * 0.8:.1f} '
                f'{x + r * 1.1:.1f},{y + r * 0.8:.1f}" fill="{color}" stroke="white" stroke-width="0.8"/>')
    if kind == "diamond":
        return (f'<polygon points="{x:.1f},{y - r * 1.3:.1f} {x + r:.1f},{y:.1f} {x:.1f},{y + r * 1.3:.1f} '
                f'{x - r:.1f},{y:.1f}" fill="{color}" stroke="white" stroke-width="0.8"/>')
    if kind == "cross":
        return (f'<path d="M{x - r:.1f},{y - r:.1f}L{x + r:.1f},{y + r:.1f}M{x - r:.1f},{y + r:.1f}L{x + r:.1f},{y - r:.1f}" '
                f'stroke="{color}" stroke-width="2.2"/>')
    if kind == "plus":
        return (f'<path d="M{x - r:.1f},{y:.1f}L{x + r:.1f},{y:.1f}M{x:.1f},{y - r:.1f}L{x:.1f},{y + r:.1f}" '
                f'stroke="{color}" stroke-width="2.2"/>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{color}" stroke="white" stroke-width="0.8"/>'


def plot(path, series, title="", xlabel="", ylabel="", xlim=None, ylim=None, hlines=(), vlines=(),
         regions=(), notes=(), width=720, height=460, xlog=False, ylog=False):
    """Write an SVG plot of the series to path (see the module docstring); returns path.  Notes
    are lines of text under the plot, wrapped to its width; the plot area shrinks to make room for
    them and for the legend."""
    series = [dict(s) for s in series]
    for i, s in enumerate(series):
        s.setdefault("color", COLORS[i % len(COLORS)])
        s.setdefault("marker", MARKERS[i % len(MARKERS)])
        s.setdefault("line", True)
        s["points"] = [(float(x), float(y)) for x, y in s.get("points", ())
                       if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]
    def lg(v, on):
        return (math.log10(v) if v > 0 else None) if on and v is not None else v
    if xlog or ylog:
        for s in series:
            s["points"] = [(lg(x, xlog), lg(y, ylog)) for x, y in s["points"]
                           if (not xlog or x > 0) and (not ylog or y > 0)]
        vlines = [(lg(v, xlog), t) for v, t in vlines if not xlog or v > 0]
        hlines = [(lg(v, ylog), t) for v, t in hlines if not ylog or v > 0]
        regions = [dict(r, **{k: tuple(lg(v, on) for v in r[k]) for k, on in (("x", xlog), ("y", ylog)) if k in r})
                   for r in regions]
        xlim = tuple(lg(v, xlog) for v in xlim) if xlim else xlim
        ylim = tuple(lg(v, ylog) for v in ylim) if ylim else ylim
    xs = [p[0] for s in series for p in s["points"]] + [v for v, _ in vlines]
    ys = [p[1] for s in series for p in s["points"]] + [v for v, _ in hlines]
    for r in regions:
        xs += [v for v in r.get("x", ()) if v is not None]
        ys += [v for v in r.get("y", ()) if v is not None]
    def padded(vs, lo, hi):   # 3% of the span on each side, so no marker sits on the frame
        a, b = min(vs, default=lo), max(vs, default=hi)
        pad = 0.03 * (b - a)
        return a - pad, b + pad
    x0, x1, xt = (log_ticks if xlog else ticks)(*(xlim or padded(xs, 0.0, 1.0)))
    y0, y1, yt = (log_ticks if ylog else ticks)(*(ylim or padded(ys, 0.0, 1.0)))
    if xlim:
        x0, x1, xt = xlim[0], xlim[1], [t for t in xt if xlim[0] - 1e-9 <= t <= xlim[1] + 1e-9]
    if ylim:
        y0, y1, yt = ylim[0], ylim[1], [t for t in yt if ylim[0] - 1e-9 <= t <= ylim[1] + 1e-9]
    xstep = xt[1] - xt[0] if len(xt) > 1 else 1.0
    ystep = yt[1] - yt[0] if len(yt) > 1 else 1.0

    left = 70
    wrap = max(20, int((width - left - 10) / 6.0))   # 11px sans-serif: about 6 px a character
    notes = [ln for note in notes for ln in (textwrap.wrap(note, wrap) or [""])]
    legend_w = 12 + 7.2 * max([len(s["name"]) for s in series] + [4]) + 34
    right, top = 20 + legend_w, 40 if title else 20
    bottom = 55 + 16 * len(notes)
    pw, ph = width - left - right, height - top - bottom

    def X(v):
        return left + (v - x0) / ((x1 - x0) or 1.0) * pw

    def Y(v):
        return top + ph - (v - y0) / ((y1 - y0) or 1.0) * ph

    def clampx(v):
        return min(max(v, x0), x1)

    def clampy(v):
        return min(max(v, y0), y1)

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
         f'<rect width="{width}" height="{height}" fill="white"/>']
    if title:
        o.append(f'<text x="{left + pw / 2:.1f}" y="22" text-anchor="middle" font-size="15" '
                 f'font-weight="bold">{escape(title)}</text>')
    for r in regions:
        rx0, rx1 = r.get("x", (x0, x1))
        ry0, ry1 = r.get("y", (y0, y1))
        ax, bx = X(clampx(rx0 if rx0 is not None else x0)), X(clampx(rx1 if rx1 is not None else x1))
        ay, by = Y(clampy(ry1 if ry1 is not None else y1)), Y(clampy(ry0 if ry0 is not None else y0))
        o.append(f'<rect x="{min(ax, bx):.1f}" y="{min(ay, by):.1f}" width="{abs(bx - ax):.1f}" '
                 f'height="{abs(by - ay):.1f}" fill="{r.get("color", "#2ca02c")}" fill-opacity="0.10"/>')
        if r.get("label"):
            o.append(f'<text x="{min(ax, bx) + 5:.1f}" y="{min(ay, by) + 14:.1f}" fill="#2a7a2a" '
                     f'font-size="11">{escape(r["label"])}</text>')
    # grid and ticks
    for t in xt:
        o.append(f'<line x1="{X(t):.1f}" y1="{top}" x2="{X(t):.1f}" y2="{top + ph}" stroke="#e6e6e6"/>')
        o.append(f'<text x="{X(t):.1f}" y="{top + ph + 16}" text-anchor="middle">'
                 f'{log_label(t) if xlog else fmt_tick(t, xstep)}</text>')
    for t in yt:
        o.append(f'<line x1="{left}" y1="{Y(t):.1f}" x2="{left + pw}" y2="{Y(t):.1f}" stroke="#e6e6e6"/>')
        o.append(f'<text x="{left - 6}" y="{Y(t) + 4:.1f}" text-anchor="end">'
                 f'{log_label(t) if ylog else fmt_tick(t, ystep)}</text>')
    o.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    for v, label in hlines:
        if y0 <= v <= y1:
            o.append(f'<line x1="{left}" y1="{Y(v):.1f}" x2="{left + pw}" y2="{Y(v):.1f}" stroke="#888" '
                     f'stroke-dasharray="5,4"/>')
            if label:
                o.append(f'<text x="{left + pw - 4}" y="{Y(v) - 4:.1f}" text-anchor="end" fill="#666" '
                         f'font-size="11">{escape(label)}</text>')
    for v, label in vlines:
        if x0 <= v <= x1:
            o.append(f'<line x1="{X(v):.1f}" y1="{top}" x2="{X(v):.1f}" y2="{top + ph}" stroke="#888" '
                     f'stroke-dasharray="5,4"/>')
            if label:
                o.append(f'<text x="{X(v) + 4:.1f}" y="{top + 12}" fill="#666" font-size="11">{escape(label)}</text>')
    o.append(f'<text x="{left + pw / 2:.1f}" y="{top + ph + 36}" text-anchor="middle">{escape(xlabel)}</text>')
    o.append(f'<text transform="translate(18,{top + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
             f'{escape(ylabel)}</text>')
    # series, clipped to the plot area
    o.append(f'<clipPath id="plotarea"><rect x="{left}" y="{top}" width="{pw}" height="{ph}"/></clipPath>')
    o.append('<g clip-path="url(#plotarea)">')
    for s in series:
        pts = s["points"]
        if s["line"] and len(pts) > 1:
            d = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in pts)
            dash = f' stroke-dasharray="{s["dash"]}"' if s.get("dash") else ""
            o.append(f'<polyline points="{d}" fill="none" stroke="{s["color"]}" stroke-width="1.8"{dash}/>')
        for x, y in pts:
            o.append(marker_svg(s["marker"], X(x), Y(y), s["color"], s.get("size", 4.5)))
    o.append('</g>')
    # legend
    lx, ly = left + pw + 14, top + 4
    o.append(f'<rect x="{lx}" y="{ly}" width="{legend_w - 18:.0f}" height="{10 + 18 * len(series)}" fill="white" '
             f'stroke="#bbb"/>')
    for i, s in enumerate(series):
        yy = ly + 14 + 18 * i
        if s["line"]:
            dash = f' stroke-dasharray="{s["dash"]}"' if s.get("dash") else ""
            o.append(f'<line x1="{lx + 6}" y1="{yy}" x2="{lx + 28}" y2="{yy}" stroke="{s["color"]}" stroke-width="1.8"{dash}/>')
        o.append(marker_svg(s["marker"], lx + 17, yy, s["color"], 4))
        o.append(f'<text x="{lx + 34}" y="{yy + 4}">{escape(s["name"])}</text>')
    for i, note in enumerate(notes):
        o.append(f'<text x="{left}" y="{top + ph + 56 + 16 * i}" fill="#444" font-size="11">{escape(note)}</text>')
    o.append('</svg>')
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("\n".join(o) + "\n")
    os.replace(tmp, path)
    return path


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "svgplot_demo.svg"
    plot(out, [{"name": "peer", "points": [(100, 1.0), (75, 1.01), (50, 1.04), (35, 1.12)]},
               {"name": "file", "points": [(100, 1.0), (75, 1.05), (50, 1.2)]},
               {"name": "recompute", "points": [(100, 1.0), (74, 1.08), (52, 1.15), (38, 1.3)]},
               {"name": "torch checkpoint", "points": [(100, 1.0), (60, 1.12), (45, 1.2), (37, 1.18)], "dash": "4,3"}],
         title="demo: memory vs step time", xlabel="busiest stage peak memory, % of the plain plan",
         ylabel="step time / plain", xlim=(0, 110), regions=[{"x": (0, 50), "y": (None, 1.10), "label": "target"}],
         hlines=[(1.0, "plain"), (1.10, "+10%")], vlines=[(50, "-50%")], notes=["file at 35%: infeasible (demo)"])
    print(out)
