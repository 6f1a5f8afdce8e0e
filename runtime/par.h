/* par.h - a rank's own threads (pipecc --threads T): the kernels' loops split over them.
 *
 * A kernel that splits its work hands pr_par_for a function over a range of
 * its items (elements, rows, planes).  With one thread, or too little work to
 * pay for waking the others, the function runs on the whole range in the
 * calling thread, as the kernel did before.  Otherwise the range is cut into
 * T contiguous parts, each a multiple of `grain` items (the last excepted),
 * and the T threads run one part each.
 *
 * Bits: a kernel splits only over items whose results are independent (an
 * output element, a row, a channel), never inside a sum, and elementwise
 * kernels use a grain that is a multiple of 64 elements, so that every
 * element falls in the same place of the vector loop as in the serial run.
 * Every result is then the same bits whatever T is.  The libraries' own
 * threads (OpenBLAS, oneDNN) keep that only for some shapes (docs/kernels.md,
 * "Threads"). */
#ifndef PIPERUN_PAR_H
#define PIPERUN_PAR_H
#include <stdint.h>

typedef void (*PrRange)(const void *arg, int64_t lo, int64_t hi);

/* Starts T-1 worker threads (T >= 1; once, before the first kernel).  0, or -1 with errno.  `cpus`: the
 * CPUs the threads can count on (their share of the host); with fewer than T (an mpirun binding, more
 * ranks than the host has cores for), a waiting thread yields at once instead of spinning. */
int pr_par_init(int threads, int cpus);
/* The threads kernels split over (1 before pr_par_init). */
int pr_par_threads(void);
extern int pr_par_nthreads; /* the same, read inline by the kernels (kernels.h, PR_PAR_RUN) */
/* fn(arg, lo, hi) over [0, n) in parts of `grain` items; `work` estimates the whole call's cost in
 * elements touched, below PR_PAR_MIN_WORK it runs on this thread alone.  Returns when every part is done. */
void pr_par_for(int64_t n, int64_t grain, double work, PrRange fn, const void *arg);
/* Stops the workers (at exit; kernels then run on one thread). */
void pr_par_stop(void);

/* Below this many elements touched a call runs serially: waking a sleeping worker costs a few
 * microseconds, about what 32K elements of a simple loop take on one core. */
#define PR_PAR_MIN_WORK 32768.0
/* The grain of elementwise kernels: a multiple of any vector loop's step (AVX-512 16 floats, unrolled 4x). */
#define PR_PAR_EW_GRAIN 256
#endif
