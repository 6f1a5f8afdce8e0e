/* cpu/rnn.h - recurrent layers: LSTM and GRU.
 * Part of the CPU kernels; runtime/kernels.h includes every family (the conventions are there). */
#ifndef PIPERUN_CPU_RNN_H
#define PIPERUN_CPU_RNN_H
#include "common.h"
/* ---- recurrent layers: LSTM and GRU, forward, reverse or both directions ----
 * Arrays that have a row per (time step, batch entry) - X and the
 * workspace's gates and states - keep the node's layout: row t*B + b
 * (layout 0, time-major) or b*T + t (layout 1, batch-major), so step t's rows
 * start at rnn_row(s, t) and lie rnn_rs(s) rows apart, and one sgemm serves
 * every step wherever the step does not matter (the input projection, dX, dW).
 * The directions run one after the other through the same workspace, each
 * with its own W, R, B and initial state (slice d of each), each writing its
 * slice of Y, Y_h and Y_c; a reverse direction visits t = T-1 .. 0.
 * Forward and backward run the same recurrence (rnn_*_run) into the
 * workspace, so backward recomputes the gates instead of keeping them per
 * micro-batch in flight; the gradients of W, R and B add up in one fixed
 * order, whatever the partition. */

static inline int64_t rnn_row(const RnnShape *s, int64_t t) { return s->layout ? t : t * s->B; }
static inline int rnn_rs(const RnnShape *s) { return s->layout ? (int)s->T : 1; }
/* The time of the k-th step the direction takes. */
static inline int64_t rnn_t(const RnnShape *s, int64_t k) { return s->rev ? s->T - 1 - k : k; }
/* Direction d's part of a state array (initial_h, Y_h, ...): its offset, and the floats between its batch rows. */
static inline int64_t rnn_soff(const RnnShape *s, int d) { return s->layout ? d * s->H : d * s->B * s->H; }
static inline int rnn_sld(const RnnShape *s) { return (int)(s->layout ? s->D * s->H : s->H); }
/* Where Y holds h_t of direction d, batch entry b. */
static inline int64_t rnn_yoff(const RnnShape *s, int d, int64_t t, int64_t b) {
  return s->layout ? ((b * s->T + t) * s->D + d) * s->H : ((t * s->D + d) * s->B + b) * s->H;
}
static inline float rnn_sigmoid(float x) { return 1 / (1 + expf(-x)); }

/* Direction d's shape: which way it runs. */
static inline RnnShape rnn_dir(const RnnShape *s, int d) {
  RnnShape sd = *s;
  if (s->D == 2) sd.rev = d;
  return sd;
}

/* G[r, :] = X[r, :] W^T + Wb + Rb for every row: the input part of every step's gates. */
static inline void rnn_input_gates(const float *x, const float *w, const float *b, float *g, const RnnShape *s, int ng,
                                   int with_rb) {
  int rows = (int)(s->T * s->B), n = ng * (int)s->H;
  pr_sgemm(CblasNoTrans, CblasTrans, rows, n, (int)s->in, 1.0f, x, (int)s->in, w, (int)s->in, 0.0f, g, n);
  if (!b) return;
  for (int64_t r = 0; r < rows; r++)
    for (int k = 0; k < n; k++) g[r * n + k] += with_rb ? b[k] + b[n + k] : b[k];
}

/* Column sums of the rows of d [rows, n] added into db (a bias gradient). */
static inline void rnn_bias_grad(const float *d, float *db, int64_t rows, int n) {
  for (int64_t r = 0; r < rows; r++)
    for (int k = 0; k < n; k++) db[k] += d[r * n + k];
}

/* The state before time t: the initial state (or NULL: zeros) at the direction's
 * first step, else the previous step's rows of hs; *ld: the floats between its batch rows. */
static inline const float *rnn_prev(const float *hs, const float *h0, const RnnShape *s, int64_t t, int *ld) {
  int first = t == rnn_t(s, 0);
  *ld = first ? rnn_sld(s) : rnn_rs(s) * (int)s->H;
  return first ? h0 : hs + rnn_row(s, s->rev ? t + 1 : t - 1) * s->H;
}

