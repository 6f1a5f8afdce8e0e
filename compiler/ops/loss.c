/* loss.c - the training loss, the one "op" no ONNX node names.
 *
 * The last stage's graph output is the logits; the loss pairs each row of
 * them with an integer label.  Its call writes the logits' gradient (the
 * backward's first) and returns the sum of this micro-batch's losses,
 * scaled so that the runtime's sum over micro-batches is the batch mean,
 * the reduction PyTorch's losses use by default. */
#include "ops/loss.h"

void loss_call(const Plan *p, StageProg *sp, Pool *pool) {
  if (sp->loss_buf < 0) return;
  int64_t rows = sp->loss_rows * p->opt.microbatches, classes = sp->loss_classes;
  const char *what = p->opt.loss_mse
      ? pool_printf(pool, "Mean squared error against one-hot labels, mean over the %lld x %lld outputs of the whole batch\n"
                          " * (the runtime divides the returned sum by rows x classes).", (long long)rows, (long long)classes)
      : pool_printf(pool, "Softmax cross-entropy, mean over the %lld rows of the whole batch.", (long long)rows);
  /* MSE's mean is over every output: its gradient scale has the classes in it, and its sum is divided by them. */
  float scale = p->opt.loss_mse ? 1.0f / (float)(rows * classes) : 1.0f / (float)rows;
  Arg args[] = {A_BUF(sp->loss_buf), A_SYM("labels"), A_BUF(sp->dloss_buf), A_INT(sp->loss_rows), A_INT(classes), A_FLT(scale)};
  sp->loss = call_new(sp, pool, PH_FWD, p->opt.loss_mse ? K_MSE_LOSS : K_SOFTMAX_XENT, -1, what, args, 6);
}
