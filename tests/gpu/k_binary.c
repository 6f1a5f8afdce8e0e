/* k_binary.c - the binary family's checks (kcheck.h): k_binary and k_binary_grad for every BIN_ op code
 * (BIN_MUL_SELF too), k_where and its gradient, k_compare for every CMP_ op code, k_not; broadcast
 * patterns of rank 0 to 4 (same shape, scalar, row, column, middle axis, both sides broadcast), odd
 * sizes, sums long enough to take the GPU's two-pass path, acc 0 and 1, the NULL operands the compiler
 * passes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.h"
#include "kcheck.h"
#include "kernels.h"

/* One broadcast: the output dims, each operand's dims at the output's rank (1 on a broadcast axis). */
typedef struct Case {
  const char *name;
  int rank;
  int64_t out[4], a[4], b[4], c[4];
} Case;

static const Case CASES[] = {
    {"scalar (rank 0)", 0, {0}, {0}, {0}, {0}},
    {"1037 same", 1, {1037}, {1037}, {1037}, {1037}},
    {"7x33 + scalar", 2, {7, 33}, {7, 33}, {1, 1}, {7, 33}},
    {"scalar + 7x9", 2, {7, 9}, {1, 1}, {7, 9}, {1, 9}},
    {"5x7x33 + row", 3, {5, 7, 33}, {5, 7, 33}, {1, 1, 33}, {5, 1, 33}},
    {"9x33 + column", 2, {9, 33}, {9, 33}, {9, 1}, {1, 33}},
    {"3x5x7x6 + middle", 4, {3, 5, 7, 6}, {3, 5, 7, 6}, {1, 5, 1, 1}, {3, 1, 7, 1}},
    {"4x1x6 + 1x5x6", 3, {4, 5, 6}, {4, 1, 6}, {1, 5, 6}, {4, 5, 6}},
    {"2x1x37 + 1x3x1", 3, {2, 3, 37}, {2, 1, 37}, {1, 3, 1}, {1, 1, 1}},
    {"3x40x5 + 1x40x1", 3, {3, 40, 5}, {3, 40, 5}, {1, 40, 1}, {3, 40, 5}},
    {"8x300x65 + bias", 3, {8, 300, 65}, {8, 300, 65}, {1, 1, 65}, {8, 300, 1}},
    {"33x1000 + column", 2, {33, 1000}, {33, 1000}, {33, 1}, {1, 1000}},
    {"70001 + scalar", 1, {70001}, {70001}, {1}, {70001}},
    {"2x3x4x1031 + 1x3x1x1", 4, {2, 3, 4, 1031}, {2, 3, 4, 1031}, {1, 3, 1, 1}, {2, 1, 4, 1031}},
};
enum { NCASES = sizeof CASES / sizeof CASES[0] };

/* Strides of an operand of dims d in the output's coordinates: its own row-major strides, 0 where it has
 * size 1; its element count. */
static int64_t strides_of(int rank, const int64_t *d, int64_t *st) {
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; i--) st[i] = d[i] == 1 ? 0 : s, s *= d[i];
  return s;
}
/* The output's dims into out; its element count. */
static int64_t out_of(const Case *c, int64_t *out) {
  int64_t n = 1;
  for (int i = 0; i < c->rank; i++) out[i] = c->out[i], n *= c->out[i];
  return n;
}
static BcastShape bshape(const Case *c) {
  BcastShape s;
  memset(&s, 0, sizeof s);
  s.rank = c->rank, s.ny = out_of(c, s.out);
  s.na = strides_of(c->rank, c->a, s.sa), s.nb = strides_of(c->rank, c->b, s.sb);
  return s;
}
/* Where(c, x, y): the condition c->c, x c->a, y c->b. */
static WhereShape wshape(const Case *c) {
  WhereShape s;
  memset(&s, 0, sizeof s);
  s.rank = c->rank, s.nout = out_of(c, s.out);
  strides_of(c->rank, c->c, s.sc);
  s.nx = strides_of(c->rank, c->a, s.sx), s.ny = strides_of(c->rank, c->b, s.sy);
  return s;
}

