/* k_gemm.c - the Gemm and MatMul kernels (cuda/gemm.cu) against the CPU's (cpu/gemm.h): transposes, odd
 * M/N/K, C broadcast from every shape it can have, alpha and beta, acc 0 and 1, and MatMul's batch
 * broadcasting (B shared, both batched, A or B broadcast along some axes, strides that do not chain). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.h"
#include "kcheck.h"
#include "kernels.h"

/* An output prefilled with the same random data on both sides (what acc = 1 adds to, or what acc = 0 must
 * overwrite): the host copy and the device copy. */
static float *prefill(int64_t n, float **dev) {
  float *h = kc_rand(n, -1.0f, 1.0f);
  *dev = kc_up(h, n);
  return h;
}

static const int SHAPES[][3] = {{1, 1, 1}, {7, 33, 257}, {33, 7, 1}, {257, 33, 7}, {1, 257, 33}, {64, 1000, 33}, {130, 5, 64}};
enum { NSHAPES = sizeof SHAPES / sizeof SHAPES[0] };

static void check_gemm_fwd(void) {
  /* C's shapes: none, a bias [1,N], a full [M,N], a column [M,1], a scalar [1,1], a full one beta ignores */
  static const struct { int has, full_m, full_n; float beta; } CM[] = {
      {0, 0, 0, 1.0f}, {1, 0, 1, 1.0f}, {1, 1, 1, 0.7f}, {1, 1, 0, 1.0f}, {1, 0, 0, -0.5f}, {1, 1, 1, 0.0f}};
  for (int sh = 0; sh < NSHAPES; sh++)
    for (int t = 0; t < 4; t++)
      for (int c = 0; c < (int)(sizeof CM / sizeof CM[0]); c++) {
        int M = SHAPES[sh][0], N = SHAPES[sh][1], K = SHAPES[sh][2], ta = t & 1, tb = t >> 1;
        int cm = CM[c].full_m ? M : 1, cn = CM[c].full_n ? N : 1;
        float alpha = c % 2 ? 0.5f : 1.0f, beta = CM[c].beta;
        float *A = kc_rand((int64_t)M * K, -1, 1), *B = kc_rand((int64_t)K * N, -1, 1), *C = kc_rand((int64_t)cm * cn, -1, 1);
        float *dA = kc_up(A, (int64_t)M * K), *dB = kc_up(B, (int64_t)K * N), *dC = kc_up(C, (int64_t)cm * cn), *dY;
        float *Y = prefill((int64_t)M * N, &dY);
        k_gemm(A, B, CM[c].has ? C : NULL, Y, M, N, K, ta, tb, alpha, beta, cm, cn);
        kc_gemm(dA, dB, CM[c].has ? dC : NULL, dY, M, N, K, ta, tb, alpha, beta, cm, cn);
        char shape[96];
        snprintf(shape, sizeof shape, "%dx%dx%d t%d%d C%s[%d,%d] a%g b%g", M, N, K, ta, tb, CM[c].has ? "" : "-", cm, cn,
                 (double)alpha, (double)beta);
        kc_report("k_gemm", shape, kc_err(dY, Y, (int64_t)M * N));
        free(A), free(B), free(C), free(Y);
        kc_free(dA), kc_free(dB), kc_free(dC), kc_free(dY);
      }
}

static void check_gemm_bwd(void) {
  for (int sh = 0; sh < NSHAPES; sh++)
    for (int t = 0; t < 4; t++)
      for (int acc = 0; acc < 2; acc++) {
        int M = SHAPES[sh][0], N = SHAPES[sh][1], K = SHAPES[sh][2], ta = t & 1, tb = t >> 1;
        float alpha = acc ? 0.75f : 1.0f;
        float *A = kc_rand((int64_t)M * K, -1, 1), *B = kc_rand((int64_t)K * N, -1, 1), *G = kc_rand((int64_t)M * N, -1, 1);
        float *dA = kc_up(A, (int64_t)M * K), *dB = kc_up(B, (int64_t)K * N), *dG = kc_up(G, (int64_t)M * N), *gA, *gB;
        float *hA = prefill((int64_t)M * K, &gA), *hB = prefill((int64_t)K * N, &gB);
        k_gemm_dA(G, B, hA, M, N, K, ta, tb, alpha, acc);
        kc_gemm_dA(dG, dB, gA, M, N, K, ta, tb, alpha, acc);
        k_gemm_dB(G, A, hB, M, N, K, ta, tb, alpha, acc);
        kc_gemm_dB(dG, dA, gB, M, N, K, ta, tb, alpha, acc);
        char shape[96];
        snprintf(shape, sizeof shape, "%dx%dx%d t%d%d a%g acc%d", M, N, K, ta, tb, (double)alpha, acc);
        kc_report("k_gemm_dA", shape, kc_err(gA, hA, (int64_t)M * K));
        kc_report("k_gemm_dB", shape, kc_err(gB, hB, (int64_t)K * N));
        free(A), free(B), free(G), free(hA), free(hB);
        kc_free(dA), kc_free(dB), kc_free(dG), kc_free(gA), kc_free(gB);
      }
  static const int DC[][2] = {{1, 1}, {7, 33}, {33, 1}, {129, 7}, {257, 33}, {1000, 33}, {2048, 65}, {1, 300}};
  for (int sh = 0; sh < (int)(sizeof DC / sizeof DC[0]); sh++)
    for (int c = 0; c < 4; c++)
      for (int acc = 0; acc < 2; acc++) {
        int M = DC[sh][0], N = DC[sh][1], cm = c & 1 ? M : 1, cn = c & 2 ? N : 1;
        float beta = acc ? 0.5f : 1.0f;
        float *G = kc_rand((int64_t)M * N, -1, 1), *dG = kc_up(G, (int64_t)M * N), *gC;
        float *hC = prefill((int64_t)cm * cn, &gC);
        k_gemm_dC(G, hC, M, N, cm, cn, beta, acc);
        kc_gemm_dC(dG, gC, M, N, cm, cn, beta, acc);
        char shape[96];
        snprintf(shape, sizeof shape, "%dx%d C[%d,%d] b%g acc%d", M, N, cm, cn, (double)beta, acc);
        kc_report("k_gemm_dC", shape, kc_err(gC, hC, (int64_t)cm * cn));
        free(G), free(hC);
        kc_free(dG), kc_free(gC);
      }
}

