/* piperun.c - the runtime of a generated stage program.
 *
 * One process per stage.  Each optimizer step executes the stage's action
 * list as the compiler wrote it, slots included; the runtime decides
 * nothing of its own.  RECV / RECV_GRAD post non-blocking receives into a
 * slot (the compiler placed them as early as the slot is free, so messages
 * travel while the stage computes); F waits for its slot's receives, runs
 * the generated forward (and the loss on the last stage); SEND / SEND_GRAD
 * post non-blocking sends; B, or I then W under zb1, run the generated
 * backward halves; UPDATE applies the optimizer: gradients were summed over
 * the micro-batches in a fixed order, so the step is the same as one large
 * batch.  Before anything refills a slot it waits for the sends from it. */
#include "piperun.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "blas_core.h"
#include "data.h"
#include "trace.h"
#include "xfer.h"

void openblas_set_num_threads(int);
char *openblas_get_corename(void);

typedef struct Args {
  const char *data, *log, *save, *checkpoint, *resume, *lr_schedule, *trace, *offload_dir, *profile;
  /* Freezing (FreezePipe): after step freeze_step[k] the first freeze_layers[k] layers freeze; the
   * freeze checkpoint goes to freeze_dir (run.sh: --checkpoint DIR, else freeze/ beside it);
   * resume_freeze: continue from one (run.sh's re-planned run). */
  int64_t freeze_step[16];
  int freeze_layers[16], nfreeze;
  const char *freeze_dir, *resume_freeze;
  /* --freeze auto: every freeze_every steps, each layer's gradient norms summed over the interval
   * against the previous interval's; the longest prefix whose relative change is below the threshold freezes. */
  int freeze_auto;
  int64_t freeze_every;
  double freeze_threshold;
  const char *val;     /* --val PATH: a held-out set evaluated every val_every steps (0: at the end) */
  int64_t val_every;
  int64_t steps, ckpt_every, warmup;
  uint64_t seed;
  int shuffle, quiet;
  double lr, momentum, weight_decay, min_lr, timeout;
  int have_lr, have_momentum, have_wd;
  int no_pin;          /* --no-pin: leave the ranks where Linux puts them (pin_rank) */
} Args;

typedef struct Run {
  const PrStage *st;
  Args a;
  int rank;
  DataSet data;
  int have_data;
  /* message state, per slot */
  MPI_Request *rreq;  /* [nslots][nrecv] forward receives */
  MPI_Request *sreq;  /* [nslots][nsend] forward sends */
  MPI_Request *greq;  /* [ngslots][nsend] gradient receives */
  MPI_Request *gsreq; /* [ngslots][nrecv] gradient sends */
  int64_t *idx;       /* sample indices of the step's batch */
  /* scratch for the loader, allocated once: labels/targets it also returns, images/tokens the labels come with */
  int64_t *in_labels, *in_y, *lab_x;
  float *lab_img;
  int64_t step;
  double timeout;      /* seconds a wait may last before the job is stopped (--timeout) */
  int pinned_cpu;      /* the CPU pin_rank pinned this rank to, -1 none */
  cpu_set_t cpus;      /* ... and the CPUs it could run on before */
  uint32_t run_id;     /* names this run's checkpoint directories (rank 0's, broadcast) */
  const PrAction *cur; /* the action running, for the trace's wait spans */
  MPI_Request *tie_req; /* tied weights' part exchange: nparts * nstages requests at most */
  PrTrace trace;
  double t_compute, t_wait, t_total;
  /* The bubble (docs/cost.md, "The bubble"): t_busy is the wall time inside F, B, I, W, RECOMPUTE and
   * UPDATE less the waits inside them; bub_busy and bub_wall sum t_busy and the step's wall time over
   * the steps after the first (the warm-up), or over the only one. */
  double t_busy, bub_busy, bub_wall;
  double sent_bytes;   /* every byte this rank sent: messages, offloaded activations (to a peer or its file), weights */
  PrProfExtra prof;    /* --profile: the loader, the loss and the update, beside the nodes' marks */
  int64_t prof_warm;   /* --profile: the first steps not measured, a quarter of the run (at least one) */
  /* The memory plan: the messages to and from the peer (on their own
   * communicator), per xslot the copy out and the copy in, per store slot the
   * peer's data coming or going; the file's I/O thread. */
  MPI_Comm ocomm;
  MPI_Request *oreq, *ireq, *hreq;
  /* PipeFB: stashed values to and from the other chain, per slot, and the weights; their own communicator. */
  MPI_Comm fcomm;
  MPI_Request *ssreq, *srreq, *wreq; /* [nslots][nstash_send], [nslots][nstash_recv], [max(nwsend, nwrecv)] */
  PrXfer *xfer;
  double t_xfer_wait;
  int64_t rss_overhead, rss_peak;
  /* async: updates applied so far (the newest weights' version), and per
   * step in flight (lookahead + 1 of them, by step modulo that) its batch's
   * sample indices and its loss so far. */
  int64_t nupdates;
  int64_t *idx_ring, *idx_of;
  double *aloss;
  /* Exposed communication: the forward values or gradients a rank sends a
   * peer in one action are followed by the time it posted them (on tcomm);
   * a wait for such messages counts the part of it after the last of those
   * times.  The peers: where forward values come from (fsrc) and go (fdst),
   * where gradients come from (gsrc) and go (gdst).  Per slot (or gslot)
   * and peer: the time sent or received, and its request.  clock[r]: rank
   * r's clock minus this rank's (measured at start). */
  MPI_Comm tcomm;
  int *fsrc, nfsrc, *fdst, nfdst, *gsrc, ngsrc, *gdst, ngdst; /* at most one per value */
  double *tsent_f, *tgot_f, *tsent_g, *tgot_g;
  MPI_Request *tsreq_f, *trreq_f, *tsreq_g, *trreq_g;
  double *clock, t_exposed;
  int freeze_to;       /* a freeze event after this step: the layers frozen from now on (0: none) */
  int in_val;          /* inside val_pass: forwards are the eval forward */
  double elapsed0;     /* wall seconds of the run before this program (a re-planned run goes on counting) */
  double *gnorm, *gprev; /* --freeze auto: per layer, this interval's summed gradient norms and the last interval's */
  DataSet val;         /* --val: the held-out set (on the ranks that read data) */
  FILE *val_log;       /* --val with --log: LOG.val.csv */
  int have_prev;
  int npoll_req; /* --progress poll: outstanding requests tested between nodes */
} Run;

static int g_rank = -1;

/* Bytes of [p, p + n) in memory now (whole pages). */
static int64_t resident_bytes(const void *p, int64_t n) {
  long pg = sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)p / (uintptr_t)pg * (uintptr_t)pg, e = ((uintptr_t)p + (uintptr_t)n + (uintptr_t)pg - 1) / (uintptr_t)pg * (uintptr_t)pg;
  size_t np = (e - a) / (size_t)pg;
  unsigned char *v = malloc(np + 1);
  int64_t got = 0;
  if (v && !mincore((void *)a, e - a, v))
    for (size_t i = 0; i < np; i++) got += v[i] & 1;
  free(v);
  return got * pg;
}

/* The process's anonymous resident memory (RssAnon), in bytes; 0 if unknown. */
static int64_t rss_anon(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long long kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "RssAnon: %lld kB", &kb) == 1) break;
  if (f) fclose(f);
  return (int64_t)kb * 1024;
}
RandCtx pr_rand = {1, 0, 0}; /* piperun.h; seed 1 is --seed's default */
OptCtx pr_opt; /* piperun.h; set at each UPDATE */
unsigned char *pr_weights;   /* piperun.h: the arena's weights region, or an older version's (async) */

