/* xfer.c - the file side of the memory plan: copies of offloaded activations to a file and back.
 *
 * Each rank has one file, written and read with a fixed block per micro-batch (block mb at
 * mb * XOUT bytes); the main thread queues a copy and later waits per xslot, and a failed copy is
 * kept and reported by the main thread, naming the file.  Two ways to run the copies, the same
 * bytes either way:
 *
 * - io_uring (Debian's liburing; built where its header is, used where the kernel lets a ring be
 *   made): each copy is one request marked IOSQE_ASYNC, so the kernel's own io-wq workers run it
 *   beside the rank instead of the rank's submitting call.  They are kernel threads: no user
 *   stack, no thread-local storage, so the rank's resident memory is its plain plan's.  This is
 *   why it is the default: a thread of ours costs 64-130 KiB of anonymous memory beside the
 *   arena (glibc zeroes every loaded library's thread-local block for it, and OpenBLAS's alone is
 *   60 KiB), which a tight --mem-limit cannot spare (docs/memory.md).
 * - one I/O thread with pwrite/pread, doing the copies in the order queued: where io_uring cannot
 *   be had (an older kernel, a container that forbids it), or with PIPERUN_XFER=thread.
 *
 * Order.  The thread runs the copies first in, first out; io_uring runs them in any order.  So
 * that both give the same bytes, a request waits, before it is submitted, for every copy in flight
 * that touches the same part of the file or the same memory (the runtime's own waits already keep
 * an xslot's memory from being reused early; this keeps a read of block mb behind its write). */
#include "xfer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef PR_URING
#include <liburing.h>
#endif

typedef struct Job {
  int write, xslot, busy;
  char *buf;
  int64_t bytes, off;
} Job;

struct PrXfer {
  int fd, uring;
  double timeout; /* seconds a copy may wait for room or for an earlier copy (the run's --timeout) */
  char path[4096];
  int *pending; /* per xslot: copies queued or running */
  char err[512];
  Job *q; /* the thread's queue (a ring of cap), or io_uring's requests in flight (user_data = index) */
  int cap, head, n, stop;
  /* the thread */
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t more, done;
#ifdef PR_URING
  struct io_uring ring;
#endif
};

static void fail(PrXfer *x, const Job *j, int errnum) {
  if (x->err[0]) return;
  snprintf(x->err, sizeof x->err, "%s %s: %s", j->write ? "writing" : "reading", x->path,
           errnum ? strerror(errnum) : "the file ended early");
}

static double mono(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Queuing waited past the run's timeout for the copies before it: the next wait stops the job. */
static void stuck(PrXfer *x, const Job *j) {
  if (!x->err[0])
    snprintf(x->err, sizeof x->err, "%s %s: the copies queued before it did not finish in %.1f s", j->write ? "writing" : "reading",
             x->path, x->timeout);
}

/* ---- the I/O thread ---- */

static int copy(PrXfer *x, const Job *j) {
  char *p = j->buf;
  int64_t left = j->bytes, off = j->off;
  while (left > 0) {
    ssize_t k = j->write ? pwrite(x->fd, p, (size_t)left, off) : pread(x->fd, p, (size_t)left, off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return fail(x, j, k < 0 ? errno : 0), -1;
    p += k, left -= k, off += k;
  }
  return 0;
}

static void *run(void *arg) {
  PrXfer *x = arg;
  pthread_mutex_lock(&x->mu);
  for (;;) {
    while (!x->n && !x->stop) pthread_cond_wait(&x->more, &x->mu);
    if (!x->n) break;
    Job j = x->q[x->head];
    pthread_mutex_unlock(&x->mu);
    if (!x->err[0]) copy(x, &j);
    pthread_mutex_lock(&x->mu);
    x->head = (x->head + 1) % x->cap, x->n--;
    x->pending[j.xslot]--;
    pthread_cond_broadcast(&x->done);
  }
  pthread_mutex_unlock(&x->mu);
  return NULL;
}

static int thread_start(PrXfer *x) {
  pthread_mutex_init(&x->mu, NULL);
  pthread_cond_init(&x->more, NULL);
  pthread_cond_init(&x->done, NULL);
  return pthread_create(&x->th, NULL, run, x) ? -1 : 0;
}

static void thread_submit(PrXfer *x, const Job *j) {
  pthread_mutex_lock(&x->mu);
  double t0 = mono();
  while (x->n == x->cap) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += 1000000;
    if (t.tv_nsec >= 1000000000) t.tv_sec++, t.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&x->done, &x->mu, &t);
    if (x->n == x->cap && mono() - t0 > x->timeout) {
      stuck(x, j);
      pthread_mutex_unlock(&x->mu);
      return;
    }
  }
  x->q[(x->head + x->n) % x->cap] = *j;
  x->n++;
  x->pending[j->xslot]++;
  pthread_cond_signal(&x->more);
  pthread_mutex_unlock(&x->mu);
}

