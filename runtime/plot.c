/* plot.c - the picture of a run's --log: F.csv's loss drawn into F.svg (F.svg
 * appended to a name not ending in .csv), with LOG.val.csv's validation loss
 * and accuracy when there is one.  Two panels: against the step and against
 * the run's time (the log's time_s, which a resumed or re-planned run goes on
 * counting).  Drawn from the whole file, so a resumed run that appended to it
 * is drawn whole; where a resumed run logged a step again (the steps after its
 * checkpoint), its row replaces the earlier ones from that step on.  A curve
 * of more than PLOT_MAX_POINTS rows is drawn through PLOT_MAX_POINTS of them,
 * evenly spaced, the first and the last among them: a browser draws a
 * polyline of a million points slowly, and a 360-pixel panel shows no more.
 * Each polyline says how many rows it stands for (data-rows) and how many
 * points it has (data-points).  Written to a temporary file and renamed. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "run.h"

/* A CSV's rows: the step and two of its columns (the log: loss and time_s; LOG.val.csv: val_loss and
 * val_accuracy), steps ascending. */
typedef struct Rows {
  int64_t n, cap, *step;
  double *a, *b;
} Rows;

static void rows_free(Rows *rw) {
  free(rw->step), free(rw->a), free(rw->b);
  memset(rw, 0, sizeof *rw);
}

/* A row; a step at or before the last kept one is a resumed run's, which replaces those rows. */
static int push(Rows *rw, int64_t step, double a, double b) {
  while (rw->n && rw->step[rw->n - 1] >= step) rw->n--;
  if (rw->n == rw->cap) {
    int64_t cap = rw->cap ? 2 * rw->cap : 256;
    int64_t *s = realloc(rw->step, sizeof *s * (size_t)cap);
    if (s) rw->step = s;
    double *na = s ? realloc(rw->a, sizeof *na * (size_t)cap) : NULL;
    if (na) rw->a = na;
    double *nb = na ? realloc(rw->b, sizeof *nb * (size_t)cap) : NULL;
    if (!nb) return -1;
    rw->b = nb, rw->cap = cap;
  }
  rw->step[rw->n] = step, rw->a[rw->n] = a, rw->b[rw->n++] = b;
  return 0;
}

/* The rows of a CSV of ncols numeric columns (the step first), keeping columns ia and ib.  The header and
 * any line that is not such a row are passed over.  A val file that is not there has no rows. */
static int read_rows(const char *path, int ncols, int ia, int ib, int optional, Rows *rw, char *msg, size_t len) {
  FILE *f = fopen(path, "r");
  if (!f && optional && errno == ENOENT) return 0;
  if (!f) return snprintf(msg, len, "cannot draw the loss picture: cannot read %s: %s", path, strerror(errno)), -1;
  char line[512];
  int rc = 0;
  while (rc == 0 && fgets(line, sizeof line, f)) {
    double c[4] = {0};
    char *p = line, *end;
    long long s = strtoll(p, &end, 10);
    if (end == p || *end != ',') continue;
    int k;
    for (k = 1, p = end + 1; k < ncols; k++) {
      c[k] = strtod(p, &end);
      if (end == p || !isfinite(c[k]) || (k + 1 < ncols && *end != ',')) break;
      p = end + (k + 1 < ncols);
    }
    if (k == ncols && (*end == '\n' || *end == '\r' || !*end)) rc = push(rw, s, c[ia], c[ib]);
  }
  if (rc) snprintf(msg, len, "cannot draw the loss picture: out of memory for the rows of %s", path);
  else if (ferror(f)) rc = -1, snprintf(msg, len, "cannot draw the loss picture: cannot read %s: %s", path, strerror(errno));
  fclose(f);
  return rc;
}

/* An axis from lo to hi in ticks of 1, 2 or 5 times a power of ten, about five of them; the ends on
 * ticks, or (tight: the steps and the time, which start and end where the run did) the data's own. */
typedef struct Axis {
  double lo, hi, tick;
} Axis;

static Axis axis_of(double lo, double hi, double min_tick, int tight) {
  if (!(hi > lo) && lo == 0) hi = 1; /* one value: 0 to 1 (a time), or a range around it */
  else if (!(hi > lo)) lo -= fabs(lo) / 10, hi += fabs(hi) / 10;
  double raw = (hi - lo) / 5, mag = pow(10, floor(log10(raw))), f = raw / mag;
  double tick = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
  if (tick < min_tick) tick = min_tick;
  return tight ? (Axis){lo, hi, tick} : (Axis){floor(lo / tick) * tick, ceil(hi / tick) * tick, tick};
}