static void die(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
/* Writes one message line: tensor names come from the model, so a newline or
 * a terminal escape in one is printed as \n or \xNN, never raw. */
static void put_line(const char *prefix, const char *msg) {
  /* One write() per line: stderr is unbuffered and the stages share one
     terminal or pipe, so a line written piecewise interleaves with another
     stage's.  Lines under PIPE_BUF (4096 bytes) are written atomically. */
  char line[4096];
  size_t n = 0, cap = sizeof line - 2;
  for (const char *c = prefix; *c && n < cap; c++) line[n++] = *c;
  for (const unsigned char *c = (const unsigned char *)msg; *c && n + 4 < cap; c++) {
    if (*c == '\n') { line[n++] = '\\'; line[n++] = 'n'; }
    else if (*c < 0x20 || *c == 0x7f) n += (size_t)snprintf(line + n, 5, "\\x%02x", *c);
    else line[n++] = (char)*c;
  }
  line[n++] = '\n';
  fflush(stderr);
  for (size_t off = 0; off < n;) {
    ssize_t w = write(2, line + off, n - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
}

static void die(int code, const char *fmt, ...) {
  char msg[2048], prefix[64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(prefix, sizeof prefix, "piperun: stage %d: error: ", g_rank);
  put_line(prefix, msg);
  MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

/* CLOCK_MONOTONIC, not MPI_Wtime: Open MPI's MPI_Wtime counts from each process's own start, and
 * the ranks of one host then read clocks 0.1-2 ms apart (measure_clocks). */
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- arguments ---- */

static void usage_error(const char *fmt, const char *arg) {
  if (g_rank == 0) {
    fprintf(stderr, "piperun: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nusage: run.sh --data PATH --steps N [--lr X] [--momentum X] [--weight-decay X] [--seed S]\n"
                    "       [--shuffle|--no-shuffle] [--log FILE] [--save FILE.onnx] [--checkpoint DIR]\n"
                    "       [--checkpoint-every K] [--resume DIR] [--lr-schedule constant|cosine] [--warmup K] [--quiet]\n"
                    "       [--trace FILE.json] [--timeout SECONDS] [--profile FILE]\n"
                    "       [--freeze-at S:N[,S:N...] | --freeze auto [--freeze-every S] [--freeze-threshold X]] [--val PATH [--val-every K]]\n");
  }
  MPI_Finalize();
  exit(2);
}

static double num(const char *flag, const char *v, double lo) {
  char *end;
  double x = v ? strtod(v, &end) : 0;
  if (!v || end == v || *end || x != x || x < lo) usage_error("bad value for %s", flag);
  return x;
}

/* --freeze-at S:N[,S:N...]: steps from 1, ascending; layers at least 1. */
static void parse_freeze(Args *a, const char *v) {
  const char *p = v ? v : "";
  while (*p) {
    char *end;
    long long step = strtoll(p, &end, 10), layers;
    if (end == p || *end != ':' || step < 1) usage_error("--freeze-at '%s': expected S:N[,S:N...] (after step S, from 1, freeze the "
                                                           "first N parameterised layers)", v);
    p = end + 1;
    layers = strtoll(p, &end, 10);
    if (end == p || (*end && *end != ',') || layers < 1 || layers > 1 << 24 || a->nfreeze == 16 ||
        (a->nfreeze && step <= a->freeze_step[a->nfreeze - 1]))
      usage_error("--freeze-at '%s': expected S:N[,S:N...] with ascending steps S >= 1 and N >= 1 (at most 16 events)", v);
    a->freeze_step[a->nfreeze] = step, a->freeze_layers[a->nfreeze++] = (int)layers;
    p = *end ? end + 1 : end;
  }
  if (!a->nfreeze) usage_error("--freeze-at '%s': expected S:N[,S:N...]", v ? v : "");
}

static void parse_args(Args *a, int argc, char **argv) {
  memset(a, 0, sizeof *a);
  a->steps = -1, a->seed = 1, a->lr_schedule = "constant";
  /* --freeze auto's defaults (docs/freeze.md, measured in bench section 9): an interval long enough
   * that a norm summed over it is not one batch's noise, and a change small enough that the layer
   * has stopped moving. */
  a->freeze_every = 50, a->freeze_threshold = 0.05;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE() (i++, v)
    if (!strcmp(f, "--data")) a->data = TAKE();
    else if (!strcmp(f, "--steps")) a->steps = (int64_t)num(f, TAKE(), 1);
    else if (!strcmp(f, "--lr")) a->lr = num(f, TAKE(), 0), a->have_lr = 1;
    else if (!strcmp(f, "--momentum")) a->momentum = num(f, TAKE(), 0), a->have_momentum = 1;
    else if (!strcmp(f, "--weight-decay")) a->weight_decay = num(f, TAKE(), 0), a->have_wd = 1;
    else if (!strcmp(f, "--seed")) a->seed = (uint64_t)num(f, TAKE(), 0);
    else if (!strcmp(f, "--shuffle")) a->shuffle = 1;
    else if (!strcmp(f, "--no-shuffle")) a->shuffle = 0;
    else if (!strcmp(f, "--log")) a->log = TAKE();
    else if (!strcmp(f, "--save")) a->save = TAKE();
    else if (!strcmp(f, "--checkpoint")) a->checkpoint = TAKE();
    else if (!strcmp(f, "--checkpoint-every")) a->ckpt_every = (int64_t)num(f, TAKE(), 1);
    else if (!strcmp(f, "--resume")) a->resume = TAKE();
    else if (!strcmp(f, "--lr-schedule")) a->lr_schedule = TAKE();
    else if (!strcmp(f, "--warmup")) a->warmup = (int64_t)num(f, TAKE(), 0);
    else if (!strcmp(f, "--min-lr")) a->min_lr = num(f, TAKE(), 0);
    else if (!strcmp(f, "--quiet")) a->quiet = 1;
    else if (!strcmp(f, "--no-pin")) a->no_pin = 1;
    else if (!strcmp(f, "--trace")) a->trace = TAKE();
    else if (!strcmp(f, "--timeout")) a->timeout = num(f, TAKE(), 0.001);
    else if (!strcmp(f, "--blas-kernels")) TAKE(); /* pr_main pinned them */
    else if (!strcmp(f, "--offload-dir")) a->offload_dir = TAKE();
    else if (!strcmp(f, "--profile")) a->profile = TAKE();
    else if (!strcmp(f, "--freeze-at")) parse_freeze(a, TAKE());
    else if (!strcmp(f, "--freeze-dir")) a->freeze_dir = TAKE();
    else if (!strcmp(f, "--val")) a->val = TAKE();
    else if (!strcmp(f, "--val-every")) a->val_every = (int64_t)num(f, TAKE(), 1);
    else if (!strcmp(f, "--freeze")) {
      const char *w = TAKE();
      if (!w || strcmp(w, "auto")) usage_error("--freeze '%s': expected auto (or --freeze-at S:N for given steps)", w ? w : "");
      a->freeze_auto = 1;
    } else if (!strcmp(f, "--freeze-every")) a->freeze_every = (int64_t)num(f, TAKE(), 1);
    else if (!strcmp(f, "--freeze-threshold")) a->freeze_threshold = num(f, TAKE(), 0);
    else if (!strcmp(f, "--resume-freeze")) a->resume_freeze = TAKE();
    else usage_error("unknown flag '%s'", f);
    if (i >= argc) usage_error("flag '%s' needs a value", f);
  }
  if (!a->data) usage_error("--data PATH is required%s", "");
  if (a->steps < 0) usage_error("--steps N is required%s", "");
  if (!a->lr_schedule || (strcmp(a->lr_schedule, "constant") && strcmp(a->lr_schedule, "cosine")))
    usage_error("--lr-schedule '%s': expected constant or cosine", a->lr_schedule ? a->lr_schedule : "");
  if (a->checkpoint && !a->ckpt_every) a->ckpt_every = 100;
  /* 0 would never freeze (no change is below it): said, not replaced by the default. */
  if (!(a->freeze_threshold > 0)) usage_error("--freeze-threshold must be above 0 (a layer freezes when its change is below it)%s", "");
}

/* ---- pinning ---- */

/* How many ranks run on this host (collective over every rank). */
static int host_ranks(void) {
  MPI_Comm node;
  int here = 1;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &here);
  MPI_Comm_free(&node);
  return here;
}

/* More ranks than cores on one host: the plan chose which ranks share a core
 * (compiler/schedule.c, schedule_pin) and timed the step so; each rank pins
 * itself to its core, the pin_core-th of the CPUs it may run on (its I/O
 * thread, started later, may run on any of them: see xfer_open's caller).
 * Only where the plan's assumption holds: every rank on this host, and as
 * many CPUs allowed as the plan's cores (a rank mpirun bound with --bind-to,
 * or a host with more cores, is left alone).  Returns the CPU, or -1. */
static int pin_rank(const PrStage *st, const Args *a, cpu_set_t *before) {
  if (st->pin_cores <= 0 || a->no_pin) return -1;
  int here = host_ranks(), world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  cpu_set_t set, one;
  if (here != world || sched_getaffinity(0, sizeof set, &set) || CPU_COUNT(&set) != st->pin_cores) return -1;
  for (int cpu = 0, k = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, &set) || k++ != st->pin_core) continue;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    *before = set;
    return sched_setaffinity(0, sizeof one, &one) ? -1 : cpu;
  }
  return -1;
}

/* The CPUs this rank's threads (pipecc --threads) can count on: those it may run on, shared with the
 * other ranks of its host when they may all run on every CPU (mpirun --bind-to none). */
static int rank_cpus(int threads) {
  if (threads <= 1) return 1;
  int here = host_ranks();
  cpu_set_t set;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int cpus = sched_getaffinity(0, sizeof set, &set) ? 1 : CPU_COUNT(&set);
  if (online > 0 && cpus >= online && here > 1) cpus /= here;
  return cpus > 0 ? cpus : 1;
}

/* ---- start-up checks: every rank agrees before the first step ---- */

/* All ranks learn whether any failed, and print the first failure's message. */
static void agree(int ok, const char *msg) {
  int bad = ok ? INT32_MAX : g_rank, first;
  MPI_Allreduce(&bad, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == INT32_MAX) return;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", msg ? msg : "");
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, first, MPI_COMM_WORLD);
  char prefix[96];
  snprintf(prefix, sizeof prefix, "piperun: stage %d: error: %s", g_rank, first == g_rank ? "" : "(reported by another stage) ");
  put_line(prefix, buf);
  MPI_Finalize();
  exit(2);
}

const char *pr_stage_dir(void) {
  static char dir[4096];
  const char *d = getenv("PIPERUN_DIR");
  if (d && *d) return d;
  /* The directory this program is in: run.sh starts every stage by its full
   * path, so a rank on another host finds its weights beside it. */
  if (!dir[0]) {
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    char *slash = n > 0 ? (dir[n] = 0, strrchr(dir, '/')) : NULL;
    if (slash) *slash = 0;
    else strcpy(dir, ".");
  }
  return dir;
}

/* Every rank must run the same BLAS kernels (blas_core.h), on a CPU that has
 * their instructions: other kernels round other ways, and the run would not
 * be the one the same job gives on one host. */
static void check_blas_core(int nranks) {
  char me[128] = "", msg[1024] = "";
  snprintf(me, 64, "%s", openblas_get_corename());
  gethostname(me + 64, 63);
  if (blas_core_runs_here(me) == 0)
    snprintf(msg, sizeof msg, "OpenBLAS runs its %s kernels on host %s, whose CPU lacks their instructions; "
             "set OPENBLAS_CORETYPE to the oldest host's type before run.sh (it passes it to every rank)", me, me + 64);
  agree(!msg[0], msg);
  char (*all)[128] = malloc(128 * (size_t)nranks);
  if (!all) abort();
  MPI_Allgather(me, 128, MPI_CHAR, all, 128, MPI_CHAR, MPI_COMM_WORLD);
  int odd = -1;
  for (int r = 1; r < nranks && odd < 0; r++)
    if (strcmp(all[r], all[0])) odd = r;
  if (odd >= 0)
    snprintf(msg, sizeof msg, "stage %d (host %s) runs OpenBLAS's %s kernels and stage 0 (host %s) its %s kernels: their "
             "sums would round differently; run the stages through run.sh, which gives every rank the launching host's "
             "kernels (--blas-kernels NAME)", odd, all[odd] + 64, all[odd], all[0] + 64, all[0]);
  free(all);
  agree(odd < 0, msg);
}

static int load_file(const char *path, void *dst, int64_t bytes, char *msg, size_t len) {
  FILE *f = fopen(path, "rb");
  if (!f) return snprintf(msg, len, "cannot open %s: %s", path, strerror(errno)), -1;
  struct stat sb;
  if (fstat(fileno(f), &sb) || sb.st_size != bytes) {
    fclose(f);
    return snprintf(msg, len, "%s has %lld bytes, this stage expects %lld (regenerate with pipecc)", path,
                    (long long)sb.st_size, (long long)bytes), -1;
  }
  int ok = bytes == 0 || fread(dst, 1, (size_t)bytes, f) == (size_t)bytes;
  fclose(f);
  if (!ok) return snprintf(msg, len, "cannot read %s", path), -1;
  return 0;
}

static int needs_data(const PrStage *st) {
  if (st->loss) return 1;
  for (int v = 0; v < st->nrecv; v++)
    if (st->recv[v].source != PR_FROM_PREV) return 1;
  return 0;
}

static void open_data(Run *r) {
  const PrStage *st = r->st;
  char msg[1024] = "";
  int ok = 1;
  if (needs_data(st)) {
    ok = data_open(&r->data, r->a.data, 0, msg, sizeof msg) == 0;
    r->have_data = ok;
    for (int v = 0; ok && v < st->nrecv; v++) {
      const PrValue *pv = &st->recv[v];
      if (pv->source == PR_FROM_IMAGES) {
        if (r->data.kind == DATA_TOKENS)
          ok = 0, snprintf(msg, sizeof msg, "%s holds tokens, but the model's input '%s' is an image batch", r->a.data, pv->name);
        else if (pv->rank != 4)
          ok = 0, snprintf(msg, sizeof msg, "input '%s' has rank %d; image data needs [batch, channels, height, width]", pv->name, pv->rank);
        else
          ok = data_check_images(&r->data, (int)pv->dims[1], (int)pv->dims[2], (int)pv->dims[3], st->loss ? (int)st->loss_classes : 256,
                                 msg, sizeof msg) == 0;
      } else if (pv->source == PR_FROM_TOKENS) {
        if (r->data.kind != DATA_TOKENS)
          ok = 0, snprintf(msg, sizeof msg, "%s holds images, but the model's input '%s' is token ids", r->a.data, pv->name);
        else
          ok = data_check_tokens(&r->data, (int)st->vocab, (int64_t)st->batch * pv->dims[1] + 1, msg, sizeof msg) == 0;
      }
    }
    if (ok && st->loss && r->data.kind != DATA_TOKENS)
      ok = data_check_images(&r->data, r->data.c, r->data.h, r->data.w, (int)st->loss_classes, msg, sizeof msg) == 0;
    if (ok && st->loss && r->data.kind == DATA_TOKENS)
      ok = data_check_tokens(&r->data, (int)st->loss_classes, (int64_t)st->batch * (st->loss_rows / st->mb_size) + 1, msg, sizeof msg) == 0;
    if (ok && r->data.kind != DATA_TOKENS && r->data.n < st->batch)
      ok = 0, snprintf(msg, sizeof msg, "%s has %lld samples, fewer than one batch of %d", r->a.data, (long long)r->data.n, st->batch);
  }
  agree(ok, msg);
}

/* ---- messages ---- */

/* A message's tag names its step (mod 64), micro-batch, value and direction. */
static int tag_of(int64_t step, int mb, int v, int grad) { return ((int)(step % 64) * 256 * 64 + (mb % 256) * 64 + v % 64) * 2 + grad; }
#define TAG_SPAN (64 * 256 * 64 * 2)

static unsigned char *ring(const Run *r, int64_t off, int64_t bytes, int slot) { return r->st->arena + off + (int64_t)slot * bytes; }

/* Completes requests, or stops the job when they take longer than --timeout:
 * a peer that stopped (kill -STOP, a hung node, a lost link) would otherwise
 * leave every rank waiting forever.  MPI_Testall in a loop is what
 * MPI_Waitall does inside; sched_yield lets an oversubscribed peer run.
 * peer < 0: a collective (any stage may be the one missing). */
static void wait_watched(const Run *r, MPI_Request *req, int n, int peer, const char *what) {
  double t0 = now();
  for (;;) {
    int done = 0;
    MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
    if (done) return;
    if (now() - t0 > r->timeout) break;
    sched_yield();
  }
  if (peer >= 0)
    die(4, "step %lld: no progress for %.1f s waiting for stage %d (%s); stage %d stopped or hung, stopping the job (run.sh --timeout S)",
        (long long)r->step + 1, r->timeout, peer, what, peer);
  die(4, "no progress for %.1f s waiting for the other stages (%s); one of them stopped or hung, stopping the job (run.sh --timeout S)",
      r->timeout, what);
}

