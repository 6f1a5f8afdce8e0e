/* kernels.c - bin/gpu-kernels: every GPU kernel against its CPU kernel (tests/gpu/check.sh runs it on the
 * GPU machine).
 *
 *   gpu-kernels [REPORT]
 *
 * Runs each family's checks (kcheck.h), then prints, and writes to REPORT, one row per kernel of
 * compiler/kernels.def: the kernel, the cases run, the worst relative error, ok or FAIL.  A kernel of
 * kernels.def that no check ran is a failure too.  Exit status 0 when every kernel passed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda/kernels.h"
#include "kcheck.h"

/* The runtime's pr_rand, which a stage program links (prmain.c); the GPU's Gather reads it at a launch. */
RandCtx pr_rand = {1, 0, 0};

static const char *const KERNELS[] = {
#define KERNEL(id, name, sig) name,
#include "../../compiler/kernels.def"
#undef KERNEL
};
enum { NKERNELS = sizeof KERNELS / sizeof KERNELS[0] };
static int cases[NKERNELS];
static double worst[NKERNELS];

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((rng >> 40) * (1.0 / 16777216.0));
}
float *kc_rand(int64_t n, float lo, float hi) {
  float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
  for (int64_t i = 0; i < n; i++) h[i] = lo + (hi - lo) * uniform();
  return h;
}
float *kc_zeros(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

static void cu(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "gpu-kernels: %s: %s\n", what, cudaGetErrorString(e));
    exit(2);
  }
}
void *kc_up_bytes(const void *h, int64_t bytes) {
  void *d = NULL;
  cu(cudaMalloc(&d, (size_t)(bytes > 0 ? bytes : 4)), "cudaMalloc");
  if (bytes > 0) cu(cudaMemcpy(d, h, (size_t)bytes, cudaMemcpyHostToDevice), "copy to the GPU");
  /* From pageable memory cudaMemcpy may return before its DMA lands, and the kernels run on the
   * runtime's own non-blocking stream, which does not wait for it: wait here. */
  cu(cudaDeviceSynchronize(), "copy to the GPU");
  return d;
}
float *kc_up(const float *h, int64_t n) { return kc_up_bytes(h, n * (int64_t)sizeof(float)); }
float *kc_dev_zeros(int64_t n) {
  float *d = NULL;
  cu(cudaMalloc((void **)&d, (size_t)(n > 0 ? n : 1) * sizeof(float)), "cudaMalloc");
  cu(cudaMemset(d, 0, (size_t)(n > 0 ? n : 1) * sizeof(float)), "cudaMemset");
  cu(cudaDeviceSynchronize(), "cudaMemset"); /* as in kc_up_bytes */
  return d;
}
void kc_down_bytes(void *h, const void *d, int64_t bytes) {
  cu(cudaDeviceSynchronize(), "a kernel"); /* a kernel's fault is reported here */
  if (bytes > 0) cu(cudaMemcpy(h, d, (size_t)bytes, cudaMemcpyDeviceToHost), "copy from the GPU");
}
void kc_down(float *h, const float *d, int64_t n) { kc_down_bytes(h, d, n * (int64_t)sizeof(float)); }
void kc_free(void *d) { cu(cudaFree(d), "cudaFree"); }

double kc_err(const float *dev, const float *cpu, int64_t n) {
  float *g = kc_zeros(n);
  kc_down(g, dev, n);
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)g[i] - cpu[i]);
    if (g[i] != g[i] || cpu[i] != cpu[i]) d = (g[i] != g[i]) == (cpu[i] != cpu[i]) ? 0 : INFINITY;
    if (d > diff || d != d) diff = d;
    if (fabs(cpu[i]) > scale) scale = fabs(cpu[i]);
  }
  free(g);
  return diff / (scale > 1e-30 ? scale : 1e-30);
}

static int index_of(const char *kernel) {
  for (int k = 0; k < NKERNELS; k++)
    if (!strcmp(KERNELS[k], kernel)) return k;
  fprintf(stderr, "gpu-kernels: a check names '%s', which compiler/kernels.def does not list\n", kernel);
  exit(2);
}
void kc_report(const char *kernel, const char *shape, double err) {
  int k = index_of(kernel);
  cases[k]++;
  if (err > worst[k] || err != err) worst[k] = err;
  printf("  %-20s %-40s %.3g%s\n", kernel, shape, err, err <= KC_TOL ? "" : "   <- over 1e-5");
}
void kc_report_exact(const char *kernel, const char *shape, const void *dev, const void *cpu, int64_t bytes) {
  unsigned char *g = malloc((size_t)(bytes > 0 ? bytes : 1));
  kc_down_bytes(g, dev, bytes);
  int same = bytes <= 0 || !memcmp(g, cpu, (size_t)bytes);
  free(g);
  int k = index_of(kernel);
  cases[k]++;
  if (!same) worst[k] = INFINITY;
  printf("  %-20s %-40s %s\n", kernel, shape, same ? "same bits" : "BITS DIFFER");
}

void kc_report_same_floats(const char *kernel, const char *shape, const float *dev, const float *cpu, int64_t n) {
  float *g = kc_zeros(n);
  kc_down(g, dev, n);
  int same = 1;
  for (int64_t i = 0; i < n && same; i++) same = (g[i] != g[i] && cpu[i] != cpu[i]) || !memcmp(&g[i], &cpu[i], sizeof *g);
  free(g);
  int k = index_of(kernel);
  cases[k]++;
  if (!same) worst[k] = INFINITY;
  printf("  %-20s %-40s %s\n", kernel, shape, same ? "same bits (any NaN for a NaN)" : "BITS DIFFER");
}

int main(int argc, char **argv) {
  pr_cu_init(0, PR_PREC_FP32);
  void (*const families[])(void) = {check_gemm, check_conv, check_pool, check_activation, check_binary, check_movement,
                                    check_reduce, check_norm, check_loss, check_dropout, check_optim, check_rnn};
  for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) families[f]();
  FILE *out = argc > 1 ? fopen(argv[1], "w") : NULL;
  if (argc > 1 && !out) {
    perror(argv[1]);
    return 2;
  }
  int bad = 0;
  char row[256];
  snprintf(row, sizeof row, "%-22s %6s  %-12s %s\n", "kernel", "cases", "worst", "result");
  fputs(row, stdout);
  if (out) fputs(row, out);
  for (int k = 0; k < NKERNELS; k++) {
    int ok = cases[k] > 0 && worst[k] <= KC_TOL;
    bad += !ok;
    snprintf(row, sizeof row, "%-22s %6d  %-12.3g %s\n", KERNELS[k], cases[k], worst[k],
             !cases[k] ? "FAIL (not checked)" : ok ? "ok" : "FAIL");
    fputs(row, stdout);
    if (out) fputs(row, out);
  }
  snprintf(row, sizeof row, "gpu-kernels: %d of %d kernels within %.0e of the CPU's\n", NKERNELS - bad, NKERNELS, KC_TOL);
  fputs(row, stdout);
  if (out) fputs(row, out), fclose(out);
  return bad ? 1 : 0;
}
