/* trace.h - a run's timeline: one span per executed action and per wait in
 * MPI, written by rank 0 as Chrome trace event JSON (chrome://tracing,
 * Perfetto, and the SVG tool read it). */
#ifndef PIPERUN_TRACE_H
#define PIPERUN_TRACE_H
#include <stddef.h>
#include <stdint.h>

typedef struct PrEvent {
  double t0, t1;   /* seconds since the common start */
  int64_t step;
  int kind;        /* PR_*, or -1 for a wait */
  int mb, slot;
  double exposed;  /* a wait for a message: the part of it after its sender had sent it (exposed communication) */
} PrEvent;

typedef struct PrTrace {
  PrEvent *ev;     /* preallocated: nothing is allocated while training */
  int64_t n, cap, dropped;
  double start;    /* MPI_Wtime of the common start (after a barrier) */
} PrTrace;

/* cap events; 0 = tracing off. */
void trace_init(PrTrace *t, int64_t cap);
static inline void trace_add(PrTrace *t, int kind, int mb, int slot, int64_t step, double t0, double t1) {
  if (!t->cap) return;
  if (t->n == t->cap) {
    t->dropped++;
    return;
  }
  t->ev[t->n++] = (PrEvent){t0 - t->start, t1 - t->start, step, kind, mb, slot, 0};
}
/* The last event (a wait just added) had `exposed` seconds of exposed communication. */
static inline void trace_exposed(PrTrace *t, double exposed) {
  if (t->cap && t->n > 0 && t->ev[t->n - 1].kind == -1) t->ev[t->n - 1].exposed = exposed;
}
/* Collective: every rank's events go to rank 0, which writes path; 0, or -1 with msg (rank 0). */
int trace_write(PrTrace *t, const char *path, int rank, int nranks, char *msg, size_t msglen);
void trace_free(PrTrace *t);
#endif
