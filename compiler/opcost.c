/* opcost.c - node times from the op probe's grid (opcost.h, docs/cost.md). */
#include "opcost.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cost.h"
#include "ops.h"
#include "ops/conv.h"
#include "plan.h"

enum { MAX_AX = 8, MAX_FAM = 24, MAX_FILE = 4 << 20 };

/* One family: its measured points, and the dense grid made of them. */
typedef struct Fam {
  char name[32];
  int n, cap;
  double (*x)[4], (*t)[3];
  int nax[4];
  double ax[4][MAX_AX]; /* each axis's values, ascending */
  double *spw;          /* per grid cell and part: log of seconds per unit of work */
  int zero[3];          /* a part that is 0 at every point (a memory kernel's weight gradient) */
} Fam;

struct OpTable {
  Fam fam[MAX_FAM];
  int nfam;
  const char *path;
  double probe_s;
};

const char *opcost_path(char *buf, size_t len) { return cache_beside("PIPECC_OPS_CACHE", "ops", buf, len); }

/* The work a family's point does: FLOPs of a convolution or GEMM, elements of a memory kernel. */
static double work(const char *fam, const double x[4]) {
  if (!strncmp(fam, "conv@", 5)) return 2 * x[0] * x[1] * x[2] * x[2] * x[3];
  if (!strncmp(fam, "dwconv@", 7)) return 2 * x[0] * x[1] * x[1] * x[2] * x[3];
  if (!strcmp(fam, "pointconv")) return 2 * x[0] * x[1] * x[2] + x[1] * x[2] * x[3] * x[3]; /* the GEMM and the packed weights */
  if (!strcmp(fam, "gemm")) return 2 * x[0] * x[1] * x[2];
  if (!strcmp(fam, "batchnorm")) return x[0] * x[1] * x[2]; /* points per channel and image, channels, images */
  return x[0];
}

static Fam *fam_of(OpTable *t, const char *name, int make) {
  for (int i = 0; i < t->nfam; i++)
    if (!strcmp(t->fam[i].name, name)) return &t->fam[i];
  if (!make || t->nfam == MAX_FAM) return NULL;
  Fam *f = &t->fam[t->nfam++];
  snprintf(f->name, sizeof f->name, "%s", name);
  return f;
}

static const Fam *fam_find(const OpTable *t, const char *name) {
  for (int i = 0; t && i < t->nfam; i++)
    if (!strcmp(t->fam[i].name, name)) return &t->fam[i];
  return NULL;
}

static void fam_put(Fam *f, const double x[4], const double t[3]) {
  if (f->n == f->cap) {
    f->cap = f->cap ? 2 * f->cap : 64;
    f->x = realloc(f->x, sizeof *f->x * (size_t)f->cap);
    f->t = realloc(f->t, sizeof *f->t * (size_t)f->cap);
    if (!f->x || !f->t) abort();
  }
  memcpy(f->x[f->n], x, sizeof *f->x), memcpy(f->t[f->n], t, sizeof *f->t);
  f->n++;
}

/* A finite, positive coordinate or non-negative time filling the whole token. */
static int num(const char *s, double *v, int coord) {
  char *end;
  errno = 0;
  *v = strtod(s, &end);
  return end == s || *end || errno || !isfinite(*v) || *v < 0 || (coord && *v < 1) || *v > 1e12 ? -1 : 0;
}

/* Parses this machine's section of text (id) into t; other sections' lines into *other (when other is not
 * NULL).  Returns 1 when the section was there. */
