/* profile.h - where a step's time goes, node by node, for the cost model.
 *
 * A stage compiled with `pipecc --profile` marks the end of each node's
 * calls in its forward and backward (PR_PROF); the time since the previous
 * mark is that node's.  `run.sh --profile FILE` then writes, after the
 * warm-up steps, each node's seconds per micro-batch (forward, backward's
 * input-gradient part, its weight-gradient part), the loader's and the
 * loss's, and each stage's update, each the median over the measured steps
 * (one slow step, a page fault or a neighbour's burst, moves a mean but not
 * the median), for `pipecc --costs FILE` to plan with (docs/cost.md).  A stage built without --profile has no marks and
 * refuses the flag. */
#ifndef PIPERUN_PROFILE_H
#define PIPERUN_PROFILE_H
#include <stdint.h>
#include <time.h>

enum { PR_PROF_FWD = 0, PR_PROF_BWD_INPUT = 1, PR_PROF_BWD_WEIGHT = 2 };
/* A stage's convolutions: none, im2col + GEMM, or oneDNN's (where this runtime was built with it). */
enum { PR_CONV_NONE = 0, PR_CONV_IM2COL = 1, PR_CONV_ONEDNN = 2 };

/* The clock of the last mark, and seconds per node and direction: acc[3 * node + dir]. */
extern double pr_prof_t;
extern double *pr_prof_acc;

static inline double pr_prof_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define PR_PROF_START() (pr_prof_t = pr_prof_clock())
static inline void pr_prof_mark(int node, int dir) {
  double t = pr_prof_clock();
  pr_prof_acc[3 * node + dir] += t - pr_prof_t;
  pr_prof_t = t;
}
#define PR_PROF(node, dir) pr_prof_mark(node, dir)

/* What the runtime times besides the nodes, per stage. */
typedef struct PrProfExtra {
  double load, loss, update; /* seconds this step: the loader's inputs and labels, the loss, the optimizer */
} PrProfExtra;

/* Allocates the accumulators of nnodes nodes (0 if none: nothing is marked). */
void prof_init(int nnodes);
/* Ends a step: a measured one's node times and x's join the history (the
 * latest 256 steps), a warm-up one's are dropped; then both start again at 0. */
void prof_end_step(PrProfExtra *x, int measured);
/* How many steps were measured. */
int64_t prof_steps(void);
/* One F, B, I or W action's compute took `seconds` (kind PR_F..PR_W of
 * piperun.h, 0..3): the spread of these is the profile's `jitter`. */
void prof_action(int kind, double seconds);
/* Collective: every rank's figures go to rank 0, which writes path
 * atomically (a temporary beside it, then rename).  names[i]: node i's
 * "index op name" key; the medians over the measured steps, per
 * micro-batch.  0, or -1 on rank 0 with a message in msg. */
int prof_write(const char *path, const char *model, const char *const *names, int nnodes, int64_t params, int64_t warmup, int mb_size,
               int microbatches, double rate, int conv, int threads, int rank, int nranks, char *msg, int len);
#endif
