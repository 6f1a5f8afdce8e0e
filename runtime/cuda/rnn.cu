/* cuda/rnn.cu - recurrent layers on the GPU: LSTM and GRU, forward, reverse or both directions, as
 * runtime/cpu/rnn.h computes them (its comments say what each step is).
 *
 * The same recurrence in the same workspace layout: the products (the input projection of every step,
 * each step's recurrent product, dX, dW and each step's dR) are cuBLAS GEMMs on the stream in the CPU's
 * order (dR and the state gradients add step by step with beta = 1, t = 0 .. T-1), and each step's gate
 * arithmetic is one element-wise kernel over [B, H] with the CPU's formulas.  The bias gradients are
 * column sums, one thread per column adding the rows in order.  Nothing waits on the host. */
#include "common.cuh"
#include "kernels.h"

/* ---- the CPU's index helpers (cpu/rnn.h: rnn_row, rnn_rs, rnn_t, rnn_soff, rnn_sld, rnn_yoff) ---- */
static __host__ __device__ __forceinline__ int64_t cr_row(const RnnShape &s, int64_t t) { return s.layout ? t : t * s.B; }
static __host__ __device__ __forceinline__ int cr_rs(const RnnShape &s) { return s.layout ? (int)s.T : 1; }
static __host__ __device__ __forceinline__ int64_t cr_t(const RnnShape &s, int64_t k) { return s.rev ? s.T - 1 - k : k; }
static __host__ __device__ __forceinline__ int64_t cr_soff(const RnnShape &s, int d) { return s.layout ? d * s.H : d * s.B * s.H; }
static __host__ __device__ __forceinline__ int cr_sld(const RnnShape &s) { return (int)(s.layout ? s.D * s.H : s.H); }
static __host__ __device__ __forceinline__ int64_t cr_yoff(const RnnShape &s, int d, int64_t t, int64_t b) {
  return s.layout ? ((b * s.T + t) * s.D + d) * s.H : ((t * s.D + d) * s.B + b) * s.H;
}
static __device__ __forceinline__ float cr_sigmoid(float x) { return 1 / (1 + expf(-x)); }

static RnnShape cr_dir(const RnnShape *s, int d) {
  RnnShape sd = *s;
  if (s->D == 2) sd.rev = d;
  return sd;
}
/* The state before time t (rnn_prev): the initial state (or NULL) at the direction's first step, else
 * the previous step's rows of hs; *ld: the floats between its batch rows. */
static const float *cr_prev(const float *hs, const float *h0, const RnnShape &s, int64_t t, int *ld) {
  int first = t == cr_t(s, 0);
  *ld = first ? cr_sld(s) : cr_rs(s) * (int)s.H;
  return first ? h0 : hs + cr_row(s, s.rev ? t + 1 : t - 1) * s.H;
}
static const float *cr_wd(const float *w, const RnnShape *s, int ng, int64_t cols, int d) {
  return w ? w + (int64_t)d * ng * s->H * cols : NULL;
}
static const float *cr_sd(const float *p, const RnnShape *s, int d) { return p ? p + cr_soff(*s, d) : NULL; }
static float *cr_gd(float *g, int64_t per_dir, int d) { return g ? g + per_dir * d : NULL; }

