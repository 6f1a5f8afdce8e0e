/* par.c - the rank's own worker threads (par.h).
 *
 * One job at a time, posted by the thread that runs the stage's kernels: the
 * job's generation number goes up, the workers see it, each runs its part and
 * counts itself done, and the poster runs part 0 and waits for the count.
 * A worker waiting for the next job spins (kernels come back to back inside a
 * forward, and waking a sleeping thread costs more than most parts take) and
 * then sleeps on a futex, so that a rank waiting for a message, or done with
 * its step, leaves the core to the other ranks. */
#include "par.h"
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PR_PAR_MAX 256
/* Pauses a worker spins before it sleeps (a pause is 40-140 cycles: 2-10 ms).  Waking a sleeping
 * thread costs 20-40 us on this project's VM, more than most kernels' parts take, and the gaps between
 * a stage's parallel kernels (a GEMM, a message) are shorter than this: a worker that slept through
 * them made every kernel after a GEMM slower than on one thread. */
#define PR_PAR_SPIN 200000

int pr_par_nthreads = 1;
static int spin_limit = PR_PAR_SPIN; /* fewer CPUs than threads (pr_par_init): a waiting thread yields at once */
static pthread_t tids[PR_PAR_MAX];
static _Atomic uint32_t gen;     /* the job's number: a worker runs a job when it changes */
static _Atomic int pending;      /* workers yet to finish the current job */
static _Atomic int sleepers;     /* workers asleep on `gen` */
static _Atomic int stopping;
static uint32_t gen0;            /* gen when the workers started: their first job comes after it */
static _Thread_local int in_job; /* a part calling pr_par_for runs it serially */
static struct {
  PrRange fn;
  const void *arg;
  int64_t n, grain;
} job;

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static void futex_wake(_Atomic uint32_t *addr) { syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0); }

/* Part t of the job: a contiguous run of whole grains (the last part ends at n). */
static void run_part(int t) {
  int64_t units = (job.n + job.grain - 1) / job.grain;
  int64_t lo = units * t / pr_par_nthreads * job.grain, hi = units * (t + 1) / pr_par_nthreads * job.grain;
  if (hi > job.n) hi = job.n;
  if (lo < hi) job.fn(job.arg, lo, hi);
}

static void *worker(void *p) {
  int t = (int)(intptr_t)p;
  uint32_t seen = gen0, g;
  in_job = 1;
  for (;;) {
    int spins = 0;
    while ((g = atomic_load_explicit(&gen, memory_order_acquire)) == seen) {
      if (++spins < spin_limit) {
        relax();
        continue;
      }
      /* A post after this increment sees a sleeper and wakes it; one before it changed gen, which the
       * futex checks before it sleeps. */
      atomic_fetch_add(&sleepers, 1);
      futex_wait(&gen, seen);
      atomic_fetch_sub(&sleepers, 1);
      spins = 0;
    }
    seen = g;
    if (atomic_load(&stopping)) return NULL;
    run_part(t);
    atomic_fetch_sub_explicit(&pending, 1, memory_order_release);
  }
}

int pr_par_init(int threads, int cpus) {
  if (threads < 1 || threads > PR_PAR_MAX) {
    errno = EINVAL;
    return -1;
  }
  if (pr_par_nthreads > 1) return threads == pr_par_nthreads ? 0 : (errno = EBUSY, -1);
  gen0 = atomic_load(&gen);
  /* Spinning pays only while each thread has a CPU of its own; otherwise a waiting thread would hold
   * the CPU the thread it waits for needs. */
  spin_limit = cpus < threads ? 16 : PR_PAR_SPIN;
  for (int t = 1; t < threads; t++) {
    int rc = pthread_create(&tids[t], NULL, worker, (void *)(intptr_t)t);
    if (rc) {
      pr_par_nthreads = t;
      pr_par_stop();
      errno = rc;
      return -1;
    }
    pr_par_nthreads = t + 1;
  }
  return 0;
}

int pr_par_threads(void) { return pr_par_nthreads; }

void pr_par_for(int64_t n, int64_t grain, double work, PrRange fn, const void *arg) {
  if (grain < 1) grain = 1;
  if (pr_par_nthreads <= 1 || in_job || n <= grain || work < PR_PAR_MIN_WORK) {
    if (n > 0) fn(arg, 0, n);
    return;
  }
  job.fn = fn, job.arg = arg, job.n = n, job.grain = grain;
  atomic_store_explicit(&pending, pr_par_nthreads - 1, memory_order_relaxed);
  atomic_fetch_add(&gen, 1); /* publishes the job (sequentially consistent, as `sleepers` below) */
  if (atomic_load(&sleepers)) futex_wake(&gen);
  in_job = 1;
  run_part(0);
  in_job = 0;
  for (int spins = 0; atomic_load_explicit(&pending, memory_order_acquire); spins++)
    if (spins < spin_limit) relax();
    else sched_yield(); /* a worker that is not running yet (more threads than cores) gets the core */
}

void pr_par_stop(void) {
  if (pr_par_nthreads <= 1) return;
  atomic_store(&stopping, 1);
  atomic_fetch_add(&gen, 1);
  futex_wake(&gen);
  for (int t = 1; t < pr_par_nthreads; t++) pthread_join(tids[t], NULL);
  pr_par_nthreads = 1;
  atomic_store(&stopping, 0);
}
