/* timeline.c - a pipeline schedule as an SVG Gantt chart (timeline.h).
 *
 * Layout, top to bottom: the title line (with a summary on the right), one row
 * per rank with its label on the left, the time axis (ticks at 1/2/5 x 10^k in
 * s, ms, us or ns, measured from the earliest action), and the legend of the
 * kinds present.  Within a row, "wait" boxes are drawn first, compute boxes
 * (F, B, I, W, UPDATE) over them at full height, communication boxes (SEND,
 * RECV, SEND_GRAD, RECV_GRAD) over those as a band along the bottom of the row,
 * and actions narrower than a pixel last, as ticks across the row.  A chunked
 * chart (pipecc --chunks: a rank runs several stages) adds a key under the
 * legend: each chunk's shade and the stages each rank runs.  Every number is
 * printed with a fixed format, so the output is a pure function of the
 * input. */
#include "timeline.h"

#include "../runtime/actions.h" /* the kinds' names and legends */

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Each kind's colours; its name and legend are runtime/actions.def's (a wait's are here). */
static const struct {
  const char *fill, *ink; /* ink: text on the fill, and the tick colour */
} KIND[TL_NKINDS] = {
    [TL_F] = {"#4e79a7", "#ffffff"},
    [TL_B] = {"#59a14f", "#ffffff"},
    [TL_I] = {"#f28e2b", "#1a1a1a"},
    [TL_W] = {"#edc948", "#1a1a1a"},
    [TL_SEND] = {"#6b6b6b", "#ffffff"},
    [TL_RECV] = {"#a9a9a9", "#1a1a1a"},
    [TL_SEND_GRAD] = {"#4f5d73", "#ffffff"},
    [TL_RECV_GRAD] = {"#9aa8bd", "#1a1a1a"},
    [TL_UPDATE] = {"#8e6bb0", "#ffffff"},
    [TL_OFFLOAD] = {"#b07aa1", "#ffffff"},
    [TL_PREFETCH] = {"#ff9da7", "#1a1a1a"},
    [TL_RECOMPUTE] = {"#76b7b2", "#1a1a1a"},
    [TL_HOLD] = {"#d4a6c8", "#1a1a1a"},
    [TL_RETURN] = {"#9c755f", "#ffffff"},
    [TL_SEND_STASH] = {"#e15759", "#ffffff"},
    [TL_RECV_STASH] = {"#f1a3a4", "#1a1a1a"},
    [TL_SEND_WEIGHTS] = {"#3d7a6e", "#ffffff"},
    [TL_RECV_WEIGHTS] = {"#a0cbc2", "#1a1a1a"},
    [TL_WAIT] = {"#f6c1c1", "#b03030"},
};

const char *tl_kind_name(int kind) { return kind == TL_WAIT ? "wait" : pr_action_name(kind); }

/* The legend's words for a kind. */
static const char *kind_what(int kind) { return kind == TL_WAIT ? "waiting" : pr_action_legend(kind); }

int tl_kind_from_name(const char *s) {
  if (!s) return -1;
  for (int k = 0; k < TL_NKINDS; k++)
    if (!strcmp(s, tl_kind_name(k))) return k;
  return -1;
}

enum { LAYER_WAIT, LAYER_COMPUTE, LAYER_COMM, LAYER_TICK };
static int is_comm(int kind) {
  return kind == TL_SEND || kind == TL_RECV || kind == TL_SEND_GRAD || kind == TL_RECV_GRAD || kind == TL_OFFLOAD ||
         kind == TL_PREFETCH || kind == TL_HOLD || kind == TL_RETURN || kind == TL_SEND_STASH || kind == TL_RECV_STASH ||
         kind == TL_SEND_WEIGHTS || kind == TL_RECV_WEIGHTS;
}

/* Geometry, in px. */
#define W_PX 1400.0
#define LEFT 90.0
#define RIGHT 30.0
#define TOP 56.0
#define ROW_H 28.0
#define ROW_GAP 8.0
#define COMM_H 12.0
#define FONT_BOX 11.0
#define FONT_COMM 9.0

/* Text with &<>"' escaped; control characters and bytes that are not valid
 * UTF-8 become '?', so the document always parses. */
static void put_text(Buf *o, const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    unsigned c = *p;
    if (c == '&') buf_printf(o, "&amp;"), p++;
    else if (c == '<') buf_printf(o, "&lt;"), p++;
    else if (c == '>') buf_printf(o, "&gt;"), p++;
    else if (c == '"') buf_printf(o, "&quot;"), p++;
    else if (c == '\'') buf_printf(o, "&apos;"), p++;
    else if (c < 0x20 || c == 0x7f) buf_printf(o, "?"), p++;
    else if (c < 0x80) buf_printf(o, "%c", (char)c), p++;
    else {
      /* A well-formed UTF-8 sequence (no overlongs, surrogates or > U+10FFFF). */
      int len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
      int ok = len > 0;
      for (int i = 1; ok && i < len; i++) ok = (p[i] & 0xc0) == 0x80;
      if (ok && len == 3) {
        if (c == 0xe0 && p[1] < 0xa0) ok = 0;
        if (c == 0xed && p[1] >= 0xa0) ok = 0;
        /* U+FFFE and U+FFFF are not XML characters. */
        if (c == 0xef && p[1] == 0xbf && (p[2] == 0xbe || p[2] == 0xbf)) ok = 0;
      }
      if (ok && len == 4) {
        if (c == 0xf0 && p[1] < 0x90) ok = 0;
        if (c == 0xf4 && p[1] >= 0x90) ok = 0;
      }
      if (!ok) {
        buf_printf(o, "?");
        p++;
      } else {
        buf_printf(o, "%.*s", len, (const char *)p);
        p += len;
      }
    }
  }
}

