/* args.c - run.sh's flags (parse_args) and, before step 1, that everything
 * the run will write can be written. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "run.h"

/* A flag run.sh cannot run with.  Before MPI (g_rank < 0) this is run.sh's own check, stage_0
 * --check-args (prmain.c): one line in run.sh's name, and no mpirun.  Under mpirun (stage programs
 * started by hand) rank 0 says it; run.sh --help lists the flags. */
void usage_error(const char *fmt, const char *arg) {
  char msg[1024];
  snprintf(msg, sizeof msg, fmt, arg);
  if (g_rank <= 0) put_line(g_rank < 0 ? "run.sh: error: " : "piperun: error: ", msg);
  if (g_rank >= 0) MPI_Finalize(); /* never initialised in the check: finalising it is an error */
  exit(2);
}

/* A finite number from lo to hi.  inf, nan and 1e999 are refused here: accepted, --lr inf stopped
 * the run at step 2 with a NaN gradient blamed on the learning rate ("lower --lr?"). */
static double num(const char *flag, const char *v, double lo, double hi) {
  char *end, why[512];
  if (!v) usage_error("flag '%s' needs a value", flag);
  double x = strtod(v, &end);
  if (end == v || *end || !isfinite(x) || x < lo || x > hi) {
    snprintf(why, sizeof why, "%s '%.200s': expected a finite number from %g to %g", flag, v, lo, hi);
    usage_error("%s", why);
  }
  return x;
}

/* Steps and step counts: far beyond any run, and small enough that steps times a plan's actions (the
 * trace's capacity) stays within 64 bits. */
#define PR_MAX_STEPS ((int64_t)1 << 40)

/* A whole number from lo to hi: --steps 1.9 ran 1 step and --steps inf said "--steps N is required". */
static int64_t whole(const char *flag, const char *v, int64_t lo, int64_t hi) {
  char *end, why[512];
  if (!v) usage_error("flag '%s' needs a value", flag);
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end || errno || x < lo || x > hi) {
    snprintf(why, sizeof why, "%s '%.200s': expected a whole number from %lld to %lld", flag, v, (long long)lo, (long long)hi);
    usage_error("%s", why);
  }
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

/* --progress lines|tty[:COLUMNS] (run.sh passes tty:COLUMNS when its stdout is a terminal): 0 for lines,
 * else the terminal's width; a terminal that reports none (0) is taken as 80 wide. */
static int progress_mode(const char *v) {
  if (!v) usage_error("flag '%s' needs a value", "--progress");
  if (!strcmp(v, "lines")) return 0;
  if (!strcmp(v, "tty")) return 80;
  if (strncmp(v, "tty:", 4)) usage_error("--progress '%s': expected lines, tty or tty:COLUMNS", v);
  int cols = (int)whole("--progress tty:COLUMNS", v + 4, 0, 4096);
  return cols ? cols : 80;
}