/* ONNX's LSTM (gates i, o, f, c in that order): gates_t = X_t W^T + h_{t-1} R^T + Wb + Rb,
 * c_t = f * c_{t-1} + i * c~, h_t = o * tanh(c_t).  Leaves the activated gates in
 * G [rows, 4H], h_t in HS and c_t in CS (all in the node's layout). */
static inline void rnn_lstm_run(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0,
                                float *G, float *HS, float *CS, const RnnShape *s) {
  int H = (int)s->H, rs = rnn_rs(s);
  rnn_input_gates(x, w, b, G, s, 4, 1);
  for (int64_t k = 0; k < s->T; k++) {
    int64_t t = rnn_t(s, k);
    int ld, ldc;
    const float *hp = rnn_prev(HS, h0, s, t, &ld), *cpt = rnn_prev(CS, c0, s, t, &ldc);
    float *gt = G + rnn_row(s, t) * 4 * H;
    if (hp) pr_sgemm(CblasNoTrans, CblasTrans, (int)s->B, 4 * H, H, 1.0f, hp, ld, r, H, 1.0f, gt, rs * 4 * H);
    for (int64_t bb = 0; bb < s->B; bb++) {
      int64_t row = rnn_row(s, t) + bb * rs;
      float *g = G + row * 4 * H, *c = CS + row * H, *h = HS + row * H;
      const float *cp = cpt ? cpt + bb * ldc : NULL;
      for (int j = 0; j < H; j++) {
        float i = rnn_sigmoid(g[j]), o = rnn_sigmoid(g[H + j]), f = rnn_sigmoid(g[2 * H + j]), cc = tanhf(g[3 * H + j]);
        g[j] = i, g[H + j] = o, g[2 * H + j] = f, g[3 * H + j] = cc;
        c[j] = (cp ? f * cp[j] : 0) + i * cc;
        h[j] = o * tanhf(c[j]);
      }
    }
  }
}

/* Direction d's part of Y, Y_h and Y_c (any may be NULL) from its states HS and CS. */
static inline void rnn_outputs(const float *HS, const float *CS, float *y, float *yh, float *yc, const RnnShape *s, int d) {
  int64_t H = s->H, last = rnn_row(s, rnn_t(s, s->T - 1)), so = rnn_soff(s, d);
  size_t bytes = sizeof(float) * (size_t)H;
  for (int64_t bb = 0; bb < s->B; bb++) {
    for (int64_t t = 0; y && t < s->T; t++) memcpy(y + rnn_yoff(s, d, t, bb), HS + (rnn_row(s, t) + bb * rnn_rs(s)) * H, bytes);
    int64_t row = last + bb * rnn_rs(s);
    if (yh) memcpy(yh + so + bb * rnn_sld(s), HS + row * H, bytes);
    if (yc) memcpy(yc + so + bb * rnn_sld(s), CS + row * H, bytes);
  }
}

/* Direction d's slices of W, R, B (ng gates) and of a state array (NULL stays NULL). */
static inline const float *rnn_wd(const float *w, const RnnShape *s, int ng, int64_t cols, int d) {
  return w ? w + (int64_t)d * ng * s->H * cols : NULL;
}
static inline const float *rnn_sd(const float *p, const RnnShape *s, int d) { return p ? p + rnn_soff(s, d) : NULL; }

static inline void k_lstm(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0, float *y,
                          float *yh, float *yc, float *work, const RnnShape *s) {
  float *G = work, *HS = G + s->T * s->B * 4 * s->H, *CS = HS + s->T * s->B * s->H;
  for (int d = 0; d < s->D; d++) {
    RnnShape sd = rnn_dir(s, d);
    rnn_lstm_run(x, rnn_wd(w, s, 4, s->in, d), rnn_wd(r, s, 4, s->H, d), rnn_wd(b, s, 8, 1, d), rnn_sd(h0, s, d), rnn_sd(c0, s, d), G,
                 HS, CS, &sd);
    rnn_outputs(HS, CS, y, yh, yc, &sd, d);
  }
}