static int parse(OpTable *t, char *text, const char *id, char **other) {
  int mine = 0, found = 0, header = 0;
  size_t olen = 0;
  for (char *line = text, *nl; line && *line; line = nl) {
    nl = strchr(line, '\n');
    if (nl) *nl++ = 0;
    if (!header) {
      if (strcmp(line, "pipecc-ops 3")) return 0;
      header = 1;
      continue;
    }
    if (!strncmp(line, "machine ", 8)) mine = !strcmp(line + 8, id), found |= mine;
    if (!mine && other && (!strncmp(line, "machine ", 8) || !strncmp(line, "o ", 2) || !strncmp(line, "probe ", 6))) {
      size_t l = strlen(line);
      *other = realloc(*other, olen + l + 2);
      if (!*other) abort();
      memcpy(*other + olen, line, l), olen += l, (*other)[olen++] = '\n', (*other)[olen] = 0;
    }
    if (!mine) continue;
    char fam[32], tok[7][40];
    double x[4], tt[3], s;
    if (sscanf(line, "probe %39s", tok[0]) == 1 && !num(tok[0], &s, 0)) t->probe_s = s;
    if (sscanf(line, "o %31s %39s %39s %39s %39s %39s %39s %39s", fam, tok[0], tok[1], tok[2], tok[3], tok[4], tok[5], tok[6]) != 8) continue;
    int bad = 0;
    for (int i = 0; i < 4; i++) bad |= num(tok[i], &x[i], 1);
    for (int i = 0; i < 3; i++) bad |= num(tok[4 + i], &tt[i], 0) || tt[i] > 1e3;
    Fam *f = bad ? NULL : fam_of(t, fam, 1);
    if (f) fam_put(f, x, tt);
  }
  return found;
}

static int dcmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int axis_index(const Fam *f, int d, double v) {
  for (int i = 0; i < f->nax[d]; i++)
    if (f->ax[d][i] == v) return i;
  return -1;
}

static size_t cell(const Fam *f, const int i[4]) { return (((size_t)i[0] * f->nax[1] + i[1]) * f->nax[2] + i[2]) * f->nax[3] + i[3]; }

/* Times never fall as a coordinate grows (more channels, pixels or elements never cost less): each
 * part is made non-decreasing along each axis, which a noisy point may have broken. */
static void make_monotone(const Fam *f, double *tg) {
  size_t ncell = (size_t)f->nax[0] * f->nax[1] * f->nax[2] * f->nax[3];
  for (int d = 0; d < 4; d++)
    for (size_t c = 0; c < ncell; c++) {
      int i[4] = {(int)(c / ((size_t)f->nax[1] * f->nax[2] * f->nax[3])), (int)(c / ((size_t)f->nax[2] * f->nax[3]) % f->nax[1]),
                  (int)(c / f->nax[3] % f->nax[2]), (int)(c % f->nax[3])};
      if (!i[d]) continue;
      int j[4] = {i[0], i[1], i[2], i[3]};
      j[d]--;
      for (int p = 0; p < 3; p++)
        if (tg[cell(f, i) * 3 + p] < tg[cell(f, j) * 3 + p]) tg[cell(f, i) * 3 + p] = tg[cell(f, j) * 3 + p];
    }
}

/* The dense grid of a family's points; a cell no point measured takes its nearest point's seconds per
 * unit of work.  -1 when the family has too many values on an axis. */
static int fam_grid(Fam *f) {
  for (int d = 0; d < 4; d++) {
    f->nax[d] = 0;
    for (int k = 0; k < f->n; k++)
      if (axis_index(f, d, f->x[k][d]) < 0) {
        if (f->nax[d] == MAX_AX) return -1;
        f->ax[d][f->nax[d]++] = f->x[k][d];
      }
    qsort(f->ax[d], (size_t)f->nax[d], sizeof(double), dcmp);
  }
  size_t ncell = (size_t)f->nax[0] * f->nax[1] * f->nax[2] * f->nax[3];
  double *tg = malloc(sizeof(double) * 3 * ncell);
  f->spw = malloc(sizeof(double) * 3 * ncell);
  if (!tg || !f->spw) abort();
  for (int p = 0; p < 3; p++) f->zero[p] = 1;
  for (size_t c = 0; c < ncell; c++) {
    int i[4] = {(int)(c / ((size_t)f->nax[1] * f->nax[2] * f->nax[3])), (int)(c / ((size_t)f->nax[2] * f->nax[3]) % f->nax[1]),
                (int)(c / f->nax[3] % f->nax[2]), (int)(c % f->nax[3])};
    double x[4], best = INFINITY;
    for (int d = 0; d < 4; d++) x[d] = f->ax[d][i[d]];
    for (int k = 0; k < f->n; k++) { /* the point itself (the last of equal ones), else the nearest in logs */
      double dist = 0;
      for (int d = 0; d < 4; d++) dist += pow(log(f->x[k][d] / x[d]), 2);
      if (dist <= best) {
        best = dist;
        for (int p = 0; p < 3; p++) tg[c * 3 + p] = f->t[k][p] * work(f->name, x) / work(f->name, f->x[k]);
      }
    }
    for (int p = 0; p < 3; p++) f->zero[p] &= tg[c * 3 + p] <= 0;
  }
  make_monotone(f, tg);
  for (size_t c = 0; c < ncell; c++) {
    int i[4] = {(int)(c / ((size_t)f->nax[1] * f->nax[2] * f->nax[3])), (int)(c / ((size_t)f->nax[2] * f->nax[3]) % f->nax[1]),
                (int)(c / f->nax[3] % f->nax[2]), (int)(c % f->nax[3])};
    double x[4];
    for (int d = 0; d < 4; d++) x[d] = f->ax[d][i[d]];
    for (int p = 0; p < 3; p++) f->spw[c * 3 + p] = log((tg[c * 3 + p] > 1e-12 ? tg[c * 3 + p] : 1e-12) / work(f->name, x));
  }
  free(tg);
  return 0;
}

