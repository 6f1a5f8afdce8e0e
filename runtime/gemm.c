/* gemm.c - the kernels' SGEMM, split over the rank's threads (pipecc --threads, par.h).
 *
 * OpenBLAS runs on one thread in every rank; a large product is cut here
 * instead, into bands of C's rows, each band one single-threaded OpenBLAS
 * call on the threads of par.c.  Why not OpenBLAS's own threads: they sleep
 * between calls, and waking them took longer than the products of a small
 * model's step; par.c's workers spin between a stage's kernels, and one set
 * of threads serves the GEMMs and the other kernels alike, so they never
 * compete for the cores.
 *
 * Bits.  A row-major product is, to OpenBLAS, a column-major one whose "N"
 * side is C's rows.  Every kernel set Debian's OpenBLAS ships computes an
 * element of C the same way whatever the rows around it, as long as its
 * row lies in a whole tile of that side and the call's rows are whole tiles:
 * tiles are 1, 4, 12 or 16 rows (measured: docs/kernels.md, "Threads").  So
 * the rows of whole 96-row blocks (96 = a multiple of each) are one product,
 * cut into bands of whole blocks, and the rows past them are a call of their
 * own, on one thread too.  C's columns are never cut: under the Haswell and
 * Zen kernels a column's bits depend on how many columns the call has, so a
 * short C (fewer than two blocks of rows) runs on one thread.
 *
 * OpenBLAS's small-matrix path (SkylakeX, M*N*K up to 1e6) is other code: a
 * product is cut only when every band has more work than that.  The cut
 * depends only on the shape and T, so a run repeats, -n 1 and -n 4 agree,
 * and 1 and T threads agree, under every kernel set. */
#include "kernels.h"

/* Bands are whole blocks of this many rows: a multiple of every kernel set's tile. */
#define GEMM_BLOCK 96
/* Multiply-adds each band must get for a product to be cut: about 10 us of one core's GEMM, and more
 * than OpenBLAS's small-matrix limit (1e6), so that no band takes a path the whole did not. */
#define GEMM_MIN_MACS (1 << 20)

typedef struct Gemm {
  enum CBLAS_TRANSPOSE ta, tb;
  int M, N, K, lda, ldb, ldc;
  float alpha, beta;
  const float *A, *B;
  float *C;
} Gemm;

/* C's rows [r0, r1) as one OpenBLAS call: A's rows (its columns when transposed), B whole. */
static void gemm_rows(const Gemm *g, int64_t r0, int64_t r1) {
  cblas_sgemm(CblasRowMajor, g->ta, g->tb, (int)(r1 - r0), g->N, g->K, g->alpha, g->ta == CblasNoTrans ? g->A + r0 * g->lda : g->A + r0,
              g->lda, g->B, g->ldb, g->beta, g->C + r0 * g->ldc, g->ldc);
}

/* Blocks [lo, hi): a band (par.h's range function). */
static void gemm_band(const void *arg, int64_t lo, int64_t hi) { gemm_rows((const Gemm *)arg, lo * GEMM_BLOCK, hi * GEMM_BLOCK); }

void pr_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc) {
  Gemm g = {ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C};
  int t = pr_par_threads();
  int64_t blocks = M / GEMM_BLOCK, per = t > 1 ? blocks / t : 0;
  if (blocks < 2) { /* a short C: one call */
    gemm_rows(&g, 0, M);
    return;
  }
  /* The whole blocks, cut over the threads or as one call, then the rows past them as a call of their
   * own: on one thread too, since a call's partial tile changes the bits of its other rows (Haswell). */
  double macs = (double)M * N * K, band_macs = (double)GEMM_BLOCK * N * K * (double)(per > 0 ? per : 1);
  if (t > 1 && band_macs >= GEMM_MIN_MACS) pr_par_for(blocks, 1, macs, gemm_band, &g);
  else gemm_band(&g, 0, blocks);
  if (M > blocks * GEMM_BLOCK) gemm_rows(&g, blocks * GEMM_BLOCK, M);
}
