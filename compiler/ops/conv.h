/* ops/conv.h - what the passes ask about convolutions (ops/conv.c): which
 * implementation runs one, what it holds beside the arena, how it is keyed
 * and noted, and which implementations a plan may try. */
#ifndef PIPECC_OPS_CONV_H
#define PIPECC_OPS_CONV_H
#include "ir.h"

/* A convolution: its time and the memory beside the arena depend on the implementation running it. */
int conv_node(const Node *n);
/* How g's convolutions run, as plan.json and profiles name it: "im2col" or "onednn". */
const char *conv_impl_name(const Graph *g);
/* How the convolutions among graph nodes node[0 .. n) run, as a profile records it (runtime/profile.h's
 * PR_CONV_*): 0 none among them, 1 im2col + GEMM, 2 oneDNN. */
int conv_profile_kind(const Graph *g, const int *node, int n);
/* A convolution of one point (input and output spatial sizes all 1): it runs as a GEMM over the one
 * kernel tap that lands on the point, whatever --conv says (runtime/kernels.h, k_conv_point). */
int conv_is_point(const Graph *g, const Node *n);
/* How node n runs, as its kernel-cache key names it after the op ("point", else conv_impl_name); NULL
 * for a node that is not a convolution (its key names no implementation). */
const char *conv_cache_key(const Graph *g, const Node *n);
/* A convolution whose implementation follows --conv (every one but those of one point): its time and
 * its memory beside the arena depend on which runs it. */
int conv_by_impl(const Graph *g, const Node *n);
/* Whether node n is a convolution run through oneDNN (and so holds memory beside the arena). */
int conv_uses_lib(const Graph *g, const Node *n);
/* Bytes node n's library holds beside the arena (0 for any node that is not such a convolution). */
double conv_beside_bytes(const Graph *g, const Node *n);
/* The listing's "convolution" line for compute nodes node[0 .. N) (NULL: none to state); fallback:
 * im2col + GEMM was chosen because no plan with oneDNN fit. */
const char *conv_note(const Graph *g, const int *node, int N, int fallback);
/* A profile whose convolutions ran as `profiled` (Costs.conv: 0 not said, 1 im2col, 2 oneDNN) timed
 * another implementation than g runs: its convolutions' times do not apply. */
int conv_costs_mismatch(int profiled, const Graph *g);
/* The implementations to plan with, in order (into out, room for 2; returns how many): --conv's own,
 * and after auto im2col + GEMM, which holds nothing beside the arena and may fit where oneDNN's
 * plan did not (the driver tries the next when a plan under a memory limit fails). */
int conv_impl_choices(int conv_impl, int *out);
#endif
