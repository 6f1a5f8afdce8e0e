/* layout.h - pipecc --ranks P: the planner chooses the stages and replicas (layout.c). */
#ifndef PIPECC_LAYOUT_H
#define PIPECC_LAYOUT_H
#include "plan.h"

/* One layout the planner compared: S stages x R replicas under a schedule, as plan_candidate planned it. */
typedef struct LayoutCand {
  int stages, replicas;
  int zero;        /* planned with --zero 1: the user's, or the planner's where --zero 0 did not fit --mem-limit */
  SchedCand c;
} LayoutCand;

/* --ranks P: every S x R = P (each synchronous schedule under --schedule auto, else the one given) planned in
 * full by `plan` (driver.c's driver_candidate); o->nstages, o->replicas and o->schedule become the fastest predicted step that fits (within 0.5%: the
 * smallest busiest arena), o->layouts says what each predicted.  0, or 2 after the error line when none plans. */
int layout_choose(Options *o, void (*plan)(Options t, SchedCand *c));
#endif
