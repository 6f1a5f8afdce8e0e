/* memplan.h - a stage program's arena: every buffer's offset (memplan.c). */
#ifndef PIPECC_MEMPLAN_H
#define PIPECC_MEMPLAN_H
#include "stageprog.h"

/* Lays out a stage's arena for its ring sizes (the forward, gradient and, zb1 and zbv, late-value ring copies
 * of both layouts: schedule.h's RingSizes). */
void memplan(Plan *p, StageProg *sp, RingSizes r);
/* The same for a program that runs only its forwards or only its backwards (pipefb's ROLE_*).  Under zb1
 * and zbv a stage program takes the smaller of the late and hold layouts (sp->hold says which; the
 * lists must then follow: schedule_hold); a rank of chunks takes each chunk's (chold). */
void memplan_as(Plan *p, StageProg *sp, RingSizes r, int role);
/* memplan in the layout sp->hold already names (the memory plan's lists follow it: stash.c). */
void memplan_keep(Plan *p, StageProg *sp, RingSizes r);
/* A backward call that only adds into weight gradients (besides its own
 * scratch workspace): zb1 runs it in W, after the input-gradient calls. */
/* --replicas R (replica.c): floats of one replica's shard of sp's weight-gradient region as memplan lays it
 * out, a multiple of REPLICA_SHARD_ALIGN (the last shard shorter). */
int64_t replica_shard_floats(int R, const StageProg *sp);
#define REPLICA_SHARD_ALIGN 64
int call_is_weight(const StageProg *sp, const Call *k);
/* Whether buffer id holds a value crossing a cut (received or sent, or the loss's logits and their gradient),
 * as opposed to an activation kept for backward. */
int buf_at_cut(const StageProg *sp, int id);
#endif
