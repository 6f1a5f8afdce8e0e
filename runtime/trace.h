/* trace.h - a run's timeline: one span per executed action and per wait in
 * MPI, written by rank 0 as Chrome trace event JSON (chrome://tracing,
 * Perfetto, and the SVG tool read it). */
#ifndef PIPERUN_TRACE_H
#define PIPERUN_TRACE_H
#include <stddef.h>
#include <stdint.h>

#include "piperun.h"

/* The trace file's format (docs/timeline.md), written as "otherData": {"pipecc_trace_version": 2}.  2: each
 * span's args have its chunk and stage (pipecc --chunks).  1, before it: no version, no chunk or stage. */
#define PR_TRACE_VERSION 2

typedef struct PrEvent {
  double t0, t1;   /* seconds since the common start */
  int64_t step;
  int kind;        /* PR_*, or -1 for a wait */
  int mb, slot;
  double exposed;  /* a wait for a message: the part of it after its sender had sent it (exposed communication) */
  int chunk;       /* the rank's chunk the action runs (PrAction.chunk), a wait's the running action's;
                      -1: the whole rank's (UPDATE) */
} PrEvent;

typedef struct PrTrace {
  PrEvent *ev;     /* preallocated: nothing is allocated while training */
  int64_t n, cap, dropped;
  double start;    /* MPI_Wtime of the common start (after a barrier) */
  /* The action running (Run.cur), whose chunk a wait inside it has; and the rank's chunks, whose stages
   * the file names (Run.chunk: one of the rank's own stage without --chunks). */
  const PrAction *const *running;
  const PrChunk *chunks;
  int nchunks;
} PrTrace;

/* cap events; 0 = tracing off. */
void trace_init(PrTrace *t, int64_t cap);
/* The chunk an action's span has: its own; UPDATE updates every chunk's weights, the whole rank's. */
static inline int trace_chunk_of(const PrAction *a) { return !a ? 0 : a->kind == PR_UPDATE ? -1 : a->chunk; }
static inline void trace_push(PrTrace *t, int kind, int mb, int slot, int chunk, int64_t step, double t0, double t1) {
  if (!t->cap) return;
  if (t->n == t->cap) {
    t->dropped++;
    return;
  }
  t->ev[t->n++] = (PrEvent){t0 - t->start, t1 - t->start, step, kind, mb, slot, 0, chunk};
}
/* Action a's span, slot the ring copy it used. */
static inline void trace_action(PrTrace *t, const PrAction *a, int slot, int64_t step, double t0, double t1) {
  trace_push(t, a->kind, a->mb, slot, trace_chunk_of(a), step, t0, t1);
}
/* A span inside the running action (a wait: kind -1), of its chunk. */
static inline void trace_add(PrTrace *t, int kind, int mb, int slot, int64_t step, double t0, double t1) {
  trace_push(t, kind, mb, slot, trace_chunk_of(t->running ? *t->running : NULL), step, t0, t1);
}
/* The last event (a wait just added) had `exposed` seconds of exposed communication. */
static inline void trace_exposed(PrTrace *t, double exposed) {
  if (t->cap && t->n > 0 && t->ev[t->n - 1].kind == -1) t->ev[t->n - 1].exposed = exposed;
}
/* Collective: every rank's events go to rank 0, which writes path; 0, or -1 with msg (rank 0). */
int trace_write(PrTrace *t, const char *path, int rank, int nranks, char *msg, size_t msglen);
void trace_free(PrTrace *t);
#endif