double opcost_at(const OpTable *t, const char *fam, const double x[4], int part) {
  const Fam *f = fam_find(t, fam);
  if (!f || !f->spw || f->zero[part]) return f ? 0 : -1;
  int lo[4], hi[4];
  double w[4];
  for (int d = 0; d < 4; d++) { /* the bracket of x[d] on the axis, held at its ends */
    int m = f->nax[d], k = 0;
    while (k + 1 < m && f->ax[d][k + 1] <= x[d]) k++;
    lo[d] = k, hi[d] = k + 1 < m && x[d] > f->ax[d][k] ? k + 1 : k;
    w[d] = hi[d] == lo[d] ? 0 : log(x[d] / f->ax[d][lo[d]]) / log(f->ax[d][hi[d]] / f->ax[d][lo[d]]);
  }
  /* Below an axis's first value the time is held (a call's own overhead does not shrink with it); above
   * its last it grows with the work. */
  double xe[4];
  for (int d = 0; d < 4; d++) xe[d] = x[d] < f->ax[d][0] ? f->ax[d][0] : x[d];
  double v = 0;
  for (int corner = 0; corner < 16; corner++) {
    int i[4];
    double wt = 1;
    for (int d = 0; d < 4; d++) {
      int up = corner >> d & 1;
      i[d] = up ? hi[d] : lo[d];
      wt *= up ? w[d] : 1 - w[d];
    }
    if (wt > 0) v += wt * f->spw[cell(f, i) * 3 + part];
  }
  return exp(v) * work(f->name, xe);
}

const char *opcost_source(const OpTable *t, double *probe_s) {
  if (probe_s) *probe_s = t ? t->probe_s : 0;
  return t ? t->path : NULL;
}

/* ---- nodes ---- */

static const struct {
  const char *fam, *ops;
} MEM_FAMS[] = {
    {"relu", ",Relu,LeakyRelu,Sqrt,Dropout,"},
    {"unary", ",Abs,Neg,Clip,HardSigmoid,HardSwish,Reciprocal,Exp,Log,"},
    {"gelu", ",Gelu,Erf,Tanh,Sigmoid,Pow,"},
    {"binary", ",Add,Sub,Mul,Div,Max,Min,Where,ReduceMean,ReduceSum,ReduceMax,"},
    {"softmax", ",Softmax,LogSoftmax,"},
    {"layernorm", ",LayerNormalization,"},
    {"batchnorm", ",BatchNormalization,BatchNormalization+Relu,"},
    {"maxpool", ",MaxPool,"},
    {"avgpool", ",AveragePool,GlobalAveragePool,"},
    {"copy", ",Transpose,Concat,Split,Slice,Pad,Gather,Expand,Tile,"},
};

static double numel(const Tensor *t) { return t ? (double)ir_numel(t) : 0; }