static void wait_all(Run *r, MPI_Request *req, int n, int peer, const char *what) {
  int any = 0;
  for (int i = 0; i < n; i++) any |= req[i] != MPI_REQUEST_NULL;
  if (!any) return;
  double t0 = now();
  wait_watched(r, req, n, peer, what);
  double t1 = now();
  r->t_wait += t1 - t0;
  trace_add(&r->trace, -1, r->cur->mb, r->cur->slot, r->step, t0, t1);
}

/* Sends still leaving slot / gslot must finish before anything refills it. */
static void wait_sends(Run *r, int slot) {
  wait_all(r, r->sreq + (size_t)slot * r->st->nsend, r->st->nsend, r->st->nsend ? r->st->send[0].peer : -1, "to take the forward values it was sent");
  wait_all(r, r->ssreq + (size_t)slot * r->st->nstash_send, r->st->nstash_send, -1, "to take the stashed values it was sent");
}
static void wait_grad_sends(Run *r, int gslot) {
  wait_all(r, r->gsreq + (size_t)gslot * r->st->nrecv, r->st->nrecv, r->st->nrecv ? r->st->recv[0].peer : -1, "to take the gradients it was sent");
}

/* Where value pv of the action's micro-batch lives: its ring slot, or its
 * xslot's block when it is one of the values that leave. */
static unsigned char *value_at(const Run *r, const PrValue *pv, const PrAction *a) {
  if (pv->xring) return r->st->arena + pv->offset + (int64_t)a->xslot * r->st->xslot_bytes;
  return ring(r, pv->offset, pv->bytes, a->slot);
}

static void wait_xslot_free(Run *r, int xslot);

/* ---- exposed communication ---- */

/* The distinct peers of a table's values (forward: those coming from a
 * rank; with grads, only those whose gradient travels back). */
static int peers_of(const PrValue *v, int n, int grads, int *out) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (v[i].peer < 0 || v[i].source != PR_FROM_PREV || (grads && v[i].goffset < 0)) continue;
    int seen = 0;
    for (int j = 0; j < k; j++) seen |= out[j] == v[i].peer;
    if (!seen) out[k++] = v[i].peer;
  }
  return k;
}

/* After an action's sends: the time they were posted goes to each peer. */
static void send_times(Run *r, double *at, MPI_Request *req, const int *peers, int np, int tag) {
  for (int k = 0; k < np; k++) {
    wait_watched(r, &req[k], 1, peers[k], "to take a message's send time");
    at[k] = now();
    MPI_Isend(&at[k], 1, MPI_DOUBLE, peers[k], tag, r->tcomm, &req[k]);
  }
}

static void recv_times(Run *r, double *got, MPI_Request *req, const int *peers, int np, int tag) {
  for (int k = 0; k < np; k++) MPI_Irecv(&got[k], 1, MPI_DOUBLE, peers[k], tag, r->tcomm, &req[k]);
}

/* Waits for an action's messages, then for their send times: the part of
 * the wait after the last sender had posted (in this rank's clock) is exposed. */
static void wait_message(Run *r, MPI_Request *req, int n, MPI_Request *treq, const double *sent, const int *peers, int np,
                         const char *what) {
  int any = 0;
  for (int i = 0; i < n; i++) any |= req[i] != MPI_REQUEST_NULL;
  double t0 = now();
  if (any) wait_all(r, req, n, np ? peers[0] : -1, what);
  double t1 = now(), last = -INFINITY;
  for (int k = 0; k < np; k++) {
    if (treq[k] == MPI_REQUEST_NULL) continue;
    wait_watched(r, &treq[k], 1, peers[k], what);
    last = fmax(last, sent[k] - r->clock[peers[k]]);
  }
  if (!any || last == -INFINITY) return; /* already arrived (a poll between nodes completed it): nothing exposed */
  double e = fmax(0, t1 - fmax(t0, last));
  r->t_exposed += e;
  trace_exposed(&r->trace, e);
}

/* Every rank's clock against this one's: rank 0 runs 8 round trips with
 * each rank and keeps the least delayed (its clock offset), then tells
 * everyone.  Ranks on one host read one clock (now): their offsets are 0
 * and are not measured, because round trips between ranks that share a
 * core take a time slice or more, and the estimate would be off by as
 * much (ms). */
static void measure_clocks(Run *r) {
  int n = r->st->nstages, me = r->rank, tag = 7, one_host = host_ranks() == n;
  double *off0 = calloc((size_t)n, sizeof(double)); /* rank r's clock minus rank 0's */
  r->clock = calloc((size_t)n, sizeof(double));
  if (!off0 || !r->clock) die(2, "out of memory for the clock offsets");
  for (int q = 1; q < n && !one_host; q++) {
    if (me == 0) {
      double best = INFINITY;
      for (int i = 0; i < 8; i++) {
        double a = now(), theirs;
        MPI_Send(&a, 1, MPI_DOUBLE, q, tag, r->tcomm);
        MPI_Recv(&theirs, 1, MPI_DOUBLE, q, tag, r->tcomm, MPI_STATUS_IGNORE);
        double b = now();
        if (b - a < best) best = b - a, off0[q] = theirs - (a + b) / 2;
      }
    } else if (me == q) {
      for (int i = 0; i < 8; i++) {
        double x;
        MPI_Recv(&x, 1, MPI_DOUBLE, 0, tag, r->tcomm, MPI_STATUS_IGNORE);
        x = now();
        MPI_Send(&x, 1, MPI_DOUBLE, 0, tag, r->tcomm);
      }
    }
  }
  MPI_Bcast(off0, n, MPI_DOUBLE, 0, r->tcomm);
  for (int q = 0; q < n; q++) r->clock[q] = off0[q] - off0[me];
  free(off0);
}

/* --progress poll: between nodes (pr_poll in the generated code) the
 * outstanding receives and sends are tested, so that MPI moves large
 * messages while the rank computes instead of at the wait. */
static Run *g_poll_run;
void pr_poll(void) {
  Run *r = g_poll_run;
  if (!r) return;
  int flag;
  const PrStage *st = r->st;
  MPI_Testall(st->nslots * st->nrecv, r->rreq, &flag, MPI_STATUSES_IGNORE);
  MPI_Testall(st->ngslots * st->nsend, r->greq, &flag, MPI_STATUSES_IGNORE);
  MPI_Testall(st->nslots * st->nsend, r->sreq, &flag, MPI_STATUSES_IGNORE);
  MPI_Testall(st->ngslots * st->nrecv, r->gsreq, &flag, MPI_STATUSES_IGNORE);
}

static void do_recv(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_sends(r, a->slot);
  if (a->xslot >= 0) wait_xslot_free(r, a->xslot);
  for (int v = 0; v < st->nrecv; v++) {
    const PrValue *pv = &st->recv[v];
    if (pv->source != PR_FROM_PREV) continue;
    MPI_Irecv(value_at(r, pv, a), (int)pv->bytes, MPI_BYTE, pv->peer, tag_of(r->step, a->mb, pv->tag, 0),
              MPI_COMM_WORLD, &r->rreq[(size_t)a->slot * st->nrecv + v]);
  }
  recv_times(r, r->tgot_f + a->slot * r->nfsrc, r->trreq_f + a->slot * r->nfsrc, r->fsrc, r->nfsrc, tag_of(r->step, a->mb, 0, 0));
}

static void do_send(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nsend; v++) {
    const PrValue *pv = &st->send[v];
    r->sent_bytes += (double)pv->bytes;
    MPI_Isend(ring(r, pv->offset, pv->bytes, a->slot), (int)pv->bytes, MPI_BYTE, pv->peer, tag_of(r->step, a->mb, pv->tag, 0),
              MPI_COMM_WORLD, &r->sreq[(size_t)a->slot * st->nsend + v]);
  }
  send_times(r, r->tsent_f + a->slot * r->nfdst, r->tsreq_f + a->slot * r->nfdst, r->fdst, r->nfdst, tag_of(r->step, a->mb, 0, 0));
}

static void do_recv_grad(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_grad_sends(r, a->gslot);
  for (int v = 0; v < st->nsend; v++) {
    const PrValue *pv = &st->send[v];
    if (pv->goffset < 0) continue;
    MPI_Irecv(ring(r, pv->goffset, pv->bytes, a->gslot), (int)pv->bytes, MPI_BYTE, pv->peer, tag_of(r->step, a->mb, pv->tag, 1),
              MPI_COMM_WORLD, &r->greq[(size_t)a->gslot * st->nsend + v]);
  }
  recv_times(r, r->tgot_g + a->gslot * r->ngsrc, r->trreq_g + a->gslot * r->ngsrc, r->gsrc, r->ngsrc, tag_of(r->step, a->mb, 0, 1));
}

static void do_send_grad(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nrecv; v++) {
    const PrValue *pv = &st->recv[v];
    if (pv->goffset < 0 || pv->source != PR_FROM_PREV) continue;
    r->sent_bytes += (double)pv->bytes;
    MPI_Isend(ring(r, pv->goffset, pv->bytes, a->gslot), (int)pv->bytes, MPI_BYTE, pv->peer, tag_of(r->step, a->mb, pv->tag, 1),
              MPI_COMM_WORLD, &r->gsreq[(size_t)a->gslot * st->nrecv + v]);
  }
  send_times(r, r->tsent_g + a->gslot * r->ngdst, r->tsreq_g + a->gslot * r->ngdst, r->gdst, r->ngdst, tag_of(r->step, a->mb, 0, 1));
}

/* ---- PipeFB: the stash and the weights between the two chains ---- */

/* Stash tags name (step, mb, value); weights come once per step, after them. */
static int fb_tag(int64_t step, int mb, int id) { return ((int)(step % 4) * 256 + mb % 256) * 4096 + id % 4096; }
#define FB_WTAG (4 * 256 * 4096)

static void do_send_stash(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nstash_send; v++) {
    const PrStash *x = &st->stash_send[v];
    r->sent_bytes += (double)x->bytes;
    MPI_Isend(ring(r, x->offset, x->bytes, a->slot), (int)x->bytes, MPI_BYTE, x->peer, fb_tag(r->step, a->mb, x->id), r->fcomm,
              &r->ssreq[(size_t)a->slot * st->nstash_send + v]);
  }
}

static void do_recv_stash(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nstash_recv; v++) {
    const PrStash *x = &st->stash_recv[v];
    MPI_Irecv(ring(r, x->offset, x->bytes, a->slot), (int)x->bytes, MPI_BYTE, x->peer, fb_tag(r->step, a->mb, x->id), r->fcomm,
              &r->srreq[(size_t)a->slot * st->nstash_recv + v]);
  }
}

static void do_send_weights(Run *r) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nwsend; v++) {
    const PrWeight *w = &st->wsend[v];
    r->sent_bytes += 4.0 * (double)w->count;
    MPI_Isend(st->arena + w->offset, (int)w->count, MPI_FLOAT, w->peer, FB_WTAG + w->id % 4096, r->fcomm, &r->wreq[v]);
  }
}

/* The forwards of the next step use the weights of this step's update: wait for them. */
static void do_recv_weights(Run *r) {
  const PrStage *st = r->st;
  for (int v = 0; v < st->nwrecv; v++) {
    const PrWeight *w = &st->wrecv[v];
    MPI_Irecv(st->arena + w->offset, (int)w->count, MPI_FLOAT, w->peer, FB_WTAG + w->id % 4096, r->fcomm, &r->wreq[v]);
  }
  wait_all(r, r->wreq, st->nwrecv, -1, "the weights the backward ranks updated");
}

/* Fills a loader input of micro-batch mb. */
static void load_input(Run *r, const PrValue *pv, int mb, int slot) {
  const PrStage *st = r->st;
  const int64_t *idx = r->idx + (int64_t)mb * st->mb_size;
  /* An input that leaves between forward and backward lives in the xslot block. */
  unsigned char *to = pv->xring ? st->arena + pv->offset + (int64_t)r->cur->xslot * st->xslot_bytes : ring(r, pv->offset, pv->bytes, slot);
  if (pv->source == PR_FROM_IMAGES)
    data_images(&r->data, idx, st->mb_size, (float *)to, r->in_labels);
  else
    data_tokens(&r->data, r->step, st->batch, (int)pv->dims[1], mb * st->mb_size, st->mb_size, (int64_t *)to, r->in_y);
}

static void load_labels(Run *r, int mb, int64_t *labels) {
  const PrStage *st = r->st;
  if (r->data.kind == DATA_TOKENS)
    data_tokens(&r->data, r->step, st->batch, (int)(st->loss_rows / st->mb_size), mb * st->mb_size, st->mb_size, r->lab_x, labels);
  else
    data_images(&r->data, r->idx + (int64_t)mb * st->mb_size, st->mb_size, r->lab_img, labels);
}

