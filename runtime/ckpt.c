/* ckpt.c - checkpoints: written atomically and verified on --resume. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "run.h"

/* ---- checkpoints ----
 *
 * DIR/MANIFEST names the committed checkpoint; its stage files are in a
 * directory of their own, DIR/step-<S>-<run id>/stage_<k>.ckpt.  A new
 * checkpoint goes into a new directory beside the committed one: each rank
 * writes its file under a temporary name, fsyncs it and renames it; rank 0
 * gathers every file's size and checksum, writes MANIFEST.tmp in the new
 * directory (the step, the plan, the files, and last the manifest's own
 * checksum), fsyncs it and renames it over DIR/MANIFEST.  That rename is the
 * commit: a crash before it leaves the previous checkpoint in force, a crash
 * after it the new one.  Only then are the other step directories removed,
 * and of them only what save_checkpoint writes: a user's step-size-sweep/ or
 * notes in a step folder stay.  While a run writes checkpoints, rank 0 holds
 * DIR/LOCK (flock), so a second run on DIR is refused, naming the first.
 * --resume checks the manifest's checksum, that the plan is this one (naming
 * what differs), and each file's size, FNV-1a 64 checksum and step. */

#define FNV_INIT 0xcbf29ce484222325ull
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}
static uint64_t fnv_i64(uint64_t h, int64_t v) { return fnv1a(h, &v, sizeof v); }
static uint64_t fnv_str(uint64_t h, const char *s) { return fnv1a(h, s ? s : "", s ? strlen(s) + 1 : 1); }

/* A model is known by its file name: the same model compiled from another
 * folder is the same plan. */
static const char *base_name(const char *p) {
  const char *s = strrchr(p ? p : "", '/');
  return s ? s + 1 : p ? p : "";
}

/* The stage's schedule: every action, in order. */
static uint64_t sched_hash(const PrStage *st) {
  uint64_t h = FNV_INIT;
  for (int i = 0; i < st->nactions; i++) {
    const PrAction *a = &st->actions[i];
    h = fnv_i64(fnv_i64(fnv_i64(fnv_i64(h, a->kind), a->mb), a->slot), a->gslot);
    if (a->wslot >= 0) h = fnv_i64(h, a->wslot); /* zb1, zbv: the late ring (a plan without it hashes as before) */
  }
  return fnv_i64(h, st->staleness);
}

static uint64_t values_hash(uint64_t h, const PrValue *v, int n) {
  for (int i = 0; i < n; i++) h = fnv_i64(fnv_i64(fnv_i64(fnv_str(h, v[i].name), v[i].bytes), v[i].offset), v[i].goffset);
  return h;
}

/* The rest of what the checkpoint's bytes mean: the model, the batch split,
 * the optimizer, the parameters and the values that cross the cuts (names,
 * sizes, offsets). */
static uint64_t prog_hash(const PrStage *st) {
  int64_t f[] = {st->stage, st->nstages, st->microbatches, st->mb_size, st->batch, st->nslots, st->ngslots, st->optimizer};
  uint64_t h = fnv1a(fnv_str(FNV_INIT, base_name(st->model)), f, sizeof f);
  for (int i = 0; i < st->nparams; i++) {
    const PrParam *p = &st->params[i];
    h = fnv_i64(fnv_i64(fnv_i64(fnv_str(h, p->name), p->count), p->offset), p->goffset);
    h = fnv_i64(fnv_i64(h, p->m1offset), p->m2offset);
  }
  return values_hash(values_hash(h, st->recv, st->nrecv), st->send, st->nsend);
}

typedef struct CkptHeader {
  char magic[8]; /* "PIPECK2" */
  int32_t stage, nstages;
  int64_t step, arena_bytes, weights_bytes;
  uint64_t sched, prog;
} CkptHeader;

/* One stage's line of the manifest. */
typedef struct CkptInfo {
  int64_t arena, weights, bytes;
  uint64_t sched, prog, fnv;
} CkptInfo;

/* Testing only: PIPERUN_CRASH_AT=R:K makes rank R kill itself with SIGKILL
 * (as kill -9 would) at the K-th point of the checkpoint writing it passes,
 * counted from 1 over the whole run: before a file is created, half written,
 * written and synced, renamed; on rank 0 also the manifest's points and each
 * old file removed.  tests/test_safety.py crashes at every point. */