/* A convolution's family, coordinates and multiplier (its groups). */
static const char *conv_family(const Graph *g, const Node *n, double x[4], double *mult) {
  const Tensor *X = node_in((Graph *)g, n, 0), *W = node_in((Graph *)g, n, 1), *Y = node_out((Graph *)g, n, 0);
  if (!X || !W || !Y || X->rank < 3 || W->rank != X->rank) return NULL;
  double group = (double)attr_int(n, "group", 1), cg = (double)X->dims[1] / group, mg = (double)W->dims[0] / group, taps = 1, P = (double)Y->dims[0];
  for (int i = 2; i < W->rank; i++) taps *= (double)W->dims[i], P *= (double)Y->dims[i];
  if (conv_is_point(g, n)) { /* its tap's weights packed, then a GEMM per group: [N, C/g] x [C/g, M/g] */
    x[0] = (double)X->dims[0], x[1] = cg, x[2] = mg, x[3] = sqrt(taps), *mult = group;
    return "pointconv";
  }
  int lib = conv_uses_lib(g, n);
  *mult = group, x[3] = 1;
  if (cg == 1 && mg == 1) { /* by pixels per image and images: oneDNN's weight gradient over 2x2 images costs per image */
    x[0] = group, x[1] = sqrt(taps), x[2] = P / (double)Y->dims[0], x[3] = (double)Y->dims[0], *mult = 1;
    return lib ? "dwconv@onednn" : "dwconv@im2col";
  }
  x[0] = cg, x[1] = mg, x[2] = sqrt(taps), x[3] = P;
  return lib ? "conv@onednn" : "conv@im2col";
}

/* A GEMM's family: Gemm's [M, K] x [K, N]; MatMul's batch of them (a shared weight folds it into M). */
static const char *gemm_family(const Graph *g, const Node *n, double x[4], double *mult) {
  const Tensor *A = node_in((Graph *)g, n, 0), *B = node_in((Graph *)g, n, 1), *Y = node_out((Graph *)g, n, 0);
  if (!A || !B || !Y || A->rank < 2 || Y->rank < 2) return NULL;
  double M = (double)Y->dims[Y->rank - 2], N = (double)Y->dims[Y->rank - 1], batch = 1, K;
  for (int i = 0; i < Y->rank - 2; i++) batch *= (double)Y->dims[i];
  if (!strcmp(n->def->name, "Gemm")) K = (double)(attr_int(n, "transA", 0) ? A->dims[0] : A->dims[1]);
  else K = (double)A->dims[A->rank - 1];
  if (B->rank == 2) M *= batch, batch = 1;
  x[0] = M, x[1] = N, x[2] = K, x[3] = 1, *mult = batch;
  return M >= 1 && N >= 1 && K >= 1 ? "gemm" : NULL;
}

static const char *node_family(const Graph *g, const Node *n, double x[4], double *mult) {
  const char *op = n->def ? n->def->name : n->op;
  if (!strcmp(op, "Conv")) return conv_family(g, n, x, mult);
  if (!strcmp(op, "Gemm") || !strncmp(op, "MatMul", 6)) return gemm_family(g, n, x, mult);
  char key[64];
  snprintf(key, sizeof key, ",%s,", op);
  for (size_t i = 0; i < sizeof MEM_FAMS / sizeof *MEM_FAMS; i++)
    if (strstr(MEM_FAMS[i].ops, key)) {
      double a = numel(node_in((Graph *)g, n, 0)), b = numel(node_out((Graph *)g, n, 0));
      x[0] = a > b ? a : b, x[1] = x[2] = x[3] = 1, *mult = 1;
      const Tensor *X = node_in((Graph *)g, n, 0);
      if (!strcmp(MEM_FAMS[i].fam, "batchnorm") && X && X->rank >= 2 && X->dims[0] > 0 && X->dims[1] > 0) /* by points, channels, images */
        x[1] = (double)X->dims[1], x[2] = (double)X->dims[0], x[0] = a / x[1] / x[2];
      int64_t k[MAX_RANK];
      if (!strcmp(MEM_FAMS[i].fam, "maxpool") && attr_ints(n, "kernel_shape", k, MAX_RANK) >= 1 && k[0] >= 1) x[1] = (double)k[0]; /* its window */
      return x[0] >= 1 ? MEM_FAMS[i].fam : NULL;
    }
  return NULL;
}

/* The share of a weight's far-memory cost (far@FAMILY) that a stage pays when its working set is ws bytes:
 * 0 up to FAR_NEAR (the last-level cache keeps it between uses), 1 at the `stream` grid's largest (the
 * probe's far state), and in between by ws's place between the two in logs.  Not by the stream curve's
 * own rate there: its knee is where other guests' use of the shared cache puts it (64 MiB ran at 21 GB/s
 * in one probe, 31 in the next), and it moved ResNet-18's prediction by 1.3x between two probes. */
