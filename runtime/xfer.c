/* xfer.c - the I/O thread of the memory plan's file target.
 *
 * One thread per rank does every copy in the order it was queued, with
 * pwrite/pread on one file in fixed blocks (the plan gives each micro-batch
 * its own block: block mb at mb * XOUT bytes).  The main thread queues and
 * later waits per xslot; a failed copy is kept and reported by the main
 * thread, naming the file.  (liburing would also do; a thread measured
 * enough to hide the copies behind compute, and needs no extra package.) */
#include "xfer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct Job {
  int write, xslot;
  void *buf;
  int64_t bytes, off;
} Job;

struct PrXfer {
  int fd;
  char path[4096];
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t more, done;
  Job *q;
  int cap, head, n, stop;
  int *pending; /* per xslot */
  char err[512];
};

static int copy(PrXfer *x, const Job *j) {
  char *p = j->buf;
  int64_t left = j->bytes, off = j->off;
  while (left > 0) {
    ssize_t k = j->write ? pwrite(x->fd, p, (size_t)left, off) : pread(x->fd, p, (size_t)left, off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      snprintf(x->err, sizeof x->err, "%s %s: %s", j->write ? "writing" : "reading", x->path,
               k < 0 ? strerror(errno) : "the file ended early");
      return -1;
    }
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
    int bad = x->err[0] ? 0 : copy(x, &j);
    pthread_mutex_lock(&x->mu);
    (void)bad;
    x->head = (x->head + 1) % x->cap, x->n--;
    x->pending[j.xslot]--;
    pthread_cond_broadcast(&x->done);
  }
  pthread_mutex_unlock(&x->mu);
  return NULL;
}

PrXfer *xfer_open(const char *dir, int stage, int nxslots, char *msg, size_t len) {
  PrXfer *x = calloc(1, sizeof *x);
  if (!x) return snprintf(msg, len, "out of memory"), NULL;
  snprintf(x->path, sizeof x->path, "%s/pipecc-offload-%d-%ld.bin", dir, stage, (long)getpid());
  x->fd = open(x->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (x->fd < 0) {
    snprintf(msg, len, "cannot create the offload file %s: %s (run.sh --offload-dir DIR names another directory)", x->path, strerror(errno));
    free(x);
    return NULL;
  }
  unlink(x->path);
  x->cap = 4 * nxslots + 8;
  x->q = calloc((size_t)x->cap, sizeof(Job));
  x->pending = calloc((size_t)nxslots + 1, sizeof(int));
  if (!x->q || !x->pending) return snprintf(msg, len, "out of memory"), NULL;
  pthread_mutex_init(&x->mu, NULL);
  pthread_cond_init(&x->more, NULL);
  pthread_cond_init(&x->done, NULL);
  if (pthread_create(&x->th, NULL, run, x)) {
    snprintf(msg, len, "cannot start the offload I/O thread");
    close(x->fd);
    return NULL;
  }
  return x;
}

void xfer_submit(PrXfer *x, int write, int xslot, void *buf, int64_t bytes, int64_t off) {
  pthread_mutex_lock(&x->mu);
  while (x->n == x->cap) pthread_cond_wait(&x->done, &x->mu);
  x->q[(x->head + x->n) % x->cap] = (Job){write, xslot, buf, bytes, off};
  x->n++;
  x->pending[xslot]++;
  pthread_cond_signal(&x->more);
  pthread_mutex_unlock(&x->mu);
}

int xfer_pending(PrXfer *x, int xslot) {
  pthread_mutex_lock(&x->mu);
  int n = x->pending[xslot];
  pthread_mutex_unlock(&x->mu);
  return n;
}

void xfer_nap(PrXfer *x) {
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
  pthread_mutex_lock(&x->mu);
  x->stop = 1;
  pthread_cond_signal(&x->more);
  pthread_mutex_unlock(&x->mu);
  pthread_join(x->th, NULL);
  close(x->fd);
  free(x->q), free(x->pending), free(x);
}
