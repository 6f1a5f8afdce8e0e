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
  /* The whole batch: every replica's micro-batches (each replica's gradients are summed before the update). */
  int64_t rows = sp->loss_rows * p->opt.microbatches * (p->opt.replicas > 1 ? p->opt.replicas : 1), classes = sp->loss_classes;
  const char *what = p->opt.loss_mse
      ? pool_printf(pool, "Mean squared error against one-hot labels, mean over the %lld x %lld outputs of the whole batch\n"
                          " * (the runtime divides the returned sum by rows x classes).", (long long)rows, (long long)classes)
      : pool_printf(pool, "Softmax cross-entropy, mean over the %lld rows of the whole batch.", (long long)rows);
  /* MSE's mean is over every output: its gradient scale has the classes in it, and its sum is divided by them. */
  float scale = p->opt.loss_mse ? 1.0f / (float)(rows * classes) : 1.0f / (float)rows;
  Arg args[] = {A_BUF(sp->loss_buf), A_SYM("labels"), A_BUF(sp->dloss_buf), A_INT(sp->loss_rows), A_INT(classes), A_FLT(scale)};
  sp->loss = call_new(sp, pool, PH_FWD, p->opt.loss_mse ? K_MSE_LOSS : K_SOFTMAX_XENT, -1, what, args, 6);
}

/* The labels the data gives per micro-batch of mb: one per image (a model of float32 inputs), or the next token
 * at each position of the int64 input [mb, T].  The loss pairs row r of the output (every axis but the last,
 * flattened) with label r, so the output's rows must be the labels in their order: [mb, classes] for images,
 * [mb, T, vocab] or [mb * T, vocab] for tokens.  Another shape (a feature map [mb, 4, 26, 26], the input itself)
 * would train rows against other samples' labels, or against labels that are not there. */
int loss_check_output(const Plan *p) {
  const Graph *g = &p->g;
  const Tensor *L = NULL, *tok = NULL;
  for (int i = 0; i < g->noutputs; i++) {
    const Tensor *t = &g->t[g->outputs[i]];
    if (t->data) continue; /* a constant output: nothing the stages compute */
    if (L) return err_set("%s: the model has more than one output ('%s' %s and '%s' %s); the loss takes one (logits)", g->path,
                          L->name, shape_str(L), t->name, shape_str(t));
    L = t;
  }
  for (int i = 0; i < g->ninputs && !tok; i++)
    if (g->t[g->inputs[i]].dtype == DT_INT64) tok = &g->t[g->inputs[i]];
  if (!L) return 0; /* the stage build names what is missing */
  if (L->dtype != DT_FLOAT) return err_set("%s: graph output '%s' is %s; the loss needs float32 logits", g->path, L->name, dtype_name(L->dtype));
  if (tok && tok->rank != 2)
    return err_set("%s: token input '%s' %s must be [batch, positions]: the labels are the next token at each position", g->path,
                   tok->name, shape_str(tok));
  int64_t mb = p->mb_size, T = tok ? tok->dims[1] : 1, rows = 1, classes = L->rank >= 1 ? L->dims[L->rank - 1] : 1;
  for (int d = 0; d + 1 < L->rank; d++) rows *= L->dims[d];
  int first = L->rank >= 2 && (L->dims[0] == mb || (tok && L->rank == 2 && L->dims[0] == mb * T));
  if (first && rows == mb * T) return 0;
  const char *loss = p->opt.loss_mse ? "the mean squared error" : "softmax cross-entropy";
  if (tok)
    return err_set("%s: graph output '%s' %s cannot be paired with the labels [%lld,%lld] (the next token at each position of '%s' "
                   "%s, per micro-batch of %lld): %s reads its last axis as %lld classes and the rest as %lld rows; the output "
                   "must be [%lld,%lld,vocab] or [%lld,vocab]", g->path, L->name, shape_str(L), (long long)mb, (long long)T, tok->name,
                   shape_str(tok), (long long)mb, loss, (long long)classes, (long long)rows, (long long)mb, (long long)T,
                   (long long)(mb * T));
  return err_set("%s: graph output '%s' %s cannot be paired with the labels [%lld] (one per image, per micro-batch of %lld): %s "
                 "reads its last axis as %lld classes and the rest as %lld rows; the output must be [%lld,classes]", g->path, L->name,
                 shape_str(L), (long long)mb, (long long)mb, loss, (long long)classes, (long long)rows, (long long)mb);
}