#define FAR_NEAR (16.0 * 1024 * 1024)
static double far_share(const OpTable *t, double ws) {
  const Fam *f = fam_find(t, "stream");
  if (!f || !f->nax[0]) return 0;
  double far = f->ax[0][f->nax[0] - 1];
  if (ws <= FAR_NEAR || far <= FAR_NEAR) return 0;
  double k = log(ws / FAR_NEAR) / log(far / FAR_NEAR);
  return k > 1 ? 1 : k;
}

/* What part `part` of a node of family fam costs more with wbytes of weights in no cache: the probe's
 * far@fam, per byte below its smallest shape (its calls' own fixed part is not the weights'). */
static double far_cost(const OpTable *t, const char *fam, double wbytes, int part) {
  char name[40];
  snprintf(name, sizeof name, "far@%s", fam);
  const Fam *f = fam_find(t, name);
  if (!f || !f->spw || !f->nax[0] || wbytes <= 0) return 0;
  double lo = f->ax[0][0], x = wbytes < lo ? lo : wbytes, d = opcost_at(t, name, (double[4]){x, 1, 1, 1}, part);
  return d > 0 ? d * wbytes / x : 0;
}

int opcost_node(const OpTable *t, const Graph *g, const char *need, int node, double ws, double out[3]) {
  const Node *n = &g->n[node];
  double x[4], mult;
  const char *fam = node_family(g, n, x, &mult);
  if (!fam || opcost_at(t, fam, x, 0) < 0) return -1;
  int weighted = n->def && n->def->weighted, gin = n->nin > 0 && n->in[0] >= 0 && need[n->in[0]], gw = 0;
  double wbytes = 0;
  for (int k = 1; k < n->nin; k++) {
    if (n->in[k] >= 0 && need[n->in[k]]) (weighted ? (gw = 1) : (gin = 1));
    if (n->in[k] >= 0 && g->t[n->in[k]].is_param) wbytes += 4 * numel(&g->t[n->in[k]]);
  }
  out[0] = mult * opcost_at(t, fam, x, 0);
  out[1] = gin ? mult * opcost_at(t, fam, x, 1) : 0;
  out[2] = gw ? mult * opcost_at(t, fam, x, 2) : 0;
  double share = wbytes > 0 ? far_share(t, ws) : 0;
  for (int p = 0; p < 3 && share > 0; p++)
    if (out[p] > 0) out[p] += share * far_cost(t, fam, wbytes, p);
  if (getenv("PIPECC_OPCOST_DEBUG"))
    fprintf(stderr, "opcost %s %s x=%g,%g,%g,%g *%g: %.3g %.3g %.3g (far share %.2g of %.0f weight bytes)\n", n->name, fam, x[0], x[1], x[2], x[3],
            mult, out[0], out[1], out[2], share, wbytes);
  return 0;
}

/* ---- the step's other work: the optimizer's update, the loss ---- */

/* Each trained weight once (a tied one is updated once): its floats, into w (NULL: only counted). */
static int trained_weights(const struct Plan *p, double *w) {
  const Graph *g = &p->g;
  char *seen = calloc((size_t)g->nt + 1, 1);
  if (!seen) abort();
  int nw = 0;
  for (int q = 0; q < p->N; q++) {
    const Node *nd = &g->n[p->node[q]];
    for (int k = 0; k < nd->nin; k++) {
      int t = nd->in[k];
      if (t < 0 || !g->t[t].is_param || seen[t] || numel(&g->t[t]) < 1) continue;
      seen[t] = 1;
      if (w) w[nw] = numel(&g->t[t]);
      nw++;
    }
  }
  free(seen);
  return nw;
}

double opcost_stream_bw(const OpTable *t, double ws) {
  const Fam *f = fam_find(t, "stream");
  if (!f || !f->spw || !f->nax[0]) return -1;
  double lo = f->ax[0][0], hi = f->ax[0][f->nax[0] - 1], x = ws < lo ? lo : ws > hi ? hi : ws;
  double s = opcost_at(t, "stream", (double[4]){x, 1, 1, 1}, 0);
  return s > 0 ? x / s : -1;
}

