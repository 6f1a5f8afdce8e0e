/* pipefb.h - PipeFB (pipefb.c): forwards and backwards on different ranks. */
#ifndef PIPECC_PIPEFB_H
#define PIPECC_PIPEFB_H
#include "stageprog.h"

/* Chooses the forward ranks (or takes --fb-split), cuts the forward and the
 * backward chains, and schedules them; 0 or -1 with err_set. */
int pipefb_plan(Plan *p);
/* The stash and weight messages between the programs of a pipefb plan. */
int pipefb_links(Plan *p, StageProg *progs, FbPlan *fb, Pool *pool);
/* The buffer of program sp that message m leaves from or arrives in
 * (a stashed value's ring, the logits' gradient, a weight), -1 if none. */
int pipefb_buf(const StageProg *sp, const FbMsg *m, int weight);
#endif
