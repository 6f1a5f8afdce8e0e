/* memplan.h - a stage program's arena: every buffer's offset (memplan.c). */
#ifndef PIPECC_MEMPLAN_H
#define PIPECC_MEMPLAN_H
#include "stageprog.h"

/* Lays out a stage's arena for its ring sizes (under zb1, first keeps what I
 * passes to W in rings). */
void memplan(Plan *p, StageProg *sp, int nslots, int ngslots);
/* The same for a program that runs only its forwards or only its backwards (pipefb's ROLE_*). */
void memplan_as(Plan *p, StageProg *sp, int nslots, int ngslots, int role);
/* A backward call that only adds into weight gradients (besides its own
 * scratch workspace): zb1 runs it in W, after the input-gradient calls. */
/* --replicas R (replica.c): floats of one replica's shard of sp's weight-gradient region as memplan lays it
 * out, a multiple of REPLICA_SHARD_ALIGN (the last shard shorter). */
int64_t replica_shard_floats(int R, const StageProg *sp);
#define REPLICA_SHARD_ALIGN 64
int call_is_weight(const StageProg *sp, const Call *k);
#endif