static void crash_point(void) {
  static int rank = -2, k;
  static int count;
  if (rank == -2) {
    const char *e = getenv("PIPERUN_CRASH_AT");
    if (!e || sscanf(e, "%d:%d", &rank, &k) != 2) rank = -1;
  }
  if (rank == g_rank && ++count == k) raise(SIGKILL);
}

/* Writes a file's bytes, hashing them; a crash point when half are out. */
typedef struct CkWriter {
  int fd, err;
  uint64_t fnv;
  int64_t done, half;
} CkWriter;

static void ck_write(CkWriter *w, const void *p, int64_t n) {
  const char *b = p;
  while (n > 0 && !w->err) {
    int64_t cut = w->done < w->half && w->done + n > w->half ? w->half - w->done : n;
    ssize_t k = write(w->fd, b, (size_t)cut);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      w->err = k < 0 ? errno : EIO;
      return;
    }
    w->fnv = fnv1a(w->fnv, b, (size_t)k);
    if (w->done < w->half && w->done + k >= w->half) crash_point();
    w->done += k, b += k, n -= k;
  }
}

/* Syncs a file under its temporary name and renames it into place, durably. */
static void ck_finish(CkWriter *w, const char *tmp, const char *path, const char *dir) {
  if (!w->err && fsync(w->fd)) w->err = errno;
  if (close(w->fd) && !w->err) w->err = errno;
  if (w->err) die(2, "cannot write checkpoint file %s: %s", tmp, strerror(w->err));
  crash_point();
  if (rename(tmp, path)) die(2, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
  crash_point();
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || fsync(fd)) die(2, "cannot sync directory %s: %s", dir, strerror(errno));
  close(fd);
}

/* Everything a step changes: weights and optimizer state (weights come first
 * in the arena; optimizer slots are found through the parameter table). */
static void ckpt_regions(const PrStage *st, int64_t *off, int64_t *len, int *n) {
  *n = 0;
  off[(*n)] = 0, len[(*n)++] = st->weights_bytes;
  /* async: the older weight versions a resumed step computes on */
  if (st->nwversions) off[*n] = st->wversion_base, len[(*n)++] = st->nwversions * st->wversion_bytes;
  /* --offload-optimizer: the state's places in its file, as -1 - offset (region_view). */
  int64_t in_file = st->opt_store_bytes ? -1 : 0;
  for (int i = 0; i < st->nparams; i++) {
    const PrParam *p = &st->params[i];
    if (p->m1offset >= 0) off[*n] = in_file ? -1 - p->m1offset : p->m1offset, len[(*n)++] = p->count * 4;
    if (p->m2offset >= 0) off[*n] = in_file ? -1 - p->m2offset : p->m2offset, len[(*n)++] = p->count * 4;
  }
}

/* A region's bytes on the host: the arena's through a view (device.h), the optimizer state's file's
 * (off < 0) through a copy, read from the file for PR_VIEW_READ and written back to it at release for
 * PR_VIEW_WRITE. */
static void *region_view(const Run *r, int64_t off, int64_t len, int mode) {
  if (off >= 0) return pr_dev_view(dev_at(r, off), len, mode);
  void *h = malloc((size_t)len + 1);
  if (!h) die(2, "out of memory for a checkpoint's copy of the optimizer state (%lld bytes)", (long long)len);
  if (mode == PR_VIEW_READ) optstore_io((Run *)r, 0, h, len, -1 - off);
  return h;
}

static void region_release(const Run *r, void *v, int64_t off, int64_t len, int mode) {
  if (off >= 0) {
    pr_dev_release(v, dev_at(r, off), len, mode);
    return;
  }
  if (mode == PR_VIEW_WRITE) optstore_io((Run *)r, 1, v, len, -1 - off);
  free(v);
}

