/* profile.c - the accumulators behind PR_PROF and the profile file (profile.h). */
#include "profile.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern MPI_Comm g_pipe; /* replica.c: this replica's stages (MPI_COMM_WORLD with one replica) */

double pr_prof_t;
double *pr_prof_acc;
static int prof_n;
/* The measured steps' figures, a row each: 3 per node, then the loader, the
 * loss and the update.  The latest PROF_KEEP steps are kept (a ring). */
enum { PROF_KEEP = 256 };
static double *hist;
static int64_t nhist;

/* The latest PROF_ACTS actions' compute times of each kind (F, B, I, W), this step's first. */
enum { PROF_ACTS = 4096, PROF_KINDS = 4 };
static double *acts[PROF_KINDS];
static int64_t nacts[PROF_KINDS], step_acts[PROF_KINDS];

static int row_len(void) { return 3 * prof_n + 3; }

static void *prof_calloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) {
    fprintf(stderr, "piperun: out of memory for the profile\n");
    exit(2);
  }
  return p;
}

void prof_init(int nnodes) {
  prof_n = nnodes;
  pr_prof_acc = prof_calloc((size_t)(3 * nnodes + 1), sizeof(double));
  hist = prof_calloc((size_t)PROF_KEEP * (size_t)row_len(), sizeof(double));
  for (int k = 0; k < PROF_KINDS; k++) acts[k] = prof_calloc(PROF_ACTS, sizeof(double));
}

void prof_action(int kind, double seconds) {
  if (kind < 0 || kind >= PROF_KINDS || !acts[kind]) return;
  acts[kind][nacts[kind]++ % PROF_ACTS] = seconds;
}

void prof_end_step(PrProfExtra *x, int measured) {
  for (int k = 0; k < PROF_KINDS; k++) {
    if (!measured) nacts[k] = step_acts[k]; /* a warm-up step's actions are forgotten */
    step_acts[k] = nacts[k];
  }
  if (measured) {
    double *row = hist + (size_t)(nhist % PROF_KEEP) * (size_t)row_len();
    memcpy(row, pr_prof_acc, sizeof(double) * (size_t)(3 * prof_n));
    row[3 * prof_n] = x->load, row[3 * prof_n + 1] = x->loss, row[3 * prof_n + 2] = x->update;
    nhist++;
  }
  memset(pr_prof_acc, 0, sizeof(double) * (size_t)(3 * prof_n + 1));
  x->load = x->loss = x->update = 0;
}

int64_t prof_steps(void) { return nhist; }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of v[0, n), sorting it (the mean of the middle two for an even count). */
static double median_of(double *v, int64_t n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The median over the kept steps of column c; tmp holds PROF_KEEP values. */
static double median(int c, double *tmp) {
  int64_t n = nhist < PROF_KEEP ? nhist : PROF_KEEP;
  if (n == 0) return 0;
  for (int64_t k = 0; k < n; k++) tmp[k] = hist[(size_t)k * (size_t)row_len() + (size_t)c];
  return median_of(tmp, n);
}

/* The actions' spread: each action's time relative to the median of its
 * kind, and 1.4826 x the median absolute deviation of those (a standard
 * deviation's robust estimate: one descheduled action does not move it).
 * -1 with fewer than 16 actions. */
static double action_jitter(void) {
  int64_t total = 0;
  for (int k = 0; k < PROF_KINDS; k++) total += nacts[k] < PROF_ACTS ? nacts[k] : PROF_ACTS;
  if (total < 16) return -1;
  double *rel = prof_calloc((size_t)total, sizeof(double)), *tmp = prof_calloc(PROF_ACTS, sizeof(double));
  int64_t at = 0;
  for (int k = 0; k < PROF_KINDS; k++) {
    int64_t n = nacts[k] < PROF_ACTS ? nacts[k] : PROF_ACTS;
    if (!n) continue;
    memcpy(tmp, acts[k], sizeof(double) * (size_t)n);
    double med = median_of(tmp, n);
    for (int64_t i = 0; i < n && med > 0; i++) rel[at++] = fabs(acts[k][i] / med - 1);
  }
  double j = at >= 16 ? 1.4826 * median_of(rel, at) : -1;
  free(rel), free(tmp);
  return j;
}

/* Appends printf output to a growing buffer. */
typedef struct Text {
  char *s;
  int len, cap;
} Text;

static void text_printf(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_printf(Text *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? (size_t)(t->cap - t->len) : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->s && t->len + n < t->cap) {
      t->len += n;
      return;
    }
    int cap = t->cap ? 2 * t->cap : 4096;
    while (cap <= t->len + n) cap *= 2;
    char *s = realloc(t->s, (size_t)cap);
    if (!s) {
      fprintf(stderr, "piperun: out of memory for the profile\n");
      exit(2);
    }
    t->s = s, t->cap = cap;
  }
}

