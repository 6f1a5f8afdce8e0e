/* broadcast.c - elementwise binary ops with numpy broadcasting (Add, Sub, Mul, Div, Pow, Max, Min), forward
 * and gradient (kernels.h declares them and holds their shape, BcastShape).
 *
 * They live here, compiled once into each build's runtime objects, because their loops are many (one per
 * op and stride pair) and every stage program calls them: inlined at every call, they doubled the time
 * clang takes on a transformer's stage file. */
#include "kernels.h"

/* The rows of a broadcast, the output's last axis at a time: each operand's offset is carried from
 * row to row by an odometer over the outer axes, with no division. */
typedef struct Rows {
  int64_t r, oa, ob, idx[8];
  const BcastShape *s;
} Rows;

/* The walk from row r (a division per axis, once per part). */
static Rows rows_at(const BcastShape *s, int64_t r) {
  Rows w = {r, 0, 0, {0}, s};
  for (int d = s->rank - 2; d >= 0; d--) {
    w.idx[d] = r % s->out[d], r /= s->out[d];
    w.oa += w.idx[d] * s->sa[d], w.ob += w.idx[d] * s->sb[d];
  }
  return w;
}

static void rows_next(Rows *w) {
  const BcastShape *s = w->s;
  w->r++;
  for (int d = s->rank - 2; d >= 0; d--) {
    w->oa += s->sa[d], w->ob += s->sb[d];
    if (++w->idx[d] < s->out[d]) return;
    w->oa -= s->sa[d] * s->out[d], w->ob -= s->sb[d] * s->out[d], w->idx[d] = 0;
  }
}

/* A broadcast is walked a row (the output's last axis) at a time: the operands' offsets are found once
 * per row, and along it each moves by its stride on that axis (0 where it is broadcast).  The op is
 * chosen once per call, and the strides the graphs have (1 and 1, 1 and 0, 0 and 1) are constants of
 * their own loops, so each loop is plain enough to vectorise; any other stride pair takes the general
 * loop. */
#define PR_BIN_ROW(OP, TA, TB)                                                                              \
  for (Rows w = rows_at(s, r0); w.r < r1; rows_next(&w)) {                                                  \
    const float *ar = a + w.oa, *br = b + w.ob;                                                             \
    float *yr = y + w.r * L;                                                                                \
    for (int64_t k = k0; k < k1; k++) yr[k] = OP == BIN_MUL_SELF ? ar[k * TA] * ar[k * TA] : bin_apply(OP, ar[k * TA], br[k * TB]); \
  }
#define PR_BIN_ROWS(OP)                                                                                     \
  if (ta == 1 && tb == 1) { PR_BIN_ROW(OP, 1, 1) }                                                          \
  else if (ta == 1 && tb == 0) { PR_BIN_ROW(OP, 1, 0) }                                                     \
  else if (ta == 0 && tb == 1) { PR_BIN_ROW(OP, 0, 1) }                                                     \
  else { PR_BIN_ROW(OP, ta, tb) }
/* A call's walk, and the part of it one thread takes: rows [r0, r1), elements [k0, k1) of each. */
typedef struct Walk {
  int op, which;
  const float *a, *b, *dy;
  float *y;
  const BcastShape *s;
  int64_t L, rows, ta, tb, td;
} Walk;

/* [rows, L]: one row when nothing is broadcast (or the output is a scalar); ta, tb: the operands'
 * strides along a row. */
static Walk walk_of(const BcastShape *s) {
  Walk w = {.s = s};
  int same = (s->na == s->ny && s->nb == s->ny) || s->rank == 0;
  w.L = same ? s->ny : s->out[s->rank - 1], w.rows = s->ny / w.L;
  w.ta = same ? (s->na == s->ny) : s->sa[s->rank - 1], w.tb = same ? (s->nb == s->ny) : s->sb[s->rank - 1];
  return w;
}

/* Runs part(w, range) over the walk's rows, or, for one row, over its elements in whole grains (par.h). */
static void walk_run(const Walk *w, PrRange part, double cost) {
  if (w->rows == 1) pr_par_for(w->L, PR_PAR_EW_GRAIN, (double)w->L * cost, part, w);
  else pr_par_for(w->rows, 1, (double)w->rows * (double)w->L * cost, part, w);
}

