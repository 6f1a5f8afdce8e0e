/* freeze.h - --frozen FILE (freeze.c): the first N parameterised layers' weights become constants. */
#ifndef PIPECC_FREEZE_H
#define PIPECC_FREEZE_H
#include "plan.h"

/* The layers, and with --frozen the first N frozen; -1 with err_set on a bad FILE. */
int freeze_apply(Plan *p);
/* The parameterised layers' positions into layers (room for N); their count. */
int freeze_layers(const Plan *p, int *layers);
/* The layer (from 0, in the loaded order, frozen ones counted) of weight tensor t: its first reader's; -1 if none. */
int freeze_layer_of(const Plan *p, int t);
/* The backward's costs as frozen weights leave them (bwdi / bwdw: measured seconds, or NULL). */
void freeze_costs(Plan *p, double *bwd_flops, double *bwdi, double *bwdw);
#endif
