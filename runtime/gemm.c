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
 * row lies in a whole tile of that side: tiles are 1, 4, 12 or 16 rows
 * (measured: docs/kernels.md, "Threads").  So a band is a whole number of
 * 96-row blocks (96 = a multiple of each), the last band taking the rest.
 * The other side, C's columns, is not safe to cut: under the Haswell and
 * Zen kernels a column's bits depend on how many columns the call has.
 *
 * A short C (fewer than two blocks of rows, as a small batch's activations
 * are) is therefore computed transposed, D = C^T = op(B)^T op(A)^T in a
 * scratch matrix, so that C's columns become D's rows and are cut as rows,
 * then copied back.  That choice depends on the shape alone, not on the
 * thread count, so one thread computes the same transposed product.
 *
 * OpenBLAS's small-matrix path (SkylakeX, M*N*K up to 1e6) is another
 * kernel: a band is cut only when every band has more work than that.
 * The cut depends only on the shape and T, so a run repeats, and -n 1 and
 * -n 4 agree, and 1 and T threads agree, under every kernel set. */
#include <stdio.h>
#include <stdlib.h>
#include "kernels.h"

/* Bands are whole blocks of this many rows: a multiple of every kernel set's tile. */
#define GEMM_BLOCK 96
/* Multiply-adds each band must get for a product to be cut: about 10 us of one core's GEMM, and more
 * than OpenBLAS's small-matrix limit (1e6), so that no band takes a path the whole did not. */
#define GEMM_MIN_MACS (1 << 20)

typedef struct Gemm {
  enum CBLAS_TRANSPOSE ta, tb;
  int M, N, K, lda, ldb, ldc, rows; /* rows: the length cut, M (or N when transposed) */
  float alpha, beta;
  const float *A, *B;
  float *C;
  float *D; /* transposed: C^T, N x M, in scratch; NULL: C directly */
} Gemm;

/* dst (cols x rows, leading dimension ldd) = src^T (rows x cols, leading dimension lds), in tiles that
 * stay in the cache.  A copy: no arithmetic, no rounding. */
static void transpose(const float *src, int64_t lds, float *dst, int64_t ldd, int rows, int cols) {
  enum { TILE = 32 };
  for (int i0 = 0; i0 < rows; i0 += TILE)
    for (int j0 = 0; j0 < cols; j0 += TILE) {
      int i1 = i0 + TILE < rows ? i0 + TILE : rows, j1 = j0 + TILE < cols ? j0 + TILE : cols;
      for (int j = j0; j < j1; j++)
        for (int i = i0; i < i1; i++) dst[j * ldd + i] = src[i * lds + j];
    }
}

/* C's rows [r0, r1) (D's, when transposed) as one OpenBLAS call. */
static void gemm_rows(const Gemm *g, int64_t r0, int64_t r1) {
  int n = (int)(r1 - r0);
  if (!g->D) { /* C rows [r0, r1): A's rows (its columns when transposed) */
    cblas_sgemm(CblasRowMajor, g->ta, g->tb, n, g->N, g->K, g->alpha, g->ta == CblasNoTrans ? g->A + r0 * g->lda : g->A + r0, g->lda,
                g->B, g->ldb, g->beta, g->C + r0 * g->ldc, g->ldc);
    return;
  }
  /* D rows [r0, r1) = C's columns: op(B)^T's rows, op(A)^T whole */
  float *d = g->D + r0 * g->M;
  if (g->beta != 0.0f) transpose(g->C + r0, g->ldc, d, g->M, g->M, n);
  enum CBLAS_TRANSPOSE tb = g->tb == CblasNoTrans ? CblasTrans : CblasNoTrans, ta = g->ta == CblasNoTrans ? CblasTrans : CblasNoTrans;
  cblas_sgemm(CblasRowMajor, tb, ta, n, g->M, g->K, g->alpha, g->tb == CblasNoTrans ? g->B + r0 : g->B + r0 * g->ldb, g->ldb, g->A, g->lda,
              g->beta, d, g->M);
  transpose(d, g->M, g->C + r0, g->ldc, n, g->M);
}

/* Blocks [lo, hi): a band (par.h's range function). */
static void gemm_band(const void *arg, int64_t lo, int64_t hi) { gemm_rows((const Gemm *)arg, lo * GEMM_BLOCK, hi * GEMM_BLOCK); }

/* The calling thread's scratch for transposed products, grown as needed and kept. */
static float *scratch(size_t floats) {
  static _Thread_local float *buf;
  static _Thread_local size_t cap;
  if (floats > cap) {
    float *p = realloc(buf, floats * sizeof(float));
    if (!p) {
      fprintf(stderr, "piperun: out of memory for a GEMM's scratch (%zu bytes)\n", floats * sizeof(float));
      exit(1);
    }
    buf = p, cap = floats;
  }
  return buf;
}

/* Whether a product of this shape is computed transposed: C is short and wide, and its columns would
 * be cut on two threads.  The shape alone decides, so 1 and T threads compute the same product. */
static int transposed(int M, int N, double macs) {
  return M < 2 * GEMM_BLOCK && N >= 2 * GEMM_BLOCK && macs >= 2.0 * GEMM_MIN_MACS;
}

void pr_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc) {
  int t = pr_par_threads();
  double macs = (double)M * N * K;
  Gemm g = {ta, tb, M, N, K, lda, ldb, ldc, M, alpha, beta, A, B, C, NULL};
  if (transposed(M, N, macs)) g.D = scratch((size_t)M * (size_t)N), g.rows = N;
  /* The whole blocks, cut over the threads or as one call, then the rows past them as a call of their
   * own: on one thread too, since the rest's rows change the bits of the others' (Haswell, Zen). */
  int64_t blocks = g.rows / GEMM_BLOCK, per = t > 1 ? blocks / t : 0;
  if (blocks == 0) {
    gemm_rows(&g, 0, g.rows);
    return;
  }
  /* every band at least `per` blocks (one, when there are fewer blocks than threads) */
  double band_macs = macs / g.rows * (double)GEMM_BLOCK * (double)(per > 0 ? per : 1);
  if (t > 1 && blocks >= 2 && band_macs >= GEMM_MIN_MACS) pr_par_for(blocks, 1, macs, gemm_band, &g);
  else gemm_band(&g, 0, blocks);
  if (g.rows > blocks * GEMM_BLOCK) gemm_rows(&g, blocks * GEMM_BLOCK, g.rows);
}
