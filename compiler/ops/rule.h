/* rule.h - what an operator's rules may use while building a stage program.
 *
 * Each file in compiler/ops/ owns one family of operators: for each, its
 * entry in the operator table (ops.h) with its shape rule, fold rule, cost,
 * forward rule and backward rule.  A forward rule appends the calls that
 * compute a node; a backward rule the calls that compute the gradients of
 * its inputs, each marked PH_IGRAD (input gradient) or PH_WGRAD (weight
 * gradient).  Buffers are handed out through the em_* functions of
 * build.h (build.c); a rule never lays out memory or prints C. */
#ifndef PIPECC_OPS_RULE_H
#define PIPECC_OPS_RULE_H
#include <string.h>

#include "fold.h"
#include "ops.h"
#include "shape.h"
#include "build.h"


#define NARGS(...) ((int)(sizeof((Arg[]){__VA_ARGS__}) / sizeof(Arg)))
/* CALL(e, PH_FWD, K_RELU, n, A_BUF(x), A_BUF(y), A_INT(count)) */
#define CALL(e, phase, kernel, n, ...) em_call(e, phase, kernel, n, (Arg[]){__VA_ARGS__}, NARGS(__VA_ARGS__))
#define VARIANT(e, which, kernel, ...) em_variant(e, which, kernel, (Arg[]){__VA_ARGS__}, NARGS(__VA_ARGS__))
#define SHAPE(e, type, name, ...) em_shape(e, type, name, (Arg[]){__VA_ARGS__}, NARGS(__VA_ARGS__))

/* [outer, inner] sizes of t around axis a. */
static inline void rule_around(const Tensor *t, int a, int64_t *outer, int64_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < a; i++) *outer *= t->dims[i];
  for (int i = a + 1; i < t->rank; i++) *inner *= t->dims[i];
}

/* Strides of src along each axis of the broadcast output y (0 where src is broadcast). */
static inline void rule_bcast_strides(const Tensor *y, const Tensor *src, int64_t *st) {
  for (int i = 0; i < y->rank; i++) {
    int si = i - (y->rank - src->rank), z = si + 1;
    int64_t m = 1;
    if (si < 0) { /* an axis src lacks: broadcast */
      st[i] = 0;
      continue;
    }
    for (; z < src->rank; z++) m *= src->dims[z];
    st[i] = src->dims[si] == 1 ? 0 : m;
  }
}

static inline double rule_numel(const Tensor *t) { return t ? (double)ir_numel(t) : 0; }

#endif
