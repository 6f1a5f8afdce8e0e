/* trace.c - gathering every rank's spans on rank 0 and writing them as one
 * Chrome trace event file: {"otherData": {"pipecc_trace_version": 2},
 * "traceEvents": [...], "displayTimeUnit": "ms"}, complete events ("ph": "X",
 * microseconds) on track tid = rank, each with its chunk and stage, named by
 * thread_name metadata events ("rank 0 (stages 0 and 3)" with chunks). */
#include "trace.h"

#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "piperun.h"

extern MPI_Comm g_pipe; /* replica.c: this replica's stages (MPI_COMM_WORLD with one replica) */

void trace_init(PrTrace *t, int64_t cap) {
  memset(t, 0, sizeof *t);
  if (cap <= 0) return;
  t->ev = malloc(sizeof(PrEvent) * (size_t)cap);
  if (t->ev) t->cap = cap;
}

void trace_free(PrTrace *t) { free(t->ev), memset(t, 0, sizeof *t); }

/* The track's name: "rank 2 (stage 2)", with chunks "rank 0 (stages 0 and 3)" (the listing's words). */
static void track_name(const PrTrace *t, int rank, char *buf, size_t len) {
  size_t k = (size_t)snprintf(buf, len, "rank %d (stage%s ", rank, t->nchunks > 1 ? "s" : "");
  for (int c = 0; c < t->nchunks && k < len; c++)
    k += (size_t)snprintf(buf + k, len - k, "%s%d", !c ? "" : c == t->nchunks - 1 ? " and " : ", ", t->chunks[c].stage);
  if (!t->nchunks && k < len) k += (size_t)snprintf(buf + k, len - k, "%d", rank);
  if (k < len) snprintf(buf + k, len - k, ")");
}

/* This rank's events as JSON objects, each followed by ",\n". */
static char *format_events(const PrTrace *t, int rank, long *len) {
  char track[1024];
  track_name(t, rank, track, sizeof track);
  size_t cap = 256 + sizeof track + (size_t)t->n * 320, n = 0;
  char *s = malloc(cap);
  if (!s) return *len = 0, NULL;
  n += (size_t)snprintf(s + n, cap - n, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, "
                                        "\"args\": {\"name\": \"%s\"}},\n", rank, track);
  for (int64_t i = 0; i < t->n && n + 300 < cap; i++) {
    const PrEvent *e = &t->ev[i];
    const char *kind = e->kind < 0 ? "wait" : pr_kind_name(e->kind);
    /* The stage the span ran: its chunk's (-1: the whole rank's, or a chunk the rank has not). */
    int stage = e->chunk >= 0 && e->chunk < t->nchunks ? t->chunks[e->chunk].stage : -1;
    char name[48];
    if (e->kind < 0 || e->mb < 0) snprintf(name, sizeof name, "%s", kind); /* UPDATE, the weights of pipefb */
    else if (e->chunk > 0) snprintf(name, sizeof name, "%s%d@%d", kind, e->mb, e->chunk); /* as the listing writes it */
    else snprintf(name, sizeof name, "%s%d", kind, e->mb);
    n += (size_t)snprintf(s + n, cap - n, "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": 0, "
                          "\"tid\": %d, \"args\": {\"step\": %lld, \"mb\": %d, \"kind\": \"%s\", \"slot\": %d, \"chunk\": %d, "
                          "\"stage\": %d", name, kind, e->t0 * 1e6, (e->t1 - e->t0) * 1e6, rank, (long long)e->step, e->mb, kind,
                          e->slot, e->chunk, stage);
    /* A wait for a message: how much of it came after the sender had sent it (exposed communication). */
    if (e->kind == -1) n += (size_t)snprintf(s + n, cap - n, ", \"exposed_us\": %.3f", e->exposed * 1e6);
    n += (size_t)snprintf(s + n, cap - n, "}},\n");
  }
  *len = (long)n;
  return s;
}

/* Rank 0: the file.  A new or regular path is written as PATH.tmp-PID
 * (O_EXCL: this process's own) and renamed over it once complete, so a full
 * disk leaves the old file or none, never JSON cut short; anything else
 * (/dev/stdout, a pipe) is written in place, and never renamed over.  0, or
 * -1 with msg (the temporary file removed). */
static int write_file(const char *path, const char *events, long n, char *msg, size_t len) {
  struct stat sb;
  char tmp[4200];
  int direct = lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode);
  snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
  int fd = direct ? open(path, O_WRONLY | O_TRUNC | O_CLOEXEC) : open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  int err = f ? 0 : errno ? errno : EIO;
  if (f) {
    errno = 0;
    if (fprintf(f, "{\"otherData\": {\"pipecc_trace_version\": %d},\n\"traceEvents\": [\n%.*s\n], \"displayTimeUnit\": \"ms\"}\n",
                PR_TRACE_VERSION, (int)n, events) < 0 || fflush(f))
      err = errno ? errno : EIO;
    if (!err && !direct && fsync(fileno(f))) err = errno;
    if (fclose(f) && !err) err = errno ? errno : EIO;
  } else if (fd >= 0) close(fd);
  if (!err && !direct && rename(tmp, path)) err = errno;
  if (!err) return 0;
  if (!direct && fd >= 0) unlink(tmp);
  return snprintf(msg, len, "cannot write --trace %s: %s", path, strerror(err)), -1;
}

int trace_write(PrTrace *t, const char *path, int rank, int nranks, char *msg, size_t msglen) {
  long len;
  char *mine = format_events(t, rank, &len);
  int ilen = len > 1 << 30 ? 1 << 30 : (int)len, *lens = NULL, *displs = NULL;
  char *all = NULL;
  if (rank == 0) lens = calloc((size_t)nranks, sizeof(int)), displs = calloc((size_t)nranks, sizeof(int));
  MPI_Gather(&ilen, 1, MPI_INT, lens, 1, MPI_INT, 0, g_pipe);
  long total = 0;
  if (rank == 0) {
    for (int r = 0; r < nranks; r++) displs[r] = (int)total, total += lens[r];
    all = malloc((size_t)total + 1);
  }
  MPI_Gatherv(mine, ilen, MPI_CHAR, all, lens, displs, MPI_CHAR, 0, g_pipe);
  int rc = 0;
  if (rank == 0) {
    /* Drop the last ",\n" so the array is valid JSON. */
    while (total > 0 && (all[total - 1] == '\n' || all[total - 1] == ',')) total--;
    rc = write_file(path, all, total, msg, msglen);
  }
  free(mine), free(all), free(lens), free(displs);
  return rc;
}
