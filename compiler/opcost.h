/* opcost.h - node times from a per-op-family probe of this machine (docs/cost.md, "The op probe").
 *
 * bin/pipecc-opprobe (tools/probe_ops.c) times the runtime's own kernels on a grid of shapes:
 * convolutions by channels in and out, kernel size and output pixels, through oneDNN and through
 * im2col + GEMM; GEMMs by M, N and K; depthwise convolutions; memory-bound kernels (elementwise,
 * activations, softmax, LayerNorm, BatchNorm, pooling, copies) by elements; each forward and its
 * backward's input-gradient and weight-gradient parts; and the step's other work, the optimizer's update
 * (sgd, sgdm, adam) by weight and model size and the loss (xent) by logits and classes.  pipecc runs it once per machine, the first time
 * it plans without one, and keeps what it printed in the op cache:
 *
 *     pipecc-ops 2
 *     machine ID                   the machine probe's identity (cost.c, machine_identity)
 *     o FAMILY X1 X2 X3 X4 FWD BWD_INPUT BWD_WEIGHT
 *     probe SECONDS                how long the probe took
 *
 * ($PIPECC_OPS_CACHE, else ops.txt beside the machine cache; "off" disables it).  A node whose family it
 * measured is costed by interpolating the grid (log of seconds per FLOP or per element, multilinear in
 * the logs of the coordinates, held at the grid's edges); a profile (--costs) and the kernel cache
 * take precedence, and a node of no family keeps the FLOP model's time.  Under --conv auto each
 * convolution runs through the implementation the grid says is faster for its shape here. */
#ifndef PIPECC_OPCOST_H
#define PIPECC_OPCOST_H
#include "ir.h"

struct Plan;
typedef struct OpTable OpTable;

/* This machine's op table: loaded from the cache, or measured now (bin/pipecc-opprobe beside this pipecc)
 * and cached when the cache has no section for this machine.  NULL when disabled (PIPECC_OPS_CACHE=off),
 * with --devices (other machines), without a machine probe, or when the probe cannot run. */
const OpTable *opcost_table(const struct Plan *p);
/* The op cache's path (NULL when disabled), into buf. */
const char *opcost_path(char *buf, size_t len);
/* Seconds of graph node `node`'s forward, input-gradient and weight-gradient parts from t (need: which
 * tensors get a gradient), with its weights' far-memory cost in the share a stage's working set of ws
 * bytes lies past the caches; 0, or -1 for a node of no measured family. */
int opcost_node(const OpTable *t, const Graph *g, const char *need, int node, double ws, double out[3]);
/* The optimizer's seconds per trained float (sgd, sgdm or adam at each weight's size, averaged over the
 * plan's weights; at least the bytes it moves over the memory's rate at a stage's working set ws, where
 * the weights and gradients wait between their uses), with the zeroing of its gradient before the step's
 * first backward; and the loss's seconds per micro-batch (k_softmax_xent at the graph output's size); -1
 * when the table has no such family (an older cache) or the loss is MSE. */
double opcost_update(const OpTable *t, const struct Plan *p, double ws);
/* The memory's rate in bytes per second over a working set of ws bytes (the probe's `stream`); -1 when the
 * table has none. */
double opcost_stream_bw(const OpTable *t, double ws);
double opcost_loss(const OpTable *t, const struct Plan *p);
/* Seconds of family `fam` at coordinates x (part 0..2): the interpolation itself (tests). */
double opcost_at(const OpTable *t, const char *fam, const double x[4], int part);
/* Under --conv auto, marks each convolution (Node.conv_gemm) that the table says runs faster as im2col +
 * GEMM than through oneDNN, forward and both backward parts summed; its shape alone decides, so every
 * -n plans it alike.  Returns how many it marked. */
int opcost_choose_convs(struct Plan *p);
/* The table's file, and how long its probe took. */
const char *opcost_source(const OpTable *t, double *probe_s);
#endif