/* Each rank: its stage file in DIR/SUB, and the manifest line that describes it. */
static CkptInfo write_stage_file(const Run *r, const char *dir, const char *sub) {
  const PrStage *st = r->st;
  char d[4200], path[4300], tmp[4400];
  snprintf(d, sizeof d, "%s/%s", dir, sub);
  if (mkdir(d, 0755) && errno != EEXIST) die(2, "cannot create checkpoint directory %s: %s", d, strerror(errno));
  snprintf(path, sizeof path, "%s/stage_%d.ckpt", d, st->stage);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int64_t *off = malloc(sizeof(int64_t) * (size_t)(2 * st->nparams + 2)), *len = malloc(sizeof(int64_t) * (size_t)(2 * st->nparams + 2));
  int n;
  ckpt_regions(st, off, len, &n);
  CkptHeader h = {"PIPECK2", st->stage, st->nstages, r->step, st->arena_bytes, st->weights_bytes, sched_hash(st), prog_hash(st)};
  int64_t total = sizeof h;
  for (int i = 0; i < n; i++) total += len[i];
  crash_point();
  CkWriter w = {open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), 0, FNV_INIT, 0, total / 2};
  if (w.fd < 0) die(2, "cannot write checkpoint file %s: %s", tmp, strerror(errno));
  ck_write(&w, &h, sizeof h);
  for (int i = 0; i < n; i++) { /* through host views: a device's bytes are copied out */
    void *v = region_view(r, off[i], len[i], PR_VIEW_READ);
    ck_write(&w, v, len[i]);
    region_release(r, v, off[i], len[i], PR_VIEW_READ);
  }
  free(off), free(len);
  ck_finish(&w, tmp, path, d);
  return (CkptInfo){st->arena_bytes, st->weights_bytes, total, h.sched, h.prog, w.fnv};
}

/* The model's path goes into the manifest with '%', control bytes and DEL as
 * %XX: a file name holding a newline stays on its one line (unescaped, its
 * second half was no line at all, and the model never matched on --resume),
 * and cannot forge the manifest's other lines.  Writes at most 3 * strlen(s) + 1. */
static void escape_model(char *o, const char *s) {
  for (const unsigned char *c = (const unsigned char *)s; *c; c++)
    if (*c == '%' || *c < 0x20 || *c == 0x7f) o += sprintf(o, "%%%02X", *c);
    else *o++ = (char)*c;
  *o = 0;
}

/* Decodes escape_model's %XX in place; -1 on a malformed escape. */
static int unescape_model(char *s) {
  char *o = s;
  for (; *s; s++) {
    unsigned v;
    if (*s != '%') *o++ = *s;
    else if (isxdigit((unsigned char)s[1]) && isxdigit((unsigned char)s[2]) && sscanf(s + 1, "%2X", &v) == 1 && v)
      *o++ = (char)v, s += 2;
    else return -1;
  }
  *o = 0;
  return 0;
}

/* The manifest's text, its own checksum on the last line. */
static char *manifest_text(const Run *r, const char *sub, const CkptInfo *all, size_t *len) {
  const PrStage *st = r->st;
  size_t cap = 1024 + 256 * (size_t)st->nstages + 4 * strlen(st->model), n = 0;
  char *t = malloc(cap), *model = malloc(3 * strlen(st->model) + 1);
  escape_model(model, st->model);
  n += (size_t)snprintf(t + n, cap - n, "pipecc-checkpoint 2\nstep %lld\nmodel %s\nstages %d\nbatch %d microbatches %d\ndir %s\n",
                        (long long)r->step, model, st->nstages, st->batch, st->microbatches, sub);
  free(model);
  for (int s = 0; s < st->nstages; s++) {
    const CkptInfo *c = &all[s];
    n += (size_t)snprintf(t + n, cap - n, "stage %d arena %lld weights %lld sched %016llx prog %016llx bytes %lld fnv %016llx\n", s,
                          (long long)c->arena, (long long)c->weights, (unsigned long long)c->sched, (unsigned long long)c->prog,
                          (long long)c->bytes, (unsigned long long)c->fnv);
  }
  n += (size_t)snprintf(t + n, cap - n, "checksum %016llx\n", (unsigned long long)fnv1a(FNV_INIT, t, n));
  *len = n;
  return t;
}

/* The number of leading bytes of s that pass is(). */
static int span(const char *s, int (*is)(int)) {
  int n = 0;
  while (is((unsigned char)s[n])) n++;
  return n;
}

/* Is this a folder name save_checkpoint makes, step-<S, 8 digits or more>-<run id, 8 hex digits>? */
static int is_step_dir(const char *s) {
  if (strncmp(s, "step-", 5)) return 0;
  s += 5;
  int n = span(s, isdigit);
  if (n < 8 || s[n] != '-') return 0;
  s += n + 1;
  return span(s, isxdigit) == 8 && !s[8];
}

/* Is this a file name the checkpoint writes into its folder: stage_<k>.ckpt, its .tmp, MANIFEST.tmp? */
static int is_ckpt_file(const char *s) {
  if (!strcmp(s, "MANIFEST.tmp")) return 1;
  if (strncmp(s, "stage_", 6)) return 0;
  int n = span(s + 6, isdigit);
  return n > 0 && (!strcmp(s + 6 + n, ".ckpt") || !strcmp(s + 6 + n, ".ckpt.tmp"));
}

