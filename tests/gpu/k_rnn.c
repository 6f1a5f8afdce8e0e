/* k_rnn.c - the recurrent kernels (k_lstm, k_lstm_grad, k_gru, k_gru_grad) on the GPU against the CPU's:
 * one and five steps, batch 1 and 3, hidden 7 and 16, layouts 0 and 1, forward, reverse and
 * bidirectional, GRU with and without linear_before_reset, the optional (NULL-able) inputs and outputs
 * present and absent in several mixes, acc 0 and 1; and one larger case per kernel.  Every gradient output
 * starts from the same random data on both sides (the kernels add into dW, dR, dB, dh0, dc0 and, with
 * acc, dX).  One line per call: the worst error over its outputs (each named when over the bar). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.h"
#include "kcheck.h"
#include "kernels.h"

/* An optional buffer: h the host data (an input, or an output's starting data), c the CPU's output,
 * d the device copy; all NULL when absent. */
typedef struct {
  float *h, *c, *d;
  int64_t n;
  const char *name;
} RB;

static RB rb_in(int on, int64_t n, float lo, float hi, const char *name) {
  RB b = {NULL, NULL, NULL, n, name};
  if (!on) return b;
  b.h = kc_rand(n, lo, hi);
  b.d = kc_up(b.h, n);
  return b;
}
static RB rb_out(int on, int64_t n, const char *name) {
  RB b = rb_in(on, n, -1, 1, name);
  if (!on) return b;
  b.c = malloc((size_t)n * sizeof(float));
  memcpy(b.c, b.h, (size_t)n * sizeof(float));
  return b;
}
static void rb_free(RB *b) {
  free(b->h), free(b->c);
  if (b->d) kc_free(b->d);
  b->h = b->c = b->d = NULL;
}
/* The worst error over the outputs present; each over the bar is named. */
static double rb_err(RB *outs, int n, const char *kernel, const char *words) {
  double worst = 0;
  for (int i = 0; i < n; i++) {
    if (!outs[i].d) continue;
    double e = kc_err(outs[i].d, outs[i].c, outs[i].n);
    if (e > KC_TOL || e != e) printf("    %s %s: %s off by %.3g\n", kernel, words, outs[i].name, e);
    if (e > worst || e != e) worst = e;
  }
  return worst;
}

typedef struct {
  int lstm, T, B, in, H, layout, dir, lbr, mode;
} RnnCase;

/* Which optional buffers a mode passes:
 *   mode 0: everything;
 *   mode 1: no B, initial_h, initial_c; forward: no Y; backward: dY_h only; dX and dW only;
 *   mode 2: no initial_h; forward: Y only; backward: dY and dY_c; dR, dB, dh0, dc0 only;
 *   mode 3: no B, initial_c; forward: Y and Y_h; backward: dY and dY_h; every gradient. */
enum { O_B, O_H0, O_C0, O_Y, O_YH, O_YC, O_DY, O_DYH, O_DYC, O_DX, O_DW, O_DR, O_DB, O_DH0, O_DC0, O_N };
static const char MODES[4][O_N] = {
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {0, 0, 0, 0, 1, 1, 0, 1, 0, 1, 1, 0, 0, 0, 0},
    {1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 1, 1},
    {0, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1},
};