double opcost_update(const OpTable *t, const struct Plan *p, double ws) {
  const char *opt = p->opt.optimizer ? p->opt.optimizer : "sgd", *fam = strcmp(opt, "sgd") ? "adam" : p->opt_slots ? "sgdm" : "sgd";
  double one[4] = {1, 1, 1, 1}, s = 0, total = 0;
  if (opcost_at(t, fam, one, 0) < 0) return -1;
  int nw = trained_weights(p, NULL);
  double *w = malloc(sizeof(double) * (size_t)(nw + 1));
  if (!w) abort();
  trained_weights(p, w);
  for (int i = 0; i < nw; i++) total += w[i];
  for (int i = 0; i < nw; i++) s += opcost_at(t, fam, (double[4]){w[i], total, 1, 1}, 0);
  free(w);
  if (total <= 0) return -1;
  /* The probe's update runs on arrays it has just touched; a stage's weights and gradients come from
   * where its working set lives (bin/pipecc-opprobe's `stream`: on this VM 130 GB/s within the core's
   * caches, 21 GB/s past 64 MiB).  Per float: the gradient's finite check, weight and gradient read,
   * weight written, each slot read and written; and the zeroing of the gradient before the next step,
   * written (and read for ownership). */
  double bw = opcost_stream_bw(t, ws), per = s / total;
  if (bw > 0) {
    double bytes = 16 + 8 * (double)p->opt_slots;
    if (per < bytes / bw) per = bytes / bw;
    per += 8 / bw;
  }
  if (getenv("PIPECC_OPCOST_DEBUG"))
    fprintf(stderr, "opcost update %s: %.3g s for %d weights of %.0f floats; %.3g s a float with the zeroing, at %.3g B/s over %.3g bytes\n",
            fam, s, nw, total, per, bw, ws);
  return per;
}

double opcost_loss(const OpTable *t, const struct Plan *p) {
  const Graph *g = &p->g;
  if (p->opt.loss_mse) return -1;
  for (int k = 0; k < g->nt; k++) {
    const Tensor *L = &g->t[k];
    if (!L->is_output || L->rank < 2 || L->dims[L->rank - 1] < 1) continue;
    double x[4] = {numel(L), (double)L->dims[L->rank - 1], 1, 1}, s = opcost_at(t, "xent", x, 0);
    if (getenv("PIPECC_OPCOST_DEBUG")) fprintf(stderr, "opcost loss xent x=%g,%g: %.3g\n", x[0], x[1], s);
    return s;
  }
  return -1;
}

/* ---- the cache, and the probe that fills it ---- */

static char *slurp(const char *path) {
  struct stat st;
  if (stat(path, &st) || !S_ISREG(st.st_mode) || st.st_size > MAX_FILE) return NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *s = malloc((size_t)st.st_size + 1);
  if (!s) abort();
  size_t got = fread(s, 1, (size_t)st.st_size, f);
  fclose(f);
  s[got] = 0;
  if (strlen(s) != got) s[0] = 0; /* a NUL byte: not text */
  return s;
}

static void mkdirs_for(const char *path) {
  char tmp[1024];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *s = tmp + 1; *s; s++)
    if (*s == '/') *s = 0, mkdir(tmp, 0755), *s = '/';
}

/* Runs bin/pipecc-opprobe (beside this pipecc); its output, or NULL. */
static char *run_probe(double *secs) {
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 32);
  if (len <= 0) return NULL;
  exe[len] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return NULL;
  strcpy(slash + 1, "pipecc-opprobe");
  if (access(exe, X_OK)) return NULL;
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "timeout 300 '%s' 2>/dev/null", exe);
  fprintf(stderr, "pipecc: timing this machine's kernels once (%s; about 20 s)\n", exe);
  double t0 = now_seconds();
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  size_t n = 0, cap = 1 << 16;
  char *out = malloc(cap);
  if (!out) abort();
  for (size_t got; (got = fread(out + n, 1, cap - n - 1, p)) > 0;)
    if ((n += got) + 1 == cap && !(out = realloc(out, cap *= 2))) abort();
  out[n] = 0;
  int rc = pclose(p);
  *secs = now_seconds() - t0;
  if (rc || !strstr(out, "\ndone ")) return free(out), NULL;
  return out;
}