/* Removes DIR's step directories other than `keep`: older checkpoints, and
 * what a crash left of uncommitted ones.  Only what save_checkpoint writes:
 * a folder of another name (a user's step-size-sweep/) is not opened, and in
 * a step folder only the checkpoint's own files go; the folder is removed
 * only when that leaves it empty. */
static void remove_old(const char *dir, const char *keep) {
  DIR *dd = opendir(dir);
  struct dirent *e;
  while (dd && (e = readdir(dd))) {
    if (!is_step_dir(e->d_name) || !strcmp(e->d_name, keep)) continue;
    char sub[4400];
    snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
    DIR *sd = opendir(sub);
    struct dirent *f;
    while (sd && (f = readdir(sd))) {
      char p[8800];
      if (!is_ckpt_file(f->d_name)) continue;
      snprintf(p, sizeof p, "%s/%s", sub, f->d_name);
      if (unlink(p) == 0) crash_point();
    }
    if (sd) closedir(sd);
    rmdir(sub); /* fails, as it should, where a file of the user's is left */
  }
  if (dd) closedir(dd);
}

/* Rank 0, once every stage file is written: the commit. */
static void commit_manifest(const Run *r, const char *dir, const char *sub, const CkptInfo *all) {
  char path[4200], tmp[4400];
  snprintf(path, sizeof path, "%s/MANIFEST", dir);
  /* In the new checkpoint's own folder: a temporary name no other run shares, removed with the folder. */
  snprintf(tmp, sizeof tmp, "%s/%s/MANIFEST.tmp", dir, sub);
  size_t len;
  char *text = manifest_text(r, sub, all, &len);
  crash_point();
  CkWriter w = {open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), 0, FNV_INIT, 0, (int64_t)len / 2};
  if (w.fd < 0) die(2, "cannot write %s: %s", tmp, strerror(errno));
  ck_write(&w, text, (int64_t)len);
  free(text);
  ck_finish(&w, tmp, path, dir);
  remove_old(dir, sub);
}

/* ---- the lock: one run writes a checkpoint directory at a time ----
 * Two runs checkpointing into one DIR remove each other's step folders after
 * their commits, and the MANIFEST left is whichever committed last.  Rank 0
 * takes flock(DIR/LOCK) before step 1 and holds it to its end; the kernel
 * drops it when the process ends, however it ends, so a kill -9 leaves no
 * stale lock.  The holder writes who it is into the file, for a second run's
 * refusal to name.  0, or -1 with msg. */
int ckpt_lock(const char *dir, char *msg, size_t len) {
  char path[4200], who[1024] = "";
  snprintf(path, sizeof path, "%s/LOCK", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
    snprintf(msg, len, "--checkpoint %s: cannot open its lock file %s: %s", dir, path, fd < 0 ? strerror(errno) : "not a regular file");
    if (fd >= 0) close(fd);
    return -1;
  }
  if (flock(fd, LOCK_EX | LOCK_NB)) {
    if (errno != EWOULDBLOCK) { /* a file system without locks: the run goes on, unguarded, and says so */
      snprintf(who, sizeof who, "--checkpoint %s: cannot lock %s (%s); a second run on this directory would not be stopped", dir, path,
               strerror(errno));
      put_line("piperun: warning: ", who);
      close(fd);
      return 0;
    }
    ssize_t n = pread(fd, who, sizeof who - 1, 0);
    who[n > 0 ? n : 0] = 0;
    who[strcspn(who, "\n")] = 0;
    close(fd);
    return snprintf(msg, len, "--checkpoint %s: another run is writing checkpoints there (%s); two runs on one directory delete each "
                    "other's checkpoints: let it end, or name another directory", dir, *who ? who : "it has not said which yet"), -1;
  }
  char host[256] = "?", when[64] = "?";
  time_t t = time(NULL);
  gethostname(host, sizeof host - 1);
  strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
  int n = snprintf(who, sizeof who, "pid %d on %s since %s, the stages in %s\n", (int)getpid(), host, when, pr_stage_dir());
  if (ftruncate(fd, 0) || pwrite(fd, who, (size_t)(n < (int)sizeof who ? n : (int)sizeof who - 1), 0) < 0) {
    snprintf(msg, len, "--checkpoint %s: cannot write %s: %s", dir, path, strerror(errno));
    close(fd);
    return -1;
  }
  return 0; /* fd stays open: the lock is held until this process ends */
}

