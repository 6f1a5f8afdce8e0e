/* freeze.c - freezing layers (FreezePipe): the freeze checkpoint a freeze
 * event writes, the re-planned run resuming from it, and --freeze auto's
 * decision from the layers' gradient norms. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "run.h"

/* ---- freezing (FreezePipe) ----
 * A freeze event after step S writes FREEZE_DIR/freeze-S/: the model with its
 * weights and BatchNorm statistics now (model.onnx, by pr_save_onnx), each
 * rank's optimizer state by weight name (opt_<stage>.bin), and frozen.txt for
 * pipecc --frozen; then FREEZE_DIR/FREEZE (step, layers, directory), written
 * last and renamed into place: the checkpoint is complete once it exists.
 * The ranks then end normally and run.sh, finding FREEZE, re-plans (a FREEZE
 * left by an earlier run is set aside when a run starts).  The data order
 * and the random numbers depend only on the step, so the re-planned run
 * continues exactly. */

/* Writes len bytes to fd, every one, or returns -1. */
static int write_all(int fd, const void *p, size_t len) {
  const char *c = p;
  while (len) {
    ssize_t w = write(fd, c, len);
    if (w <= 0) return -1;
    c += w, len -= (size_t)w;
  }
  return 0;
}

/* Writes bytes of device memory to fd through a host view. */
static int write_dev(int fd, unsigned char *dev, int64_t bytes) {
  void *v = pr_dev_view(dev, bytes, PR_VIEW_READ);
  int rc = write_all(fd, v, (size_t)bytes);
  pr_dev_release(v, dev, bytes, PR_VIEW_READ);
  return rc;
}

/* Writes an optimizer state's bytes to fd: from the arena, or from its file (--offload-optimizer). */
static int write_state(const Run *r, int fd, int64_t off, int64_t bytes) {
  if (!r->st->opt_store_bytes) return write_dev(fd, dev_at(r, off), bytes);
  void *h = malloc((size_t)bytes + 1);
  if (!h) return -1;
  optstore_io((Run *)r, 0, h, bytes, off);
  int rc = write_all(fd, h, (size_t)bytes);
  free(h);
  return rc;
}

/* An optimizer state's bytes from the host: into the arena, or into its file. */
static void state_from_host(Run *r, int64_t off, const void *src, int64_t bytes) {
  if (r->st->opt_store_bytes) optstore_io(r, 1, (void *)src, bytes, off);
  else pr_dev_from_host(dev_at(r, off), src, bytes);
}

/* This rank's optimizer state: "PIPEOPT1 <n>\n", then per weight "<name length> <count> <m1> <m2>\n<name>" and its slots. */
static int write_opt_file(const Run *r, const char *sub, char *msg, size_t len) {
  const PrStage *st = r->st;
  char path[4400], tmp[4500], head[64];
  snprintf(path, sizeof path, "%s/opt_%d.bin", sub, st->stage);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644), ok = fd >= 0;
  snprintf(head, sizeof head, "PIPEOPT1 %d\n", st->nparams);
  ok = ok && !write_all(fd, head, strlen(head));
  for (int i = 0; ok && i < st->nparams; i++) {
    const PrParam *p = &st->params[i];
    snprintf(head, sizeof head, "%zu %lld %d %d\n", strlen(p->name), (long long)p->count, p->m1offset >= 0, p->m2offset >= 0);
    ok = !write_all(fd, head, strlen(head)) && !write_all(fd, p->name, strlen(p->name));
    if (ok && p->m1offset >= 0) ok = !write_state(r, fd, p->m1offset, p->count * 4);
    if (ok && p->m2offset >= 0) ok = !write_state(r, fd, p->m2offset, p->count * 4);
  }
  ok = ok && fsync(fd) == 0;
  if (fd >= 0) close(fd);
  if (!ok || rename(tmp, path)) return snprintf(msg, len, "cannot write the freeze checkpoint's %s: %s", path, strerror(errno)), -1;
  return 0;
}

static int write_text(const char *path, const char *text) {
  char tmp[4500];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644), ok = fd >= 0 && !write_all(fd, text, strlen(text)) && fsync(fd) == 0;
  if (fd >= 0) close(fd);
  return ok && !rename(tmp, path) ? 0 : -1;
}

