/* k_loss.c - the loss family's GPU kernels against the CPU's (cpu/loss.h): softmax cross-entropy and MSE
 * against one-hot labels, the returned loss sum and dlogits, on rows 1, 3, 37 and more, classes 1, 7,
 * 10, 768, 1001, 50257, labels in device memory (MSE also with labels outside the classes, which match
 * no class on the CPU). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/kernels.h"
#include "kcheck.h"
#include "kernels.h"

typedef double (*Loss)(const float *logits, const int64_t *labels, float *dlogits, int64_t rows, int classes, float scale);

/* mse: the loss's scale is over every output (compiler/ops/loss.c), else over the rows. */
static void check_one(const char *name, Loss cpu, Loss gpu, int mse, int64_t rows, int classes, int outside) {
  const int64_t n = rows * classes;
  float *z = kc_rand(n, -5, 5), *u = kc_rand(rows, 0, 1);
  int64_t *labels = malloc((size_t)rows * sizeof *labels);
  for (int64_t r = 0; r < rows; r++) {
    int64_t l = (int64_t)(u[r] * (float)classes);
    labels[r] = l < classes ? l : classes - 1;
  }
  if (outside) labels[0] = -100, labels[rows - 1] = classes; /* only where the CPU reads no logit by the label */
  const float scale = mse ? 1.0f / (float)(rows * classes) : 1.0f / (float)rows;
  float *dl = kc_rand(n, -1, 1), *gz = kc_up(z, n), *gdl = kc_up(dl, n); /* dlogits prefilled: the loss writes it */
  int64_t *glabels = kc_up_bytes(labels, rows * (int64_t)sizeof *labels);
  double lc = cpu(z, labels, dl, rows, classes, scale);
  double lg = gpu(gz, glabels, gdl, rows, classes, scale);
  char w[128];
  snprintf(w, sizeof w, "%lld x %d%s: dlogits", (long long)rows, classes, outside ? " labels outside" : "");
  kc_report(name, w, kc_err(gdl, dl, n));
  snprintf(w, sizeof w, "%lld x %d%s: loss %.6g", (long long)rows, classes, outside ? " labels outside" : "", lc);
  double err = fabs(lg - lc) / (fabs(lc) > 1e-30 ? fabs(lc) : 1e-30);
  if (lg != lg || lc != lc) err = (lg != lg) == (lc != lc) ? 0 : INFINITY;
  kc_report(name, w, err);
  kc_free(gz), kc_free(gdl), kc_free(glabels), free(z), free(u), free(labels), free(dl);
}

void check_loss(void) {
  static const int64_t rows[] = {1, 3, 37, 1000};
  static const int classes[] = {1, 7, 10, 768, 1001, 50257};
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 6; c++) {
      if (rows[r] * classes[c] > 4000000) continue;
      check_one("k_softmax_xent", k_softmax_xent, kc_softmax_xent, 0, rows[r], classes[c], 0);
      check_one("k_mse_loss", k_mse_loss, kc_mse_loss, 1, rows[r], classes[c], 0);
    }
  check_one("k_mse_loss", k_mse_loss, kc_mse_loss, 1, 37, 10, 1);
  check_one("k_mse_loss", k_mse_loss, kc_mse_loss, 1, 3, 1001, 1);
}