/* The plot areas: two panels side by side. */
enum { W = 1000, H = 450, PY = 70, PW = 360, PH = 290 };
static const double PX[2] = {80, 580};

static double at_x(Axis a, double px, double v) { return px + (v - a.lo) / (a.hi - a.lo) * PW; }
static double at_y(Axis a, double v) { return PY + PH - (v - a.lo) / (a.hi - a.lo) * PH; }

/* A tick's label: as many decimals as the tick needs. */
static void tick_label(char *b, size_t n, double v, double tick) {
  int dec = tick >= 1 ? 0 : (int)-floor(log10(tick) + 1e-9);
  snprintf(b, n, "%.*f", dec, fabs(v) < tick / 2 ? 0.0 : v);
}

/* A curve of one panel: x and y per row, the right axis (accuracy in %) or the left (loss). */
typedef struct Curve {
  const char *cls, *colour;
  const double *x, *y;
  int64_t n;
  int right, dots;
} Curve;

static void draw_curve(FILE *f, const Curve *c, double px, Axis ax, Axis ay) {
  int64_t m = c->n < PLOT_MAX_POINTS ? c->n : PLOT_MAX_POINTS;
  if (!m) return;
  fprintf(f, "<polyline class=\"%s\" data-rows=\"%lld\" data-points=\"%lld\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"",
          c->cls, (long long)c->n, (long long)m, c->colour, c->dots ? "1" : "1.5");
  if (c->dots) fprintf(f, " marker-start=\"url(#dot-%s)\" marker-mid=\"url(#dot-%s)\" marker-end=\"url(#dot-%s)\"", c->cls, c->cls, c->cls);
  fprintf(f, " points=\"");
  for (int64_t i = 0; i < m; i++) {
    int64_t k = m == c->n ? i : i * (c->n - 1) / (m - 1); /* evenly spaced rows, the first and the last */
    fprintf(f, "%s%.1f,%.1f", i ? " " : "", at_x(ax, px, c->x[k]), at_y(ay, c->y[k]));
  }
  fprintf(f, "\"/>\n");
}

/* One panel: its frame, the grid and ticks of both axes (the right one, accuracy, when there is a
 * validation curve), the labels, the curves. */
static void draw_panel(FILE *f, int p, const char *title, const char *xlabel, Axis ax, Axis ay, const Curve *c, int nc) {
  double px = PX[p];
  char lab[64];
  int acc = 0;
  for (int i = 0; i < nc; i++) acc |= c[i].right && c[i].n > 0;
  fprintf(f, "<g class=\"panel\" id=\"%s\">\n<text x=\"%.0f\" y=\"%d\" text-anchor=\"middle\" font-weight=\"bold\">%s</text>\n",
          p ? "by-time" : "by-step", px + PW / 2.0, PY - 12, title);
  /* Ticks by their index: at 1e17 adding a tick of 1 leaves the value as it was. */
  for (int i = 0; i < 100 && ceil(ax.lo / ax.tick - 1e-9) * ax.tick + i * ax.tick <= ax.hi + ax.tick * 1e-9; i++) {
    double v = ceil(ax.lo / ax.tick - 1e-9) * ax.tick + i * ax.tick, x = at_x(ax, px, v);
    tick_label(lab, sizeof lab, v, ax.tick);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e4e4e4\"/><text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
            x, PY, x, PY + PH + 4, x, PY + PH + 17, lab);
  }
  for (int i = 0; i < 100 && ay.lo + i * ay.tick <= ay.hi + ay.tick / 2; i++) {
    double v = ay.lo + i * ay.tick, y = at_y(ay, v);
    tick_label(lab, sizeof lab, v, ay.tick);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
            px - 4, y, px + PW, y, px - 7, y + 4, lab);
  }
  for (int v = 0; acc && v <= 100; v += 20)
    fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#59a14f\"/><text x=\"%d\" y=\"%.1f\" fill=\"#3b7a35\">%d%%</text>\n",
            (int)px + PW, PY + PH - v / 100.0 * PH, (int)px + PW + 4, PY + PH - v / 100.0 * PH, (int)px + PW + 7, PY + PH - v / 100.0 * PH + 4, v);
  fprintf(f, "<rect x=\"%.0f\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#555\"/>\n", px, PY, PW, PH);
  fprintf(f, "<text x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", px + PW / 2.0, PY + PH + 36, xlabel);
  fprintf(f, "<text transform=\"translate(%.0f,%d) rotate(-90)\" text-anchor=\"middle\">loss</text>\n", px - 55, PY + PH / 2);
  if (acc)
    fprintf(f, "<text transform=\"translate(%.0f,%d) rotate(90)\" text-anchor=\"middle\" fill=\"#3b7a35\">validation accuracy</text>\n",
            px + PW + 45, PY + PH / 2);
  Axis aacc = {0, 100, 20};
  for (int i = 0; i < nc; i++) draw_curve(f, &c[i], px, ax, c[i].right ? aacc : ay);
  fprintf(f, "</g>\n");
}