/* The data files are mapped: if one shrinks during the run (truncated,
 * rewritten in place), reading the lost pages raises SIGBUS, which would kill
 * the rank with no word of why.  Loads run under a handler that jumps back
 * here, and the rank stops naming the file. */
static sigjmp_buf g_data_jmp;
static volatile sig_atomic_t g_in_data;
static void *volatile g_fault_addr;
static struct sigaction g_old_sigbus; /* Open MPI's (a stack trace), for a SIGBUS elsewhere */

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  if (!g_in_data) { /* not a data read: what was there before (Open MPI's stack trace, or a core) */
    sigaction(sig, &g_old_sigbus, NULL);
    raise(sig);
    return;
  }
  g_fault_addr = si->si_addr;
  siglongjmp(g_data_jmp, 1);
}

static void data_fault(const Run *r) {
  long long was = 0, is = 0;
  const char *file = data_mapped_file(&r->data, g_fault_addr, &was, &is);
  if (!file) die(5, "step %lld: reading the data %s failed (SIGBUS): did a data file change during the run?", (long long)r->step + 1, r->a.data);
  die(5, "step %lld: data file %s changed during the run: %lld bytes when opened, %lld now (truncated or rewritten?); stopping",
      (long long)r->step + 1, file, was, is);
}

/* A loader input (pv) or, pv NULL, the labels of micro-batch mb, under the SIGBUS guard. */
static void load_guarded(Run *r, const PrValue *pv, int mb, int slot, int64_t *labels) {
  if (sigsetjmp(g_data_jmp, 1)) {
    g_in_data = 0;
    data_fault(r);
  }
  g_in_data = 1;
  if (pv) load_input(r, pv, mb, slot);
  else load_labels(r, mb, labels);
  g_in_data = 0;
}

static void guard_data_reads(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_old_sigbus);
}

/* The loader's scratch, sized once the data is open: nothing is allocated in the step loop. */
static void alloc_scratch(Run *r) {
  const PrStage *st = r->st;
  int64_t T = 1;
  for (int v = 0; v < st->nrecv; v++)
    if (st->recv[v].source == PR_FROM_TOKENS && st->recv[v].dims[1] > T) T = st->recv[v].dims[1];
  r->in_labels = malloc(sizeof(int64_t) * (size_t)st->mb_size);
  r->in_y = malloc(sizeof(int64_t) * (size_t)(st->mb_size * T));
  r->lab_x = malloc(sizeof(int64_t) * (size_t)(st->loss_rows + 1));
  int64_t img = r->have_data && r->data.kind != DATA_TOKENS ? (int64_t)st->mb_size * r->data.c * r->data.h * r->data.w : 1;
  r->lab_img = malloc(sizeof(float) * (size_t)img);
  if (!r->in_labels || !r->in_y || !r->lab_x || !r->lab_img) die(2, "out of memory for the loader's buffers");
}

static double do_forward(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_sends(r, a->slot); /* the forward writes the slot's outgoing values */
  if (a->xslot >= 0) wait_xslot_free(r, a->xslot);
  double l0 = now();
  for (int v = 0; v < st->nrecv; v++)
    if (st->recv[v].source != PR_FROM_PREV) load_guarded(r, &st->recv[v], a->mb, a->slot, NULL);
  r->prof.load += now() - l0;
  wait_message(r, r->rreq + (size_t)a->slot * st->nrecv, st->nrecv, r->trreq_f + a->slot * r->nfsrc, r->tgot_f + a->slot * r->nfsrc, r->fsrc,
               r->nfsrc, "the forward values of a micro-batch");
  double t0 = now(), loss = 0;
  (r->in_val && st->forward_eval ? st->forward_eval : st->forward)(a->slot, a->xslot);
  if (st->loss) {
    int64_t *labels = (int64_t *)(st->arena + st->labels_offset);
    double t1 = now();
    load_guarded(r, NULL, a->mb, a->slot, labels);
    double t2 = now();
    loss = st->loss(a->slot, labels);
    r->prof.load += t2 - t1, r->prof.loss += now() - t2;
  }
  double dt = now() - t0;
  r->t_compute += dt;
  if (st->nprof) prof_action(a->kind, dt);
  return loss;
}

/* ---- the memory plan's transfers ---- */

/* Offload traffic has a communicator of its own; its tag names the step, the
 * micro-batch and the direction (0: to the peer, 1: back to the owner). */
static int otag(int64_t step, int mb, int back) { return ((int)(step % 64) * 4096 + mb % 4096) * 2 + back; }

/* Waits for the file's copies of xslot (the I/O thread), under the watchdog. */
static void wait_file(Run *r, int xslot, const char *what) {
  if (!r->xfer) return;
  double t0 = now();
  int waited = 0;
  while (xfer_pending(r->xfer, xslot)) {
    if (now() - t0 > r->timeout) die(4, "step %lld: the offload file's I/O took more than %.1f s (%s); stopping", (long long)r->step + 1, r->timeout, what);
    xfer_nap(r->xfer), waited = 1;
  }
  /* Whether or not this xslot waited: a copy that failed is not retried, and what it left must not be read. */
  const char *e = xfer_error(r->xfer);
  if (e) die(5, "step %lld: offloading activations failed: %s", (long long)r->step + 1, e);
  if (!waited) return;
  double t1 = now();
  r->t_wait += t1 - t0, r->t_xfer_wait += t1 - t0;
  trace_add(&r->trace, -1, r->cur->mb, r->cur->slot, r->step, t0, t1);
}

/* Before an xslot takes another micro-batch's values: the copy out of it is done. */
static void wait_xslot_free(Run *r, int xslot) {
  const PrStage *st = r->st;
  if (st->offload_to >= 0) {
    double t0 = now();
    wait_all(r, &r->oreq[xslot], 1, st->offload_to, "to take offloaded activations");
    r->t_xfer_wait += now() - t0;
  } else {
    wait_file(r, xslot, "writing offloaded activations");
  }
}

/* Before the values in an xslot are read: the copy in is done. */
static void wait_xslot_in(Run *r, int xslot) {
  const PrStage *st = r->st;
  if (st->offload_to >= 0) {
    double t0 = now();
    wait_all(r, &r->ireq[xslot], 1, st->offload_to, "to send back offloaded activations");
    r->t_xfer_wait += now() - t0;
  } else {
    wait_file(r, xslot, "reading offloaded activations back");
  }
}

static unsigned char *xblock(const Run *r, int xslot) { return r->st->arena + r->st->xslot_base + (int64_t)xslot * r->st->xslot_bytes; }

static void do_offload(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  if (st->offload_to >= 0) {
    wait_all(r, &r->oreq[a->xslot], 1, st->offload_to, "to take offloaded activations");
    r->sent_bytes += (double)st->xout_bytes;
    MPI_Isend(xblock(r, a->xslot), (int)st->xout_bytes, MPI_BYTE, st->offload_to, otag(r->step, a->mb, 0), r->ocomm, &r->oreq[a->xslot]);
  } else {
    r->sent_bytes += (double)st->xout_bytes;
    xfer_submit(r->xfer, 1, a->xslot, xblock(r, a->xslot), st->xout_bytes, (int64_t)a->mb * st->xout_bytes);
  }
}

static void do_prefetch(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_xslot_free(r, a->xslot);
  if (st->offload_to >= 0)
    MPI_Irecv(xblock(r, a->xslot), (int)st->xout_bytes, MPI_BYTE, st->offload_to, otag(r->step, a->mb, 1), r->ocomm, &r->ireq[a->xslot]);
  else
    xfer_submit(r->xfer, 0, a->xslot, xblock(r, a->xslot), st->xout_bytes, (int64_t)a->mb * st->xout_bytes);
}

static unsigned char *store(const Run *r, int y) { return r->st->arena + r->st->store_base + (int64_t)y * r->st->store_bytes; }

static void do_hold(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_all(r, &r->hreq[a->xslot], 1, a->peer, "to take back the activations it offloaded here");
  MPI_Irecv(store(r, a->xslot), (int)st->store_bytes, MPI_BYTE, a->peer, otag(r->step, a->mb, 0), r->ocomm, &r->hreq[a->xslot]);
}

static void do_return(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  wait_all(r, &r->hreq[a->xslot], 1, a->peer, "the activations it offloads here");
  r->sent_bytes += (double)st->store_bytes;
  MPI_Isend(store(r, a->xslot), (int)st->store_bytes, MPI_BYTE, a->peer, otag(r->step, a->mb, 1), r->ocomm, &r->hreq[a->xslot]);
}

static void do_recompute(Run *r, const PrAction *a) {
  wait_xslot_in(r, a->xslot);
  double t0 = now();
  r->st->recompute(a->slot, a->xslot);
  r->t_compute += now() - t0;
}

static void do_backward(Run *r, const PrAction *a, void (*fn)(int, int, int)) {
  const PrStage *st = r->st;
  if (a->kind != PR_W) {
    if (!st->loss)
      wait_message(r, r->greq + (size_t)a->gslot * st->nsend, st->nsend, r->trreq_g + a->gslot * r->ngsrc, r->tgot_g + a->gslot * r->ngsrc,
                   r->gsrc, r->ngsrc, "the gradients of a micro-batch");
    wait_all(r, r->srreq + (size_t)a->slot * st->nstash_recv, st->nstash_recv, -1, "the stashed values of a micro-batch");
    wait_grad_sends(r, a->gslot); /* it writes the gradients sent back from gslot */
  }
  if (a->xslot >= 0) wait_xslot_in(r, a->xslot);
  double t0 = now();
  fn(a->slot, a->xslot, a->gslot);
  double dt = now() - t0;
  r->t_compute += dt;
  if (st->nprof) prof_action(a->kind, dt);
}

static void optimizer_step(Run *r);

/* Runs one action; returns the loss it adds (F on the last stage). */
static double run_action(Run *r, const PrAction *a) {
  const PrStage *st = r->st;
  r->cur = a;
  if (a->kind == PR_F || a->kind == PR_B || a->kind == PR_I || a->kind == PR_W || a->kind == PR_RECOMPUTE)
    pr_rand.step = r->step, pr_rand.mb = a->mb; /* the backward (and a recomputation) redraws the forward's Dropout masks */
  switch (a->kind) {
  case PR_F: return do_forward(r, a);
  case PR_B: do_backward(r, a, st->backward); break;
  case PR_I: do_backward(r, a, st->backward_input); break;
  case PR_W: do_backward(r, a, st->backward_weight); break;
  case PR_SEND: do_send(r, a); break;
  case PR_RECV: do_recv(r, a); break;
  case PR_SEND_GRAD: do_send_grad(r, a); break;
  case PR_RECV_GRAD: do_recv_grad(r, a); break;
  case PR_UPDATE: {
    wait_all(r, r->wreq, st->nwsend, -1, "to take the last step's weights"); /* pipefb: the update rewrites what they send */
    double t0 = now();
    /* async: the weights before this update stay, for the steps that compute on them; the update writes the newest. */
    if (st->nwversions)
      memcpy(st->arena + st->wversion_base + (r->step % st->nwversions) * st->wversion_bytes, st->arena, (size_t)st->weights_bytes);
    optimizer_step(r);
    r->nupdates = r->step + 1;
    r->prof.update += now() - t0;
    break;
  }
  case PR_OFFLOAD: do_offload(r, a); break;
  case PR_PREFETCH: do_prefetch(r, a); break;
  case PR_RECOMPUTE: do_recompute(r, a); break;
  case PR_HOLD: do_hold(r, a); break;
  case PR_RETURN: do_return(r, a); break;
  case PR_SEND_STASH: do_send_stash(r, a); break;
  case PR_RECV_STASH: do_recv_stash(r, a); break;
  case PR_SEND_WEIGHTS: do_send_weights(r); break;
  case PR_RECV_WEIGHTS: do_recv_weights(r); break;
  default: die(2, "action kind %d is not supported by this runtime (regenerate with pipecc)", a->kind);
  }
  return 0;
}

/* Runs action a and times it: the trace span, and the busy time of a compute action (F, B, I, W,
 * RECOMPUTE, UPDATE: its wall time, a core shared with another rank included, less its waits for
 * messages and transfers, which are bubble).  Returns the loss it adds. */