/* A MatMulShape as the compiler makes it (compiler/ops/gemm.c, matmul_fwd): A [abatch..., M, K] and
 * B [bbatch..., K, N] (ra, rb batch axes each), the batch axes broadcast numpy's way. */
static MatMulShape mm_shape(int ra, const int64_t *ab, int rb, const int64_t *bb, int64_t M, int64_t N, int64_t K,
                            int64_t *na, int64_t *nbel) {
  MatMulShape s;
  memset(&s, 0, sizeof s);
  int nb = ra > rb ? ra : rb;
  s.nb = nb, s.M = M, s.N = N, s.K = K, s.batch = 1;
  *na = M * K, *nbel = K * N;
  for (int i = 0; i < ra; i++) *na *= ab[i];
  for (int i = 0; i < rb; i++) *nbel *= bb[i];
  for (int i = 0; i < nb; i++) {
    int ia = i - (nb - ra), ib = i - (nb - rb);
    int64_t da = ia < 0 ? 1 : ab[ia], db = ib < 0 ? 1 : bb[ib], ma = 1, mb = 1;
    s.bdims[i] = da > db ? da : db;
    s.batch *= s.bdims[i];
    for (int z = ia + 1; z < ra; z++) ma *= ab[z];
    for (int z = ib + 1; z < rb; z++) mb *= bb[z];
    s.sa[i] = ia < 0 || da == 1 ? 0 : ma;
    s.sb[i] = ib < 0 || db == 1 ? 0 : mb;
  }
  s.b_shared = rb == 0;
  for (int i = 0; i < nb; i++) s.b_shared &= s.sa[i] != 0 || s.bdims[i] == 1;
  return s;
}

static void check_matmul(void) {
  static const struct { int ra; int64_t ab[3]; int rb; int64_t bb[3]; const char *name; } CASES[] = {
      {2, {2, 3}, 0, {0}, "A[2,3] B[] (B shared)"},
      {1, {4}, 1, {4}, "A[4] B[4]"},
      {0, {0}, 2, {2, 3}, "A[] B[2,3]"},
      {2, {2, 1}, 2, {1, 3}, "A[2,1] B[1,3]"},
      {2, {3, 1}, 2, {3, 4}, "A[3,1] B[3,4]"},
      {2, {2, 3}, 1, {3}, "A[2,3] B[3]"},
      {3, {2, 1, 5}, 1, {5}, "A[2,1,5] B[5]"},
      {1, {1}, 1, {5}, "A[1] B[5]"},
      {1, {6}, 1, {1}, "A[6] B[1]"},
      {3, {2, 3, 2}, 3, {2, 1, 2}, "A[2,3,2] B[2,1,2]"},
  };
  static const int MNK[][3] = {{7, 33, 5}, {1, 7, 33}, {33, 1, 7}, {16, 64, 17}};
  for (int c = 0; c < (int)(sizeof CASES / sizeof CASES[0]); c++)
    for (int z = 0; z < (int)(sizeof MNK / sizeof MNK[0]); z++)
      for (int acc = 0; acc < 2; acc++) {
        int64_t na, nbel;
        MatMulShape s = mm_shape(CASES[c].ra, CASES[c].ab, CASES[c].rb, CASES[c].bb, MNK[z][0], MNK[z][1], MNK[z][2], &na, &nbel);
        int64_t ny = s.batch * s.M * s.N;
        float *A = kc_rand(na, -1, 1), *B = kc_rand(nbel, -1, 1), *G = kc_rand(ny, -1, 1);
        float *dA = kc_up(A, na), *dB = kc_up(B, nbel), *dG = kc_up(G, ny), *gY, *gA, *gB;
        float *hY = prefill(ny, &gY), *hA = prefill(na, &gA), *hB = prefill(nbel, &gB);
        char shape[96];
        snprintf(shape, sizeof shape, "%s %lldx%lldx%lld%s acc%d", CASES[c].name, (long long)s.M, (long long)s.N,
                 (long long)s.K, s.b_shared ? " shared" : "", acc);
        if (!acc) {
          k_matmul(A, B, hY, &s);
          kc_matmul(dA, dB, gY, &s);
          kc_report("k_matmul", shape, kc_err(gY, hY, ny));
        }
        k_matmul_dA(G, B, hA, na, &s, acc);
        kc_matmul_dA(dG, dB, gA, na, &s, acc);
        kc_report("k_matmul_dA", shape, kc_err(gA, hA, na));
        k_matmul_dB(G, A, hB, nbel, &s, acc);
        kc_matmul_dB(dG, dA, gB, nbel, &s, acc);
        kc_report("k_matmul_dB", shape, kc_err(gB, hB, nbel));
        free(A), free(B), free(G), free(hY), free(hA), free(hB);
        kc_free(dA), kc_free(dB), kc_free(dG), kc_free(gY), kc_free(gA), kc_free(gB);
      }
}

void check_gemm(void) {
  check_gemm_fwd();
  check_gemm_bwd();
  check_matmul();
}