/* Row-major C [M, N] = op(A) op(B) + beta C (pr_sgemm's arguments, alpha = 1): one product of pr_cu_sgemm. */
static void cr_gemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float beta, float *C,
                    int ldc) {
  pr_cu_sgemm(ta, tb, M, N, K, 1.0f, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

#define CR_LAUNCH(kernel, n, ...)                                                                         \
  do {                                                                                                    \
    kernel<<<pr_cu_blocks((n), PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(__VA_ARGS__);          \
    PR_CU_LAUNCHED();                                                                                     \
  } while (0)

/* ---- shared pieces ---- */

/* g[r, k] += Wb[k] (+ Rb[k] when with_rb) for every row. */
__global__ void cr_bias_add_k(float *g, const float *b, int64_t rows, int n, int with_rb) {
  PR_CU_FOR(i, rows * n) {
    int k = (int)(i % n);
    g[i] += with_rb ? b[k] + b[n + k] : b[k];
  }
}

/* G[r, :] = X[r, :] W^T + Wb (+ Rb) for every row (rnn_input_gates). */
static void cr_input_gates(const float *x, const float *w, const float *b, float *g, const RnnShape &s, int ng, int with_rb) {
  int rows = (int)(s.T * s.B), n = ng * (int)s.H;
  cr_gemm(0, 1, rows, n, (int)s.in, x, (int)s.in, w, (int)s.in, 0.0f, g, n);
  if (b) CR_LAUNCH(cr_bias_add_k, (int64_t)rows * n, g, b, (int64_t)rows, n, with_rb);
}

/* db[k] += the column sum of d [rows, n], rows in order (rnn_bias_grad). */
__global__ void cr_bias_grad_k(const float *d, float *db, int64_t rows, int n) {
  PR_CU_FOR(k, n) {
    float v = db[k];
    for (int64_t r = 0; r < rows; r++) v += d[r * n + k];
    db[k] = v;
  }
}

/* Direction d's part of Y, Y_h, Y_c (any may be NULL) from HS and CS (rnn_outputs). */
__global__ void cr_outputs_k(const float *HS, const float *CS, float *y, float *yh, float *yc, RnnShape s, int d) {
  int64_t H = s.H, last = cr_t(s, s.T - 1);
  PR_CU_FOR(i, s.T * s.B * H) {
    int64_t j = i % H, bb = (i / H) % s.B, t = i / (H * s.B);
    int64_t row = cr_row(s, t) + bb * cr_rs(s);
    if (y) y[cr_yoff(s, d, t, bb) + j] = HS[row * H + j];
    if (t == last) {
      int64_t at = cr_soff(s, d) + bb * cr_sld(s) + j;
      if (yh) yh[at] = HS[row * H + j];
      if (yc) yc[at] = CS[row * H + j];
    }
  }
}

/* dh, dc [B, H] from direction d's dY_h, dY_c, or zeros (rnn_grad_init). */
__global__ void cr_grad_init_k(const float *dyh, const float *dyc, float *dh, float *dc, RnnShape s, int d) {
  PR_CU_FOR(i, s.B * s.H) {
    int64_t bb = i / s.H, j = i % s.H, at = cr_soff(s, d) + bb * cr_sld(s) + j;
    dh[i] = dyh ? dyh[at] : 0;
    if (dc) dc[i] = dyc ? dyc[at] : 0;
  }
}

/* d0 (direction d's slice) += g [B, H] (rnn_state_grad). */
__global__ void cr_state_grad_k(const float *g, float *d0, RnnShape s, int d) {
  PR_CU_FOR(i, s.B * s.H) {
    int64_t bb = i / s.H, j = i % s.H;
    d0[cr_soff(s, d) + bb * cr_sld(s) + j] += g[i];
  }
}
static void cr_state_grad(const float *g, float *d0, const RnnShape &s, int d) {
  if (d0) CR_LAUNCH(cr_state_grad_k, s.B * s.H, g, d0, s, d);
}

/* dX (= or += by acc), dW += dGx^T X, dR += sum_t dGh_t^T h_{t-1} (t = 0 .. T-1), dB += column sums
 * (rnn_weight_grads; hr: what multiplies R's last H rows, its rows hrw floats apart, or NULL). */
static void cr_weight_grads(const float *x, const float *w, const float *h0, const float *HS, const float *hr, int hrw, const float *dGx,
                            const float *dGh, float *dx, float *dw, float *dr, float *db, const RnnShape &s, int ng, int acc) {
  int H = (int)s.H, ni = (int)s.in, n = ng * H, rows = (int)(s.T * s.B), rs = cr_rs(s);
  if (dx) cr_gemm(0, 0, rows, ni, n, dGx, n, w, ni, acc ? 1.0f : 0.0f, dx, ni);
  if (dw) cr_gemm(1, 0, n, ni, rows, dGx, n, x, ni, 1.0f, dw, ni);
  if (dr)
    for (int64_t t = 0; t < s.T; t++) {
      int ld;
      const float *hp = cr_prev(HS, h0, s, t, &ld), *dg = dGh + cr_row(s, t) * n;
      int m = hr ? n - H : n;
      if (hp) cr_gemm(1, 0, m, H, (int)s.B, dg, rs * n, hp, ld, 1.0f, dr, H);
      if (hr) cr_gemm(1, 0, H, H, (int)s.B, dg + m, rs * n, hr + cr_row(s, t) * hrw, rs * hrw, 1.0f, dr + (int64_t)m * H, H);
    }
  if (db) {
    CR_LAUNCH(cr_bias_grad_k, n, dGx, db, (int64_t)rows, n);
    CR_LAUNCH(cr_bias_grad_k, n, dGh, db + n, (int64_t)rows, n);
  }
}

/* ---- LSTM ---- */

/* Step t's gates, activated in place, and its c_t, h_t (rnn_lstm_run's inner loops). */
__global__ void cr_lstm_step_k(float *G, float *CS, float *HS, const float *cpt, int ldc, RnnShape s, int64_t t) {
  int64_t H = s.H;
  int rs = cr_rs(s);
  PR_CU_FOR(i, s.B * H) {
    int64_t bb = i / H, j = i % H, row = cr_row(s, t) + bb * rs;
    float *g = G + row * 4 * H, *c = CS + row * H, *h = HS + row * H;
    const float *cp = cpt ? cpt + bb * ldc : NULL;
    float ig = cr_sigmoid(g[j]), o = cr_sigmoid(g[H + j]), f = cr_sigmoid(g[2 * H + j]), cc = tanhf(g[3 * H + j]);
    g[j] = ig, g[H + j] = o, g[2 * H + j] = f, g[3 * H + j] = cc;
    float cv = (cp ? f * cp[j] : 0) + ig * cc;
    c[j] = cv;
    h[j] = o * tanhf(cv);
  }
}

static void cr_lstm_run(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0, float *G,
                        float *HS, float *CS, const RnnShape &s) {
  int H = (int)s.H, rs = cr_rs(s);
  cr_input_gates(x, w, b, G, s, 4, 1);
  for (int64_t k = 0; k < s.T; k++) {
    int64_t t = cr_t(s, k);
    int ld, ldc;
    const float *hp = cr_prev(HS, h0, s, t, &ld), *cpt = cr_prev(CS, c0, s, t, &ldc);
    float *gt = G + cr_row(s, t) * 4 * H;
    if (hp) cr_gemm(0, 1, (int)s.B, 4 * H, H, hp, ld, r, H, 1.0f, gt, rs * 4 * H);
    CR_LAUNCH(cr_lstm_step_k, s.B * s.H, G, CS, HS, cpt, ldc, s, t);
  }
}

extern "C" void kc_lstm(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0, float *y,
                        float *yh, float *yc, float *work, const RnnShape *s) {
  float *G = work, *HS = G + s->T * s->B * 4 * s->H, *CS = HS + s->T * s->B * s->H;
  for (int d = 0; d < s->D; d++) {
    RnnShape sd = cr_dir(s, d);
    cr_lstm_run(x, cr_wd(w, s, 4, s->in, d), cr_wd(r, s, 4, s->H, d), cr_wd(b, s, 8, 1, d), cr_sd(h0, s, d), cr_sd(c0, s, d), G, HS,
                CS, sd);
    if (y || yh || yc) CR_LAUNCH(cr_outputs_k, sd.T * sd.B * sd.H, HS, CS, y, yh, yc, sd, d);
  }
}

/* Step t of LSTM's backward: dh (+ dY_t) and dc into the gates' gradients dG, and dc * f into dc
 * (rnn_lstm_grad's inner loops; dh itself is replaced by dG_t R next). */
__global__ void cr_lstm_step_grad_k(const float *G, const float *CS, const float *cpt, int ldc, const float *dy, const float *dh,
                                    float *dc, float *dG, RnnShape s, int d, int64_t t) {
  int64_t H = s.H;
  int rs = cr_rs(s);
  PR_CU_FOR(q, s.B * H) {
    int64_t bb = q / H, j = q % H, row = cr_row(s, t) + bb * rs;
    const float *g = G + row * 4 * H, *c = CS + row * H, *cp = cpt ? cpt + bb * ldc : NULL;
    float *dg = dG + row * 4 * H;
    float dhj = dh[q];
    if (dy) dhj += dy[cr_yoff(s, d, t, bb) + j];
    float i = g[j], o = g[H + j], f = g[2 * H + j], cc = g[3 * H + j], tc = tanhf(c[j]);
    float dcj = dc[q] + dhj * o * (1 - tc * tc);
    dg[j] = dcj * cc * i * (1 - i);
    dg[H + j] = dhj * tc * o * (1 - o);
    dg[2 * H + j] = (cp ? dcj * cp[j] : 0) * f * (1 - f);
    dg[3 * H + j] = dcj * i * (1 - cc * cc);
    dc[q] = dcj * f;
  }
}

static void cr_lstm_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0, const float *dy,
                         const float *dyh, const float *dyc, float *dx, float *dw, float *dr, float *db, float *dh0, float *dc0,
                         float *work, const RnnShape &s, int d, int acc) {
  int64_t H = s.H, rows = s.T * s.B;
  int rs = cr_rs(s);
  float *G = work, *HS = G + rows * 4 * H, *CS = HS + rows * H, *dG = CS + rows * H, *dh = dG + rows * 4 * H, *dc = dh + s.B * H;
  cr_lstm_run(x, w, r, b, h0, c0, G, HS, CS, s);
  CR_LAUNCH(cr_grad_init_k, s.B * H, dyh, dyc, dh, dc, s, d);
  for (int64_t k = s.T - 1; k >= 0; k--) {
    int64_t t = cr_t(s, k);
    int ldc;
    const float *cpt = cr_prev(CS, c0, s, t, &ldc);
    CR_LAUNCH(cr_lstm_step_grad_k, s.B * H, G, CS, cpt, ldc, dy, dh, dc, dG, s, d, t);
    cr_gemm(0, 0, (int)s.B, (int)H, 4 * (int)H, dG + cr_row(s, t) * 4 * H, rs * 4 * (int)H, r, (int)H, 0.0f, dh, (int)H);
  }
  cr_weight_grads(x, w, h0, HS, NULL, 0, dG, dG, dx, dw, dr, db, s, 4, acc);
  cr_state_grad(dh, dh0, s, d);
  cr_state_grad(dc, dc0, s, d);
}

extern "C" void kc_lstm_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0,
                             const float *dy, const float *dyh, const float *dyc, float *dx, float *dw, float *dr, float *db, float *dh0,
                             float *dc0, float *work, const RnnShape *s, int acc) {
  int64_t G = 4 * s->H;
  for (int d = 0; d < s->D; d++) {
    RnnShape sd = cr_dir(s, d);
    cr_lstm_grad(x, cr_wd(w, s, 4, s->in, d), cr_wd(r, s, 4, s->H, d), cr_wd(b, s, 8, 1, d), cr_sd(h0, s, d), cr_sd(c0, s, d), dy,
                 dyh, dyc, dx, cr_gd(dw, G * s->in, d), cr_gd(dr, G * s->H, d), cr_gd(db, 2 * G, d), dh0, dc0, work, sd, d,
                 d ? 1 : acc);
  }
}

/* ---- GRU ---- */

/* Step t's gates (rnn_gru_run's passes): pass 0 z, r (and r * h_{t-1}), pass 1 h~ and h_t; pass 2
 * both (with linear_before_reset nothing comes between them). */
__global__ void cr_gru_step_k(const float *GX, float *A, float *HS, const float *hp, int ld, const float *rb, RnnShape s, int64_t t,
                              int pass) {
  int64_t H = s.H;
  int rs = cr_rs(s), lbr = s.lbr;
  PR_CU_FOR(i, s.B * H) {
    int64_t bb = i / H, j = i % H, row = cr_row(s, t) + bb * rs;
    const float *gx = GX + row * 3 * H, *hpb = hp ? hp + bb * ld : NULL;
    float *a = A + row * 4 * H, *h = HS + row * H;
    float hpj = hpb ? hpb[j] : 0;
    if (pass != 1) {
      a[j] = cr_sigmoid(gx[j] + (hp ? a[j] : 0) + (rb ? rb[j] : 0));
      a[H + j] = cr_sigmoid(gx[H + j] + (hp ? a[H + j] : 0) + (rb ? rb[H + j] : 0));
      if (!lbr) a[3 * H + j] = a[H + j] * hpj;
    }
    if (pass != 0) {
      float rec = (hp ? a[2 * H + j] : 0) + (rb ? rb[2 * H + j] : 0);
      if (lbr) a[3 * H + j] = rec;
      float hh = tanhf(gx[2 * H + j] + (lbr ? a[H + j] * rec : rec));
      a[2 * H + j] = hh;
      h[j] = (1 - a[j]) * hh + a[j] * hpj;
    }
  }
}

static void cr_gru_run(const float *x, const float *w, const float *r, const float *b, const float *h0, float *GX, float *A, float *HS,
                       const RnnShape &s) {
  int H = (int)s.H, rs = cr_rs(s), lbr = s.lbr;
  const float *rb = b ? b + 3 * H : NULL;
  cr_input_gates(x, w, b, GX, s, 3, 0);
  for (int64_t k = 0; k < s.T; k++) {
    int64_t t = cr_t(s, k);
    int ld;
    const float *hp = cr_prev(HS, h0, s, t, &ld);
    float *at = A + cr_row(s, t) * 4 * H;
    if (hp) cr_gemm(0, 1, (int)s.B, (lbr ? 3 : 2) * H, H, hp, ld, r, H, 0.0f, at, rs * 4 * H);
    if (lbr) {
      CR_LAUNCH(cr_gru_step_k, s.B * s.H, GX, A, HS, hp, ld, rb, s, t, 2);
      continue;
    }
    CR_LAUNCH(cr_gru_step_k, s.B * s.H, GX, A, HS, hp, ld, rb, s, t, 0);
    if (hp) cr_gemm(0, 1, (int)s.B, H, H, at + 3 * H, rs * 4 * H, r + 2 * H * H, H, 0.0f, at + 2 * H, rs * 4 * H);
    CR_LAUNCH(cr_gru_step_k, s.B * s.H, GX, A, HS, hp, ld, rb, s, t, 1);
  }
}

extern "C" void kc_gru(const float *x, const float *w, const float *r, const float *b, const float *h0, float *y, float *yh,
                       float *work, const RnnShape *s) {
  float *GX = work, *A = GX + s->T * s->B * 3 * s->H, *HS = A + s->T * s->B * 4 * s->H;
  for (int d = 0; d < s->D; d++) {
    RnnShape sd = cr_dir(s, d);
    cr_gru_run(x, cr_wd(w, s, 3, s->in, d), cr_wd(r, s, 3, s->H, d), cr_wd(b, s, 6, 1, d), cr_sd(h0, s, d), GX, A, HS, sd);
    if (y || yh) CR_LAUNCH(cr_outputs_k, sd.T * sd.B * sd.H, HS, (const float *)NULL, y, yh, (float *)NULL, sd, d);
  }
}

/* Step t of GRU's backward (rnn_gru_step_grad's passes): pass 0 adds dY_t into dh and fills h~'s
 * gradients and tmp = dh * z; pass 1 the gradients of z and r (and tmp += d(r h) * r); pass 2 both
 * (linear_before_reset: nothing comes between them). */
__global__ void cr_gru_step_grad_k(const float *A, const float *hp, int ld, const float *dy, float *dGx, float *dGh, float *dh,
                                   float *tmp, RnnShape s, int d, int64_t t, int pass) {
  int64_t H = s.H;
  int rs = cr_rs(s), lbr = s.lbr;
  PR_CU_FOR(q, s.B * H) {
    int64_t bb = q / H, j = q % H, row = cr_row(s, t) + bb * rs;
    const float *a = A + row * 4 * H, *hpb = hp ? hp + bb * ld : NULL;
    float *gx = dGx + row * 3 * H, *gh = dGh + row * 3 * H;
    float z = a[j], rr = a[H + j], hh = a[2 * H + j], hpj = hpb ? hpb[j] : 0;
    float dhj = dh[q];
    if (pass != 1) {
      if (dy) dhj += dy[cr_yoff(s, d, t, bb) + j], dh[q] = dhj;
      float dah = dhj * (1 - z) * (1 - hh * hh);
      gx[2 * H + j] = dah;
      gh[2 * H + j] = lbr ? dah * rr : dah;
      tmp[q] = dhj * z;
    }
    if (pass != 0) {
      float dah = gx[2 * H + j], drh = lbr ? 0 : gx[j];
      float dr = lbr ? dah * a[3 * H + j] : drh * hpj;
      float dz = dhj * (hpj - hh);
      if (!lbr) tmp[q] += drh * rr;
      gx[j] = gh[j] = dz * z * (1 - z);
      gx[H + j] = gh[H + j] = dr * rr * (1 - rr);
    }
  }
}

static void cr_gru_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *dy, const float *dyh,
                        float *dx, float *dw, float *dr, float *db, float *dh0, float *work, const RnnShape &s, int d, int acc) {
  int64_t H = s.H, rows = s.T * s.B;
  int Hi = (int)H, rs = cr_rs(s), lbr = s.lbr;
  float *GX = work, *A = GX + rows * 3 * H, *HS = A + rows * 4 * H, *dGx = HS + rows * H, *dGh = dGx + rows * 3 * H;
  float *dh = dGh + rows * 3 * H, *tmp = dh + s.B * H;
  cr_gru_run(x, w, r, b, h0, GX, A, HS, s);
  CR_LAUNCH(cr_grad_init_k, s.B * H, dyh, (const float *)NULL, dh, (float *)NULL, s, d);
  for (int64_t k = s.T - 1; k >= 0; k--) {
    int64_t t = cr_t(s, k), r0 = cr_row(s, t);
    int ld;
    const float *hp = cr_prev(HS, h0, s, t, &ld);
    if (lbr) {
      CR_LAUNCH(cr_gru_step_grad_k, s.B * H, A, hp, ld, dy, dGx, dGh, dh, tmp, s, d, t, 2);
    } else {
      CR_LAUNCH(cr_gru_step_grad_k, s.B * H, A, hp, ld, dy, dGx, dGh, dh, tmp, s, d, t, 0);
      cr_gemm(0, 0, (int)s.B, Hi, Hi, dGx + r0 * 3 * H + 2 * H, rs * 3 * Hi, r + 2 * H * H, Hi, 0.0f, dGx + r0 * 3 * H, rs * 3 * Hi);
      CR_LAUNCH(cr_gru_step_grad_k, s.B * H, A, hp, ld, dy, dGx, dGh, dh, tmp, s, d, t, 1);
    }
    /* The state before's gradient = tmp + dGh_t R: made in tmp, which becomes dh (the old dh, spent,
     * becomes the next step's tmp). */
    cr_gemm(0, 0, (int)s.B, Hi, (lbr ? 3 : 2) * Hi, dGh + r0 * 3 * H, rs * 3 * Hi, r, Hi, 1.0f, tmp, Hi);
    float *spent = dh;
    dh = tmp, tmp = spent;
  }
  cr_weight_grads(x, w, h0, HS, lbr ? NULL : A + 3 * H, 4 * Hi, dGx, dGh, dx, dw, dr, db, s, 3, acc);
  cr_state_grad(dh, dh0, s, d);
}

extern "C" void kc_gru_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *dy,
                            const float *dyh, float *dx, float *dw, float *dr, float *db, float *dh0, float *work, const RnnShape *s,
                            int acc) {
  int64_t G = 3 * s->H;
  for (int d = 0; d < s->D; d++) {
    RnnShape sd = cr_dir(s, d);
    cr_gru_grad(x, cr_wd(w, s, 3, s->in, d), cr_wd(r, s, 3, s->H, d), cr_wd(b, s, 6, 1, d), cr_sd(h0, s, d), dy, dyh, dx,
                cr_gd(dw, G * s->in, d), cr_gd(dr, G * s->H, d), cr_gd(db, 2 * G, d), dh0, work, sd, d, d ? 1 : acc);
  }
}