static void rnn_case(const RnnCase *k) {
  const char *on = MODES[k->mode];
  int D = k->dir == 2 ? 2 : 1, G = k->lstm ? 4 : 3;
  int64_t T = k->T, B = k->B, NI = k->in, H = k->H;
  RnnShape s = {.T = T, .B = B, .in = NI, .H = H, .layout = k->layout, .lbr = k->lbr, .D = D, .rev = k->dir == 1};
  char words[160];
  snprintf(words, sizeof words, "T%lld B%lld in%lld H%lld L%d %s%s m%d", (long long)T, (long long)B, (long long)NI, (long long)H,
           k->layout, k->dir == 0 ? "fwd" : k->dir == 1 ? "rev" : "bidir", k->lstm ? "" : k->lbr ? " lbr1" : " lbr0", k->mode);
  int64_t nx = T * B * NI, nw = D * G * H * NI, nr = D * G * H * H, nb = D * 2 * G * H, ns = D * B * H, ny = T * D * B * H;
  int64_t nwork = k->lstm ? T * B * 10 * H + 2 * B * H : T * B * 14 * H + 2 * B * H;
  RB x = rb_in(1, nx, -1, 1, "X"), w = rb_in(1, nw, -0.5f, 0.5f, "W"), r = rb_in(1, nr, -0.5f, 0.5f, "R");
  RB b = rb_in(on[O_B], nb, -0.5f, 0.5f, "B"), h0 = rb_in(on[O_H0], ns, -1, 1, "initial_h");
  RB c0 = rb_in(k->lstm && on[O_C0], ns, -1, 1, "initial_c");
  float *work = kc_zeros(nwork), *gwork = kc_dev_zeros(nwork);

  /* forward */
  RB outs[6];
  outs[0] = rb_out(on[O_Y], ny, "Y"), outs[1] = rb_out(on[O_YH], ns, "Y_h"), outs[2] = rb_out(k->lstm && on[O_YC], ns, "Y_c");
  if (k->lstm) {
    k_lstm(x.h, w.h, r.h, b.h, h0.h, c0.h, outs[0].c, outs[1].c, outs[2].c, work, &s);
    kc_lstm(x.d, w.d, r.d, b.d, h0.d, c0.d, outs[0].d, outs[1].d, outs[2].d, gwork, &s);
    kc_report("k_lstm", words, rb_err(outs, 3, "k_lstm", words));
  } else {
    k_gru(x.h, w.h, r.h, b.h, h0.h, outs[0].c, outs[1].c, work, &s);
    kc_gru(x.d, w.d, r.d, b.d, h0.d, outs[0].d, outs[1].d, gwork, &s);
    kc_report("k_gru", words, rb_err(outs, 2, "k_gru", words));
  }
  for (int i = 0; i < 3; i++) rb_free(&outs[i]);

  /* backward, acc 0 and 1 */
  RB dy = rb_in(on[O_DY], ny, -1, 1, "dY"), dyh = rb_in(on[O_DYH], ns, -1, 1, "dY_h");
  RB dyc = rb_in(k->lstm && on[O_DYC], ns, -1, 1, "dY_c");
  for (int acc = 0; acc < 2; acc++) {
    char w2[200];
    snprintf(w2, sizeof w2, "%s acc%d", words, acc);
    outs[0] = rb_out(on[O_DX], nx, "dX"), outs[1] = rb_out(on[O_DW], nw, "dW"), outs[2] = rb_out(on[O_DR], nr, "dR");
    outs[3] = rb_out(on[O_DB], nb, "dB"), outs[4] = rb_out(on[O_DH0], ns, "dh0"), outs[5] = rb_out(k->lstm && on[O_DC0], ns, "dc0");
    if (k->lstm) {
      k_lstm_grad(x.h, w.h, r.h, b.h, h0.h, c0.h, dy.h, dyh.h, dyc.h, outs[0].c, outs[1].c, outs[2].c, outs[3].c, outs[4].c,
                  outs[5].c, work, &s, acc);
      kc_lstm_grad(x.d, w.d, r.d, b.d, h0.d, c0.d, dy.d, dyh.d, dyc.d, outs[0].d, outs[1].d, outs[2].d, outs[3].d, outs[4].d,
                   outs[5].d, gwork, &s, acc);
      kc_report("k_lstm_grad", w2, rb_err(outs, 6, "k_lstm_grad", w2));
    } else {
      k_gru_grad(x.h, w.h, r.h, b.h, h0.h, dy.h, dyh.h, outs[0].c, outs[1].c, outs[2].c, outs[3].c, outs[4].c, work, &s, acc);
      kc_gru_grad(x.d, w.d, r.d, b.d, h0.d, dy.d, dyh.d, outs[0].d, outs[1].d, outs[2].d, outs[3].d, outs[4].d, gwork, &s, acc);
      kc_report("k_gru_grad", w2, rb_err(outs, 5, "k_gru_grad", w2));
    }
    for (int i = 0; i < 6; i++) rb_free(&outs[i]);
  }
  rb_free(&dy), rb_free(&dyh), rb_free(&dyc);
  rb_free(&x), rb_free(&w), rb_free(&r), rb_free(&b), rb_free(&h0), rb_free(&c0);
  free(work), kc_free(gwork);
}

void check_rnn(void) {
  for (int lstm = 1; lstm >= 0; lstm--)
    for (int lbr = 0; lbr <= !lstm; lbr++)
      for (int layout = 0; layout < 2; layout++)
        for (int dir = 0; dir < 3; dir++)
          for (int mode = 0; mode < 4; mode++) {
            RnnCase k = {.lstm = lstm, .T = mode == 1 ? 1 : 5, .B = mode == 2 ? 1 : 3, .in = 5, .H = (mode + dir + layout) % 2 ? 16 : 7,
                         .layout = layout, .dir = dir, .lbr = lbr, .mode = mode};
            rnn_case(&k);
          }
  /* Larger: every product several blocks wide. */
  static const RnnCase big[] = {
      {1, 24, 8, 33, 64, 0, 2, 0, 0},
      {1, 17, 5, 20, 48, 1, 1, 0, 0},
      {0, 24, 8, 33, 64, 1, 2, 1, 0},
      {0, 17, 5, 20, 48, 0, 2, 0, 0},
  };
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) rnn_case(&big[i]);
}