/* ---- io_uring ---- */

#ifdef PR_URING
static void uring_send(PrXfer *x, int i) {
  Job *j = &x->q[i];
  struct io_uring_sqe *s = io_uring_get_sqe(&x->ring); /* never NULL: no more requests than entries */
  unsigned n = j->bytes > (1 << 30) ? 1u << 30 : (unsigned)j->bytes; /* a larger block goes in parts, as a short copy */
  if (j->write) io_uring_prep_write(s, x->fd, j->buf, n, (uint64_t)j->off);
  else io_uring_prep_read(s, x->fd, j->buf, n, (uint64_t)j->off);
  io_uring_sqe_set_flags(s, IOSQE_ASYNC);
  io_uring_sqe_set_data64(s, (uint64_t)i);
  int r;
  while ((r = io_uring_submit(&x->ring)) == -EINTR || r == -EAGAIN) nanosleep(&(struct timespec){0, 100000}, NULL);
  /* Failed: the run stops at its next wait (xfer_error); a completion the kernel may still send for
   * this request finds its slot free and is ignored. */
  if (r < 0) fail(x, j, -r), j->busy = 0, x->n--, x->pending[j->xslot]--;
}

/* One completion: done, failed, or short (the rest is sent again, as pwrite's loop would). */
static void uring_done(PrXfer *x, struct io_uring_cqe *c) {
  int i = (int)io_uring_cqe_get_data64(c), res = c->res;
  io_uring_cqe_seen(&x->ring, c);
  if (i < 0 || i >= x->cap || !x->q[i].busy) return; /* not ours (a request whose submission failed) */
  Job *j = &x->q[i];
  if ((res == -EINTR || res == -EAGAIN) && !x->err[0]) {
    uring_send(x, i);
    return;
  }
  if (res > 0 && res < j->bytes && !x->err[0]) {
    j->buf += res, j->bytes -= res, j->off += res;
    uring_send(x, i);
    return;
  }
  if (res <= 0) fail(x, j, res < 0 ? -res : 0);
  j->busy = 0, x->n--, x->pending[j->xslot]--;
}

/* Takes every completion there is; with wait, first waits for one (or timeout_ns, if > 0). */
static void uring_reap(PrXfer *x, int wait, long long timeout_ns) {
  struct io_uring_cqe *c;
  if (wait && x->n) {
    struct __kernel_timespec t = {timeout_ns / 1000000000, timeout_ns % 1000000000};
    int r = timeout_ns > 0 ? io_uring_wait_cqe_timeout(&x->ring, &c, &t) : io_uring_wait_cqe(&x->ring, &c);
    if (r == 0) uring_done(x, c);
  }
  while (x->n && io_uring_peek_cqe(&x->ring, &c) == 0) uring_done(x, c);
}

static int overlaps(int64_t a, int64_t an, int64_t b, int64_t bn) { return a < b + bn && b < a + an; }

/* A copy in flight that this one must follow: the same file bytes or the same memory. */
static int conflict(const PrXfer *x, const Job *j) {
  for (int i = 0; i < x->cap; i++) {
    const Job *o = &x->q[i];
    if (o->busy && (overlaps(o->off, o->bytes, j->off, j->bytes) ||
                    overlaps((int64_t)(uintptr_t)o->buf, o->bytes, (int64_t)(uintptr_t)j->buf, j->bytes)))
      return 1;
  }
  return 0;
}

static void uring_submit(PrXfer *x, const Job *j) {
  if (j->bytes <= 0) return; /* nothing to copy (the thread's loop does nothing either) */
  uring_reap(x, 0, 0);
  double t0 = mono();
  while (!x->err[0] && (x->n == x->cap || conflict(x, j))) {
    uring_reap(x, 1, 1000000);
    if (mono() - t0 > x->timeout) stuck(x, j);
  }
  if (x->err[0]) return;
  int i = 0;
  while (x->q[i].busy) i++;
  x->q[i] = *j;
  x->q[i].busy = 1, x->n++, x->pending[j->xslot]++;
  uring_send(x, i);
}

/* A ring of at least cap entries; the kernel's workers may run on every CPU the rank had when the
 * file was opened (its caller widens them: the copies fill whichever core idles). */
