/* gemm.c - the kernels' SGEMM, split over the rank's threads (pipecc --threads, par.h).
 *
 * OpenBLAS runs on one thread in every rank; a large product is cut here
 * instead, into bands of C's rows (or, for a short C, of its columns), each
 * band one single-threaded OpenBLAS call on the threads of par.c.  Why not
 * OpenBLAS's own threads: they sleep between calls, and waking them took
 * longer than the products of a small model's step; par.c's workers spin
 * between a stage's kernels, and one set of threads serves the GEMMs and the
 * other kernels alike, so they never compete for the cores.
 *
 * Bits: a band is a whole number of 64-row (or column) blocks, so every
 * element of C is computed by the same OpenBLAS kernel code along the same
 * K blocking as in one call, and a product gives the bits it gives on one
 * thread, except where a band falls under OpenBLAS's small-matrix path and the
 * whole did not (docs/kernels.md, "Threads").  The cut depends only on the
 * shape and T, so a run repeats, and -n 1 and -n 4 agree, at any T. */
#include "kernels.h"

/* Bands are whole blocks of this many rows or columns. */
#define GEMM_BLOCK 64
/* Multiply-adds each thread must get for a product to be cut: about 10 us of one core's GEMM. */
#define GEMM_MIN_MACS (1 << 20)

typedef struct Gemm {
  enum CBLAS_TRANSPOSE ta, tb;
  int M, N, K, lda, ldb, ldc, rows;
  float alpha, beta;
  const float *A, *B;
  float *C;
} Gemm;

static void gemm_band(const void *arg, int64_t lo, int64_t hi) {
  const Gemm *g = (const Gemm *)arg;
  int n = (int)(hi - lo);
  if (g->rows) /* C rows [lo, hi): A's rows (its columns when transposed) */
    cblas_sgemm(CblasRowMajor, g->ta, g->tb, n, g->N, g->K, g->alpha, g->ta == CblasNoTrans ? g->A + lo * g->lda : g->A + lo, g->lda,
                g->B, g->ldb, g->beta, g->C + lo * g->ldc, g->ldc);
  else /* C columns [lo, hi): B's columns (its rows when transposed) */
    cblas_sgemm(CblasRowMajor, g->ta, g->tb, g->M, n, g->K, g->alpha, g->A, g->lda, g->tb == CblasNoTrans ? g->B + lo : g->B + lo * g->ldb,
                g->ldb, g->beta, g->C + lo, g->ldc);
}

void pr_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc) {
  int t = pr_par_threads();
  double macs = (double)M * N * K;
  if (t > 1 && macs >= (double)GEMM_MIN_MACS * t && (M >= 2 * GEMM_BLOCK || N >= 2 * GEMM_BLOCK)) {
    Gemm g = {ta, tb, M, N, K, lda, ldb, ldc, M >= 2 * GEMM_BLOCK, alpha, beta, A, B, C};
    pr_par_for(g.rows ? M : N, GEMM_BLOCK, macs, gemm_band, &g);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