/* Direction d's dY at time t (if any) added into dh [B, H]. */
static inline void rnn_add_dy(const float *dy, float *dh, const RnnShape *s, int d, int64_t t) {
  if (!dy) return;
  for (int64_t bb = 0; bb < s->B; bb++)
    for (int64_t j = 0; j < s->H; j++) dh[bb * s->H + j] += dy[rnn_yoff(s, d, t, bb) + j];
}

/* dh, dc [B, H] start from direction d's dY_h and dY_c (or zeros). */
static inline void rnn_grad_init(const float *dyh, const float *dyc, float *dh, float *dc, const RnnShape *s, int d) {
  for (int64_t bb = 0; bb < s->B; bb++)
    for (int64_t j = 0; j < s->H; j++) {
      int64_t i = bb * s->H + j, at = rnn_soff(s, d) + bb * rnn_sld(s) + j;
      dh[i] = dyh ? dyh[at] : 0;
      if (dc) dc[i] = dyc ? dyc[at] : 0;
    }
}

/* After the direction's first step, dh and dc are its initial state's gradients: added into dh0 / dc0 when asked. */
static inline void rnn_state_grad(const float *g, float *d0, const RnnShape *s, int d) {
  for (int64_t bb = 0; d0 && bb < s->B; bb++)
    for (int64_t j = 0; j < s->H; j++) d0[rnn_soff(s, d) + bb * rnn_sld(s) + j] += g[bb * s->H + j];
}

/* The products every recurrent gradient ends with, given dGx [rows, ng*H] (the
 * gradient of the input part of the gates) and dGh (of the recurrent part):
 * dX (= or += by acc), dW += dGx^T X, dR += sum_t dGh_t^T h_{t-1}, dB += their
 * column sums.  hr: what multiplies R's last H rows (GRU's r * h_{t-1} when
 * linear_before_reset is 0; its rows hrw floats apart), else NULL. */
static inline void rnn_weight_grads(const float *x, const float *w, const float *h0, const float *HS, const float *hr, int hrw,
                                    const float *dGx, const float *dGh, float *dx, float *dw, float *dr, float *db, const RnnShape *s,
                                    int ng, int acc) {
  int H = (int)s->H, ni = (int)s->in, n = ng * H, rows = (int)(s->T * s->B), rs = rnn_rs(s);
  if (dx) pr_sgemm(CblasNoTrans, CblasNoTrans, rows, ni, n, 1.0f, dGx, n, w, ni, acc ? 1.0f : 0.0f, dx, ni);
  if (dw) pr_sgemm(CblasTrans, CblasNoTrans, n, ni, rows, 1.0f, dGx, n, x, ni, 1.0f, dw, ni);
  if (dr)
    for (int64_t t = 0; t < s->T; t++) {
      int ld;
      const float *hp = rnn_prev(HS, h0, s, t, &ld), *dg = dGh + rnn_row(s, t) * n;
      int m = hr ? n - H : n; /* rows of R that multiply h_{t-1} */
      if (hp) pr_sgemm(CblasTrans, CblasNoTrans, m, H, (int)s->B, 1.0f, dg, rs * n, hp, ld, 1.0f, dr, H);
      if (hr)
        pr_sgemm(CblasTrans, CblasNoTrans, H, H, (int)s->B, 1.0f, dg + m, rs * n, hr + rnn_row(s, t) * hrw, rs * hrw,
                    1.0f, dr + (int64_t)m * H, H);
    }
  if (db) {
    rnn_bias_grad(dGx, db, rows, n);
    rnn_bias_grad(dGh, db + n, rows, n);
  }
}

/* Direction d's slice of a gradient (NULL stays NULL). */
static inline float *rnn_gd(float *g, int64_t per_dir, int d) { return g ? g + per_dir * d : NULL; }

/* One direction of LSTM's backward through time: the forward again into the
 * workspace, then its steps in reverse turn dh, dc into the gates' gradients
 * (dG [rows, 4H], before the activations) and hand dh = dG_t R and dc * f to
 * the step before.  LSTM's dGx and dGh are one array. */
