/* driver.h - the compiler's pipeline, one pass after another (driver.c). */
#ifndef PIPECC_DRIVER_H
#define PIPECC_DRIVER_H
#include "plan.h"

/* Compiles o->model as the options say: plans, lays out and writes DIR (or
 * prints the shapes), trying each convolution implementation the options
 * allow until a plan fits.  The exit status: 0, or 2 after the one error
 * line.  o->conv_impl and o->conv_fallback say what ran. */
int driver_run(Options *o);
/* Loads, infers, costs, partitions and schedules.  -1 with err_set on failure. */
int plan_build(Plan *p, const Options *o);
/* The same from a graph already in p->g (loaded from memory: the fuzzer), with p->opt set. */
int plan_from_graph(Plan *p);
/* Builds and lays out every stage's program and makes each stage's memory
 * in p->part.cost the arena's (the estimate is kept in mem_estimate).  -1
 * with err_set when a stage cannot be built; with --plan-only that is not an
 * error: the memory stays the estimate and p->mem_note says why. */
int plan_programs(Plan *p);
/* The step's predicted time and bubble under the spread of action times the
 * node costs measured (schedule_jitter; nothing without one).  After the
 * memory plan, which settles the lists.  0, or -1 with err_set. */
int plan_jitter(Plan *p);
void plan_free(Plan *p);
/* A candidate plan with t's flags and c->kind's schedule (c->chunks per rank), planned as compile() plans and
 * written nowhere: c's figures, or why it does not plan (--schedule auto, --ranks). */
void driver_candidate(Options t, SchedCand *c);
#endif
