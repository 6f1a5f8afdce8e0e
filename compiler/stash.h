/* stash.h - the memory plan (stash.c): keep, offload or recompute each
 * stashed activation so that every rank fits --mem-limit. */
#ifndef PIPECC_STASH_H
#define PIPECC_STASH_H
#include "stageprog.h"

/* After plan_programs: for each stage over its limit, chooses fates, adds
 * the OFFLOAD / PREFETCH / RECOMPUTE (and a peer's HOLD / RETURN) actions,
 * lays the arenas out again and re-times the schedule.  Nothing happens
 * when every stage fits.  -1 with err_set when a stage cannot fit. */
int stash_plan(Plan *p);
/* The smallest arena stage s can have holding [a, e) if every value that
 * may leave does (the partitioner's price once no plain plan fits); builds
 * the stage's program. */
/* stash_floor's stage described: what its least arena holds by region, and what would have to move to go lower
 * ("; with every move allowed it holds ...", for an error; "" when the stage does not build). */
const char *stash_floor_what(Plan *p, int s, int a, int e);
double stash_floor(Plan *p, int s, int a, int e);
/* Per stage, the ring slots and xslots of the leanest lists (for stash_floor). */
void stash_floor_slots(Plan *p);
const char *offload_name(int o);
/* OFFLOAD actions in stage s's list (0: its leaving values never leave: each micro-batch goes straight to its backward). */
int stash_offloads(const Plan *p, int s);
#endif