static inline void rnn_lstm_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0,
                                 const float *dy, const float *dyh, const float *dyc, float *dx, float *dw, float *dr, float *db,
                                 float *dh0, float *dc0, float *work, const RnnShape *s, int d, int acc) {
  int64_t H = s->H, rows = s->T * s->B;
  int rs = rnn_rs(s);
  float *G = work, *HS = G + rows * 4 * H, *CS = HS + rows * H, *dG = CS + rows * H, *dh = dG + rows * 4 * H, *dc = dh + s->B * H;
  rnn_lstm_run(x, w, r, b, h0, c0, G, HS, CS, s);
  rnn_grad_init(dyh, dyc, dh, dc, s, d);
  for (int64_t k = s->T - 1; k >= 0; k--) {
    int64_t t = rnn_t(s, k);
    int ldc;
    const float *cpt = rnn_prev(CS, c0, s, t, &ldc);
    rnn_add_dy(dy, dh, s, d, t);
    for (int64_t bb = 0; bb < s->B; bb++) {
      int64_t row = rnn_row(s, t) + bb * rs;
      const float *g = G + row * 4 * H, *c = CS + row * H, *cp = cpt ? cpt + bb * ldc : NULL;
      float *dg = dG + row * 4 * H, *dhb = dh + bb * H, *dcb = dc + bb * H;
      for (int64_t j = 0; j < H; j++) {
        float i = g[j], o = g[H + j], f = g[2 * H + j], cc = g[3 * H + j], tc = tanhf(c[j]);
        float dcj = dcb[j] + dhb[j] * o * (1 - tc * tc);
        dg[j] = dcj * cc * i * (1 - i);
        dg[H + j] = dhb[j] * tc * o * (1 - o);
        dg[2 * H + j] = (cp ? dcj * cp[j] : 0) * f * (1 - f);
        dg[3 * H + j] = dcj * i * (1 - cc * cc);
        dcb[j] = dcj * f;
      }
    }
    /* dh of the step before = dG_t R: replaces dh (its own part is spent). */
    pr_sgemm(CblasNoTrans, CblasNoTrans, (int)s->B, (int)H, 4 * (int)H, 1.0f, dG + rnn_row(s, t) * 4 * H,
                rs * 4 * (int)H, r, (int)H, 0.0f, dh, (int)H);
  }
  rnn_weight_grads(x, w, h0, HS, NULL, 0, dG, dG, dx, dw, dr, db, s, 4, acc);
  rnn_state_grad(dh, dh0, s, d);
  rnn_state_grad(dc, dc0, s, d);
}

/* Every direction's backward in turn; dX sums them (the second adds). */
static inline void k_lstm_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0,
                               const float *dy, const float *dyh, const float *dyc, float *dx, float *dw, float *dr, float *db,
                               float *dh0, float *dc0, float *work, const RnnShape *s, int acc) {
  int64_t G = 4 * s->H;
  for (int d = 0; d < s->D; d++) {
    RnnShape sd = rnn_dir(s, d);
    rnn_lstm_grad(x, rnn_wd(w, s, 4, s->in, d), rnn_wd(r, s, 4, s->H, d), rnn_wd(b, s, 8, 1, d), rnn_sd(h0, s, d), rnn_sd(c0, s, d),
                  dy, dyh, dyc, dx, rnn_gd(dw, G * s->in, d), rnn_gd(dr, G * s->H, d), rnn_gd(db, 2 * G, d), dh0, dc0, work, &sd, d,
                  d ? 1 : acc);
  }
}

/* ONNX's GRU (gates z, r, h): z, r = sigmoid(X_t W^T + h_{t-1} R^T + Wb + Rb),
 * h~ = tanh(X_t Wh^T + Wbh + r * (h_{t-1} Rh^T + Rbh)) when linear_before_reset
 * (torch's form), else tanh(X_t Wh^T + Wbh + (r * h_{t-1}) Rh^T + Rbh);
 * h_t = (1 - z) h~ + z h_{t-1}.  Leaves X's part of the gates in GX [rows, 3H],
 * z, r, h~ and the recurrent term (h_{t-1} Rh^T + Rbh, or r * h_{t-1}) in A [rows, 4H], h_t in HS. */
