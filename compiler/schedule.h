/* schedule.h - the per-stage order of forward (F) and backward (B) actions
 * for one optimizer step, and its predicted timing. */
#ifndef PIPECC_SCHEDULE_H
#define PIPECC_SCHEDULE_H
#include "partition.h"

typedef struct Action {
  char kind;   /* 'F' or 'B' */
  int mb;      /* micro-batch */
  double start, end; /* predicted seconds from the step's start */
} Action;

typedef struct Schedule {
  int nstages, m, kind;
  Action **act;      /* act[s][k]: stage s's k-th action, 2m per stage */
  double step_time;  /* predicted makespan of one step */
  double bubble;     /* 1 - mean busy / makespan */
  double *busy;      /* per stage */
} Schedule;

/* Orders and times the actions given each stage's per-micro-batch forward,
 * backward and communication time. */
void schedule_build(Schedule *sc, int kind, int nstages, int m, const StageCost *cost, Pool *pool);
/* The analytic bubble of a balanced pipeline: (p - 1) / (m + p - 1). */
double schedule_ideal_bubble(int nstages, int m);
const char *schedule_name(int kind);
#endif