static void binary_part(const void *arg, int64_t lo, int64_t hi) {
  const Walk *wk = (const Walk *)arg;
  const BcastShape *s = wk->s;
  const float *a = wk->a, *b = wk->b;
  float *y = wk->y;
  int64_t L = wk->L, ta = wk->ta, tb = wk->tb;
  int64_t r0 = wk->rows == 1 ? 0 : lo, r1 = wk->rows == 1 ? 1 : hi, k0 = wk->rows == 1 ? lo : 0, k1 = wk->rows == 1 ? hi : L;
  switch (wk->op) {
  case BIN_ADD: PR_BIN_ROWS(BIN_ADD) break;
  case BIN_SUB: PR_BIN_ROWS(BIN_SUB) break;
  case BIN_MUL: PR_BIN_ROWS(BIN_MUL) break;
  case BIN_DIV: PR_BIN_ROWS(BIN_DIV) break;
  case BIN_MAX: PR_BIN_ROWS(BIN_MAX) break;
  case BIN_MIN: PR_BIN_ROWS(BIN_MIN) break;
  default: /* x**2, the norms' square, as x*x without evaluating powf beside it */
    if (s->nb == 1 && b[0] == 2.0f) { PR_BIN_ROWS(BIN_MUL_SELF) } else { PR_BIN_ROWS(BIN_POW) }
  }
}

void k_binary(int op, const float *a, const float *b, float *y, const BcastShape *s) {
  Walk w = walk_of(s);
  w.op = op, w.a = a, w.b = b, w.y = y;
  walk_run(&w, binary_part, op == BIN_POW ? 20 : 3);
}
#undef PR_BIN_ROW
#undef PR_BIN_ROWS

/* Gradient for input `which` (0 = a, 1 = b), summed over its broadcast axes: rows of the output's last
 * axis as k_binary walks them, a row that sums into one element of d (a norm's scale) in eight lanes,
 * the others in output order.  The op's formula is chosen once per call, not per element, so the loops
 * are plain enough to vectorise.  a or b is NULL where the op's gradient does not read it; it is then
 * not touched. */
#define PR_BIN_GRAD_ROW(EXPR, TA, TB, TD)                                                                              \
  for (Rows w = rows_at(s, r0); w.r < r1; rows_next(&w)) {                                                  \
    int64_t ia = w.oa, ib = w.ob;                                                                           \
    const float *ar = a ? a + ia : NULL, *br = b ? b + ib : NULL, *g = dy + w.r * L;                        \
    float *dr = d + (which ? ib : ia);                                                                      \
    if (TD == 0 && L >= 16) { /* the row sums into one element: in lanes (pr_sum8) */                       \
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0}, t;                                                             \
      int64_t k = 0;                                                                                        \
      for (; k + 8 <= L; k += 8)                                                                            \
        for (int j = 0; j < 8; j++) {                                                                       \
          float A = ar ? ar[(k + j) * TA] : 0, B = br ? br[(k + j) * TB] : 0, G = g[k + j];                 \
          (void)A, (void)B;                                                                                 \
          l[j] += (EXPR);                                                                                   \
        }                                                                                                   \
      t = pr_lanes_total(l);                                                                                \
      for (; k < L; k++) {                                                                                  \
        float A = ar ? ar[k * TA] : 0, B = br ? br[k * TB] : 0, G = g[k];                                   \
        (void)A, (void)B;                                                                                   \
        t += (EXPR);                                                                                        \
      }                                                                                                     \
      dr[0] += t;                                                                                           \
      continue;                                                                                             \
    }                                                                                                       \
    for (int64_t k = k0; k < k1; k++) {                                                                     \
      float A = ar ? ar[k * TA] : 0, B = br ? br[k * TB] : 0, G = g[k];                                     \
      (void)A, (void)B;                                                                                     \
      dr[k * TD] += (EXPR);                                                                                 \
    }                                                                                                       \
  }
