/* planq.h - questions about a plan (planq.c): who reads a value, where it
 * travels, what a stage may hold.  Queries only: nothing here runs a pass. */
#ifndef PIPECC_PLANQ_H
#define PIPECC_PLANQ_H
#include "plan.h"

/* Whether compute nodes [a, e) read edge q's value (the loss counts on the last stage's range). */
int plan_reads_range(const Plan *p, int q, int a, int e);
/* Edge q's route through the ranks (rbegin/rend): its maker's rank (rank 0
 * for the loader's), then, with direct sends, each rank that reads it, else
 * every rank up to the last reader's.  Rank s's neighbours on it: the rank
 * it receives the value from and the rank it sends it on to (-1: none, or s
 * not on the route); gradients go the other way. */
void plan_route(const Plan *p, int q, int s, int *from, int *to);
/* Direct sends: each rank's sources and destinations (sc->src, dst), from the values' routes. */
void plan_route_peers(Plan *p, Schedule *sc);
/* Tied weights (a parameter several compute nodes read): the reading nodes'
 * positions k in compute order into ks (room for p->nreaders[t]); returns
 * how many.  *same_kind: two of them are the same op (two LayerNorms, two
 * Convs), the mark of an exporter that merged equal initializers. */
int plan_tie_readers(const Plan *p, int t, int *ks, int *same_kind);
/* Per tensor: whether its gradient is needed (a trained weight, or computed from one); cached. */
const char *plan_needs(Plan *p);
/* The compute resources the schedule's simulation shares among the ranks: the host's cores over the
 * threads of each rank (--threads), at least 1; 0 when each rank has its own (cluster figures). */
int plan_core_groups(const Plan *p);
/* Some rank has a memory limit (--mem-limit, or its mem in --devices). */
int plan_limited(const Plan *p);
/* Stage s's memory limit: the smaller of --mem-limit and its rank's mem in --devices; 0 = none. */
double plan_stage_limit(const Plan *p, int s);
/* What rank r's program may take: the stage's limit, or with --chunks V the whole limit its stages share. */
double plan_rank_limit(const Plan *p, int r);
/* Bytes the convolution library holds beside the arena for compute nodes [i, j) (0 under --conv gemm). */
double plan_lib_bytes(const Plan *p, int i, int j);
/* Stage s's arena (p->arena[s]) and its breakdown in p->part.cost[s], from its laid-out program. */
void plan_stage_memory(Plan *p, int s);
#endif
