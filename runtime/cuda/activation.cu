/* cuda/activation.cu - element-wise activations and unary maths on the GPU: Relu, Tanh, Sigmoid, Erf, Sqrt,
 * Gelu, LeakyRelu, kc_unary (Neg, Exp, Log, Abs, Reciprocal, Clip, HardSigmoid, HardSwish) and their
 * gradients.  Each is one grid-stride loop over the elements on pr_cu_stream, each element the CPU's
 * expression (cpu/activation.h) in float with CUDA's expf/tanhf/erff/logf (within a few ulp of glibc's);
 * where a comparison follows arithmetic (HardSigmoid, HardSwish) the arithmetic is rounded as the CPU
 * rounds it (no fused multiply-add), so the same elements fall on each side of a kink.  x and y may be
 * the same buffer (in place): each element is read before it is written by the same thread. */
#include "common.cuh"
#include "kernels.h"

/* A product and a sum rounded each on its own, as the CPU's (never fused into one multiply-add). */
#define A_MUL(a, b) __fmul_rn((a), (b))
#define A_ADD(a, b) __fadd_rn((a), (b))

namespace {

/* A gradient's element: written, or added (acc). */
__device__ __forceinline__ void grad_out(float *dx, int64_t i, float g, int acc) { dx[i] = acc ? dx[i] + g : g; }

/* ---- one-input maps (forward) and their gradients, as functors over one element ---- */
struct Relu {
  __device__ float operator()(float v) const { return v > 0 || v != v ? v : 0.0f; }
};
struct Tanh {
  __device__ float operator()(float v) const { return tanhf(v); }
};
struct Sigmoid {
  __device__ float operator()(float v) const { return 1 / (1 + expf(-v)); }
};
struct Erf {
  __device__ float operator()(float v) const { return erff(v); }
};
struct Sqrt {
  __device__ float operator()(float v) const { return sqrtf(v); }
};
struct LeakyRelu {
  float alpha;
  __device__ float operator()(float v) const { return v > 0 ? v : v * alpha; }
};
struct Gelu {
  int tanh_approx;
  __device__ float operator()(float v) const {
    const float kAlpha = 0.70710678118654752440f; /* 1/sqrt(2) */
    const float kBeta = 0.79788456080286535588f;  /* sqrt(2/pi) */
    const float kKappa = 0.044715f;
    if (tanh_approx) {
      float inner = kBeta * (v + kKappa * (v * v * v));
      return 0.5f * v * (1.0f + tanhf(inner));
    }
    return v * 0.5f * (1.0f + erff(v * kAlpha));
  }
};

template <class F> __global__ void map_kernel(const float *__restrict__ x, float *__restrict__ y, int64_t n, F f) {
  PR_CU_FOR(i, n) y[i] = f(x[i]);
}
/* In place (x == y): the same loop without __restrict__. */
template <class F> __global__ void map_kernel_alias(const float *x, float *y, int64_t n, F f) {
  PR_CU_FOR(i, n) y[i] = f(x[i]);
}
template <class F> void map_launch(const float *x, float *y, int64_t n, F f) {
  if (n <= 0) return;
  if (x == y) map_kernel_alias<F><<<pr_cu_blocks(n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, y, n, f);
  else map_kernel<F><<<pr_cu_blocks(n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, y, n, f);
  PR_CU_LAUNCHED();
}

/* Gradients: g(a, dy) where a is the one saved tensor the CPU's formula reads (x or y). */
struct ReluGrad {
  __device__ float operator()(float y, float dy) const { return y <= 0 ? 0 : dy; }
};
struct TanhGrad {
  __device__ float operator()(float y, float dy) const { return dy * (1 - y * y); }
};
struct SigmoidGrad {
  __device__ float operator()(float y, float dy) const { return dy * y * (1 - y); }
};
struct ErfGrad {
  __device__ float operator()(float x, float dy) const { return dy * 1.12837916709551257f * expf(-x * x); }
};
struct SqrtGrad {
  __device__ float operator()(float y, float dy) const { return dy * 0.5f / y; }
};
struct LeakyReluGrad {
  float alpha;
  __device__ float operator()(float x, float dy) const { return x > 0 ? dy : dy * alpha; }
};
struct GeluGrad {
  int tanh_approx;
  __device__ float operator()(float v, float dy) const {
    const float kAlpha = 0.70710678118654752440f; /* 1/sqrt(2) */
    const float kPdf = 0.39894228040143267794f;   /* 1/sqrt(2 pi) */
    const float kBeta = 0.79788456080286535588f;  /* sqrt(2/pi) */
    const float kKappa = 0.044715f;
    float slope;
    if (tanh_approx) {
      float v2 = v * v;
      float t = tanhf(kBeta * (v + kKappa * (v2 * v)));
      float left = 0.5f * v, right = 1.0f + t;
      float dleft = 0.5f * right;
      float dright = left * (1.0f - t * t) * (kBeta * (1.0f + 3.0f * kKappa * v2));
      slope = dleft + dright;
    } else {
      float cdf = 0.5f * (1.0f + erff(v * kAlpha));
      float pdf = kPdf * expf(v * v * -0.5f);
      slope = cdf + v * pdf;
    }
    return dy * slope;
  }
};

/* dx may alias dy (or a) in place: no __restrict__. */
template <class G> __global__ void grad_kernel(const float *a, const float *dy, float *dx, int64_t n, int acc, G g) {
  PR_CU_FOR(i, n) grad_out(dx, i, g(a[i], dy[i]), acc);
}
template <class G> void grad_launch(const float *a, const float *dy, float *dx, int64_t n, int acc, G g) {
  if (n <= 0) return;
  grad_kernel<G><<<pr_cu_blocks(n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(a, dy, dx, n, acc, g);
  PR_CU_LAUNCHED();
}

/* ---- k_unary: the op a template argument, so each op's loop is its own (as the CPU's UN_LOOP) ---- */
template <int OP> __device__ __forceinline__ float un_apply(float x, float a, float b) {
  switch (OP) {
  case UN_NEG: return -x;
  case UN_EXP: return expf(x);
  case UN_LOG: return logf(x);
  case UN_ABS: return fabsf(x);
  case UN_RECIPROCAL: return 1.0f / x;
  case UN_CLIP: { /* min(max(x, lo), hi): hi wins when lo > hi; NaN stays NaN */
    float v = x < a ? a : x;
    return v > b ? b : v;
  }
  case UN_HARDSIGMOID: {
    float v = A_ADD(A_MUL(a, x), b);
    return v < 0 ? 0 : v > 1 ? 1 : v;
  }
  default: { /* hardswish: x * min(max(x + 3, 0), 6) / 6 */
    float t = x + 3.0f;
    t = t < 0 ? 0 : t > 6 ? 6 : t;
    return A_MUL(x, t) / 6.0f;
  }
  }
}
template <int OP> __device__ __forceinline__ float un_grad(float x, float y, float dy, float a, float b) {
  switch (OP) {
  case UN_NEG: return -dy;
  case UN_EXP: return dy * y;
  case UN_LOG: return dy / x;
  case UN_ABS: return x > 0 ? dy : x < 0 ? -dy : 0;
  case UN_RECIPROCAL: return -dy * (y * y);
  case UN_CLIP: return x >= a && x <= b ? dy : 0;
  case UN_HARDSIGMOID: {
    float v = A_ADD(A_MUL(a, x), b);
    return v > 0 && v < 1 ? dy * a : 0;
  }
  default: return x < -3.0f ? 0 : x <= 3.0f ? dy * (x / 3.0f + 0.5f) : dy;
  }
}
template <int OP> __global__ void unary_kernel(const float *x, float *y, int64_t n, float a, float b) {
  PR_CU_FOR(i, n) y[i] = un_apply<OP>(x[i], a, b);
}
/* x, y: NULL where the op does not read them (the CPU reads 0 there). */
template <int OP>
__global__ void unary_grad_kernel(const float *x, const float *y, const float *dy, float *dx, int64_t n, float a, float b, int acc) {
  PR_CU_FOR(i, n) grad_out(dx, i, un_grad<OP>(x ? x[i] : 0.0f, y ? y[i] : 0.0f, dy[i], a, b), acc);
}
template <int OP> void unary_launch(const float *x, float *y, int64_t n, float a, float b) {
  unary_kernel<OP><<<pr_cu_blocks(n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, y, n, a, b);
  PR_CU_LAUNCHED();
}
template <int OP>
void unary_grad_launch(const float *x, const float *y, const float *dy, float *dx, int64_t n, float a, float b, int acc) {
  unary_grad_kernel<OP><<<pr_cu_blocks(n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, y, dy, dx, n, a, b, acc);
  PR_CU_LAUNCHED();
}

} // namespace

extern "C" void kc_relu(const float *x, float *y, int64_t n) { map_launch(x, y, n, Relu{}); }
extern "C" void kc_relu_grad(const float *y, const float *dy, float *dx, int64_t n, int acc) { grad_launch(y, dy, dx, n, acc, ReluGrad{}); }
extern "C" void kc_tanh(const float *x, float *y, int64_t n) { map_launch(x, y, n, Tanh{}); }
extern "C" void kc_tanh_grad(const float *y, const float *dy, float *dx, int64_t n, int acc) { grad_launch(y, dy, dx, n, acc, TanhGrad{}); }
extern "C" void kc_sigmoid(const float *x, float *y, int64_t n) { map_launch(x, y, n, Sigmoid{}); }
extern "C" void kc_sigmoid_grad(const float *y, const float *dy, float *dx, int64_t n, int acc) {
  grad_launch(y, dy, dx, n, acc, SigmoidGrad{});
}
extern "C" void kc_erf(const float *x, float *y, int64_t n) { map_launch(x, y, n, Erf{}); }
extern "C" void kc_erf_grad(const float *x, const float *dy, float *dx, int64_t n, int acc) { grad_launch(x, dy, dx, n, acc, ErfGrad{}); }
extern "C" void kc_sqrt(const float *x, float *y, int64_t n) { map_launch(x, y, n, Sqrt{}); }
extern "C" void kc_sqrt_grad(const float *y, const float *dy, float *dx, int64_t n, int acc) { grad_launch(y, dy, dx, n, acc, SqrtGrad{}); }
extern "C" void kc_gelu(const float *x, float *y, int64_t n, int tanh_approx) { map_launch(x, y, n, Gelu{tanh_approx}); }
extern "C" void kc_gelu_grad(const float *x, const float *dy, float *dx, int64_t n, int tanh_approx, int acc) {
  grad_launch(x, dy, dx, n, acc, GeluGrad{tanh_approx});
}
extern "C" void kc_leakyrelu(const float *x, float *y, int64_t n, float alpha) { map_launch(x, y, n, LeakyRelu{alpha}); }
extern "C" void kc_leakyrelu_grad(const float *x, const float *dy, float *dx, int64_t n, float alpha, int acc) {
  grad_launch(x, dy, dx, n, acc, LeakyReluGrad{alpha});
}

extern "C" void kc_unary(int op, const float *x, float *y, int64_t n, float a, float b) {
  if (n <= 0) return;
  switch (op) {
  case UN_NEG: unary_launch<UN_NEG>(x, y, n, a, b); break;
  case UN_EXP: unary_launch<UN_EXP>(x, y, n, a, b); break;
  case UN_LOG: unary_launch<UN_LOG>(x, y, n, a, b); break;
  case UN_ABS: unary_launch<UN_ABS>(x, y, n, a, b); break;
  case UN_RECIPROCAL: unary_launch<UN_RECIPROCAL>(x, y, n, a, b); break;
  case UN_CLIP: unary_launch<UN_CLIP>(x, y, n, a, b); break;
  case UN_HARDSIGMOID: unary_launch<UN_HARDSIGMOID>(x, y, n, a, b); break;
  default: unary_launch<UN_HARDSWISH>(x, y, n, a, b); /* the CPU's default too */
  }
}
extern "C" void kc_unary_grad(int op, const float *x, const float *y, const float *dy, float *dx, int64_t n, float a, float b, int acc) {
  if (n <= 0) return;
  switch (op) {
  case UN_NEG: unary_grad_launch<UN_NEG>(x, y, dy, dx, n, a, b, acc); break;
  case UN_EXP: unary_grad_launch<UN_EXP>(x, y, dy, dx, n, a, b, acc); break;
  case UN_LOG: unary_grad_launch<UN_LOG>(x, y, dy, dx, n, a, b, acc); break;
  case UN_ABS: unary_grad_launch<UN_ABS>(x, y, dy, dx, n, a, b, acc); break;
  case UN_RECIPROCAL: unary_grad_launch<UN_RECIPROCAL>(x, y, dy, dx, n, a, b, acc); break;
  case UN_CLIP: unary_grad_launch<UN_CLIP>(x, y, dy, dx, n, a, b, acc); break;
  case UN_HARDSIGMOID: unary_grad_launch<UN_HARDSIGMOID>(x, y, dy, dx, n, a, b, acc); break;
  default: unary_grad_launch<UN_HARDSWISH>(x, y, dy, dx, n, a, b, acc);
  }
}
