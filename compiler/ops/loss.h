/* loss.h - the training loss as a call of the last stage's program (loss.c). */
#ifndef PIPECC_OPS_LOSS_H
#define PIPECC_OPS_LOSS_H
#include "stageprog.h"

/* Sets sp->loss, the call the last stage makes on each micro-batch's logits (nothing elsewhere):
 * softmax cross-entropy, or with --loss mse the mean squared error against one-hot labels, both
 * as means over the whole batch; the call returns this micro-batch's share as a double. */
void loss_call(const Plan *p, StageProg *sp, Pool *pool);
#endif
