/* k_optim.c - the optimizers' GPU updates against the CPU's (cpu/optim.h): SGD with momentum 0 (its buffer
 * NULL) and 0.9, weight decay 0 and 0.01; Adam and AdamW with weight decay 0 and 0.01.  Eleven steps
 * (0 .. 10) on the same weights and fresh gradients each, the learning rate changing between steps as a
 * schedule would; the weights and the optimizer's slots compared after steps 0, 1 and 10. */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/kernels.h"
#include "kcheck.h"
#include "kernels.h"

static const int64_t SIZES[] = {1, 7, 33, 1000, 100003};
enum { NSIZES = sizeof SIZES / sizeof SIZES[0], NSTEPS = 11 };

static int reported(int64_t step) { return step == 0 || step == 1 || step == 10; }

/* kind 0: SGD, 1: Adam, 2: AdamW. */
static void check_run(int kind, int64_t n, float momentum, float wd) {
  const char *kname = kind ? "k_adam_step" : "k_sgd_step";
  float *p = kc_rand(n, -1, 1), *s1 = kc_rand(n, -1, 1), *s2 = kc_zeros(n);
  if (kind) /* Adam's moments start at 0, as the runtime's; SGD's buffer is overwritten at step 0 */
    for (int64_t i = 0; i < n; i++) s1[i] = 0;
  int has_buf = kind || momentum != 0;
  float *dp = kc_up(p, n), *ds1 = kc_up(s1, n), *ds2 = kc_up(s2, n);
  for (int64_t step = 0; step < NSTEPS; step++) {
    float *g = kc_rand(n, -1, 1), *dg = kc_up(g, n);
    OptCtx o = {kind ? 1e-3f : 0.1f, momentum, wd, 0.9f, 0.999f, 1e-8f, step, NULL, 0, 0};
    o.lr *= 1.0f - 0.05f * (float)step;
    if (kind) {
      k_adam_step(p, g, s1, s2, n, kind == 2, &o);
      kc_adam_step(dp, dg, ds1, ds2, n, kind == 2, &o);
    } else {
      k_sgd_step(p, g, has_buf ? s1 : NULL, n, &o);
      kc_sgd_step(dp, dg, has_buf ? ds1 : NULL, n, &o);
    }
    if (reported(step)) {
      char shape[128];
      snprintf(shape, sizeof shape, "%s n=%lld mom=%g wd=%g step=%lld", kind == 2 ? "AdamW" : kind ? "Adam" : "SGD", (long long)n,
               momentum, wd, (long long)step);
      char what[160];
      snprintf(what, sizeof what, "%s p", shape);
      kc_report(kname, what, kc_err(dp, p, n));
      if (has_buf) {
        snprintf(what, sizeof what, "%s %s", shape, kind ? "m" : "buf");
        kc_report(kname, what, kc_err(ds1, s1, n));
      }
      if (kind) {
        snprintf(what, sizeof what, "%s v", shape);
        kc_report(kname, what, kc_err(ds2, s2, n));
      }
    }
    kc_free(dg), free(g);
  }
  kc_free(dp), kc_free(ds1), kc_free(ds2), free(p), free(s1), free(s2);
}

void check_optim(void) {
  for (int s = 0; s < NSIZES; s++) {
    for (int m = 0; m < 2; m++)
      for (int w = 0; w < 2; w++) check_run(0, SIZES[s], m ? 0.9f : 0.0f, w ? 0.01f : 0.0f);
    for (int kind = 1; kind <= 2; kind++)
      for (int w = 0; w < 2; w++) check_run(kind, SIZES[s], 0.0f, w ? 0.01f : 0.0f);
  }
}
