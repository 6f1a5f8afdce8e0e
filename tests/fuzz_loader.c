/* fuzz_loader.c - libFuzzer target: the ONNX loader and every pass after it
 * (shape inference, constant folding, costs) on arbitrary bytes.  It must
 * reject what is wrong with a message and never crash, overrun or leak. */
#include <stddef.h>
#include <stdint.h>

#include "cost.h"
#include "onnx_load.h"
#include "ops.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Graph g;
  err_clear();
  if (onnx_load_buffer(data, size, "fuzz.onnx", NULL, &g)) return 0;
  /* Give symbolic or missing input dims a size so later passes run too. */
  for (int i = 0; i < g.ninputs; i++) {
    Tensor *t = &g.t[g.inputs[i]];
    if (t->declared_rank < 0 || t->declared_rank > MAX_RANK) continue;
    t->rank = t->declared_rank;
    for (int d = 0; d < t->rank; d++) t->dims[d] = t->declared_dims[d] > 0 && t->declared_dims[d] < 64 ? t->declared_dims[d] : 2;
    if (!dtype_size(t->dtype)) t->rank = -1;
  }
  if (!infer_and_fold(&g)) {
    NodeCost *c = pool_alloc(&g.pool, sizeof(NodeCost) * (size_t)(g.nn + 1));
    cost_nodes(&g, c);
  }
  err_clear();
  ir_free(&g);
  return 0;
}