/* The display unit for a time range: s, ms, us or ns. */
static void pick_unit(double range, double *unit, const char **uname) {
  static const double u[] = {1, 1e-3, 1e-6, 1e-9};
  static const char *n[] = {"s", "ms", "\xc2\xb5s", "ns"};
  int k = 0;
  while (k < 3 && range < u[k]) k++;
  *unit = u[k];
  *uname = n[k];
}

/* A tick step of 1, 2 or 5 x 10^k (in units) giving about `want` ticks. */
static double nice_step(double range_units, int want, int *decimals) {
  double raw = range_units / want;
  if (!(raw > 0)) raw = 1;
  double mag = pow(10, floor(log10(raw)));
  double norm = raw / mag;
  double nice = norm < 1.5 ? 1 : norm < 3.5 ? 2 : norm < 7.5 ? 5 : 10;
  double step = nice * mag;
  int d = (int)-floor(log10(step) + 1e-9);
  *decimals = d > 0 ? (d > 9 ? 9 : d) : 0;
  return step;
}

static int ndigits(int v) {
  int d = 1;
  while (v >= 10) v /= 10, d++;
  return d;
}

typedef struct {
  int step;
  double start;
} StepStart;
static int cmp_step(const void *a, const void *b) {
  const StepStart *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  return x->start < y->start ? -1 : x->start > y->start ? 1 : 0;
}

static int span_ok(const TlSpan *s, int nranks) {
  return s->rank >= 0 && s->rank < nranks && s->kind >= 0 && s->kind < TL_NKINDS && s->chunk < TL_MAX_CHUNKS &&
         isfinite(s->start) && isfinite(s->end);
}

/* What the drawing is laid out by: the time range and its unit, the rows, and where each part goes. */
typedef struct Frame {
  const TlSpan *spans;
  int n, nranks, nvalid, present[TL_NKINDS];
  double t0, t1, range, unit, pw, pitch, rows_end, axis_y, legend_y, height;
  const char *uname;
  double legend_x[TL_NKINDS], legend_row_y[TL_NKINDS];
  /* Chunked: the chunks a rank runs (0: not chunked) and stage_of[rank * nchunks + chunk] (-1: unknown). */
  int nchunks, *stage_of;
  double key_y; /* the baseline of the chunks' key's first line */
} Frame;