void freeze_write(Run *r) {
  const PrStage *st = r->st;
  char sub[4200], path[4400], msg[4600] = "", text[256];
  snprintf(sub, sizeof sub, "%s/freeze-%lld", r->a.freeze_dir, (long long)r->step);
  int ok = 1;
  if (r->rank == 0 && ((mkdir(r->a.freeze_dir, 0755) && errno != EEXIST) || (mkdir(sub, 0755) && errno != EEXIST)))
    ok = 0, snprintf(msg, sizeof msg, "cannot create the freeze checkpoint %s: %s", sub, strerror(errno));
  agree(ok, msg);
  agree(weights_finite(r, "a freeze checkpoint", msg, sizeof msg) == 0, msg);
  snprintf(path, sizeof path, "%s/model.onnx", sub);
  weights_to_host(r);
  pr_save_onnx(st, path, pr_stage_dir());
  agree(write_opt_file(r, sub, msg, sizeof msg) == 0, msg);
  if (r->rank == 0) {
    snprintf(path, sizeof path, "%s/frozen.txt", sub);
    snprintf(text, sizeof text, "pipecc-frozen 1\nlayers %d\n", r->freeze_to);
    ok = write_text(path, text) == 0;
    snprintf(path, sizeof path, "%s/FREEZE", r->a.freeze_dir);
    snprintf(text, sizeof text, "pipecc-freeze 1\nstep %lld\nlayers %d\ndir freeze-%lld\nelapsed %.6f\n", (long long)r->step,
             r->freeze_to, (long long)r->step, r->elapsed0 + r->t_total);
    ok = ok && write_text(path, text) == 0;
    if (!ok) snprintf(msg, sizeof msg, "cannot write the freeze checkpoint in %s: %s", r->a.freeze_dir, strerror(errno));
    else if (!r->a.quiet) progress_clear(), printf("freeze after step %lld: the first %d parameterised layers; checkpoint %s\n", (long long)r->step, r->freeze_to, sub);
    fflush(stdout);
  }
  agree(ok, msg);
}

/* Reads a whole file; NULL if it cannot. */
static unsigned char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *b = NULL;
  size_t cap = 0, n = 0, got;
  do {
    if (n == cap && !(b = realloc(b, cap = cap ? 2 * cap : 1 << 16))) break;
    got = fread(b + n, 1, cap - n, f), n += got;
  } while (got);
  fclose(f);
  *len = n;
  return b;
}

/* Each of this rank's weights' optimizer state from whichever opt_<k>.bin holds it (by name). */
static int read_opt_state(const Run *r, const char *sub, char *msg, size_t len) {
  const PrStage *st = r->st;
  int *found = calloc((size_t)st->nparams + 1, sizeof(int));
  for (int k = 0; k < 4096; k++) {
    char path[4400];
    snprintf(path, sizeof path, "%s/opt_%d.bin", sub, k);
    size_t n;
    unsigned char *b = slurp(path, &n);
    if (!b) break;
    size_t pos = 0;
    int recs, used;
    if (sscanf((char *)b, "PIPEOPT1 %d\n%n", &recs, &used) != 1 || recs < 0) {
      free(b), free(found);
      return snprintf(msg, len, "--resume-freeze %s: %s is not an optimizer-state file", sub, path), -1;
    }
    pos = (size_t)used;
    for (int q = 0; q < recs; q++) {
      unsigned long nl;
      long long count;
      int h1, h2;
      if (pos >= n || sscanf((char *)b + pos, "%lu %lld %d %d\n%n", &nl, &count, &h1, &h2, &used) != 4 || count < 0 ||
          pos + (size_t)used + nl + (size_t)(h1 + h2) * (size_t)count * 4 > n) {
        free(b), free(found);
        return snprintf(msg, len, "--resume-freeze %s: %s is truncated or corrupt (record %d)", sub, path, q), -1;
      }
      pos += (size_t)used;
      const char *name = (char *)b + pos;
      pos += nl;
      for (int i = 0; i < st->nparams; i++) {
        const PrParam *p = &st->params[i];
        if (strlen(p->name) != nl || memcmp(p->name, name, nl)) continue;
        if (count != p->count || h1 != (p->m1offset >= 0) || h2 != (p->m2offset >= 0)) {
          free(b), free(found);
          return snprintf(msg, len, "--resume-freeze %s: weight '%s' has %lld elements and %d optimizer slots there, this plan "
                                    "%lld and %d", sub, p->name, count, h1 + h2, (long long)p->count, (p->m1offset >= 0) + (p->m2offset >= 0)), -1;
        }
        if (h1) state_from_host((Run *)r, p->m1offset, b + pos, count * 4);
        if (h2) state_from_host((Run *)r, p->m2offset, b + pos + (size_t)h1 * (size_t)count * 4, count * 4);
        found[i] = 1;
      }
      pos += (size_t)(h1 + h2) * (size_t)count * 4;
    }
    free(b);
  }
  for (int i = 0; i < st->nparams; i++)
    if (!found[i]) {
      free(found);
      return snprintf(msg, len, "--resume-freeze %s: no optimizer state for weight '%s' (a checkpoint of another model?)", sub,
                      st->params[i].name), -1;
    }
  free(found);
  return 0;
}