static inline void rnn_gru_run(const float *x, const float *w, const float *r, const float *b, const float *h0, float *GX, float *A,
                               float *HS, const RnnShape *s) {
  int H = (int)s->H, rs = rnn_rs(s), lbr = s->lbr;
  const float *rb = b ? b + 3 * H : NULL;
  rnn_input_gates(x, w, b, GX, s, 3, 0);
  for (int64_t k = 0; k < s->T; k++) {
    int64_t t = rnn_t(s, k);
    int ld;
    const float *hp = rnn_prev(HS, h0, s, t, &ld);
    float *at = A + rnn_row(s, t) * 4 * H;
    if (hp) pr_sgemm(CblasNoTrans, CblasTrans, (int)s->B, (lbr ? 3 : 2) * H, H, 1.0f, hp, ld, r, H, 0.0f, at, rs * 4 * H);
    for (int pass = 0; pass < 2; pass++) {
      /* Without linear_before_reset, h~ needs (r * h_{t-1}) Rh^T: one more product between the passes. */
      if (pass == 1 && !lbr && hp)
        pr_sgemm(CblasNoTrans, CblasTrans, (int)s->B, H, H, 1.0f, at + 3 * H, rs * 4 * H, r + 2 * H * H, H, 0.0f,
                    at + 2 * H, rs * 4 * H);
      for (int64_t bb = 0; bb < s->B; bb++) {
        int64_t row = rnn_row(s, t) + bb * rs;
        const float *gx = GX + row * 3 * H, *hpb = hp ? hp + bb * ld : NULL;
        float *a = A + row * 4 * H, *h = HS + row * H;
        for (int j = 0; j < H; j++) {
          float hpj = hpb ? hpb[j] : 0;
          if (pass == 0) {
            a[j] = rnn_sigmoid(gx[j] + (hp ? a[j] : 0) + (rb ? rb[j] : 0));
            a[H + j] = rnn_sigmoid(gx[H + j] + (hp ? a[H + j] : 0) + (rb ? rb[H + j] : 0));
            if (!lbr) a[3 * H + j] = a[H + j] * hpj;
            continue;
          }
          float rec = (hp ? a[2 * H + j] : 0) + (rb ? rb[2 * H + j] : 0);
          if (lbr) a[3 * H + j] = rec;
          float hh = tanhf(gx[2 * H + j] + (lbr ? a[H + j] * rec : rec));
          a[2 * H + j] = hh;
          h[j] = (1 - a[j]) * hh + a[j] * hpj;
        }
      }
    }
  }
}

static inline void k_gru(const float *x, const float *w, const float *r, const float *b, const float *h0, float *y, float *yh,
                         float *work, const RnnShape *s) {
  float *GX = work, *A = GX + s->T * s->B * 3 * s->H, *HS = A + s->T * s->B * 4 * s->H;
  for (int d = 0; d < s->D; d++) {
    RnnShape sd = rnn_dir(s, d);
    rnn_gru_run(x, rnn_wd(w, s, 3, s->in, d), rnn_wd(r, s, 3, s->H, d), rnn_wd(b, s, 6, 1, d), rnn_sd(h0, s, d), GX, A, HS, &sd);
    rnn_outputs(HS, NULL, y, yh, NULL, &sd, d);
  }
}

/* One step of GRU's backward: dh [B, H] (dL/dh_t) becomes the gradient of the
 * state before; fills time t's rows of dGx and dGh (the gradients of X's and
 * h's parts of the gates, before the activations).  tmp [B, H]: the part of
 * that gradient that is not a product with R. */