/* As k_binary: the usual stride pairs as constants of their own loops. */
#define PR_BIN_GRAD_ROWS(EXPR)                                                                              \
  if (ta == 1 && tb == 1) { PR_BIN_GRAD_ROW(EXPR, 1, 1, 1) }                                                \
  else if (ta == 1 && tb == 0) { if (which) { PR_BIN_GRAD_ROW(EXPR, 1, 0, 0) } else { PR_BIN_GRAD_ROW(EXPR, 1, 0, 1) } } \
  else if (ta == 0 && tb == 1) { if (which) { PR_BIN_GRAD_ROW(EXPR, 0, 1, 1) } else { PR_BIN_GRAD_ROW(EXPR, 0, 1, 0) } } \
  else { PR_BIN_GRAD_ROW(EXPR, ta, tb, td) }
static void binary_grad_part(const void *arg, int64_t lo, int64_t hi) {
  const Walk *wk = (const Walk *)arg;
  const BcastShape *s = wk->s;
  const float *a = wk->a, *b = wk->b, *dy = wk->dy;
  float *d = wk->y;
  int which = wk->which;
  int64_t L = wk->L, ta = wk->ta, tb = wk->tb, td = wk->td;
  int64_t r0 = wk->rows == 1 ? 0 : lo, r1 = wk->rows == 1 ? 1 : hi, k0 = wk->rows == 1 ? lo : 0, k1 = wk->rows == 1 ? hi : L;
  switch (wk->op) {
  case BIN_ADD: PR_BIN_GRAD_ROWS(G) break;
  case BIN_SUB:
    if (which) { PR_BIN_GRAD_ROWS(-G) } else { PR_BIN_GRAD_ROWS(G) }
    break;
  case BIN_MUL:
    if (which) { PR_BIN_GRAD_ROWS(G * A) } else { PR_BIN_GRAD_ROWS(G * B) }
    break;
  case BIN_DIV:
    if (which) { PR_BIN_GRAD_ROWS(-G * A / (B * B)) } else { PR_BIN_GRAD_ROWS(G / B) }
    break;
  /* torch.maximum / minimum: dy / 2 to each side of a tie, dy to the winner
   * and to both when a NaN makes every comparison false. */
  case BIN_MAX:
    if (which) { PR_BIN_GRAD_ROWS(B == A ? G / 2 : B < A ? 0 : G) } else { PR_BIN_GRAD_ROWS(A == B ? G / 2 : A < B ? 0 : G) }
    break;
  case BIN_MIN:
    if (which) { PR_BIN_GRAD_ROWS(B == A ? G / 2 : B > A ? 0 : G) } else { PR_BIN_GRAD_ROWS(A == B ? G / 2 : A > B ? 0 : G) }
    break;
  default: /* pow; x**2's b * x**(b-1) is 2 * x exactly (powf(x, 1) is x) */
    if (which) { PR_BIN_GRAD_ROWS(G * powf(A, B) * logf(A)) }
    else if (s->nb == 1 && b[0] == 2.0f) { PR_BIN_GRAD_ROWS(G * 2.0f * A) }
    else { PR_BIN_GRAD_ROWS(G * B * powf(A, B - 1)) }
  }
}

void k_binary_grad(int op, int which, const float *a, const float *b, const float *dy, float *d, const BcastShape *s,
                                 int acc) {
  int64_t n = which ? s->nb : s->na;
  if (!acc) memset(d, 0, sizeof(float) * (size_t)n);
  Walk w = walk_of(s);
  w.op = op, w.which = which, w.a = a, w.b = b, w.dy = dy, w.y = d, w.td = which ? w.tb : w.ta;
  /* Parts only where each output element has an element of d to itself: a gradient summed over broadcast
   * axes keeps the one order of its sums. */
  if (n == s->ny) walk_run(&w, binary_grad_part, op == BIN_POW ? 30 : 4);
  else binary_grad_part(&w, 0, w.rows == 1 ? w.L : w.rows);
}
#undef PR_BIN_GRAD_ROWS
#undef PR_BIN_GRAD_ROW