static double fx(const Frame *f, double t) { return LEFT + (t - f->t0) / f->range * f->pw; }

/* A chunked chart's chunks: the highest chunk + 1 of the spans drawn, and each rank's chunks' stages as the
 * first span of each names them.  Nothing when no span is past chunk 0. */
static void frame_chunks(Frame *f) {
  int v = 0;
  for (int i = 0; i < f->n; i++)
    if (span_ok(&f->spans[i], f->nranks) && f->spans[i].chunk + 1 > v) v = f->spans[i].chunk + 1;
  if (v <= 1) return;
  size_t cells = (size_t)f->nranks * (size_t)v;
  f->nchunks = v;
  f->stage_of = malloc(sizeof(int) * (cells + 1));
  if (!f->stage_of) abort();
  for (size_t i = 0; i < cells; i++) f->stage_of[i] = -1;
  for (int i = 0; i < f->n; i++) {
    const TlSpan *s = &f->spans[i];
    int *at = span_ok(s, f->nranks) && s->chunk >= 0 ? &f->stage_of[(size_t)s->rank * (size_t)v + (size_t)s->chunk] : NULL;
    if (at && *at < 0 && s->stage >= 0) *at = s->stage;
  }
}

void timeline_stage_list(Buf *o, const int *stages, int n) {
  for (int i = 0; i < n; i++) {
    buf_printf(o, "%s", !i ? "" : i == n - 1 ? " and " : ", ");
    if (stages[i] >= 0) buf_printf(o, "%d", stages[i]);
    else buf_printf(o, "?");
  }
}

static void rank_stages(Buf *o, const Frame *f, int r) {
  buf_printf(o, "rank %d runs stages ", r);
  timeline_stage_list(o, &f->stage_of[(size_t)r * (size_t)f->nchunks], f->nchunks);
}

int timeline_chunks_text(Buf *o, const TlSpan *spans, int n, int nranks) {
  Frame f = {0};
  f.spans = spans, f.n = n < 0 || !spans ? 0 : n;
  f.nranks = nranks < 0 ? 0 : nranks > TL_MAX_RANKS ? TL_MAX_RANKS : nranks;
  frame_chunks(&f);
  for (int r = 0; f.nchunks && r < f.nranks; r++) {
    if (r) buf_printf(o, "; ");
    rank_stages(o, &f, r);
  }
  free(f.stage_of);
  return f.nchunks;
}

/* Chunk c of a chunked chart's v, as a shade of a kind's colour: mixed with white, the more the later the
 * chunk (up to 55%), so that a rank's chunks tell apart while every kind keeps its hue. */
static void shade(char out[8], const char *hex, int c, int v) {
  double w = v > 1 && c > 0 ? 0.55 * c / (v - 1) : 0;
  unsigned long rgb = strtoul(hex + 1, NULL, 16);
  int ch[3];
  for (int k = 0; k < 3; k++) {
    int x = (int)(rgb >> (16 - 8 * k) & 0xff);
    ch[k] = (int)lround(x + (255 - x) * w);
  }
  snprintf(out, 8, "#%02x%02x%02x", ch[0], ch[1], ch[2]);
}

/* A span's fill and ink: its kind's; in a chunked chart a later chunk's shade of it, with dark ink (a wait
 * and the whole rank's actions, chunk -1, keep their kind's). */
static void span_colours(const Frame *f, const TlSpan *s, char fill[8], const char **ink) {
  int later = f->nchunks && s->chunk > 0 && s->kind != TL_WAIT;
  snprintf(fill, 8, "%s", KIND[s->kind].fill);
  *ink = KIND[s->kind].ink;
  if (later) shade(fill, KIND[s->kind].fill, s->chunk, f->nchunks), *ink = "#1a1a1a";
}

#define KEY_RANKS 256 /* a chunked chart's key names the stages of this many ranks at most */