int prof_write(const char *path, const char *model, const char *const *names, int nnodes, int64_t params, int64_t warmup, int mb_size,
               int microbatches, double rate, int conv, int threads, int rank, int nranks, char *msg, int len) {
  Text t = {0};
  double per = 1.0 / (double)(microbatches > 0 ? microbatches : 1), *tmp = prof_calloc(PROF_KEEP, sizeof(double));
  if (rank == 0) {
    text_printf(&t, "# pipecc profile of %s: seconds per micro-batch of %d, the median over %lld steps of %d micro-batches\n", model,
                mb_size, (long long)(nhist < PROF_KEEP ? nhist : PROF_KEEP), microbatches);
    text_printf(&t, "# after %lld warm-up step%s, on %d rank%s.  node K OP FORWARD BACKWARD_INPUT BACKWARD_WEIGHT NAME\n", (long long)warmup,
                warmup == 1 ? "" : "s", nranks, nranks == 1 ? "" : "s");
    text_printf(&t, "pipecc-profile 1\nmb %d\nrate %.6g\n", mb_size, rate);
    if (threads > 1) text_printf(&t, "threads %d\n", threads); /* pipecc --threads: the times are of that many */
  }
  for (int i = 0; i < nnodes; i++) {
    /* names[i] is "K OP NAME": the times go between the op and the name. */
    const char *sp1 = strchr(names[i], ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp2) continue;
    text_printf(&t, "node %.*s %.6e %.6e %.6e %s\n", (int)(sp2 - names[i]), names[i], median(3 * i, tmp) * per,
                median(3 * i + 1, tmp) * per, median(3 * i + 2, tmp) * per, sp2 + 1);
  }
  double load = median(3 * prof_n, tmp), loss = median(3 * prof_n + 1, tmp);
  if (load > 0) text_printf(&t, "load %.6e\n", load * per);
  if (loss > 0) text_printf(&t, "loss %.6e\n", loss * per);
  text_printf(&t, "update %lld %.6e\n", (long long)params, median(3 * prof_n + 2, tmp));
#ifndef PR_DNNL
  if (conv == PR_CONV_ONEDNN) conv = PR_CONV_IM2COL; /* built without oneDNN: conv_dnnl.c runs them as im2col + GEMM */
#endif
  if (conv != PR_CONV_NONE) text_printf(&t, "conv %s\n", conv == PR_CONV_ONEDNN ? "onednn" : "im2col");
  double jitter = action_jitter();
  if (jitter >= 0) text_printf(&t, "jitter %.4f\n", jitter);
  free(tmp);
  int mine = t.len, *lens = NULL, *offs = NULL;
  char *all = NULL;
  if (rank == 0) {
    lens = calloc((size_t)nranks, sizeof(int)), offs = calloc((size_t)nranks, sizeof(int));
    if (!lens || !offs) exit(2);
  }
  MPI_Gather(&mine, 1, MPI_INT, lens, 1, MPI_INT, 0, g_pipe);
  int total = 0;
  if (rank == 0) {
    for (int r = 0; r < nranks; r++) offs[r] = total, total += lens[r];
    all = malloc((size_t)total + 1);
    if (!all) exit(2);
  }
  MPI_Gatherv(t.s ? t.s : "", mine, MPI_CHAR, all, lens, offs, MPI_CHAR, 0, g_pipe);
  free(t.s);
  int rc = 0;
  if (rank == 0) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    int ok = f && fwrite(all, 1, (size_t)total, f) == (size_t)total;
    if (f && fclose(f)) ok = 0;
    if (!ok || rename(tmp, path)) {
      snprintf(msg, (size_t)len, "cannot write --profile %s: %s", path, strerror(errno));
      unlink(tmp);
      rc = -1;
    }
  }
  free(all), free(lens), free(offs);
  return rc;
}
