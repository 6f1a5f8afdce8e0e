/* k_dropout.c - the dropout family's GPU kernels against the CPU's (cpu/dropout.h): the outputs, masks and
 * gradients must be the CPU's bits (the same Philox draws for the same RandCtx, node and element), for
 * ratios 0 (no draws), 0.1, 0.5 and 1 (all dropped), micro-batches 0, 1 and 3 (a first element that is not
 * a multiple of 4), the mask given or NULL, acc 0 and 1, in place, a node and a step past 32 bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.h"
#include "kcheck.h"
#include "kernels.h"

static const int64_t SIZES[] = {1, 7, 33, 1000, 100003};
enum { NSIZES = sizeof SIZES / sizeof SIZES[0] };

static void check_case(int64_t n, float ratio, const RandCtx *rc, int64_t node, int with_mask) {
  char shape[128];
  snprintf(shape, sizeof shape, "n=%lld p=%g mb=%lld%s", (long long)n, ratio, (long long)rc->mb, with_mask ? "" : " mask NULL");
  char what[160];
  float *x = kc_rand(n, -2, 2);
  if (n > 3) x[3] = NAN; /* stays NaN where dropped: x * 0 */
  float *y = kc_rand(n, -1, 1); /* garbage on both sides: every element must be written */
  uint8_t *mask = malloc((size_t)n);
  memset(mask, 0xAA, (size_t)n);
  float *dx_ = kc_up(x, n), *dy_ = kc_up(y, n);
  uint8_t *dmask = kc_up_bytes(mask, n);
  k_dropout(x, y, with_mask ? mask : NULL, n, ratio, node, rc);
  kc_dropout(dx_, dy_, with_mask ? dmask : NULL, n, ratio, node, rc);
  snprintf(what, sizeof what, "%s y", shape);
  kc_report_same_floats("k_dropout", what, dy_, y, n);
  if (with_mask) {
    snprintf(what, sizeof what, "%s mask", shape);
    kc_report_exact("k_dropout", what, dmask, mask, n);
  }
  if (n == 1000 && with_mask) { /* y = x, in place */
    kc_dropout(dx_, dx_, NULL, n, ratio, node, rc);
    snprintf(what, sizeof what, "%s in place", shape);
    kc_report_same_floats("k_dropout", what, dx_, y, n);
  }
  kc_free(dx_), kc_free(dy_), kc_free(dmask), free(x), free(y), free(mask);

  /* the gradient: dx = dy * mask * scale, written or added */
  float *dy = kc_rand(n, -1, 1), *ddy = kc_up(dy, n);
  for (int acc = 0; acc < 2; acc++) {
    float *dx = kc_rand(n, -1, 1), *ddx = kc_up(dx, n);
    k_dropout_grad(dy, dx, n, ratio, node, rc, acc);
    kc_dropout_grad(ddy, ddx, n, ratio, node, rc, acc);
    snprintf(what, sizeof what, "n=%lld p=%g mb=%lld acc=%d", (long long)n, ratio, (long long)rc->mb, acc);
    kc_report_exact("k_dropout_grad", what, ddx, dx, n * (int64_t)sizeof(float));
    kc_free(ddx), free(dx);
  }
  kc_free(ddy), free(dy);
}

void check_dropout(void) {
  const float ratios[] = {0.0f, 0.1f, 0.5f, 1.0f};
  const int64_t mbs[] = {0, 1, 3};
  for (int s = 0; s < NSIZES; s++)
    for (int r = 0; r < 4; r++)
      for (int m = 0; m < 3; m++) {
        RandCtx rc = {0x0123456789abcdefull, 7, mbs[m]};
        check_case(SIZES[s], ratios[r], &rc, 5, m != 1);
      }
  /* the counter's words past 32 bits: the node's and the step's low words, the seed's both words */
  RandCtx big = {0xfedcba9876543210ull, ((int64_t)1 << 32) + 3, 2};
  check_case(1000, 0.5f, &big, ((int64_t)1 << 33) + 11, 1);
  check_case(33, 0.3f, &big, 12, 1);
}
