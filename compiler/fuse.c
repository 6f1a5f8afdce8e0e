/* fuse.c - adjacent nodes made one call, where nothing else sees what passes between them.
 *
 * BatchNormalization then Relu (every torchvision ResNet block starts so): when the Relu is the
 * only reader of the normalization's output and that output is not a graph output, the pair becomes
 * one node, OP_BATCHNORM_RELU (ops/norm.c).  Its forward applies the Relu as it writes, and its
 * backward masks dy by the output as it reads it, so the activation between them is never written
 * or read again: one pass over it less each way (and one value less to hold).  The expressions and
 * their order are the separate kernels', so the bits are too (tests/test_parity_models.py compares a
 * fused plan with `--no-fuse`).  The Relu stays in the graph, folded and marked fused, so node
 * indices and names do not move; the pair keeps the normalization's name. */
#include <string.h>

#include "fuse.h"
#include "ops.h"

extern const OpDef OP_BATCHNORM_RELU;

static int graph_output(const Graph *g, int t) {
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == t) return 1;
  return 0;
}

/* The one live node after j that reads tensor t, or -1. */
static int only_reader(const Graph *g, int j, int t) {
  if (g->t[t].nuses != 1) return -1;
  for (int i = j + 1; i < g->nn; i++) {
    if (g->n[i].folded) continue;
    for (int q = 0; q < g->n[i].nin; q++)
      if (g->n[i].in[q] == t) return i;
  }
  return -1;
}

int fuse_graph(Graph *g) {
  int fused = 0;
  for (int j = 0; j < g->nn; j++) {
    Node *n = &g->n[j];
    if (n->folded || strcmp(n->def->name, "BatchNormalization") || n->nout < 1 || n->out[0] < 0) continue;
    int t = n->out[0], r = graph_output(g, t) ? -1 : only_reader(g, j, t);
    if (r < 0) continue;
    Node *relu = &g->n[r];
    if (strcmp(relu->def->name, "Relu") || relu->nin != 1 || relu->nout != 1 || relu->out[0] < 0) continue;
    int y = relu->out[0];
    n->out[0] = y, g->t[y].producer = j;
    g->t[t].producer = -1, g->t[t].nuses = 0; /* nothing makes or reads it now */
    n->def = &OP_BATCHNORM_RELU, n->op = OP_BATCHNORM_RELU.name;
    relu->folded = relu->fused = 1;
    fused++;
  }
  return fused;
}