static inline void rnn_gru_step_grad(const float *r, const float *A, const float *hp, int ld, float *dGx, float *dGh, float *dh,
                                     float *tmp, const RnnShape *s, int64_t t) {
  int H = (int)s->H, rs = rnn_rs(s), lbr = s->lbr;
  int64_t r0 = rnn_row(s, t);
  for (int pass = 0; pass < 2; pass++) {
    /* Without linear_before_reset, dr needs d(r * h_{t-1}) = dah Rh, kept in dGx's z columns until pass 1 fills them. */
    if (pass == 1 && !lbr)
      pr_sgemm(CblasNoTrans, CblasNoTrans, (int)s->B, H, H, 1.0f, dGx + r0 * 3 * H + 2 * H, rs * 3 * H, r + 2 * H * H,
                  H, 0.0f, dGx + r0 * 3 * H, rs * 3 * H);
    for (int64_t bb = 0; bb < s->B; bb++) {
      int64_t row = r0 + bb * rs;
      const float *a = A + row * 4 * H, *hpb = hp ? hp + bb * ld : NULL;
      float *gx = dGx + row * 3 * H, *gh = dGh + row * 3 * H, *dhb = dh + bb * H, *tb = tmp + bb * H;
      for (int j = 0; j < H; j++) {
        float z = a[j], rr = a[H + j], hh = a[2 * H + j], hpj = hpb ? hpb[j] : 0;
        if (pass == 0) {
          float dah = dhb[j] * (1 - z) * (1 - hh * hh);
          gx[2 * H + j] = dah;
          gh[2 * H + j] = lbr ? dah * rr : dah;
          tb[j] = dhb[j] * z;
          continue;
        }
        float dah = gx[2 * H + j], drh = lbr ? 0 : gx[j];
        float dr = lbr ? dah * a[3 * H + j] : drh * hpj;
        float dz = dhb[j] * (hpj - hh);
        if (!lbr) tb[j] += drh * rr;
        gx[j] = gh[j] = dz * z * (1 - z);
        gx[H + j] = gh[H + j] = dr * rr * (1 - rr);
      }
    }
  }
  /* The state before's gradient = tmp + dGh_t R (over z, r and, with linear_before_reset, h). */
  pr_sgemm(CblasNoTrans, CblasNoTrans, (int)s->B, H, (lbr ? 3 : 2) * H, 1.0f, dGh + r0 * 3 * H, rs * 3 * H, r, H,
              1.0f, tmp, H);
  memcpy(dh, tmp, sizeof(float) * (size_t)(s->B * H));
}

static inline void rnn_gru_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *dy,
                                const float *dyh, float *dx, float *dw, float *dr, float *db, float *dh0, float *work, const RnnShape *s,
                                int d, int acc) {
  int64_t H = s->H, rows = s->T * s->B;
  float *GX = work, *A = GX + rows * 3 * H, *HS = A + rows * 4 * H, *dGx = HS + rows * H, *dGh = dGx + rows * 3 * H;
  float *dh = dGh + rows * 3 * H, *tmp = dh + s->B * H;
  rnn_gru_run(x, w, r, b, h0, GX, A, HS, s);
  rnn_grad_init(dyh, NULL, dh, NULL, s, d);
  for (int64_t k = s->T - 1; k >= 0; k--) {
    int64_t t = rnn_t(s, k);
    int ld;
    const float *hp = rnn_prev(HS, h0, s, t, &ld);
    rnn_add_dy(dy, dh, s, d, t);
    rnn_gru_step_grad(r, A, hp, ld, dGx, dGh, dh, tmp, s, t);
  }
  /* Without linear_before_reset, Rh multiplies r * h_{t-1} (A's last H columns), not h_{t-1}. */
  rnn_weight_grads(x, w, h0, HS, s->lbr ? NULL : A + 3 * H, 4 * (int)H, dGx, dGh, dx, dw, dr, db, s, 3, acc);
  rnn_state_grad(dh, dh0, s, d);
}

static inline void k_gru_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *dy,
                              const float *dyh, float *dx, float *dw, float *dr, float *db, float *dh0, float *work, const RnnShape *s,
                              int acc) {
  int64_t G = 3 * s->H;
  for (int d = 0; d < s->D; d++) {
    RnnShape sd = rnn_dir(s, d);
    rnn_gru_grad(x, rnn_wd(w, s, 3, s->in, d), rnn_wd(r, s, 3, s->H, d), rnn_wd(b, s, 6, 1, d), rnn_sd(h0, s, d), dy, dyh, dx,
                 rnn_gd(dw, G * s->in, d), rnn_gd(dr, G * s->H, d), rnn_gd(db, 2 * G, d), dh0, work, &sd, d, d ? 1 : acc);
  }
}
#endif