/* Bytes of a file name that are not plain ASCII text become '?': the SVG stays valid XML in UTF-8. */
static void put_escaped(FILE *f, const char *s) {
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '&') fputs("&amp;", f);
    else if (*c == '<') fputs("&lt;", f);
    else if (*c == '>') fputs("&gt;", f);
    else if (*c < 0x20 || *c >= 0x7f) fputc('?', f);
    else fputc(*c, f);
  }
}

/* What a picture is drawn from: the rows, and per curve of the time panel its x (the log's time of the
 * validation row's step: a row whose step the log lacks is left out of that panel). */
typedef struct Picture {
  const char *name;
  const Rows *lr, *vr;
  double *steps, *acc, *vx, *vy, *vacc; /* steps: the log's, then the validation rows'; acc in % */
  int64_t nvt;
} Picture;

/* The curves' x and y that the rows do not hold as they are. */
static int picture_arrays(Picture *pc) {
  const Rows *lr = pc->lr, *vr = pc->vr;
  size_t nv = (size_t)vr->n + 1;
  pc->steps = malloc(sizeof(double) * (size_t)(lr->n + vr->n)), pc->acc = malloc(sizeof(double) * nv);
  pc->vx = malloc(sizeof(double) * nv), pc->vy = malloc(sizeof(double) * nv), pc->vacc = malloc(sizeof(double) * nv);
  if (!pc->steps || !pc->acc || !pc->vx || !pc->vy || !pc->vacc) return -1;
  for (int64_t i = 0; i < lr->n; i++) pc->steps[i] = (double)lr->step[i];
  int64_t j = 0;
  for (int64_t i = 0; i < vr->n; i++) {
    pc->steps[lr->n + i] = (double)vr->step[i], pc->acc[i] = 100 * vr->b[i];
    while (j < lr->n && lr->step[j] < vr->step[i]) j++; /* both ascend */
    if (j < lr->n && lr->step[j] == vr->step[i]) pc->vx[pc->nvt] = lr->b[j], pc->vy[pc->nvt] = vr->a[i], pc->vacc[pc->nvt++] = pc->acc[i];
  }
  return 0;
}

static void picture_head(FILE *f, const Picture *pc) {
  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
             "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n<title>",
          W, H, W, H);
  put_escaped(f, pc->name);
  fprintf(f, "</title>\n<defs>");
  static const char *dots[3][2] = {{"loss", "#4e79a7"}, {"val-loss", "#f28e2b"}, {"val-accuracy", "#59a14f"}};
  for (int i = 0; i < 3; i++)
    fprintf(f, "<marker id=\"dot-%s\" viewBox=\"0 0 6 6\" refX=\"3\" refY=\"3\" markerWidth=\"6\" markerHeight=\"6\" "
               "markerUnits=\"userSpaceOnUse\"><circle cx=\"3\" cy=\"3\" r=\"2.5\" fill=\"%s\"/></marker>",
            dots[i][0], dots[i][1]);
  fprintf(f, "</defs>\n<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n<text x=\"%d\" y=\"26\" text-anchor=\"middle\" font-size=\"15\">", W, H, W / 2);
  put_escaped(f, pc->name);
  fprintf(f, ": %lld step%s, last loss %.6g</text>\n", (long long)pc->lr->n, pc->lr->n == 1 ? "" : "s", pc->lr->a[pc->lr->n - 1]);
}