/* run.sh's re-planned run: the step and optimizer state of the freeze checkpoint SUB (its weights are this plan's own). */
static void load_freeze(Run *r, const char *sub) {
  char msg[4600] = "", path[4400], parent[4200];
  snprintf(parent, sizeof parent, "%s", sub);
  char *slash = strrchr(parent, '/');
  if (slash) *slash = 0;
  else snprintf(parent, sizeof parent, ".");
  snprintf(path, sizeof path, "%s/FREEZE", parent);
  size_t n;
  unsigned char *b = slurp(path, &n);
  long long step = -1;
  int layers = -1, ok = b != NULL;
  if (ok) {
    b = realloc(b, n + 1), b[n] = 0;
    double el = 0;
    ok = sscanf((char *)b, "pipecc-freeze 1\nstep %lld\nlayers %d\ndir %*s\nelapsed %lf", &step, &layers, &el) >= 2 && step >= 1;
    r->elapsed0 = el >= 0 && el < 1e9 ? el : 0;
  }
  free(b);
  if (!ok) snprintf(msg, sizeof msg, "--resume-freeze %s: %s is missing or not a freeze record", sub, path);
  else if (layers != r->st->nfrozen)
    ok = 0, snprintf(msg, sizeof msg, "--resume-freeze %s: it froze %d layers, this plan %d (re-plan with its frozen.txt)", sub, layers,
                     r->st->nfrozen);
  else ok = read_opt_state(r, sub, msg, sizeof msg) == 0;
  agree(ok, msg);
  r->step = step;
  /* Begun: a later --resume of that directory is of this plan's checkpoints, not a re-plan. */
  MPI_Barrier(g_pipe);
  if (r->rank == 0) {
    char done[4500];
    snprintf(done, sizeof done, "%s.done", path);
    rename(path, done);
  }
}

/* --freeze auto: after each step, each layer's gradient norm (its weights' gradients on whichever
 * rank holds them) is added to this interval's sum; at the interval's end every rank learns every
 * layer's sum (one all-reduce), compares it with the previous interval's and freezes the longest
 * prefix, past the layers already frozen, whose relative change is below the threshold (never the
 * last layer).  Every rank reaches the same decision from the same numbers. */
void auto_freeze(Run *r) {
  const PrStage *st = r->st;
  int L = st->nlayers;
  if (L <= 0) return;
  if (!r->gnorm) {
    r->gnorm = calloc((size_t)(3 * L), sizeof(double)), r->gprev = r->gnorm + L;
    if (!r->gnorm) die(2, "out of memory for --freeze auto%s", "");
  }
  double *sq = r->gnorm + 2 * L;
  memset(sq, 0, sizeof(double) * (size_t)L);
  for (int i = 0; i < st->nparams; i++) {
    const PrParam *p = &st->params[i];
    if (p->goffset < 0 || p->layer < 0 || p->layer >= L) continue;
    if (p->grad_in_file)
      die(2, "run.sh --freeze auto measures the gradients, and this stage keeps '%s''s in a file (pipecc --offload-optimizer); "
             "freeze at given steps (--freeze-at), or compile with the gradients in the arena", p->name);
    sq[p->layer] += pr_dev_kernels.sumsq((const float *)dev_at(r, p->goffset), p->count);
  }
  for (int l = 0; l < L; l++) r->gnorm[l] += sqrt(sq[l]);
  if ((r->step + 1) % r->a.freeze_every) return;
  MPI_Allreduce(MPI_IN_PLACE, r->gnorm, L, MPI_DOUBLE, MPI_SUM, g_pipe);
  int k = st->nfrozen;
  if (r->have_prev)
    while (k < L - 1 && r->gprev[k] > 0 && fabs(r->gnorm[k] - r->gprev[k]) / r->gprev[k] < r->a.freeze_threshold) k++;
  if (r->rank == 0 && !r->a.quiet && r->have_prev) {
    progress_clear();
    printf("freeze auto after step %lld: relative change of each layer's gradient norm:", (long long)r->step + 1);
    for (int l = st->nfrozen; l < L && l < st->nfrozen + 12; l++)
      printf(" %.3g", r->gprev[l] > 0 ? fabs(r->gnorm[l] - r->gprev[l]) / r->gprev[l] : 0);
    printf("%s -> %d layers frozen\n", L > st->nfrozen + 12 ? " ..." : "", k);
    fflush(stdout);
  }
  memcpy(r->gprev, r->gnorm, sizeof(double) * (size_t)L);
  memset(r->gnorm, 0, sizeof(double) * (size_t)L);
  r->have_prev = 1;
  if (k > st->nfrozen && r->step + 1 < r->a.steps) r->freeze_to = k, r->a.steps = r->step + 1;
}


/* Before step 1: the re-planned run resumes its freeze checkpoint; any other run sets aside a FREEZE
 * it did not write (it must not re-plan this one).  Its freeze flags were checked with the others
 * (prmain.c, check_flags). */
void freeze_start(Run *r) {
  if (r->a.resume_freeze) load_freeze(r, r->a.resume_freeze);
  else if (r->rank == 0 && r->a.freeze_dir) {
    char stale[4200], aside[4300];
    snprintf(stale, sizeof stale, "%s/FREEZE", r->a.freeze_dir);
    snprintf(aside, sizeof aside, "%s.stale", stale);
    if (access(stale, F_OK) == 0) rename(stale, aside);
  }
}