/* The next entry of a legend line, w px wide, at (*x, *y): on a new line when it would pass the right edge. */
static void key_place(double w, double *x, double *y) {
  if (*x > LEFT && *x + w > W_PX - RIGHT) *x = LEFT, *y += 22;
}

/* A chunked chart's key, its first line at baseline y, wrapped to the width like the legend: what "3@1"
 * means, each chunk's shade (of a forward's colour) and the stages each rank runs.  o NULL: only measures.
 * Returns the baseline of its last line. */
static double chunk_key(Buf *o, const Frame *f, double y) {
  double x = LEFT, w;
  if (o) buf_printf(o, "<g id=\"chunks\" font-size=\"12\" fill=\"#1a1a1a\">\n");
  static const char *head = "chunks: 3@1 = micro-batch 3 of the rank's chunk 1, drawn lighter;";
  w = 6.6 * (double)strlen(head) + 22;
  if (o) buf_printf(o, "<text x=\"%.2f\" y=\"%.2f\">%s</text>\n", x, y, head);
  x += w;
  for (int c = 0; c < f->nchunks; c++) {
    char fill[8];
    key_place(w = 22 + 6.6 * (7 + ndigits(c)) + 16, &x, &y);
    shade(fill, KIND[TL_F].fill, c, f->nchunks);
    if (o)
      buf_printf(o, "<rect class=\"chunk-key\" data-chunk=\"%d\" x=\"%.2f\" y=\"%.2f\" width=\"16\" height=\"12\" fill=\"%s\"/>\n"
                    "<text x=\"%.2f\" y=\"%.2f\">chunk %d</text>\n", c, x, y - 10, fill, x + 22, y, c);
    x += w;
  }
  Buf t = {0};
  int shown = f->nranks < KEY_RANKS ? f->nranks : KEY_RANKS;
  for (int r = 0; r <= shown && r < f->nranks; r++) {
    t.len = 0;
    if (r < shown) rank_stages(&t, f, r);
    else buf_printf(&t, "and %d more ranks", f->nranks - shown);
    buf_printf(&t, "%s", r + 1 < f->nranks ? ";" : "");
    key_place(w = 6.6 * (double)t.len + 16, &x, &y);
    if (o) buf_printf(o, "<text class=\"rank-stages\" data-rank=\"%d\" x=\"%.2f\" y=\"%.2f\">%s</text>\n", r, x, y, t.s);
    x += w;
  }
  buf_free(&t);
  if (o) buf_printf(o, "</g>\n");
  return y;
}

/* The time range, the kinds present, the rows' and the legend's places (the legend wrapped to the width). */
static void frame_measure(Frame *f) {
  for (int i = 0; i < f->n; i++) {
    const TlSpan *s = &f->spans[i];
    if (!span_ok(s, f->nranks)) continue;
    double e = s->end > s->start ? s->end : s->start;
    if (!f->nvalid || s->start < f->t0) f->t0 = s->start;
    if (!f->nvalid || e > f->t1) f->t1 = e;
    f->nvalid++;
    f->present[s->kind] = 1;
  }
  f->range = f->t1 - f->t0;
  if (!(f->range > 0)) f->range = 1e-3;
  pick_unit(f->range, &f->unit, &f->uname);
  f->pw = W_PX - LEFT - RIGHT;
  f->pitch = ROW_H + ROW_GAP;
  f->rows_end = TOP + f->nranks * f->pitch - ROW_GAP;
  f->axis_y = f->rows_end + 6;
  f->legend_y = f->axis_y + 52;
  double lx = LEFT, ly = f->legend_y;
  for (int k = 0; k < TL_NKINDS; k++) {
    if (!f->present[k]) continue;
    double w = 22 + 6.6 * (double)(strlen(tl_kind_name(k)) + 3 + strlen(kind_what(k))) + 22;
    if (lx > LEFT && lx + w > W_PX - RIGHT) lx = LEFT, ly += 22;
    f->legend_x[k] = lx;
    f->legend_row_y[k] = ly;
    lx += w;
  }
  frame_chunks(f);
  f->key_y = ly + 22;
  if (f->nchunks) ly = chunk_key(NULL, f, f->key_y);
  f->height = ly + 28;
}