/* The picture: the title, the two panels on shared loss ticks, the legend. */
static void draw(FILE *f, const Picture *pc) {
  const Rows *lr = pc->lr, *vr = pc->vr;
  double lo = lr->a[0], hi = lr->a[0], last = (double)lr->step[lr->n - 1];
  for (int64_t i = 0; i < lr->n; i++) lo = fmin(lo, lr->a[i]), hi = fmax(hi, lr->a[i]);
  for (int64_t i = 0; i < vr->n; i++) lo = fmin(lo, vr->a[i]), hi = fmax(hi, vr->a[i]), last = fmax(last, (double)vr->step[i]);
  if (lo >= 0 && lo < hi / 2) lo = 0; /* a loss falling towards 0 is drawn from 0 */
  Axis ay = axis_of(lo, hi, 0, 0), as = axis_of(pc->steps[0], last, 1, 1), at = axis_of(0, lr->b[lr->n - 1], 0, 1);
  picture_head(f, pc);
  int one = lr->n == 1; /* a line through one point draws nothing: a dot */
  Curve by_step[3] = {{"loss", "#4e79a7", pc->steps, lr->a, lr->n, 0, one},
                      {"val-loss", "#f28e2b", pc->steps + lr->n, vr->a, vr->n, 0, 1},
                      {"val-accuracy", "#59a14f", pc->steps + lr->n, pc->acc, vr->n, 1, 1}};
  Curve by_time[3] = {{"loss", "#4e79a7", lr->b, lr->a, lr->n, 0, one},
                      {"val-loss", "#f28e2b", pc->vx, pc->vy, pc->nvt, 0, 1},
                      {"val-accuracy", "#59a14f", pc->vx, pc->vacc, pc->nvt, 1, 1}};
  draw_panel(f, 0, "loss against step", "step", as, ay, by_step, 3);
  draw_panel(f, 1, "loss against time", "time (s)", at, ay, by_time, 3);
  static const char *what[3] = {"training loss", "validation loss", "validation accuracy (right axis)"};
  for (int i = 0; i < (vr->n ? 3 : 1); i++)
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/><text x=\"%d\" y=\"%d\">%s</text>\n",
            250 + 200 * i, H - 22, 275 + 200 * i, H - 22, by_step[i].colour, 281 + 200 * i, H - 18, what[i]);
  if (lr->n > PLOT_MAX_POINTS || vr->n > PLOT_MAX_POINTS)
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"10\" fill=\"#777\">a curve of more than %d rows is drawn through "
               "%d of them, evenly spaced</text>\n", W - 8, H - 4, PLOT_MAX_POINTS, PLOT_MAX_POINTS);
  fprintf(f, "</svg>\n");
}

/* The picture into svg: written to svg.tmp-PID and renamed over it, so that a reader (a browser
 * reloading it during the run) never sees half a picture.  An svg that is there must be a regular
 * file: the rename would replace a device node, a FIFO or a symbolic link with it. */
static int write_svg(const char *svg, const Picture *pc, char *msg, size_t len) {
  char tmp[4200];
  struct stat sb;
  if (lstat(svg, &sb) == 0 && !S_ISREG(sb.st_mode))
    return snprintf(msg, len, "cannot write the loss picture %s: it exists and is not a regular file; the log is whole", svg), -1;
  snprintf(tmp, sizeof tmp, "%s.tmp-%d", svg, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return snprintf(msg, len, "cannot write the loss picture %s: %s; the log is whole", tmp, strerror(errno)), -1;
  draw(f, pc);
  errno = 0;
  int bad = ferror(f), err = errno;
  if (fclose(f) && !bad) bad = 1, err = errno;
  if (!bad && rename(tmp, svg)) bad = 1, err = errno;
  if (!bad) return 0;
  unlink(tmp);
  return snprintf(msg, len, "cannot write the loss picture %s: %s; the log is whole", svg, strerror(err ? err : EIO)), -1;
}

/* F.csv -> F.svg, any other name -> name.svg.  -1 when it does not fit. */
int plot_name(const char *log, char *svg, size_t len) {
  size_t n = strlen(log);
  int k = n > 4 && !strcmp(log + n - 4, ".csv") ? snprintf(svg, len, "%.*s.svg", (int)(n - 4), log) : snprintf(svg, len, "%s.svg", log);
  return k < 0 || (size_t)k >= len ? -1 : 0;
}

/* --log's picture, from the log and, where val is not NULL, LOG.val.csv (when it is there); a log
 * without rows draws nothing.  0, or -1 with the reason in msg. */
int plot_log(const char *log, const char *val, const char *svg, char *msg, size_t len) {
  Rows lr = {0}, vr = {0};
  const char *slash = strrchr(log, '/');
  Picture pc = {slash ? slash + 1 : log, &lr, &vr, NULL, NULL, NULL, NULL, NULL, 0};
  int rc = read_rows(log, 4, 1, 3, 0, &lr, msg, len);
  if (rc == 0 && val) rc = read_rows(val, 3, 1, 2, 1, &vr, msg, len);
  if (rc == 0 && lr.n && picture_arrays(&pc)) rc = -1, snprintf(msg, len, "cannot draw the loss picture: out of memory");
  if (rc == 0 && lr.n) rc = write_svg(svg, &pc, msg, len);
  rows_free(&lr), rows_free(&vr);
  free(pc.steps), free(pc.acc), free(pc.vx), free(pc.vy), free(pc.vacc);
  return rc;
}