static double timed_action(Run *r, const PrAction *a, int64_t step) {
  double w0 = r->t_wait, a0 = now();
  double loss = run_action(r, a);
  double a1 = now();
  trace_add(&r->trace, a->kind, a->mb, a->kind == PR_SEND_GRAD || a->kind == PR_RECV_GRAD ? a->gslot : a->slot, step, a0, a1);
  if (a->kind == PR_F || a->kind == PR_B || a->kind == PR_I || a->kind == PR_W || a->kind == PR_RECOMPUTE || a->kind == PR_UPDATE)
    r->t_busy += (a1 - a0) - (r->t_wait - w0);
  return loss;
}

/* Adds a step's busy time (t_busy less busy0) and wall time to the bubble's sums: the first step of
 * the run warms pages and caches, and counts only when it is the only one. */
static void bubble_step(Run *r, int64_t step, int64_t first, double busy0, double wall) {
  if (step == first && r->a.steps - first > 1) return;
  r->bub_busy += r->t_busy - busy0, r->bub_wall += wall;
}

const char *pr_kind_name(int kind) {
  static const char *names[PR_NKINDS] = {"F", "B", "I", "W", "SEND", "RECV", "SEND_GRAD", "RECV_GRAD", "UPDATE",
                                         "OFFLOAD", "PREFETCH", "RECOMPUTE", "HOLD", "RETURN", "SEND_STASH", "RECV_STASH",
                                         "SEND_WEIGHTS", "RECV_WEIGHTS"};
  return kind >= 0 && kind < PR_NKINDS ? names[kind] : "?";
}

/* ---- the optimizer ---- */

static double lr_at(const Run *r, int64_t step) {
  double lr = r->a.have_lr ? r->a.lr : r->st->lr;
  if (r->a.warmup > 0 && step < r->a.warmup) return lr * (double)(step + 1) / (double)r->a.warmup;
  if (!strcmp(r->a.lr_schedule, "cosine")) {
    double span = (double)(r->a.steps - r->a.warmup), t = (double)(step - r->a.warmup);
    double min = r->a.min_lr;
    return min + 0.5 * (lr - min) * (1 + cos(M_PI * (span > 0 ? t / span : 1)));
  }
  return lr;
}

static void check_finite(const Run *r, const char *what, const char *name, const float *x, int64_t n) {
  /* A pass over the exponent bits that vectorises (all ones: Inf or NaN); the element is looked for only
   * when there is one. */
  const uint32_t *b = (const uint32_t *)x;
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad |= (b[i] & 0x7f800000u) == 0x7f800000u;
  if (!bad) return;
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(x[i]))
      die(3, "step %lld: %s of '%s' is %s at element %lld; stopping (lower --lr?)", (long long)r->step + 1, what, name,
          isnan(x[i]) ? "NaN" : "Inf", (long long)i);
}

/* Tied weights: every stage holding one sends the parts it computed to the
 * other holders and receives theirs, then sums all parts in graph order, so
 * each copy gets the same gradient, bit for bit, and the same update. */
static int tie_tag(const PrParam *p, int part) {
  uint64_t h = 1469598103934665603ull;
  for (const char *c = p->name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  return TAG_SPAN + (int)(h % 4096) * 1024 + part % 1024; /* the same on every stage; messages of one pair keep their order */
}

/* Moves each tied weight's parts computed here to the other stages holding it, and theirs here; the
 * stage program's sum_ties() then adds them up in graph order. */
static void exchange_ties(Run *r) {
  const PrStage *st = r->st;
  for (int i = 0; i < st->nparams; i++) {
    const PrParam *p = &st->params[i];
    if (!p->nparts) continue;
    int bytes = (int)(p->count * 4), n = 0;
    MPI_Request *req = r->tie_req;
    for (int j = 0; j < p->nparts; j++) {
      unsigned char *buf = st->arena + p->parts[j].offset;
      if (p->parts[j].stage != st->stage) {
        MPI_Irecv(buf, bytes, MPI_BYTE, p->parts[j].stage, tie_tag(p, j), MPI_COMM_WORLD, &req[n++]);
        continue;
      }
      /* To every other holder, once each. */
      for (int h = 0; h < p->nparts; h++) {
        int to = p->parts[h].stage, seen = to == st->stage;
        for (int e = 0; e < h && !seen; e++) seen = p->parts[e].stage == to;
        if (!seen) MPI_Isend(buf, bytes, MPI_BYTE, to, tie_tag(p, j), MPI_COMM_WORLD, &req[n++]), r->sent_bytes += bytes;
      }
    }
    wait_all(r, req, n, -1, "to exchange a tied weight's gradient parts");
  }
}

/* UPDATE: the tied sums, a check that every gradient is finite (naming the first weight that is not),
 * then the stage program's update() with this step's hyper-parameters. */
static void optimizer_step(Run *r) {
  const PrStage *st = r->st;
  exchange_ties(r);
  if (st->sum_ties) st->sum_ties();
  float mom = r->a.have_momentum ? (float)r->a.momentum : st->momentum;
  for (int i = 0; i < st->nparams; i++) {
    const PrParam *p = &st->params[i];
    check_finite(r, "the gradient", p->name, (const float *)(st->arena + p->goffset), p->count);
    if (st->optimizer == PR_SGD && mom != 0 && p->m1offset < 0) die(2, "--momentum needs the optimizer state: compile with pipecc --momentum X");
  }
  pr_opt = (OptCtx){.lr = (float)lr_at(r, r->step), .momentum = mom,
                    .weight_decay = r->a.have_wd ? (float)r->a.weight_decay : st->weight_decay, .beta1 = st->beta1,
                    .beta2 = st->beta2, .eps = st->eps, .step = r->step};
  unsigned char *was = pr_weights;
  pr_weights = st->arena; /* async: the update writes the newest weights */
  if (st->update) st->update();
  pr_weights = was;
}

/* ---- checkpoints ----
 *
 * DIR/MANIFEST names the committed checkpoint; its stage files are in a
 * directory of their own, DIR/step-<S>-<run id>/stage_<k>.ckpt.  A new
 * checkpoint goes into a new directory beside the committed one: each rank
 * writes its file under a temporary name, fsyncs it and renames it; rank 0
 * gathers every file's size and checksum, writes MANIFEST.tmp (the step, the
 * plan, the files, and last the manifest's own checksum), fsyncs it and
 * renames it over MANIFEST.  That rename is the commit: a crash before it
 * leaves the previous checkpoint in force, a crash after it the new one.  Only
 * then are the other step directories removed.  --resume checks the
 * manifest's checksum, that the plan is this one (naming what differs), and
 * each file's size, FNV-1a 64 checksum and step. */

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
  for (int i = 0; i < st->nparams; i++) {
    if (st->params[i].m1offset >= 0) off[*n] = st->params[i].m1offset, len[(*n)++] = st->params[i].count * 4;
    if (st->params[i].m2offset >= 0) off[*n] = st->params[i].m2offset, len[(*n)++] = st->params[i].count * 4;
  }
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
  for (int i = 0; i < n; i++) ck_write(&w, st->arena + off[i], len[i]);
  free(off), free(len);
  ck_finish(&w, tmp, path, d);
  return (CkptInfo){st->arena_bytes, st->weights_bytes, total, h.sched, h.prog, w.fnv};
}