/* The document's head, the title line and the summary. */
static void svg_head(Buf *o, const Frame *f, const char *title) {
  double height = f->height;
  buf_printf(o, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  buf_printf(o,
             "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
             "font-family=\"DejaVu Sans, Arial, Helvetica, sans-serif\">\n",
             W_PX, height, W_PX, height);
  buf_printf(o, "<title>");
  put_text(o, title ? title : "pipeline schedule");
  buf_printf(o, "</title>\n");
  buf_printf(o, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", W_PX, height);
  buf_printf(o, "<text id=\"title\" x=\"%.0f\" y=\"26\" font-size=\"16\" font-weight=\"bold\" fill=\"#1a1a1a\">",
             LEFT - 70);
  put_text(o, title ? title : "pipeline schedule");
  buf_printf(o, "</text>\n");
  buf_printf(o,
             "<text id=\"summary\" x=\"%.0f\" y=\"26\" font-size=\"12\" fill=\"#555555\" text-anchor=\"end\">"
             "%d action%s on %d rank%s, %.3f %s</text>\n",
             W_PX - RIGHT, f->nvalid, f->nvalid == 1 ? "" : "s", f->nranks, f->nranks == 1 ? "" : "s",
             f->nvalid ? (f->t1 - f->t0) / f->unit : 0.0, f->uname);
}

/* Row backgrounds and labels. */
static void svg_rows(Buf *o, const Frame *f) {
  buf_printf(o, "<g id=\"rows\">\n");
  for (int r = 0; r < f->nranks; r++) {
    double y = TOP + r * f->pitch;
    buf_printf(o, "<rect x=\"%.0f\" y=\"%.2f\" width=\"%.0f\" height=\"%.0f\" fill=\"%s\"/>\n", LEFT, y, f->pw, ROW_H,
               r % 2 ? "#f1f3f6" : "#f7f8fa");
    buf_printf(o,
               "<text class=\"rank\" x=\"%.0f\" y=\"%.2f\" font-size=\"13\" fill=\"#1a1a1a\" "
               "text-anchor=\"end\">rank %d</text>\n",
               LEFT - 10, y + ROW_H / 2 + 4.5, r);
  }
  buf_printf(o, "</g>\n");
}

/* Axis: grid lines through the rows, ticks and labels below. */
static void svg_axis(Buf *o, const Frame *f) {
  int dec;
  double step = nice_step(f->range / f->unit, 8, &dec), axis_y = f->axis_y;
  buf_printf(o, "<g id=\"axis\" font-size=\"11\" fill=\"#333333\">\n");
  buf_printf(o, "<line x1=\"%.0f\" y1=\"%.2f\" x2=\"%.0f\" y2=\"%.2f\" stroke=\"#333333\" stroke-width=\"1\"/>\n",
             LEFT, axis_y, W_PX - RIGHT, axis_y);
  for (int k = 0; k <= 1000; k++) {
    double v = k * step;
    if (v > f->range / f->unit * (1 + 1e-9)) break;
    double x = LEFT + v * f->unit / f->range * f->pw;
    if (f->nranks)
      buf_printf(o,
                 "<line x1=\"%.2f\" y1=\"%.0f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#dddddd\" stroke-width=\"1\"/>\n", x,
                 TOP - 2, x, f->rows_end);
    buf_printf(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#333333\" stroke-width=\"1\"/>\n", x,
               axis_y, x, axis_y + 5);
    buf_printf(o, "<text class=\"tick-label\" x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%.*f</text>\n", x,
               axis_y + 18, dec, v);
  }
  buf_printf(o, "<text id=\"axis-label\" x=\"%.0f\" y=\"%.2f\" font-size=\"12\" text-anchor=\"middle\">time (%s) from the first action</text>\n",
             LEFT + f->pw / 2, axis_y + 36, f->uname);
  buf_printf(o, "</g>\n");
}

/* Step boundaries when several steps are drawn: a dashed line where each step's first action starts,
 * labelled when there is room. */
static void svg_steps(Buf *o, const Frame *f) {
  if (!f->nvalid) return;
  StepStart *ss = malloc((size_t)f->nvalid * sizeof *ss);
  if (!ss) abort();
  int m = 0;
  for (int i = 0; i < f->n; i++)
    if (span_ok(&f->spans[i], f->nranks)) ss[m++] = (StepStart){f->spans[i].step, f->spans[i].start};
  qsort(ss, (size_t)m, sizeof *ss, cmp_step);
  int nsteps = 0;
  for (int i = 0; i < m; i++)
    if (!i || ss[i].step != ss[i - 1].step) ss[nsteps++] = ss[i];
  if (nsteps > 1 && nsteps <= 500) {
    buf_printf(o, "<g id=\"steps\" font-size=\"11\" fill=\"#555555\">\n");
    double last_label = -1e9;
    for (int i = 0; i < nsteps; i++) {
      double x = fx(f, ss[i].start);
      /* Only a labelled line reaches up to its label. */
      int label = x - last_label >= 60 && x < W_PX - RIGHT - 40;
      buf_printf(o,
                 "<line class=\"step\" x1=\"%.2f\" y1=\"%.0f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#777777\" "
                 "stroke-width=\"1\" stroke-dasharray=\"4 3\"/>\n",
                 x, label ? TOP - 14 : TOP - 2, x, f->rows_end + 2);
      if (label) {
        buf_printf(o, "<text x=\"%.2f\" y=\"%.0f\">step %d</text>\n", x + 3, TOP - 5, ss[i].step);
        last_label = x;
      }
    }
    buf_printf(o, "</g>\n");
  }
  free(ss);
}

/* One action of the given layer: a tick when narrower than a pixel, else a box with its tooltip and,
 * where it fits, its micro-batch. */
static void svg_span(Buf *o, const Frame *f, const TlSpan *s, int layer) {
  double end = s->end > s->start ? s->end : s->start;
  double x = fx(f, s->start), w = fx(f, end) - x;
  int tick = w < 1.0;
  int l = tick ? LAYER_TICK : s->kind == TL_WAIT ? LAYER_WAIT : is_comm(s->kind) ? LAYER_COMM : LAYER_COMPUTE;
  if (l != layer) return;
  double ytop = TOP + s->rank * f->pitch;
  int chunked = f->nchunks && s->chunk >= 0;
  char mbtxt[64] = "", label[32] = "", chunk[80] = "", fill[8];
  const char *ink;
  span_colours(f, s, fill, &ink);
  if (s->mb >= 0) snprintf(mbtxt, sizeof mbtxt, " mb %d,", s->mb);
  /* The box's text is its micro-batch, and in a chunked chart its chunk as the listing writes it (F3@1). */
  if (s->mb >= 0) snprintf(label, sizeof label, chunked && s->chunk > 0 ? "%d@%d" : "%d", s->mb, s->chunk);
  if (chunked && s->stage >= 0) snprintf(chunk, sizeof chunk, " data-chunk=\"%d\" data-stage=\"%d\"", s->chunk, s->stage);
  else if (chunked) snprintf(chunk, sizeof chunk, " data-chunk=\"%d\"", s->chunk);
  char tip[320];
  int k = snprintf(tip, sizeof tip, "%s (%s),%s", tl_kind_name(s->kind), kind_what(s->kind), mbtxt);
  if (chunked && k < (int)sizeof tip)
    k += s->stage >= 0 ? snprintf(tip + k, sizeof tip - (size_t)k, " chunk %d (stage %d),", s->chunk, s->stage)
                       : snprintf(tip + k, sizeof tip - (size_t)k, " chunk %d,", s->chunk);
  if (k < (int)sizeof tip)
    snprintf(tip + k, sizeof tip - (size_t)k, " step %d, rank %d: %.3f to %.3f %s (%.3f %s)", s->step, s->rank, (s->start - f->t0) / f->unit,
             (end - f->t0) / f->unit, f->uname, (end - s->start) / f->unit, f->uname);
  if (tick) {
    buf_printf(o,
               "<line class=\"tick\" data-kind=\"%s\" data-rank=\"%d\" data-mb=\"%d\" data-step=\"%d\"%s "
               "x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" stroke-width=\"1.5\">"
               "<title>%s</title></line>\n",
               tl_kind_name(s->kind), s->rank, s->mb, s->step, chunk, x, ytop - 3, x, ytop + ROW_H + 3,
               s->kind == TL_WAIT ? ink : fill, tip);
    return;
  }
  int comm = layer == LAYER_COMM;
  double y = comm ? ytop + ROW_H - COMM_H : ytop + 1, h = comm ? COMM_H : ROW_H - 2;
  buf_printf(o,
             "<rect class=\"span\" data-kind=\"%s\" data-rank=\"%d\" data-mb=\"%d\" data-step=\"%d\"%s "
             "x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"%s><title>%s</title></rect>\n",
             tl_kind_name(s->kind), s->rank, s->mb, s->step, chunk, x, y, w, h, fill,
             w >= 4 ? " stroke=\"#ffffff\" stroke-width=\"0.75\"" : "", tip);
  double font = comm ? FONT_COMM : FONT_BOX;
  if (label[0] && w >= (double)strlen(label) * 0.62 * font + 4)
    buf_printf(o,
               "<text class=\"mb\" x=\"%.2f\" y=\"%.2f\" font-size=\"%.0f\" fill=\"%s\" "
               "text-anchor=\"middle\">%s</text>\n",
               x + w / 2, y + h / 2 + font * 0.36, font, ink, label);
}

/* The actions, layer by layer, each layer in input order. */
static void svg_actions(Buf *o, const Frame *f) {
  buf_printf(o, "<g id=\"actions\">\n");
  for (int layer = LAYER_WAIT; layer <= LAYER_TICK; layer++)
    for (int i = 0; i < f->n; i++)
      if (span_ok(&f->spans[i], f->nranks)) svg_span(o, f, &f->spans[i], layer);
  buf_printf(o, "</g>\n");
}

static void svg_legend(Buf *o, const Frame *f) {
  buf_printf(o, "<g id=\"legend\" font-size=\"12\" fill=\"#1a1a1a\">\n");
  for (int k = 0; k < TL_NKINDS; k++) {
    if (!f->present[k]) continue;
    buf_printf(o,
               "<rect class=\"legend\" data-kind=\"%s\" x=\"%.2f\" y=\"%.2f\" width=\"16\" height=\"12\" "
               "fill=\"%s\"/>\n",
               tl_kind_name(k), f->legend_x[k], f->legend_row_y[k] - 10, KIND[k].fill);
    buf_printf(o, "<text x=\"%.2f\" y=\"%.2f\"><tspan font-weight=\"bold\">%s</tspan> %s</text>\n",
               f->legend_x[k] + 22, f->legend_row_y[k], tl_kind_name(k), kind_what(k));
  }
  if (!f->nvalid)
    buf_printf(o, "<text x=\"%.0f\" y=\"%.2f\" fill=\"#777777\">no actions</text>\n", LEFT, f->legend_y);
  buf_printf(o, "</g>\n");
}

void timeline_svg(Buf *o, const TlSpan *spans, int n, int nranks, const char *title) {
  Frame f = {0};
  f.spans = spans, f.n = n < 0 || !spans ? 0 : n;
  f.nranks = nranks < 0 ? 0 : nranks > TL_MAX_RANKS ? TL_MAX_RANKS : nranks;
  frame_measure(&f);
  svg_head(o, &f, title);
  svg_rows(o, &f);
  svg_axis(o, &f);
  svg_steps(o, &f);
  svg_actions(o, &f);
  svg_legend(o, &f);
  if (f.nchunks) chunk_key(o, &f, f.key_y);
  buf_printf(o, "</svg>\n");
  free(f.stage_of);
}
