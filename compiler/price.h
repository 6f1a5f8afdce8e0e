/* price.h - the exact prices of candidate stages (price.c): a stage's arena
 * as its program would lay it out, memoised, plus what its convolutions'
 * library holds beside it.  The partitioner asks through price_stage. */
#ifndef PIPECC_PRICE_H
#define PIPECC_PRICE_H
#include "plan.h"

/* A new, empty memo of prices (p->memo); freed by price_memo_free. */
struct PriceMemo *price_memo_new(void);
void price_memo_free(struct PriceMemo *m);
/* The arena stage s would lay out if it held compute nodes [i, j) (PartProblem.stage_mem, ctx the
 * Plan): its program built and laid out exactly as the emitted one will be, or under floor pricing
 * the least it can hold (stash_floor).  A range that cannot be built never fits (INFINITY). */
double price_stage(void *ctx, int s, int i, int j);
/* PipeFB's price of a rank holding compute nodes [i, j) in role ROLE_FWD or ROLE_BWD: its arena (memoised). */
double plan_price_role(Plan *p, int role, int i, int j);
#endif
