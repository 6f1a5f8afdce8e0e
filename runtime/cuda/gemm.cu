/* cuda/gemm.cu - Gemm and MatMul on the GPU: each pr_sgemm of cpu/gemm.h as one cuBLAS call (pr_cu_sgemm:
 * row-major products as cuBLAS's column-major transposes), batched MatMul as strided-batched calls over the
 * innermost batch axes whose strides chain, and the sums over broadcast operands (Gemm's C, MatMul's
 * shared A or B) in an order fixed by the shape.  Kernels of cuda/gemm.h. */
#include "common.cuh"
#include "kernels.h"

/* ---- Gemm ---- */

/* Y = beta * C broadcast from [cm, cn] (before the product adds to it). */
__global__ void gemm_fill_c(const float *C, float *Y, int64_t M, int64_t N, int cm, int cn, float beta) {
  PR_CU_FOR(e, M * N) {
    int64_t i = e / N, j = e % N;
    Y[e] = beta * C[(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
  }
}

extern "C" void kc_gemm(const float *A, const float *B, const float *C, float *Y, int M, int N, int K, int ta, int tb,
                        float alpha, float beta, int cm, int cn) {
  int bias = C && beta != 0;
  if (M <= 0 || N <= 0) return;
  if (bias) {
    gemm_fill_c<<<pr_cu_blocks((int64_t)M * N, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(C, Y, M, N, cm, cn, beta);
    PR_CU_LAUNCHED();
  }
  pr_cu_sgemm(ta, tb, M, N, K, alpha, A, ta ? M : K, 0, B, tb ? K : N, 0, bias ? 1.0f : 0.0f, Y, N, 0, 1);
}

extern "C" void kc_gemm_dA(const float *dY, const float *B, float *dA, int M, int N, int K, int ta, int tb, float alpha,
                           int acc) {
  if (!ta) /* dA[M,K] = dY[M,N] . op(B)^T */
    pr_cu_sgemm(0, !tb, M, K, N, alpha, dY, N, 0, B, tb ? K : N, 0, acc ? 1.0f : 0.0f, dA, K, 0, 1);
  else /* dA[K,M] = op(B) . dY^T */
    pr_cu_sgemm(tb, 1, K, M, N, alpha, B, tb ? K : N, 0, dY, N, 0, acc ? 1.0f : 0.0f, dA, M, 0, 1);
}

extern "C" void kc_gemm_dB(const float *dY, const float *A, float *dB, int M, int N, int K, int ta, int tb, float alpha,
                           int acc) {
  if (!tb) /* dB[K,N] = op(A)^T . dY */
    pr_cu_sgemm(!ta, 0, K, N, M, alpha, A, ta ? M : K, 0, dY, N, 0, acc ? 1.0f : 0.0f, dB, N, 0, 1);
  else /* dB[N,K] = dY^T . op(A) */
    pr_cu_sgemm(1, ta, N, K, M, alpha, dY, N, 0, A, ta ? M : K, 0, acc ? 1.0f : 0.0f, dB, K, 0, 1);
}

/* dC: one thread per element of dC, adding beta * dY over the rows and columns that broadcast to it in the
 * CPU's order (rows, then columns). */
__global__ void gemm_dc_each(const float *dY, float *dC, int M, int N, int cm, int cn, float beta, int acc) {
  PR_CU_FOR(e, (int64_t)cm * cn) {
    int64_t r = e / cn, c = e % cn;
    int64_t i0 = cm == 1 ? 0 : r, i1 = cm == 1 ? M : r + 1, j0 = cn == 1 ? 0 : c, j1 = cn == 1 ? N : c + 1;
    float v = acc ? dC[e] : 0.0f;
    for (int64_t i = i0; i < i1; i++)
      for (int64_t j = j0; j < j1; j++) v += beta * dY[i * N + j];
    dC[e] = v;
  }
}

/* A bias over many rows: the column sums of DC_ROWS rows at a time (P[k][j]), then the parts in order. */
#define DC_ROWS 64
__global__ void gemm_dc_part(const float *dY, float *P, int M, int N, float beta) {
  int64_t parts = (M + DC_ROWS - 1) / DC_ROWS;
  PR_CU_FOR(e, parts * N) {
    int64_t k = e / N, j = e % N, i1 = (k + 1) * DC_ROWS < M ? (k + 1) * DC_ROWS : M;
    float v = 0.0f;
    for (int64_t i = k * DC_ROWS; i < i1; i++) v += beta * dY[i * N + j];
    P[e] = v;
  }
}
__global__ void gemm_dc_sum(const float *P, float *dC, int64_t parts, int N, int acc) {
  PR_CU_FOR(j, N) {
    float v = acc ? dC[j] : 0.0f;
    for (int64_t k = 0; k < parts; k++) v += P[k * N + j];
    dC[j] = v;
  }
}

extern "C" void kc_gemm_dC(const float *dY, float *dC, int M, int N, int cm, int cn, float beta, int acc) {
  if (cm <= 0 || cn <= 0) return;
  if (cm == 1 && cn == N && M > 2 * DC_ROWS) {
    int64_t parts = (M + DC_ROWS - 1) / DC_ROWS;
    float *P = (float *)pr_cu_scratch(parts * N * (int64_t)sizeof(float));
    gemm_dc_part<<<pr_cu_blocks(parts * N, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(dY, P, M, N, beta);
    PR_CU_LAUNCHED();
    gemm_dc_sum<<<pr_cu_blocks(N, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(P, dC, parts, N, acc);
    PR_CU_LAUNCHED();
    return;
  }
  gemm_dc_each<<<pr_cu_blocks((int64_t)cm * cn, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(dY, dC, M, N, cm, cn,
                                                                                                  beta, acc);
  PR_CU_LAUNCHED();
}

/* ---- MatMul with numpy semantics: batch dims broadcast ---- */

/* The output's own strides, in matrices: batch b's matrix is matrix b. */
static void mm_own_strides(const MatMulShape *s, int64_t *own) {
  int64_t r = 1;
  for (int d = s->nb - 1; d >= 0; d--) own[d] = r, r *= s->bdims[d];
}

/* The matrix offset of batch b in an operand with strides st (cpu/gemm.h's mm_offsets). */
static int64_t mm_off(const MatMulShape *s, const int64_t *st, int64_t b) {
  int64_t o = 0;
  for (int d = s->nb - 1; d >= 0; d--) {
    o += (b % s->bdims[d]) * st[d];
    b /= s->bdims[d];
  }
  return o;
}

/* How many consecutive batches (from any multiple of the count) have each of the three operands' matrices a
 * fixed step apart (steps t[0..2]): the innermost batch axes whose strides chain in all three. */
static int64_t mm_inner(const MatMulShape *s, const int64_t *const st[3], int64_t t[3]) {
  int64_t inner = 1;
  int first = 1;
  t[0] = t[1] = t[2] = 0;
  for (int d = s->nb - 1; d >= 0; d--) {
    if (s->bdims[d] == 1) continue;
    if (first)
      for (int q = 0; q < 3; q++) t[q] = st[q][d];
    first = 0;
    if (st[0][d] != t[0] * inner || st[1][d] != t[1] * inner || st[2][d] != t[2] * inner) break;
    inner *= s->bdims[d];
  }
  return inner;
}

/* One GEMM per batch b (in runs of strided-batched calls): the forward (which 0: out_b = x_b w_b, x = A,
 * w = B), dA (1: out_b = x_b w_b^T, x = dY, w = B) or dB (2: out_b = w_b^T x_b, x = dY, w = A).  sx, sw, so:
 * the operands' strides in matrices. */
static void mm_run(const MatMulShape *s, const float *x, const int64_t *sx, const float *w, const int64_t *sw,
                   float *out, const int64_t *so, int which, float beta) {
  int M = (int)s->M, N = (int)s->N, K = (int)s->K;
  int64_t MK = s->M * s->K, KN = s->K * s->N, MN = s->M * s->N;
  const int64_t *st[3] = {sx, sw, so};
  int64_t t[3], inner = mm_inner(s, st, t);
  for (int64_t b0 = 0; b0 < s->batch; b0 += inner) {
    int64_t ox = mm_off(s, sx, b0), ow = mm_off(s, sw, b0), oo = mm_off(s, so, b0);
    if (which == 0)
      pr_cu_sgemm(0, 0, M, N, K, 1.0f, x + ox * MK, K, t[0] * MK, w + ow * KN, N, t[1] * KN, beta, out + oo * MN, N,
                  t[2] * MN, inner);
    else if (which == 1)
      pr_cu_sgemm(0, 1, M, K, N, 1.0f, x + ox * MN, N, t[0] * MN, w + ow * KN, N, t[1] * KN, beta, out + oo * MK, K,
                  t[2] * MK, inner);
    else
      pr_cu_sgemm(1, 0, K, N, M, 1.0f, w + ow * MK, K, t[1] * MK, x + ox * MN, N, t[0] * MN, beta, out + oo * KN, N,
                  t[2] * KN, inner);
  }
}

/* Whether each batch has a matrix of its own in the operand with strides st (cpu/gemm.h's mm_own). */
static int mm_own(const MatMulShape *s, const int64_t *st) {
  for (int d = 0; d < s->nb; d++)
    if (st[d] == 0 && s->bdims[d] > 1) return 0;
  return 1;
}

/* The sum over the batches that share an operand's matrix: out[a][e] (+)= P[b][e] over the batches b whose
 * matrix is a, in increasing b (the CPU's order).  The operand's strides st: its own axes (st != 0) give a,
 * the others (broadcast) are walked, the last fastest. */
typedef struct MmRed {
  int nb;
  int64_t bdims[6], st[6], own[6]; /* own: batch b's stride along each axis */
  int64_t walk, mk;                /* batches per matrix; floats per matrix */
} MmRed;
__global__ void mm_reduce(const float *P, float *out, int64_t n, MmRed r, int acc) {
  PR_CU_FOR(idx, n) {
    int64_t a = idx / r.mk, e = idx % r.mk, base = 0;
    for (int d = 0; d < r.nb; d++)
      if (r.st[d] != 0) base += (a / r.st[d] % r.bdims[d]) * r.own[d];
    float v = acc ? out[idx] : 0.0f;
    for (int64_t u = 0; u < r.walk; u++) {
      int64_t b = base, q = u;
      for (int d = r.nb - 1; d >= 0; d--)
        if (r.st[d] == 0) {
          b += (q % r.bdims[d]) * r.own[d];
          q /= r.bdims[d];
        }
      v += P[b * r.mk + e];
    }
    out[idx] = v;
  }
}

/* The gradient of the operand with strides st (dA: which 1, dB: which 2), n floats, into out. */
static void mm_grad(const MatMulShape *s, const float *dY, const float *w, const int64_t *sw, float *out, int64_t n,
                    const int64_t *st, int which, int acc) {
  int64_t own[6];
  mm_own_strides(s, own);
  if (mm_own(s, st)) { /* each batch adds to a matrix of its own */
    if (!acc && n > 0) PR_CU(cudaMemsetAsync(out, 0, sizeof(float) * (size_t)n, pr_cu_stream));
    mm_run(s, dY, own, w, sw, out, st, which, 1.0f);
    return;
  }
  /* Shared: each batch's product into scratch, then the sums in batch order. */
  int64_t mk = which == 1 ? s->M * s->K : s->K * s->N;
  float *P = (float *)pr_cu_scratch(s->batch * mk * (int64_t)sizeof(float));
  mm_run(s, dY, own, w, sw, P, own, which, 0.0f);
  MmRed r;
  r.nb = s->nb, r.mk = mk, r.walk = 1;
  for (int d = 0; d < 6; d++) r.bdims[d] = r.st[d] = r.own[d] = 1;
  for (int d = 0; d < s->nb; d++) {
    r.bdims[d] = s->bdims[d], r.st[d] = st[d], r.own[d] = own[d];
    if (st[d] == 0) r.walk *= s->bdims[d];
  }
  if (n <= 0) return;
  mm_reduce<<<pr_cu_blocks(n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(P, out, n, r, acc);
  PR_CU_LAUNCHED();
}

extern "C" void kc_matmul(const float *A, const float *B, float *Y, const MatMulShape *s) {
  if (s->b_shared) {
    pr_cu_sgemm(0, 0, (int)(s->batch * s->M), (int)s->N, (int)s->K, 1.0f, A, (int)s->K, 0, B, (int)s->N, 0, 0.0f, Y,
                (int)s->N, 0, 1);
    return;
  }
  int64_t own[6];
  mm_own_strides(s, own);
  mm_run(s, A, s->sa, B, s->sb, Y, own, 0, 0.0f);
}

/* dA = dY B^T (summed over batches that share an A), acc as usual. */
extern "C" void kc_matmul_dA(const float *dY, const float *B, float *dA, int64_t na, const MatMulShape *s, int acc) {
  if (s->b_shared) {
    pr_cu_sgemm(0, 1, (int)(s->batch * s->M), (int)s->K, (int)s->N, 1.0f, dY, (int)s->N, 0, B, (int)s->N, 0,
                acc ? 1.0f : 0.0f, dA, (int)s->K, 0, 1);
    return;
  }
  mm_grad(s, dY, B, s->sb, dA, na, s->sa, 1, acc);
}

/* dB = A^T dY, summed over the batches that share a B. */
extern "C" void kc_matmul_dB(const float *dY, const float *A, float *dB, int64_t nbel, const MatMulShape *s, int acc) {
  if (s->b_shared) {
    pr_cu_sgemm(1, 0, (int)s->K, (int)s->N, (int)(s->batch * s->M), 1.0f, A, (int)s->K, 0, dY, (int)s->N, 0,
                acc ? 1.0f : 0.0f, dB, (int)s->N, 0, 1);
    return;
  }
  mm_grad(s, dY, A, s->sa, dB, nbel, s->sb, 2, acc);
}