/* The probe's lines into the cache's section `id` (the other sections kept), under a lock, through a
 * temporary file renamed over it. */
static void cache_store(const char *path, const char *id, const char *probe_out, double secs) {
  mkdirs_for(path);
  char lock[1100], tmp[1100];
  snprintf(lock, sizeof lock, "%s.lock", path);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  int lfd = open(lock, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lfd >= 0) flock(lfd, LOCK_EX);
  char *old = slurp(path), *other = NULL;
  OpTable scratch;
  memset(&scratch, 0, sizeof scratch);
  if (old) parse(&scratch, old, id, &other);
  for (int i = 0; i < scratch.nfam; i++) free(scratch.fam[i].x), free(scratch.fam[i].t);
  FILE *f = fopen(tmp, "w");
  if (f) {
    fprintf(f, "pipecc-ops 3\n# pipecc's op cache (docs/cost.md, compiler/opcost.h): bin/pipecc-opprobe's times of the runtime's\n"
               "# kernels on a grid of shapes, seconds of FWD BWD_INPUT BWD_WEIGHT; one section per machine.\n%s", other ? other : "");
    fprintf(f, "machine %s\n", id);
    for (const char *l = probe_out; *l;) {
      size_t len = strcspn(l, "\n");
      if (!strncmp(l, "o ", 2)) fprintf(f, "%.*s\n", (int)len, l);
      l += len + (l[len] == '\n');
    }
    fprintf(f, "probe %.2f\n", secs);
    int bad = ferror(f) != 0;
    if (fclose(f) || bad || rename(tmp, path)) unlink(tmp);
  }
  free(old), free(other);
  if (lfd >= 0) close(lfd);
}

static int table_ready(OpTable *t) {
  int ok = 0;
  for (int i = 0; i < t->nfam; i++) ok += fam_grid(&t->fam[i]) == 0;
  return ok;
}

const OpTable *opcost_table(const struct Plan *p) {
  static OpTable table;
  static int state; /* 0 not looked, 1 loaded, -1 none */
  if (p->opt.devices || p->opt.threads > 1) return NULL; /* other machines; times at T threads are other times */
  if (state) return state > 0 ? &table : NULL;
  state = -1;
  char buf[1024];
  const char *path = opcost_path(buf, sizeof buf);
  Pool *pool = (Pool *)&p->g.pool;
  double flops;
  const char *id = path ? machine_identity(pool, &flops) : NULL;
  if (!id) return NULL;
  char *text = slurp(path);
  int found = text && parse(&table, text, id, NULL);
  free(text);
  if (!found) {
    double secs = 0;
    char *out = run_probe(&secs);
    if (!out) return NULL;
    cache_store(path, id, out, secs);
    text = slurp(path);
    found = text && parse(&table, text, id, NULL);
    free(text), free(out);
    if (found) fprintf(stderr, "pipecc: kernel times probed in %.1f s, cached in %s\n", secs, path);
  }
  if (!found || !table_ready(&table)) return NULL;
  static char keep[1024];
  snprintf(keep, sizeof keep, "%s", path);
  table.path = keep;
  state = 1;
  return &table;
}

/* ---- --conv auto ---- */

int opcost_choose_convs(struct Plan *p) {
  Graph *g = &p->g;
  for (int j = 0; j < g->nn; j++) g->n[j].conv_gemm = 0;
  if (g->conv_impl != CONV_AUTO) return 0;
  const OpTable *t = opcost_table(p);
  if (!t) return 0;
  int marked = 0;
  for (int j = 0; j < g->nn; j++) {
    Node *n = &g->n[j];
    if (n->folded || !conv_by_impl(g, n)) continue;
    double x[4], mult, tl = 0, tg = 0;
    const char *fam = conv_family(g, n, x, &mult); /* through oneDNN: conv_gemm is 0 */
    if (!fam) continue;
    const char *other = !strcmp(fam, "conv@onednn") ? "conv@im2col" : "dwconv@im2col";
    for (int part = 0; part < 3; part++) tl += opcost_at(t, fam, x, part), tg += opcost_at(t, other, x, part);
    if (tl >= 0 && tg >= 0 && tg < tl) n->conv_gemm = 1, marked++;
  }
  return marked;
}