static float *dup(const float *h, int64_t n) {
  float *c = malloc((size_t)(n > 0 ? n : 1) * sizeof *c);
  memcpy(c, h, (size_t)n * sizeof *c);
  return c;
}
/* Multiples of 1/4: ties for Max, Min and Equal. */
static void quarters(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = floorf(x[i] * 4) / 4;
}
static uint8_t *bytes_rand(int64_t n, int top) {
  float *r = kc_rand(n, 0, (float)top + 1);
  uint8_t *b = malloc((size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) b[i] = (uint8_t)(int)r[i];
  free(r);
  return b;
}

static const char *const BIN_NAME[] = {"add", "sub", "mul", "div", "pow", "max", "min"};
static const int OPS[] = {BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV, BIN_POW, BIN_MAX, BIN_MIN, BIN_MUL_SELF};
enum { NOPS = sizeof OPS / sizeof OPS[0] };
static const char *op_name(int op) { return op == BIN_MUL_SELF ? "mul_self" : BIN_NAME[op]; }

/* The operands of op on case c: a positive (pow's log), b away from 0 (div); b all 2 for BIN_MUL_SELF
 * (the exponent the compiler gives it) and for pow2; quarters for Max and Min; a NaN or two in the
 * same-shape case of Max and Min. */
static void operands(const Case *c, const BcastShape *s, int op, int two, float **a, float **b) {
  *a = kc_rand(s->na, 0.5f, 2.0f), *b = kc_rand(s->nb, 0.5f, 2.0f);
  if (op == BIN_MUL_SELF || two)
    for (int64_t i = 0; i < s->nb; i++) (*b)[i] = 2.0f;
  if (op == BIN_MAX || op == BIN_MIN) {
    quarters(*a, s->na), quarters(*b, s->nb);
    if (!strcmp(c->name, "1037 same")) (*a)[5] = NAN, (*b)[9] = NAN, (*a)[17] = (*b)[17] = NAN;
  }
}

/* Whether the gradient of `which` reads operand k (compiler/ops/elementwise.c's bin_grad_reads). */
static int grad_reads(int op, int which, int k) {
  switch (op) {
  case BIN_ADD:
  case BIN_SUB: return 0;
  case BIN_MUL: return k != which;
  case BIN_DIV: return which == 1 || k == 1;
  default: return 1;
  }
}

static void check_binary_case(const Case *c, int op, int two) {
  BcastShape s = bshape(c);
  float *a, *b;
  operands(c, &s, op, two, &a, &b);
  float *da = kc_up(a, s.na), *db = kc_up(b, s.nb);
  char what[96];
  snprintf(what, sizeof what, "%s %s%s", op_name(op), c->name, two ? " b=2" : "");
  /* forward */
  float *y = kc_zeros(s.ny), *dyv = kc_dev_zeros(s.ny);
  k_binary(op, a, b, y, &s);
  kc_binary(op, da, db, dyv, &s);
  kc_report("k_binary", what, kc_err(dyv, y, s.ny));
  free(y), kc_free(dyv);
  /* in place on a, as Max/Min of three inputs does (a has the output's shape) */
  if (s.na == s.ny && op != BIN_MUL_SELF) {
    float *ya = dup(a, s.na), *d2 = kc_up(a, s.na);
    k_binary(op, ya, b, ya, &s);
    kc_binary(op, d2, db, d2, &s);
    char w2[120];
    snprintf(w2, sizeof w2, "%s in place", what);
    kc_report("k_binary", w2, kc_err(d2, ya, s.ny));
    free(ya), kc_free(d2);
  }
  /* gradients: each side, acc 0 and 1, with the operands the compiler passes, and (Add) both */
  /* dy off centre, so that a long sum is well above its rounding (either order is as right) */
  float *g = kc_rand(s.ny, -0.25f, 1), *dg = kc_up(g, s.ny);
  for (int which = 0; which < 2; which++)
    for (int acc = 0; acc < 2; acc++)
      for (int all = 0; all < (op == BIN_ADD ? 2 : 1); all++) {
        int64_t n = which ? s.nb : s.na;
        /* acc = 0: the GPU's d starts as junk, which it must overwrite */
        float *d = acc ? kc_rand(n, -1, 1) : kc_zeros(n), *junk = kc_rand(n, -5, 5), *dd = kc_up(acc ? d : junk, n);
        int ra = all || grad_reads(op, which, 0), rb = all || grad_reads(op, which, 1);
        k_binary_grad(op, which, ra ? a : NULL, rb ? b : NULL, g, d, &s, acc);
        kc_binary_grad(op, which, ra ? da : NULL, rb ? db : NULL, dg, dd, &s, acc);
        char w[140];
        snprintf(w, sizeof w, "%s d%c acc=%d%s%s", what, which ? 'b' : 'a', acc, ra ? "" : " a=NULL", rb ? "" : " b=NULL");
        kc_report("k_binary_grad", w, kc_err(dd, d, n));
        free(d), free(junk), kc_free(dd);
      }
  free(g), kc_free(dg);
  free(a), free(b), kc_free(da), kc_free(db);
}

static void check_where_case(const Case *c) {
  WhereShape s = wshape(c);
  int64_t nc = 1;
  for (int i = 0; i < c->rank; i++) nc *= c->c[i];
  uint8_t *cond = bytes_rand(nc, 2); /* 0, 1, 2: any nonzero byte is true */
  float *x = kc_rand(s.nx, -1, 1), *y = kc_rand(s.ny, -1, 1);
  uint8_t *dc = kc_up_bytes(cond, nc);
  float *dx = kc_up(x, s.nx), *dy = kc_up(y, s.ny);
  float *o = kc_zeros(s.nout), *dout = kc_dev_zeros(s.nout);
  k_where(cond, x, y, o, &s);
  kc_where(dc, dx, dy, dout, &s);
  kc_report_exact("k_where", c->name, dout, o, s.nout * (int64_t)sizeof(float));
  free(o), kc_free(dout);
  float *g = kc_rand(s.nout, -0.25f, 1), *dg = kc_up(g, s.nout);
  for (int which = 1; which <= 2; which++)
    for (int acc = 0; acc < 2; acc++) {
      int64_t n = which == 1 ? s.nx : s.ny;
      float *d = acc ? kc_rand(n, -1, 1) : kc_zeros(n), *junk = kc_rand(n, -5, 5), *dd = kc_up(acc ? d : junk, n);
      k_where_grad(cond, g, d, which, &s, acc);
      kc_where_grad(dc, dg, dd, which, &s, acc);
      char w[120];
      snprintf(w, sizeof w, "%s d%c acc=%d", c->name, which == 1 ? 'x' : 'y', acc);
      kc_report("k_where_grad", w, kc_err(dd, d, n));
      free(d), free(junk), kc_free(dd);
    }
  free(g), kc_free(dg);
  free(cond), free(x), free(y), kc_free(dc), kc_free(dx), kc_free(dy);
}

static void check_compare_case(const Case *c, int op) {
  static const char *const NAME[] = {"equal", "less", "greater"};
  BcastShape s = bshape(c);
  float *a = kc_rand(s.na, -1, 1), *b = kc_rand(s.nb, -1, 1);
  quarters(a, s.na), quarters(b, s.nb);
  if (s.na > 3) a[3] = NAN;
  float *da = kc_up(a, s.na), *db = kc_up(b, s.nb);
  uint8_t *y = calloc((size_t)s.ny + 1, 1), *junk = malloc((size_t)s.ny + 1);
  memset(junk, 7, (size_t)s.ny + 1);
  uint8_t *dyv = kc_up_bytes(junk, s.ny);
  k_compare(op, a, b, y, &s);
  kc_compare(op, da, db, dyv, &s);
  char w[96];
  snprintf(w, sizeof w, "%s %s", NAME[op], c->name);
  kc_report_exact("k_compare", w, dyv, y, s.ny);
  free(a), free(b), free(y), free(junk), kc_free(da), kc_free(db), kc_free(dyv);
}

static void check_not(int64_t n) {
  uint8_t *x = bytes_rand(n, 3), *y = calloc((size_t)n + 1, 1), *dx = kc_up_bytes(x, n), *dy = kc_up_bytes(y, n);
  k_not(x, y, n);
  kc_not(dx, dy, n);
  char w[32];
  snprintf(w, sizeof w, "%lld", (long long)n);
  kc_report_exact("k_not", w, dy, y, n);
  free(x), free(y), kc_free(dx), kc_free(dy);
}

void check_binary(void) {
  for (int k = 0; k < NCASES; k++) {
    for (int o = 0; o < NOPS; o++) check_binary_case(&CASES[k], OPS[o], 0);
    check_binary_case(&CASES[k], BIN_POW, 1);
  }
  for (int k = 0; k < NCASES; k++) check_where_case(&CASES[k]);
  for (int k = 0; k < NCASES; k++)
    for (int op = CMP_EQUAL; op <= CMP_GREATER; op++) check_compare_case(&CASES[k], op);
  check_not(1), check_not(7), check_not(1037), check_not(100003);
}