/* A checkpoint of this step (collective): every stage's file, then rank 0's commit. */
void save_checkpoint(Run *r, const char *dir) {
  const PrStage *st = r->st;
  char msg[1024] = "";
  /* Every stage checks before any writes: no stage file of a refused checkpoint is left behind. */
  agree(weights_finite(r, "a checkpoint", msg, sizeof msg) == 0, msg);
  if (g_replica) return; /* --replicas: every replica holds the same weights and state; replica 0's stages write them */
  char sub[64];
  snprintf(sub, sizeof sub, "step-%08lld-%08x", (long long)r->step, r->run_id);
  CkptInfo mine = write_stage_file(r, dir, sub), *all = st->stage == 0 ? malloc(sizeof mine * (size_t)st->nstages) : NULL;
  MPI_Request req;
  MPI_Igather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, 0, g_pipe, &req);
  wait_watched(r, &req, 1, -1, "for every stage's checkpoint file");
  if (st->stage == 0) commit_manifest(r, dir, sub, all);
  free(all);
}

/* ---- --resume: the committed checkpoint, verified ---- */

typedef struct Manifest {
  long long step;
  int stages, batch, microbatches;
  char model[12288], sub[256]; /* model: as escape_model wrote it */
  CkptInfo mine; /* this stage's line */
  int have_mine;
} Manifest;

/* Reads and verifies DIR/MANIFEST; 0, or -1 with msg. */
static int read_manifest(const Run *r, const char *dir, Manifest *m, char *msg, size_t len) {
  char path[4200];
  snprintf(path, sizeof path, "%s/MANIFEST", dir);
  FILE *f = fopen(path, "rb");
  if (!f) {
    char old[4200];
    snprintf(old, sizeof old, "%s/step", dir);
    return snprintf(msg, len, "--resume %s: cannot open %s: %s%s", dir, path, strerror(errno),
                    access(old, F_OK) ? " (no committed checkpoint there)" : " (a checkpoint of an older pipecc: not resumable)"), -1;
  }
  static char text[1 << 20];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  char *sum = strstr(text, "\nchecksum "); /* the last line; no other line starts with it */
  unsigned long long want = 0;
  if (sum) sum++;
  if (strncmp(text, "pipecc-checkpoint 2\n", 20) || !sum || sscanf(sum, "checksum %llx", &want) != 1)
    return snprintf(msg, len, "--resume %s: %s is not a pipecc checkpoint manifest (or one of another version)", dir, path), -1;
  if (fnv1a(FNV_INIT, text, (size_t)(sum - text)) != want)
    return snprintf(msg, len, "--resume %s: %s is corrupted or was edited (its checksum does not match its text)", dir, path), -1;
  memset(m, 0, sizeof *m);
  for (char *line = text; line < sum; line = strchr(line, '\n') + 1) {
    int s;
    unsigned long long a, w, sc, pg, b, fv;
    if (sscanf(line, "step %lld", &m->step) == 1 || sscanf(line, "stages %d", &m->stages) == 1 ||
        sscanf(line, "batch %d microbatches %d", &m->batch, &m->microbatches) == 2 || sscanf(line, "dir %255s", m->sub) == 1 ||
        sscanf(line, "model %12287[^\n]", m->model) == 1)
      continue;
    if (sscanf(line, "stage %d arena %llu weights %llu sched %llx prog %llx bytes %llu fnv %llx", &s, &a, &w, &sc, &pg, &b, &fv) == 7 &&
        s == r->st->stage)
      m->mine = (CkptInfo){(int64_t)a, (int64_t)w, (int64_t)b, sc, pg, fv}, m->have_mine = 1;
  }
  return 0;
}

