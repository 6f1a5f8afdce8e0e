/* loss.h - the training loss as a call of the last stage's program (loss.c). */
#ifndef PIPECC_OPS_LOSS_H
#define PIPECC_OPS_LOSS_H
#include "stageprog.h"

/* Sets sp->loss, the call the last stage makes on each micro-batch's logits (nothing elsewhere):
 * softmax cross-entropy, or with --loss mse the mean squared error against one-hot labels, both
 * as means over the whole batch; the call returns this micro-batch's share as a double. */
void loss_call(const Plan *p, StageProg *sp, Pool *pool);

/* 0 when the graph's output pairs with the labels the data gives (one per image, or one per token position);
 * else -1 with err_set naming the output's shape and the labels'. */
int loss_check_output(const Plan *p);
#endif