void parse_args(Args *a, int argc, char **argv) {
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
    else if (!strcmp(f, "--data-x")) a->data_x = TAKE();
    else if (!strcmp(f, "--data-y")) a->data_y = TAKE();
    else if (!strcmp(f, "--steps")) a->steps = whole(f, TAKE(), 1, PR_MAX_STEPS);
    else if (!strcmp(f, "--lr")) a->lr = num(f, TAKE(), 0, FLT_MAX), a->have_lr = 1;
    else if (!strcmp(f, "--momentum")) a->momentum = num(f, TAKE(), 0, FLT_MAX), a->have_momentum = 1;
    else if (!strcmp(f, "--weight-decay")) a->weight_decay = num(f, TAKE(), 0, FLT_MAX), a->have_wd = 1;
    else if (!strcmp(f, "--seed")) a->seed = (uint64_t)whole(f, TAKE(), 0, INT64_MAX);
    else if (!strcmp(f, "--shuffle")) a->shuffle = 1;
    else if (!strcmp(f, "--no-shuffle")) a->shuffle = 0;
    else if (!strcmp(f, "--log")) a->log = TAKE();
    else if (!strcmp(f, "--save")) a->save = TAKE();
    else if (!strcmp(f, "--checkpoint")) a->checkpoint = TAKE();
    else if (!strcmp(f, "--checkpoint-every")) a->ckpt_every = whole(f, TAKE(), 1, PR_MAX_STEPS);
    else if (!strcmp(f, "--resume")) a->resume = TAKE();
    else if (!strcmp(f, "--lr-schedule")) a->lr_schedule = TAKE();
    else if (!strcmp(f, "--warmup")) a->warmup = whole(f, TAKE(), 0, PR_MAX_STEPS);
    else if (!strcmp(f, "--min-lr")) a->min_lr = num(f, TAKE(), 0, FLT_MAX);
    else if (!strcmp(f, "--quiet")) a->quiet = 1;
    else if (!strcmp(f, "--log-every")) a->log_every = whole(f, TAKE(), 1, PR_MAX_STEPS);
    else if (!strcmp(f, "--progress")) a->tty_cols = progress_mode(TAKE());
    else if (!strcmp(f, "--no-pin")) a->no_pin = 1;
    else if (!strcmp(f, "--trace")) a->trace = TAKE();
    else if (!strcmp(f, "--timeout")) a->timeout = num(f, TAKE(), 0.001, 1e9);
    else if (!strcmp(f, "--blas-kernels")) TAKE(); /* pr_main pinned them */
    else if (!strcmp(f, "--offload-dir")) a->offload_dir = TAKE();
    else if (!strcmp(f, "--profile")) a->profile = TAKE();
    else if (!strcmp(f, "--freeze-at")) parse_freeze(a, TAKE());
    else if (!strcmp(f, "--freeze-dir")) a->freeze_dir = TAKE();
    else if (!strcmp(f, "--val")) a->val = TAKE();
    else if (!strcmp(f, "--val-every")) a->val_every = whole(f, TAKE(), 1, PR_MAX_STEPS);
    else if (!strcmp(f, "--freeze")) {
      const char *w = TAKE();
      if (!w || strcmp(w, "auto")) usage_error("--freeze '%s': expected auto (or --freeze-at S:N for given steps)", w ? w : "");
      a->freeze_auto = 1;
    } else if (!strcmp(f, "--freeze-every")) a->freeze_every = whole(f, TAKE(), 1, PR_MAX_STEPS);
    else if (!strcmp(f, "--freeze-threshold")) a->freeze_threshold = num(f, TAKE(), 0, DBL_MAX);
    else if (!strcmp(f, "--resume-freeze")) a->resume_freeze = TAKE();
    else usage_error("unknown flag '%s'", f);
    if (i >= argc) usage_error("flag '%s' needs a value", f);
  }
  if (!a->data) usage_error("--data PATH is required%s", "");
  if ((a->data_x && !*a->data_x) || (a->data_y && !*a->data_y)) usage_error("--data-x and --data-y take an array's name, not an empty one%s", "");
  if (a->steps < 0) usage_error("--steps N is required%s", "");
  if (!a->lr_schedule || (strcmp(a->lr_schedule, "constant") && strcmp(a->lr_schedule, "cosine")))
    usage_error("--lr-schedule '%s': expected constant or cosine", a->lr_schedule ? a->lr_schedule : "");
  if (a->checkpoint && !a->ckpt_every) a->ckpt_every = 100;
  /* 0 would never freeze (no change is below it): said, not replaced by the default. */
  if (!(a->freeze_threshold > 0)) usage_error("--freeze-threshold must be above 0 (a layer freezes when its change is below it)%s", "");
}

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
  /* A FIFO's open blocks until someone reads it (the run hung with no time limit), a socket's fails
   * later.  A character device (/dev/stdout, /dev/null, /dev/full) is written in place, and a write
   * that fails there stops the run with the reason; --save's own check refuses devices (save_target_ok). */
  if (stat(file, &sb) == 0 && (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode)))
    return snprintf(msg, len, "%s %s: exists and is not a regular file (a FIFO or a socket, which would block the run)", flag, file), -1;
  return 0;
}

/* --save writes FILE.tmp-PID and renames it over FILE: a FILE that is there
 * must be a regular file, or the rename would replace a device node (as root,
 * --save /dev/null replaced the system's /dev/null), a FIFO, a socket or a
 * symbolic link with the model.  Checked again when the model is written. */
static int save_target_ok(const char *file, char *msg, size_t len) {
  struct stat sb;
  if (lstat(file, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode))
    return snprintf(msg, len, "--save %s: exists and is not a regular file (%s); name a new file or a regular one", file,
                    S_ISLNK(sb.st_mode) ? "a symbolic link" : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device" :
                    S_ISFIFO(sb.st_mode) ? "a FIFO" : "a socket"), -1;
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
void check_outputs(Run *r) {
  char msg[1024] = "";
  int ok = 1;
  if (r->rank == 0 && r->a.save) ok = writable_dir_of("--save", r->a.save, msg, sizeof msg) == 0 && save_target_ok(r->a.save, msg, sizeof msg) == 0;
  if (ok && r->rank == 0 && r->a.trace) ok = writable_dir_of("--trace", r->a.trace, msg, sizeof msg) == 0;
  if (ok && r->rank == 0 && r->a.profile) ok = writable_dir_of("--profile", r->a.profile, msg, sizeof msg) == 0;
  if (ok && r->st->loss && r->a.log) ok = writable_dir_of("--log", r->a.log, msg, sizeof msg) == 0;
  if (ok && r->st->loss && r->a.log && r->a.val) { /* --val's rows go beside the log (report.c) */
    char vlog[4200];
    snprintf(vlog, sizeof vlog, "%s.val.csv", r->a.log);
    ok = writable_dir_of("--log", vlog, msg, sizeof msg) == 0;
  }
  if (ok && r->a.checkpoint) ok = checkpoint_dir_ok(r->a.checkpoint, msg, sizeof msg) == 0;
  if (ok && r->rank == 0 && r->a.checkpoint) ok = ckpt_lock(r->a.checkpoint, msg, sizeof msg) == 0; /* before anything is written there */
  agree(ok, msg);
  /* The manifest --save (and a freeze event) writes the model from, read now rather than after the training. */
  if (r->a.save || r->a.nfreeze || r->a.freeze_auto) agree(pr_check_manifest(r->st, pr_stage_dir(), msg, sizeof msg) == 0, msg);
}