/* Is the checkpoint of this plan?  Names the first thing that differs. */
static int same_plan(const PrStage *st, const char *dir, const Manifest *m, char *msg, size_t len) {
  const char *p = "--resume %s: the checkpoint is of another plan: ";
  char head[4400];
  snprintf(head, sizeof head, p, dir);
  static char model[sizeof m->model];
  snprintf(model, sizeof model, "%s", m->model);
  /* A manifest written before names were escaped holds the name raw: the same unless it has a '%'. */
  if ((unescape_model(model) || strcmp(base_name(model), base_name(st->model))) && strcmp(base_name(m->model), base_name(st->model)))
    return snprintf(msg, len, "%smodel '%s' there, '%s' here", head, m->model, st->model), -1;
  if (m->stages != st->nstages) return snprintf(msg, len, "%s%d stages there, %d here", head, m->stages, st->nstages), -1;
  if (m->batch != st->batch || m->microbatches != st->microbatches)
    return snprintf(msg, len, "%sbatch %d in %d micro-batches there, %d in %d here", head, m->batch, m->microbatches, st->batch,
                    st->microbatches), -1;
  if (!m->have_mine) return snprintf(msg, len, "%sthe manifest has no line for stage %d", head, st->stage), -1;
  const CkptInfo *c = &m->mine;
  if (c->weights != st->weights_bytes)
    return snprintf(msg, len, "%sstage %d's weights are %lld bytes there, %lld here", head, st->stage, (long long)c->weights,
                    (long long)st->weights_bytes), -1;
  if (c->arena != st->arena_bytes)
    return snprintf(msg, len, "%sstage %d's arena is %lld bytes there, %lld here", head, st->stage, (long long)c->arena,
                    (long long)st->arena_bytes), -1;
  if (c->sched != sched_hash(st)) return snprintf(msg, len, "%sstage %d's schedule differs", head, st->stage), -1;
  if (c->prog != prog_hash(st))
    return snprintf(msg, len, "%sstage %d's program differs (parameters, buffers or optimizer)", head, st->stage), -1;
  return 0;
}

/* Reads this stage's file into the arena, checking size, checksum and step. */
static int read_stage_file(Run *r, const char *dir, const Manifest *m, char *msg, size_t len) {
  const PrStage *st = r->st;
  char path[4600];
  snprintf(path, sizeof path, "%s/%s/stage_%d.ckpt", dir, m->sub, st->stage);
  FILE *f = fopen(path, "rb");
  if (!f) return snprintf(msg, len, "--resume %s: cannot open %s: %s", dir, path, strerror(errno)), -1;
  struct stat sb = {0};
  CkptHeader h;
  int64_t *off = malloc(sizeof(int64_t) * (size_t)(2 * st->nparams + 2)), *ln = malloc(sizeof(int64_t) * (size_t)(2 * st->nparams + 2));
  int n, ok = fstat(fileno(f), &sb) == 0 && sb.st_size == m->mine.bytes && fread(&h, sizeof h, 1, f) == 1;
  uint64_t fnv = fnv1a(FNV_INIT, &h, sizeof h);
  ckpt_regions(st, off, ln, &n);
  for (int i = 0; i < n && ok; i++) {
    void *v = region_view(r, off[i], ln[i], PR_VIEW_WRITE);
    ok = fread(v, 1, (size_t)ln[i], f) == (size_t)ln[i];
    fnv = fnv1a(fnv, v, (size_t)ln[i]);
    region_release(r, v, off[i], ln[i], PR_VIEW_WRITE);
  }
  fclose(f);
  free(off), free(ln);
  if (!ok)
    return snprintf(msg, len, "--resume %s: %s is %lld bytes, the manifest says %lld (truncated?)", dir, path, (long long)sb.st_size,
                    (long long)m->mine.bytes), -1;
  if (fnv != m->mine.fnv)
    return snprintf(msg, len, "--resume %s: %s is corrupted: its FNV-1a checksum is %016llx, the manifest says %016llx", dir, path,
                    (unsigned long long)fnv, (unsigned long long)m->mine.fnv), -1;
  if (memcmp(h.magic, "PIPECK2", 8) || h.stage != st->stage || h.step != m->step)
    return snprintf(msg, len, "--resume %s: %s holds stage %d at step %lld, the manifest says stage %d at step %lld", dir, path, h.stage,
                    (long long)h.step, st->stage, m->step), -1;
  r->step = h.step;
  return 0;
}

void load_checkpoint(Run *r, const char *dir) {
  char msg[2048] = "";
  Manifest m;
  int ok = read_manifest(r, dir, &m, msg, sizeof msg) == 0 && same_plan(r->st, dir, &m, msg, sizeof msg) == 0 &&
           read_stage_file(r, dir, &m, msg, sizeof msg) == 0;
  /* --steps counts from the run's start, the checkpoint's steps included: fewer ran "-2 steps" and exited 0. */
  if (ok && r->step > r->a.steps)
    ok = 0, snprintf(msg, sizeof msg, "--resume %s: the checkpoint is at step %lld, past --steps %lld (the total, counted from the "
                                      "first step): give --steps above %lld to train on", dir, (long long)r->step, (long long)r->a.steps,
                     (long long)r->step);
  agree(ok, msg);
}