/* The manifest's text, its own checksum on the last line. */
static char *manifest_text(const Run *r, const char *sub, const CkptInfo *all, size_t *len) {
  const PrStage *st = r->st;
  size_t cap = 1024 + 256 * (size_t)st->nstages + strlen(st->model), n = 0;
  char *t = malloc(cap);
  n += (size_t)snprintf(t + n, cap - n, "pipecc-checkpoint 2\nstep %lld\nmodel %s\nstages %d\nbatch %d microbatches %d\ndir %s\n",
                        (long long)r->step, st->model, st->nstages, st->batch, st->microbatches, sub);
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

/* Removes DIR's step directories other than `keep`: older checkpoints, and
 * what a crash left of uncommitted ones. */
static void remove_old(const char *dir, const char *keep) {
  DIR *dd = opendir(dir);
  struct dirent *e;
  while (dd && (e = readdir(dd))) {
    if (strncmp(e->d_name, "step-", 5) || !strcmp(e->d_name, keep)) continue;
    char sub[4400];
    snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
    DIR *sd = opendir(sub);
    struct dirent *f;
    while (sd && (f = readdir(sd))) {
      char p[8800];
      if (f->d_name[0] == '.') continue;
      snprintf(p, sizeof p, "%s/%s", sub, f->d_name);
      if (unlink(p) == 0) crash_point();
    }
    if (sd) closedir(sd);
    rmdir(sub);
  }
  if (dd) closedir(dd);
}

/* Rank 0, once every stage file is written: the commit. */
static void commit_manifest(const Run *r, const char *dir, const char *sub, const CkptInfo *all) {
  char path[4200], tmp[4300];
  snprintf(path, sizeof path, "%s/MANIFEST", dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
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

/* Nothing non-finite is written (a checkpoint, --save): resuming from NaN
 * weights could only reproduce them.  0, or -1 with msg naming the tensor. */
static int weights_finite(const Run *r, const char *what, char *msg, size_t len) {
  const PrStage *st = r->st;
  for (int i = 0; i < st->nparams; i++) {
    const float *w = (const float *)(st->arena + st->params[i].offset);
    for (int64_t k = 0; k < st->params[i].count; k++)
      if (!isfinite(w[k]))
        return snprintf(msg, len, "after step %lld: weight '%s' is %s at element %lld; not writing %s of non-finite weights",
                        (long long)r->step, st->params[i].name, isnan(w[k]) ? "NaN" : "Inf", (long long)k, what), -1;
  }
  return 0;
}

static void save_checkpoint(Run *r, const char *dir) {
  const PrStage *st = r->st;
  char msg[1024] = "";
  /* Every stage checks before any writes: no stage file of a refused checkpoint is left behind. */
  agree(weights_finite(r, "a checkpoint", msg, sizeof msg) == 0, msg);
  char sub[64];
  snprintf(sub, sizeof sub, "step-%08lld-%08x", (long long)r->step, r->run_id);
  CkptInfo mine = write_stage_file(r, dir, sub), *all = st->stage == 0 ? malloc(sizeof mine * (size_t)st->nstages) : NULL;
  MPI_Request req;
  MPI_Igather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, 0, MPI_COMM_WORLD, &req);
  wait_watched(r, &req, 1, -1, "for every stage's checkpoint file");
  if (st->stage == 0) commit_manifest(r, dir, sub, all);
  free(all);
}

/* ---- --resume: the committed checkpoint, verified ---- */

typedef struct Manifest {
  long long step;
  int stages, batch, microbatches;
  char model[1024], sub[256];
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
        sscanf(line, "model %1023[^\n]", m->model) == 1)
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
  if (strcmp(base_name(m->model), base_name(st->model)))
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
    ok = fread(st->arena + off[i], 1, (size_t)ln[i], f) == (size_t)ln[i];
    fnv = fnv1a(fnv, st->arena + off[i], (size_t)ln[i]);
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

static void load_checkpoint(Run *r, const char *dir) {
  char msg[2048] = "";
  Manifest m;
  int ok = read_manifest(r, dir, &m, msg, sizeof msg) == 0 && same_plan(r->st, dir, &m, msg, sizeof msg) == 0 &&
           read_stage_file(r, dir, &m, msg, sizeof msg) == 0;
  agree(ok, msg);
}

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
    if (ok && p->m1offset >= 0) ok = !write_all(fd, st->arena + p->m1offset, (size_t)p->count * 4);
    if (ok && p->m2offset >= 0) ok = !write_all(fd, st->arena + p->m2offset, (size_t)p->count * 4);
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

static void freeze_write(Run *r) {
  const PrStage *st = r->st;
  char sub[4200], path[4400], msg[4600] = "", text[256];
  snprintf(sub, sizeof sub, "%s/freeze-%lld", r->a.freeze_dir, (long long)r->step);
  int ok = 1;
  if (r->rank == 0 && ((mkdir(r->a.freeze_dir, 0755) && errno != EEXIST) || (mkdir(sub, 0755) && errno != EEXIST)))
    ok = 0, snprintf(msg, sizeof msg, "cannot create the freeze checkpoint %s: %s", sub, strerror(errno));
  agree(ok, msg);
  agree(weights_finite(r, "a freeze checkpoint", msg, sizeof msg) == 0, msg);
  snprintf(path, sizeof path, "%s/model.onnx", sub);
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
    else if (!r->a.quiet) printf("freeze after step %lld: the first %d parameterised layers; checkpoint %s\n", (long long)r->step, r->freeze_to, sub);
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
    size_t at = 0;
    int recs, used;
    if (sscanf((char *)b, "PIPEOPT1 %d\n%n", &recs, &used) != 1 || recs < 0) {
      free(b), free(found);
      return snprintf(msg, len, "--resume-freeze %s: %s is not an optimizer-state file", sub, path), -1;
    }
    at = (size_t)used;
    for (int q = 0; q < recs; q++) {
      unsigned long nl;
      long long count;
      int h1, h2;
      if (at >= n || sscanf((char *)b + at, "%lu %lld %d %d\n%n", &nl, &count, &h1, &h2, &used) != 4 || count < 0 ||
          at + (size_t)used + nl + (size_t)(h1 + h2) * (size_t)count * 4 > n) {
        free(b), free(found);
        return snprintf(msg, len, "--resume-freeze %s: %s is truncated or corrupt (record %d)", sub, path, q), -1;
      }
      at += (size_t)used;
      const char *name = (char *)b + at;
      at += nl;
      for (int i = 0; i < st->nparams; i++) {
        const PrParam *p = &st->params[i];
        if (strlen(p->name) != nl || memcmp(p->name, name, nl)) continue;
        if (count != p->count || h1 != (p->m1offset >= 0) || h2 != (p->m2offset >= 0)) {
          free(b), free(found);
          return snprintf(msg, len, "--resume-freeze %s: weight '%s' has %lld elements and %d optimizer slots there, this plan "
                                    "%lld and %d", sub, p->name, count, h1 + h2, (long long)p->count, (p->m1offset >= 0) + (p->m2offset >= 0)), -1;
        }
        if (h1) memcpy(st->arena + p->m1offset, b + at, (size_t)count * 4);
        if (h2) memcpy(st->arena + p->m2offset, b + at + (size_t)h1 * (size_t)count * 4, (size_t)count * 4);
        found[i] = 1;
      }
      at += (size_t)(h1 + h2) * (size_t)count * 4;
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
  MPI_Barrier(MPI_COMM_WORLD);
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
static void auto_freeze(Run *r) {
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
    const float *g = (const float *)(st->arena + p->goffset);
    double acc = 0;
    for (int64_t k = 0; k < p->count; k++) acc += (double)g[k] * g[k];
    sq[p->layer] += acc;
  }
  for (int l = 0; l < L; l++) r->gnorm[l] += sqrt(sq[l]);
  if ((r->step + 1) % r->a.freeze_every) return;
  MPI_Allreduce(MPI_IN_PLACE, r->gnorm, L, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  int k = st->nfrozen;
  if (r->have_prev)
    while (k < L - 1 && r->gprev[k] > 0 && fabs(r->gnorm[k] - r->gprev[k]) / r->gprev[k] < r->a.freeze_threshold) k++;
  if (r->rank == 0 && !r->a.quiet && r->have_prev) {
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

/* ---- run.sh --val: a forward-only pass over a held-out set ----
 * Between two steps of a synchronous schedule every ring is free, so each
 * rank runs, per held-out micro-batch, its RECV, F and SEND through ring
 * slot 0, with the held-out set in place of the training one (batches in
 * order, unshuffled; whole batches only).  Each F is the stage's eval
 * forward (forward_eval where the compiler emitted one: training-mode
 * BatchNorm on its running statistics, Dropout off).  The last rank sums the
 * loss and counts the rows whose largest logit is the label. */
static void val_open(Run *r) {
  const PrStage *st = r->st;
  char msg[1024] = "";
  int ok = 1;
  if (st->staleness || st->role != PR_ROLE_BOTH) ok = 0, snprintf(msg, sizeof msg, "--val: async and pipefb programs do not validate yet");
  else if (needs_data(st)) {
    ok = data_open(&r->val, r->a.val, (r->data.kind == DATA_TOKENS ? DATA_TOKENS : 0) | DATA_HELD_OUT, msg, sizeof msg) == 0;
    if (ok && r->val.kind != r->data.kind) ok = 0, snprintf(msg, sizeof msg, "--val %s is not in the training data's format", r->a.val);
    if (ok && r->val.kind != DATA_TOKENS && (r->val.c != r->data.c || r->val.h != r->data.h || r->val.w != r->data.w))
      ok = 0, snprintf(msg, sizeof msg, "--val %s: images of %dx%dx%d, the training data's are %dx%dx%d", r->a.val, r->val.c, r->val.h,
                       r->val.w, r->data.c, r->data.h, r->data.w);
    if (ok && r->val.kind != DATA_TOKENS && st->loss)
      ok = data_check_images(&r->val, r->val.c, r->val.h, r->val.w, (int)st->loss_classes, msg, sizeof msg) == 0;
    if (ok && r->val.kind != DATA_TOKENS && r->val.n < st->batch)
      ok = 0, snprintf(msg, sizeof msg, "--val %s has %lld samples, fewer than one batch of %d", r->a.val, (long long)r->val.n, st->batch);
  }
  agree(ok, msg);
}

static void val_pass(Run *r, int64_t after) {
  const PrStage *st = r->st;
  int64_t nb = 0, T = 1; /* whole batches of the held-out set; every rank learns the data ranks' count */
  for (int v = 0; v < st->nrecv; v++)
    if (st->recv[v].source == PR_FROM_TOKENS) T = st->recv[v].dims[1];
  if (st->loss && r->val.kind == DATA_TOKENS) T = st->loss_rows / st->mb_size;
  if (needs_data(st)) nb = r->val.kind == DATA_TOKENS ? (r->val.n - 1) / ((int64_t)st->batch * T) : r->val.n / st->batch;
  MPI_Allreduce(MPI_IN_PLACE, &nb, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  DataSet train = r->data;
  int64_t step = r->step, *idx = r->idx;
  r->data = r->val;
  r->in_val = 1;
  double loss = 0, hits = 0;
  for (int64_t v = 0; v < nb; v++) {
    r->step = v; /* the tags and the token loader's batch; nothing of training is in flight between steps */
    for (int i = 0; i < st->batch; i++) r->idx[i] = v * st->batch + i;
    for (int k = 0; k < st->microbatches; k++) {
      PrAction a = {PR_RECV, k, 0, 0, st->nxslots ? 0 : -1, -1}; /* between steps no transfer holds copy 0 of the leaving block */
      r->cur = &a; /* the loader and the trace read the running action */
      do_recv(r, &a);
      a.kind = PR_F;
      double l = do_forward(r, &a);
      if (st->loss) {
        loss += l;
        const float *z = (const float *)(st->arena + st->logits_offset);
        const int64_t *y = (const int64_t *)(st->arena + st->labels_offset);
        for (int64_t row = 0; row < st->loss_rows; row++) {
          int64_t best = 0;
          for (int64_t c = 1; c < st->loss_classes; c++)
            if (z[row * st->loss_classes + c] > z[row * st->loss_classes + best]) best = c;
          hits += best == y[row];
        }
      }
      a.kind = PR_SEND;
      do_send(r, &a);
    }
  }
  r->data = train, r->step = step, r->idx = idx, r->in_val = 0;
  if (!st->loss || !nb) return;
  double rows = (double)nb * st->microbatches * st->loss_rows;
  loss /= rows;
  if (!r->a.quiet) printf("validation after step %lld: loss %.6f, accuracy %.2f%% (%.0f rows)\n", (long long)after, loss, 100 * hits / rows, rows);
  if (r->val_log) fprintf(r->val_log, "%lld,%.9g,%.9g\n", (long long)after, loss, hits / rows), fflush(r->val_log);
  fflush(stdout);
}

/* ---- the step loop ---- */

typedef struct StepLog {
  FILE *log;
  double t_start;
  int64_t first_step;
  double first_loss, last_loss;
} StepLog;

/* Weight gradients (and this stage's parts of tied ones) start each step at zero. */
/* A step's gradients start from zero (the stage program's zero_grads(): its weight gradients and the
 * tied parts it computes). */
static void zero_grads(Run *r) {
  if (r->st->zero_grads) r->st->zero_grads();
}

/* After step r->step (its loss summed over its micro-batches on the loss
 * rank, dt its seconds): the log line, the profile's warm-up, the checkpoint. */
static void end_step(Run *r, StepLog *sl, double loss, double dt) {
  const PrStage *st = r->st;
  if (st->loss) {
    loss /= (double)(st->loss_rows * st->microbatches);
    if (!isfinite(loss)) die(3, "step %lld: the loss is %s; stopping (lower --lr?)", (long long)r->step + 1, isnan(loss) ? "NaN" : "Inf");
    if (r->step == sl->first_step) sl->first_loss = loss;
    sl->last_loss = loss;
    double elapsed = now() - sl->t_start, sps = st->batch / dt;
    double eta = elapsed / (double)(r->step + 1 - sl->first_step) * (double)(r->a.steps - r->step - 1);
    if (sl->log) fprintf(sl->log, "%lld,%.9g,%.1f,%.6f\n", (long long)r->step + 1, loss, sps, r->elapsed0 + elapsed); /* the run's time */
    if (!r->a.quiet)
      printf("step %lld/%lld  loss %.6f  %.1f samples/s  eta %.1f s\n", (long long)r->step + 1, (long long)r->a.steps, loss, sps, eta);
    fflush(stdout);
  }
  /* The first steps warm caches and pages (a quarter of the run, at least one): not profiled. */
  if (st->nprof) prof_end_step(&r->prof, r->step >= sl->first_step + r->prof_warm);
  if (r->a.checkpoint && (r->step + 1) % r->a.ckpt_every == 0) {
    r->step++;
    save_checkpoint(r, r->a.checkpoint);
    r->step--;
  }
  if (r->a.val && r->a.val_every && (r->step + 1) % r->a.val_every == 0) val_pass(r, r->step + 1);
  if (r->a.freeze_auto) auto_freeze(r);
  /* A freeze event that freezes more than this program has frozen ends the run after this step. */
  for (int k = 0; k < r->a.nfreeze; k++)
    if (r->a.freeze_step[k] == r->step + 1 && r->a.freeze_layers[k] > st->nfrozen && r->step + 1 < r->a.steps)
      r->freeze_to = r->a.freeze_layers[k], r->a.steps = r->step + 1;
}

/* ---- async ----
 * The body runs once per step t from first - lookahead: an action of
 * micro-batch k is the run's micro-batch g = t*m + k, of step g / m, run
 * only when that step is one of this run's (before: the fill; after the
 * last: the drain).  Each F and B computes on its step's weight version. */

static unsigned char *weights_for(Run *r, int64_t step) {
  const PrStage *st = r->st;
  int64_t v = step > st->staleness ? step - st->staleness : 0;
  if (v == r->nupdates || !st->nwversions) return st->arena;
  if (v > r->nupdates || v < r->nupdates - st->nwversions)
    die(2, "internal error: step %lld needs the weights of step %lld; the newest are step %lld's and %d older are kept", (long long)step + 1,
        (long long)v, (long long)r->nupdates, st->nwversions);
  return st->arena + st->wversion_base + (v % st->nwversions) * st->wversion_bytes;
}

/* The sample indices of step `step`'s batch (computed once per step). */
static void batch_of(Run *r, int64_t step) {
  const PrStage *st = r->st;
  int64_t k = step % (st->lookahead + 1);
  r->idx = r->idx_ring + k * st->batch;
  if (r->idx_of[k] != step) data_batch_indices(&r->data, step, st->batch, r->a.seed, r->a.shuffle, r->idx), r->idx_of[k] = step;
}

static void async_body(Run *r, int64_t t, int64_t first) {
  const PrStage *st = r->st;
  int64_t m = st->microbatches, L1 = st->lookahead + 1;
  for (int k = 0; k < st->nactions; k++) {
    const PrAction *b = &st->actions[k];
    PrAction a = *b;
    int64_t step = t;
    if (b->kind == PR_UPDATE) {
      if (t < first) continue;
    } else {
      int64_t g = t * m + b->mb;
      if (g < first * m || g >= r->a.steps * m) continue;
      step = g / m, a.mb = (int)(g % m);
      if (b->slot >= 0) a.slot = (int)(g % st->nslots);
      if (b->gslot >= 0) a.gslot = (int)(g % st->ngslots);
    }
    r->step = step;
    if (a.kind == PR_F || a.kind == PR_B) {
      pr_weights = weights_for(r, step);
      if (a.kind == PR_F && r->have_data && r->data.kind != DATA_TOKENS) batch_of(r, step);
    }
    r->aloss[step % L1] += timed_action(r, &a, step);
    pr_weights = st->arena;
  }
  r->step = t;
}

static void run_async(Run *r, StepLog *sl) {
  const PrStage *st = r->st;
  int64_t first = r->step, L1 = st->lookahead + 1, *own = r->idx;
  r->nupdates = first;
  r->idx_ring = malloc(sizeof(int64_t) * (size_t)(L1 * st->batch));
  r->idx_of = malloc(sizeof(int64_t) * (size_t)L1);
  r->aloss = calloc((size_t)L1, sizeof(double));
  if (!r->idx_ring || !r->idx_of || !r->aloss) die(2, "out of memory for the async schedule's bookkeeping");
  for (int64_t k = 0; k < L1; k++) r->idx_of[k] = -1;
  for (int64_t t = first - st->lookahead; t < r->a.steps; t++) {
    double t0 = now(), busy0 = r->t_busy;
    if (t >= first) zero_grads(r); /* the body's backwards are all step t's, after step t-1's UPDATE */
    async_body(r, t, first);
    if (t < first) continue; /* the fill: forwards of the first steps only */
    double loss = r->aloss[t % L1], dt = now() - t0;
    r->aloss[t % L1] = 0;
    bubble_step(r, t, first, busy0, dt);
    end_step(r, sl, loss, dt);
  }
  r->step = r->a.steps;
  free(r->idx_ring), free(r->idx_of), free(r->aloss);
  r->idx_ring = r->idx_of = NULL, r->aloss = NULL, r->idx = own;
}

/* ---- the run ---- */

/* The directory a file will be written into must exist and be writable:
 * found out after the training, the trained weights would be lost. */
static int writable_dir_of(const char *flag, const char *file, char *msg, size_t len) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", file);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) slash[1] = 0;
  else *slash = 0;
  struct stat sb;
  if (stat(dir, &sb) || !S_ISDIR(sb.st_mode))
    return snprintf(msg, len, "%s %s: directory %s does not exist", flag, file, dir), -1;
  if (access(dir, W_OK)) return snprintf(msg, len, "%s %s: cannot write in %s: %s", flag, file, dir, strerror(errno)), -1;
  if (stat(file, &sb) == 0 && S_ISDIR(sb.st_mode)) return snprintf(msg, len, "%s %s: is a directory", flag, file), -1;
  return 0;
}

/* --checkpoint DIR is created now (its parent must exist), on every rank. */
static int checkpoint_dir_ok(const char *dir, char *msg, size_t len) {
  struct stat sb;
  if (mkdir(dir, 0755) && errno != EEXIST) return snprintf(msg, len, "--checkpoint %s: cannot create it: %s", dir, strerror(errno)), -1;
  if (stat(dir, &sb) || !S_ISDIR(sb.st_mode)) return snprintf(msg, len, "--checkpoint %s: not a directory", dir), -1;
  if (access(dir, W_OK)) return snprintf(msg, len, "--checkpoint %s: cannot write in it: %s", dir, strerror(errno)), -1;
  return 0;
}

/* Before step 1: everything the run will write can be written. */
static void check_outputs(Run *r) {
  char msg[1024] = "";
  int ok = 1;
  if (r->rank == 0 && r->a.save) ok = writable_dir_of("--save", r->a.save, msg, sizeof msg) == 0;
  if (ok && r->rank == 0 && r->a.trace) ok = writable_dir_of("--trace", r->a.trace, msg, sizeof msg) == 0;
  if (ok && r->rank == 0 && r->a.profile) ok = writable_dir_of("--profile", r->a.profile, msg, sizeof msg) == 0;
  if (ok && r->st->loss && r->a.log) ok = writable_dir_of("--log", r->a.log, msg, sizeof msg) == 0;
  if (ok && r->a.checkpoint) ok = checkpoint_dir_ok(r->a.checkpoint, msg, sizeof msg) == 0;
  agree(ok, msg);
}

/* Names this run's checkpoint directories apart from any earlier run's. */
static uint32_t make_run_id(void) {
  uint32_t id = (uint32_t)data_mix64((uint64_t)time(NULL) ^ (uint64_t)getpid() << 32 ^ (uint64_t)(now() * 1e9));
  MPI_Bcast(&id, 1, MPI_UINT32_T, 0, MPI_COMM_WORLD);
  return id;
}

static void on_signal(int sig) {
  char msg[96];
  int n = snprintf(msg, sizeof msg, "piperun: stage %d: stopped by signal %d (another stage failed?)\n", g_rank, sig);
  if (write(2, msg, (size_t)n) < 0) _exit(1);
  _exit(1);
}

int pr_main(int argc, char **argv, const PrStage *st) {
  if (argc == 2 && !strcmp(argv[1], "--blas-core")) { /* run.sh asks which kernels this host runs best */
    puts(blas_core_for_cpu());
    return 0;
  }
  const char *kernels = NULL;
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--blas-kernels")) kernels = argv[i + 1];
  int threads = st->threads > 0 ? st->threads : 1;
#ifdef PR_DNNL
  /* oneDNN runs on OpenMP, which fixes its thread count when it loads, from OMP_NUM_THREADS (else one
   * thread per core: ranks sharing cores would then fight over them).  It runs on one thread, so that
   * is set and, when it changes, the program runs itself again, as blas_core_pin does.  Under
   * pipecc --threads too: OpenMP's threads and par.c's, each spinning while it waits, took the cores
   * from each other (LeNet on 2 threads ran 8 times slower than on one), and a convolution split by
   * oneDNN gave other bits than on one thread (docs/kernels.md, "Threads"). */
  const char *omp = getenv("OMP_NUM_THREADS");
  if ((!omp || strcmp(omp, "1")) && !setenv("OMP_NUM_THREADS", "1", 1)) execv("/proc/self/exe", argv);
#endif
  blas_core_pin(argv, kernels);
  if (st->forward_only) return pr_eval(argc, argv, st);
  MPI_Init(&argc, &argv);
  int size;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  signal(SIGTERM, on_signal);
  guard_data_reads();
  if (size != st->nstages || g_rank != st->stage) {
    if (g_rank == 0)
      fprintf(stderr, "piperun: error: this is a %d-stage program; start it with run.sh (mpirun started %d ranks, stage %d got rank %d)\n",
              st->nstages, size, st->stage, g_rank);
    MPI_Finalize();
    return 2;
  }
  openblas_set_num_threads(1); /* --threads: gemm.c cuts the products over par.c's threads instead */
  check_blas_core(size);
#ifdef PR_DNNL
  pr_conv_lib_init(openblas_get_corename(), 1);
#endif
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  int *tag_ub, flag;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
  if (flag && *tag_ub < TAG_SPAN + 4096 * 1024)
    die(2, "this MPI allows tags up to %d; piperun needs %d", *tag_ub, TAG_SPAN + 4096 * 1024);
  Run r;
  memset(&r, 0, sizeof r);
  r.st = st;
  r.rank = g_rank;
  parse_args(&r.a, argc, argv);
  r.pinned_cpu = pin_rank(st, &r.a, &r.cpus);
  /* The kernels' own threads (par.h), after pinning: a pinned rank has one thread (the plan pins only then). */
  if (pr_par_init(threads, rank_cpus(threads))) die(2, "cannot start %d threads for this rank's kernels (pipecc --threads): %s", threads, strerror(errno));
  if (r.a.profile && !st->nprof) usage_error("--profile: these stages have no timing marks; compile them with pipecc --profile%s", "");
  if (r.a.profile && r.a.steps < 2) usage_error("--profile needs --steps 2 or more (the first quarter, at least one step, only warms up)%s", "");
  if (st->nprof) prof_init(st->nprof);
  pr_rand.seed = r.a.seed;
  char path[4096], msg[1024] = "";
  snprintf(path, sizeof path, "%s/weights/stage_%d.bin", pr_stage_dir(), st->stage);
  agree(load_file(path, st->arena, st->weights_bytes, msg, sizeof msg) == 0, msg);
  open_data(&r);
  check_outputs(&r);
  /* The watchdog: far beyond any wait a healthy step has, never under a minute. */
  r.timeout = r.a.timeout > 0 ? r.a.timeout : fmax(60, 100 * st->predicted_step_s);
  r.run_id = make_run_id();
  if (r.a.resume) load_checkpoint(&r, r.a.resume);
  if (r.a.val) val_open(&r);
  if (r.a.resume_freeze) load_freeze(&r, r.a.resume_freeze);
  else if (r.rank == 0 && r.a.freeze_dir) { /* a FREEZE this run did not write must not re-plan it */
    char stale[4200], aside[4300];
    snprintf(stale, sizeof stale, "%s/FREEZE", r.a.freeze_dir);
    snprintf(aside, sizeof aside, "%s.stale", stale);
    if (access(stale, F_OK) == 0) rename(stale, aside);
  }
  if ((r.a.nfreeze || r.a.freeze_auto) && (st->staleness || st->role != PR_ROLE_BOTH))
    usage_error("--freeze-at / --freeze auto: async and pipefb programs do not freeze layers yet%s", "");
  if ((r.a.nfreeze || r.a.freeze_auto) && !r.a.freeze_dir) usage_error("--freeze-at and --freeze auto need --freeze-dir DIR (run.sh gives it)%s", "");
  int ns = st->nslots, ngs = st->ngslots;
  r.rreq = malloc(sizeof(MPI_Request) * (size_t)(ns * st->nrecv + 1));
  r.sreq = malloc(sizeof(MPI_Request) * (size_t)(ns * st->nsend + 1));
  r.greq = malloc(sizeof(MPI_Request) * (size_t)(ngs * st->nsend + 1));
  r.gsreq = malloc(sizeof(MPI_Request) * (size_t)(ngs * st->nrecv + 1));
  for (int i = 0; i < ns * st->nrecv; i++) r.rreq[i] = MPI_REQUEST_NULL;
  for (int i = 0; i < ns * st->nsend; i++) r.sreq[i] = MPI_REQUEST_NULL;
  for (int i = 0; i < ngs * st->nsend; i++) r.greq[i] = MPI_REQUEST_NULL;
  for (int i = 0; i < ngs * st->nrecv; i++) r.gsreq[i] = MPI_REQUEST_NULL;
  /* Exposed communication: the send times that follow the messages, per slot and gslot. */
  MPI_Comm_dup(MPI_COMM_WORLD, &r.tcomm);
  r.fsrc = malloc(sizeof(int) * (size_t)(2 * st->nrecv + 2 * st->nsend + 4));
  if (!r.fsrc) die(2, "out of memory for the message bookkeeping%s", "");
  r.gdst = r.fsrc + st->nrecv + 1, r.fdst = r.gdst + st->nrecv + 1, r.gsrc = r.fdst + st->nsend + 1;
  r.nfsrc = peers_of(st->recv, st->nrecv, 0, r.fsrc), r.ngdst = peers_of(st->recv, st->nrecv, 1, r.gdst);
  r.nfdst = peers_of(st->send, st->nsend, 0, r.fdst), r.ngsrc = peers_of(st->send, st->nsend, 1, r.gsrc);
  int nts = ns * (r.nfsrc + r.nfdst) + ngs * (r.ngsrc + r.ngdst) + 1;
  r.tsent_f = calloc((size_t)nts, sizeof(double));
  r.tsreq_f = malloc(sizeof(MPI_Request) * (size_t)nts);
  if (!r.tsent_f || !r.tsreq_f) die(2, "out of memory for the message bookkeeping");
  r.tgot_f = r.tsent_f + ns * r.nfdst, r.tsent_g = r.tgot_f + ns * r.nfsrc, r.tgot_g = r.tsent_g + ngs * r.ngdst;
  r.trreq_f = r.tsreq_f + ns * r.nfdst, r.tsreq_g = r.trreq_f + ns * r.nfsrc, r.trreq_g = r.tsreq_g + ngs * r.ngdst;
  for (int i = 0; i < nts; i++) r.tsreq_f[i] = MPI_REQUEST_NULL;
  measure_clocks(&r);
  alloc_scratch(&r);
  /* The memory plan's state: requests per xslot and store slot, the file. */
  MPI_Comm_dup(MPI_COMM_WORLD, &r.ocomm);
  MPI_Comm_dup(MPI_COMM_WORLD, &r.fcomm);
  int nw = st->nwsend > st->nwrecv ? st->nwsend : st->nwrecv;
  r.ssreq = malloc(sizeof(MPI_Request) * (size_t)(st->nslots * st->nstash_send + st->nslots * st->nstash_recv + nw + 1));
  r.srreq = r.ssreq + st->nslots * st->nstash_send, r.wreq = r.srreq + st->nslots * st->nstash_recv;
  for (int i = 0; i < st->nslots * (st->nstash_send + st->nstash_recv) + nw; i++) r.ssreq[i] = MPI_REQUEST_NULL;
  int nx = st->nxslots, nst = st->nstore;
  r.oreq = malloc(sizeof(MPI_Request) * (size_t)(2 * nx + nst + 1));
  r.ireq = r.oreq + nx, r.hreq = r.oreq + 2 * nx;
  for (int i = 0; i < 2 * nx + nst; i++) r.oreq[i] = MPI_REQUEST_NULL;
  if (nx && st->offload_to == -1) {
    const char *dir = r.a.offload_dir ? r.a.offload_dir : st->offload_dir;
    /* The I/O thread may run on any of the CPUs the rank had before pin_rank: its copies fill
     * whichever core idles (the plan does not charge them to the rank's core). */
    cpu_set_t mine;
    int repin = r.pinned_cpu >= 0 && !sched_getaffinity(0, sizeof mine, &mine) && !sched_setaffinity(0, sizeof r.cpus, &r.cpus);
    r.xfer = xfer_open(dir && *dir ? dir : ".", st->stage, nx, r.timeout, msg, sizeof msg);
    if (repin) sched_setaffinity(0, sizeof mine, &mine);
    agree(r.xfer != NULL, msg);
  } else {
    agree(1, msg);
  }
  int most_parts = 1;
  for (int i = 0; i < st->nparams; i++) most_parts = st->params[i].nparts > most_parts ? st->params[i].nparts : most_parts;
  r.tie_req = malloc(sizeof(MPI_Request) * (size_t)most_parts * (size_t)st->nstages);
  /* The trace: one span per action, and room for waits; capped (a very long run keeps its first events). */
  if (r.a.trace) {
    int64_t cap = (r.a.steps - r.step) * st->nactions * 4 + 16;
    trace_init(&r.trace, cap < (1 << 22) ? cap : (1 << 22));
  }
  r.idx = malloc(sizeof(int64_t) * (size_t)st->batch);
  FILE *log = NULL;
  if (st->loss && r.a.log) {
    int cont = r.a.resume || r.a.resume_freeze;
    log = fopen(r.a.log, cont ? "a" : "w");
    if (!log) die(2, "cannot write --log %s: %s", r.a.log, strerror(errno));
    if (!cont) fprintf(log, "step,loss,samples_per_s,time_s\n");
    if (r.a.val) { /* LOG.val.csv: the held-out set's loss and accuracy */
      char vpath[4200];
      snprintf(vpath, sizeof vpath, "%s.val.csv", r.a.log);
      r.val_log = fopen(vpath, cont ? "a" : "w");
      if (!r.val_log) die(2, "cannot write %s: %s", vpath, strerror(errno));
      if (!cont) fprintf(r.val_log, "step,val_loss,val_accuracy\n");
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double t_start = now(), start0 = t_start + r.clock[0];
  /* The trace counts from the earliest rank's start (on rank 0's clock), on every rank, so that the ranks'
   * spans line up and none is before 0. */
  MPI_Allreduce(MPI_IN_PLACE, &start0, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  r.trace.start = start0 - r.clock[0];
  int64_t first_step = r.step;
  r.prof_warm = (r.a.steps - first_step) / 4 > 1 ? (r.a.steps - first_step) / 4 : 1;
  StepLog sl = {log, t_start, first_step, NAN, NAN};
  pr_weights = st->arena;
  g_poll_run = &r;
  if (st->staleness) {
    run_async(&r, &sl);
  } else {
    for (; r.step < r.a.steps; r.step++) {
      double t0 = now(), loss = 0, busy0 = r.t_busy;
      if (r.have_data && r.data.kind != DATA_TOKENS)
        data_batch_indices(&r.data, r.step, st->batch, r.a.seed, r.a.shuffle, r.idx);
      zero_grads(&r);
      for (int k = 0; k < st->nactions; k++) loss += timed_action(&r, &st->actions[k], r.step);
      double dt = now() - t0;
      bubble_step(&r, r.step, first_step, busy0, dt);
      end_step(&r, &sl, loss, dt);
    }
  }
  double first_loss = sl.first_loss, last_loss = sl.last_loss;
  /* The held-out set after the last step, unless --val-every just did it (or a freeze event stopped the run). */
  if (r.a.val && !r.freeze_to && !(r.a.val_every && r.step % r.a.val_every == 0)) val_pass(&r, r.step);
  g_poll_run = NULL;
  /* Drain what is still in flight. */
  static const PrAction drain = {PR_UPDATE, -1, -1, -1, -1, -1};
  r.cur = &drain;
  wait_all(&r, r.sreq, ns * st->nsend, r.nfdst ? r.fdst[0] : -1, "to take the last forward values");
  wait_all(&r, r.gsreq, ngs * st->nrecv, r.ngdst ? r.gdst[0] : -1, "to take the last gradients");
  wait_all(&r, r.ssreq, ns * st->nstash_send, -1, "to take the last stashed values");
  wait_all(&r, r.wreq, st->nwsend, -1, "to take the last weights");
  wait_all(&r, r.tsreq_f, ns * r.nfdst, -1, "to take the last send times");
  wait_all(&r, r.tsreq_g, ngs * r.ngdst, -1, "to take the last send times");
  for (int i = 0; i < ns * r.nfsrc + ngs * r.ngsrc; i++) {
    MPI_Request *q = i < ns * r.nfsrc ? &r.trreq_f[i] : &r.trreq_g[i - ns * r.nfsrc];
    if (*q != MPI_REQUEST_NULL) MPI_Cancel(q), MPI_Request_free(q);
  }
  MPI_Comm_free(&r.tcomm);
  free(r.clock);
  MPI_Comm_free(&r.fcomm);
  wait_all(&r, r.oreq, 2 * nx + nst, -1, "to finish moving offloaded activations");
  for (int x = 0; r.xfer && x < nx; x++) wait_file(&r, x, "the last offloaded activations");
  double xfer_how = !r.xfer ? 0 : !strcmp(xfer_kind(r.xfer), "io_uring") ? 1 : 2;
  xfer_close(r.xfer);
  MPI_Comm_free(&r.ocomm);
  /* The arena is static and the step loop allocates nothing: the end is the
   * peak.  What is not the arena (MPI's buffers, BLAS's, the loader's, the
   * libraries') is the runtime's overhead, the same whatever the plan. */
  r.rss_peak = rss_anon();
  r.rss_overhead = r.rss_peak - resident_bytes(st->arena, st->arena_bytes);
  for (int i = 0; i < ns * st->nrecv; i++)
    if (r.rreq[i] != MPI_REQUEST_NULL) MPI_Cancel(&r.rreq[i]), MPI_Request_free(&r.rreq[i]);
  for (int i = 0; i < ngs * st->nsend; i++)
    if (r.greq[i] != MPI_REQUEST_NULL) MPI_Cancel(&r.greq[i]), MPI_Request_free(&r.greq[i]);
  r.t_total = now() - t_start;
  if (r.a.trace) {
    if (r.trace.dropped && g_rank == 0) fprintf(stderr, "piperun: the trace kept its first %lld events\n", (long long)r.trace.cap);
    if (trace_write(&r.trace, r.a.trace, g_rank, st->nstages) && g_rank == 0) fprintf(stderr, "piperun: cannot write --trace %s\n", r.a.trace);
    trace_free(&r.trace);
  }
  if (log) fclose(log);
  if (r.val_log) fclose(r.val_log);
  if (r.a.profile) {
    if (prof_steps() == 0)
      die(2, "--profile: no step was measured (the run's first %lld step%s only warm up); run more --steps", (long long)r.prof_warm,
          r.prof_warm == 1 ? "" : "s");
    int64_t params = 0;
    for (int i = 0; i < st->nparams; i++) params += st->params[i].count;
    int rc = prof_write(r.a.profile, st->model, st->prof_nodes, st->nprof, params, r.prof_warm, st->mb_size, st->microbatches,
                        st->prof_rate, st->prof_conv, threads, g_rank, st->nstages, msg, sizeof msg);
    if (rc) die(2, "%s", msg);
  }
  if (r.freeze_to) freeze_write(&r); /* and no --save: the run goes on in the re-planned program */
  else if (r.a.save) {
    agree(weights_finite(&r, "the model (--save)", msg, sizeof msg) == 0, msg);
    pr_save_onnx(st, r.a.save, pr_stage_dir());
  }
  /* The summary: every stage's compute, wait and memory, on the last stage. */
  /* Each rank's own wall time: another rank's would make comm+other negative. */
  enum { NSUM = 14 };
  double mine[NSUM] = {r.t_compute, r.t_wait, (double)st->arena_bytes, st->predicted_bytes, r.t_total, (double)r.rss_peak,
                       (double)r.rss_overhead, r.t_xfer_wait, r.sent_bytes, r.t_exposed, r.bub_busy, r.bub_wall, r.pinned_cpu,
                       xfer_how}, *all = NULL;
  if (st->loss) all = malloc(sizeof(double) * NSUM * (size_t)st->nstages);
  MPI_Gather(mine, NSUM, MPI_DOUBLE, all, NSUM, MPI_DOUBLE, st->loss_rank, MPI_COMM_WORLD);
  if (st->loss && !r.a.quiet) {
    int64_t steps = r.a.steps - first_step;
    /* The bubble (docs/cost.md): 1 - the ranks' busy time / the ranks' wall time, over the steps after the first. */
    double busy = 0, wall = 0;
    for (int s = 0; s < st->nstages; s++) busy += all[NSUM * s + 10], wall += all[NSUM * s + 11];
    printf("done: %lld steps in %.2f s, %.1f samples/s, loss %.6f -> %.6f\n", (long long)steps, r.t_total,
           steps ? (double)steps * st->batch / r.t_total : 0, first_loss, last_loss);
    printf("step time %.3f ms measured, %.3f ms predicted; bubble %.1f%% measured\n", steps ? 1e3 * r.t_total / (double)steps : 0,
           1e3 * st->predicted_step_s, wall > 0 ? 100 * (1 - busy / wall) : 0);
    if (st->threads > 1) printf("each rank computes on %d threads (pipecc --threads)\n", st->threads);
    if (all[12] >= 0) { /* pin_rank: every rank or none (they see the same host) */
      printf("ranks pinned to CPUs");
      for (int s = 0; s < st->nstages; s++) printf(" %.0f", all[NSUM * s + 12]);
      printf(" (the plan's sharing of %d cores; run.sh --no-pin leaves them to Linux)\n", st->pin_cores);
    }
    int nfile = 0; /* runtime/xfer.c: io_uring, or a thread where none can be had */
    for (int s = 0; s < st->nstages; s++) nfile += all[NSUM * s + 13] > 0;
    for (int s = 0, k = 0; s < st->nstages; s++)
      if (all[NSUM * s + 13] > 0)
        k++, printf("%s stage %d by %s%s", k > 1 ? "," : "offload file copies:", s, all[NSUM * s + 13] == 1 ? "io_uring" : "an I/O thread",
                    k == nfile ? "\n" : "");
    printf("stage  compute_s  wait_s  comm+other_s  arena_bytes  predicted_bytes  rss_peak_bytes  rss_overhead_bytes  xfer_wait_s"
           "  sent_bytes  exposed_s\n");
    for (int s = 0; s < st->nstages; s++) {
      const double *x = &all[NSUM * s];
      printf("%5d  %9.3f  %6.3f  %12.3f  %11.0f  %15.0f  %14.0f  %18.0f  %11.3f  %10.0f  %9.3f\n", s, x[0], x[1], fmax(0, x[4] - x[0] - x[1]),
             x[2], x[3], x[5], x[6], x[7], x[8], x[9]);
    }
  }
  free(all);
  if (r.have_data) data_close(&r.data);
  data_close(&r.val);
  free(r.rreq), free(r.sreq), free(r.greq), free(r.gsreq), free(r.idx), free(r.oreq), free(r.ssreq), free(r.tsent_f), free(r.tsreq_f), free(r.fsrc);
  free(r.in_labels), free(r.in_y), free(r.lab_x), free(r.lab_img);
  MPI_Finalize();
  return 0; /* a freeze event too: its FREEZE file tells run.sh to re-plan */
}
