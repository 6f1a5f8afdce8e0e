/* update.c - the optimizer step as calls of the stage program.
 *
 * What a step does to the weights besides forward and backward is written
 * out like the rest of the program, so that every device runs it where the
 * weights live: the gradients are zeroed before the step's first backward,
 * a tied weight's gradient is the sum of its readers' parts in graph order
 * (the runtime moves the parts computed on other stages here first), and
 * each weight gets one update with PyTorch's rule (SGD with momentum and
 * weight decay, Adam, AdamW).  The hyper-parameters and the step count are
 * the run's (run.sh can change the learning rate and its schedule), so the
 * update kernels read them from the runtime's `pr_opt`. */
#include <string.h>

#include "update.h"

static void step_call(StageProg *sp, Pool *pool, int phase, int kernel, const char *what, const char *name, const Arg *args, int nargs) {
  call_add(sp, pool, phase, kernel, -1, pool_printf(pool, "%s '%s'", what, name), args, nargs);
}

void update_calls(const Plan *p, StageProg *sp, Pool *pool) {
  const char *opt = p->opt.optimizer ? p->opt.optimizer : "sgd";
  int sgd = !strcmp(opt, "sgd"), adamw = !strcmp(opt, "adamw");
  if (p->opt.forward_only) return;
  for (int i = 0; i < sp->nparams; i++) {
    const Buffer *w = &sp->bufs[sp->params[i]];
    const char *name = p->g.t[w->tensor].name;
    int64_t n = w->bytes / 4;
    if (sp->pgrad[i] >= 0) step_call(sp, pool, PH_ZERO, K_ZERO, "zero the gradient of", name, (Arg[]){A_BUF(sp->pgrad[i]), A_INT(n)}, 2);
    for (int j = 0; sp->nparts && j < sp->nparts[i]; j++)
      if (sp->parts[i][j].stage == sp->stage)
        step_call(sp, pool, PH_ZERO, K_ZERO, "zero this stage's part of", name, (Arg[]){A_BUF(sp->parts[i][j].buf), A_INT(n)}, 2);
  }
  for (int i = 0; sp->nparts && i < sp->nparams; i++) {
    const char *name = p->g.t[sp->bufs[sp->params[i]].tensor].name;
    int64_t n = sp->bufs[sp->params[i]].bytes / 4;
    for (int j = 0; j < sp->nparts[i]; j++)
      step_call(sp, pool, PH_TIES, K_COPY_GRAD, j ? "add the next part of" : "the first part of", name,
                (Arg[]){A_BUF(sp->parts[i][j].buf), A_BUF(sp->pgrad[i]), A_INT(n), A_INT(j > 0)}, 4);
  }
  for (int i = 0; i < sp->nparams; i++) {
    const Buffer *w = &sp->bufs[sp->params[i]];
    const char *name = p->g.t[w->tensor].name;
    int64_t n = w->bytes / 4;
    if (sp->pgrad[i] < 0) continue;
    if (sp->zero) { /* --zero 1: this replica's shard of it (replica.c) */
      if (sgd)
        step_call(sp, pool, PH_UPDATE, K_SGD_SHARD, "SGD on this replica's shard of", name,
                  (Arg[]){A_BUF(sp->params[i]), A_BUF(sp->pgrad[i]), A_BUF(sp->zero_state[0]), A_INT(n), A_SYM("&pr_opt")}, 5);
      else
        step_call(sp, pool, PH_UPDATE, K_ADAM_SHARD, adamw ? "AdamW on this replica's shard of" : "Adam on this replica's shard of", name,
                  (Arg[]){A_BUF(sp->params[i]), A_BUF(sp->pgrad[i]), A_BUF(sp->zero_state[0]), A_BUF(sp->zero_state[1]), A_INT(n),
                          A_INT(adamw), A_SYM("&pr_opt")}, 7);
      continue;
    }
    if (sgd)
      step_call(sp, pool, PH_UPDATE, K_SGD_STEP, "SGD on", name,
                (Arg[]){A_BUF(sp->params[i]), A_BUF(sp->pgrad[i]), A_BUF(sp->opt1[i]), A_INT(n), A_SYM("&pr_opt")}, 5);
    else
      step_call(sp, pool, PH_UPDATE, K_ADAM_STEP, adamw ? "AdamW on" : "Adam on", name,
                (Arg[]){A_BUF(sp->params[i]), A_BUF(sp->pgrad[i]), A_BUF(sp->opt1[i]), A_BUF(sp->opt2[i]), A_INT(n), A_INT(adamw),
                        A_SYM("&pr_opt")}, 7);
  }
}