static int uring_start(PrXfer *x) {
  const char *force = getenv("PIPERUN_XFER");
  if (force && !strcmp(force, "thread")) return -1;
  unsigned entries = 1;
  while (entries < (unsigned)x->cap) entries *= 2;
  if (io_uring_queue_init(entries, &x->ring, 0) < 0) return -1;
  /* A sandbox may let a ring be made and still refuse its requests: one no-op must come back. */
  struct io_uring_sqe *s = io_uring_get_sqe(&x->ring);
  struct io_uring_cqe *c = NULL;
  io_uring_prep_nop(s);
  io_uring_sqe_set_data64(s, (uint64_t)-1);
  int ok = io_uring_submit(&x->ring) == 1 && io_uring_wait_cqe(&x->ring, &c) == 0 && c->res == 0;
  if (c) io_uring_cqe_seen(&x->ring, c);
  if (!ok) return io_uring_queue_exit(&x->ring), -1;
  cpu_set_t cpus;
  if (!sched_getaffinity(0, sizeof cpus, &cpus)) io_uring_register_iowq_aff(&x->ring, sizeof cpus, &cpus);
  return 0;
}
#endif

/* ---- the interface ---- */

PrXfer *xfer_open(const char *dir, const char *what, int stage, int nxslots, double timeout_s, char *msg, size_t len) {
  PrXfer *x = calloc(1, sizeof *x);
  if (!x) return snprintf(msg, len, "out of memory"), NULL;
  x->timeout = timeout_s;
  snprintf(x->path, sizeof x->path, "%s/pipecc-%s-%d-%ld.bin", dir, what, stage, (long)getpid());
  x->fd = open(x->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (x->fd < 0) {
    snprintf(msg, len, "cannot create the %s file %s: %s (run.sh --offload-dir DIR names another directory)",
             strcmp(what, "optstate") ? "offload" : "optimizer state's", x->path, strerror(errno));
    free(x);
    return NULL;
  }
  unlink(x->path);
  x->cap = 4 * nxslots + 8;
  x->q = calloc((size_t)x->cap, sizeof(Job));
  x->pending = calloc((size_t)nxslots + 1, sizeof(int));
  if (!x->q || !x->pending) {
    snprintf(msg, len, "out of memory");
    return close(x->fd), free(x->q), free(x->pending), free(x), NULL;
  }
#ifdef PR_URING
  x->uring = uring_start(x) == 0;
#endif
  if (!x->uring && thread_start(x)) {
    snprintf(msg, len, "cannot start the offload I/O thread");
    return close(x->fd), free(x->q), free(x->pending), free(x), NULL;
  }
  return x;
}

int xfer_size(PrXfer *x, int64_t bytes, char *msg, size_t len) {
  if (!ftruncate(x->fd, (off_t)bytes)) return 0;
  return snprintf(msg, len, "cannot size %s to %lld bytes: %s", x->path, (long long)bytes, strerror(errno)), -1;
}

const char *xfer_kind(const PrXfer *x) { return x->uring ? "io_uring" : "an I/O thread"; }

void xfer_submit(PrXfer *x, int write, int xslot, void *buf, int64_t bytes, int64_t off) {
  Job j = {write, xslot, 0, buf, bytes, off};
#ifdef PR_URING
  if (x->uring) {
    uring_submit(x, &j);
    return;
  }
#endif
  thread_submit(x, &j);
}

int xfer_pending(PrXfer *x, int xslot) {
#ifdef PR_URING
  if (x->uring) {
    uring_reap(x, 0, 0);
    return x->pending[xslot];
  }
#endif
  pthread_mutex_lock(&x->mu);
  int n = x->pending[xslot];
  pthread_mutex_unlock(&x->mu);
  return n;
}

void xfer_nap(PrXfer *x) {
#ifdef PR_URING
  if (x->uring) {
    uring_reap(x, 1, 1000000);
    return;
  }
#endif
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_nsec += 1000000;
  if (t.tv_nsec >= 1000000000) t.tv_sec++, t.tv_nsec -= 1000000000;
  pthread_mutex_lock(&x->mu);
  if (x->n) pthread_cond_timedwait(&x->done, &x->mu, &t);
  pthread_mutex_unlock(&x->mu);
}

const char *xfer_error(PrXfer *x) { return x->err[0] ? x->err : NULL; }

void xfer_close(PrXfer *x) {
  if (!x) return;
#ifdef PR_URING
  if (x->uring) {
    while (x->n) uring_reap(x, 1, 0);
    io_uring_queue_exit(&x->ring);
  }
#endif
  if (!x->uring) {
    pthread_mutex_lock(&x->mu);
    x->stop = 1;
    pthread_cond_signal(&x->more);
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->th, NULL);
  }
  close(x->fd);
  free(x->q), free(x->pending), free(x);
}
