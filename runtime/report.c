/* report.c - what a run tells: the progress and --log row of each step
 * (end_step, which also runs what comes after a step: the profile's
 * warm-up, checkpoints, --val, freezing), the picture of the log (plot.c),
 * and the end-of-run summary of every stage's compute, waits, memory and
 * traffic, on the loss rank.
 *
 * Progress goes one of two ways.  Piped (a file, a CI log), a line on the
 * first step, every --log-every steps and the last step.  On a terminal
 * (run.sh --progress tty: under mpirun a rank's stdout is mpirun's pty or
 * pipe whatever the user's is, so run.sh looks and says), one line that is
 * drawn again in place with a carriage return, at most ten times a second. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "run.h"

/* A checkpoint redraws --log's picture at most this often (seconds); the end of the run always does. */
#define PICTURE_EVERY_S 60.0

/* A row of --log or LOG.val.csv is out: flushed now, so that a write that
 * fails (a full disk) stops the run at the row it could not write, with the
 * reason, rather than the CSV ending mid-line and the run exiting 0.  A
 * regular file is cut back to `at`, its size before the row: the rows before
 * are whole, and a resumed run appends after them. */
void log_row_end(FILE *f, long long at, const char *path, const char *what) {
  errno = 0;
  if (fflush(f) == 0 && !ferror(f)) return;
  int err = errno ? errno : EIO;
  struct stat sb;
  int cut = at >= 0 && fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && ftruncate(fileno(f), (off_t)at) == 0;
  die(2, "--log: cannot write %s (%s): %s; stopping%s", path, what, strerror(err), cut ? " (the rows before it are whole)" : "");
}

/* The default --log-every: the smallest of 1, 2, 5, 10, 20, 50, ... that prints at most 25 lines
 * besides the first step's and the last's, so that a piped run of any length says about 20 lines, at
 * round step numbers, and a resumed run prints the steps the whole run would (it counts --steps). */
static int64_t default_every(int64_t steps) {
  static const int64_t d[3] = {1, 2, 5};
  for (int64_t m = 1;; m *= 10)
    for (int k = 0; k < 3; k++)
      if ((steps + d[k] * m - 1) / (d[k] * m) <= 25) return d[k] * m;
}

/* Seconds as the terminal's line shows them: 42 s, 3m07s, 2h05m. */
static void fmt_secs(char *b, size_t n, double s) {
  if (!(s >= 0 && s < 1e8)) snprintf(b, n, "?");
  else if (s < 59.5) snprintf(b, n, "%.0f s", s);
  else if (s < 3600) snprintf(b, n, "%dm%02ds", (int)s / 60, (int)s % 60);
  else snprintf(b, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

/* The terminal's line for step s: a bar, the loss, samples/s over the steps this program ran (a step's
 * own rate jumps from step to step, unreadable at ten draws a second) and the ETA, the last validation
 * accuracy.  Cut to the terminal's width less one column: a line that fills it wraps, and a carriage
 * return then rewrites only its last row. */
static void compose_tty(const Run *r, StepLog *sl, int64_t s, double loss, double elapsed, double eta) {
  char right[192], left[64], eta_s[32], bar[64];
  sl->shown = s, sl->shown_loss = loss, sl->shown_elapsed = elapsed, sl->shown_eta = eta;
  fmt_secs(eta_s, sizeof eta_s, eta);
  double rate = elapsed > 0 ? (double)(s - sl->first_step) * global_batch(r->st) / elapsed : 0;
  int nr = snprintf(right, sizeof right, " loss %.6f  %.1f samples/s  eta %s", loss, rate, eta_s);
  if (nr < 0 || nr >= (int)sizeof right) nr = (int)sizeof right - 1; /* a loss of 1e300 prints 300 digits: cut, not past the end */
  if (r->have_val_acc) snprintf(right + nr, sizeof right - (size_t)nr, "  val acc %.2f%%", 100 * r->val_acc);
  int nl = snprintf(left, sizeof left, "step %lld/%lld", (long long)s, (long long)r->a.steps);
  int width = r->a.tty_cols - 1 < (int)sizeof sl->line - 1 ? r->a.tty_cols - 1 : (int)sizeof sl->line - 1;
  int nb = width - nl - (int)strlen(right) - 3; /* " [" and "]" */
  nb = nb > 30 ? 30 : nb;
  bar[0] = 0;
  if (nb >= 5) { /* a bar too short to read is left out */
    int fill = (int)((double)nb * (double)s / (double)r->a.steps);
    bar[0] = ' ', bar[1] = '[';
    for (int i = 0; i < nb; i++) bar[2 + i] = i < fill ? '#' : '.';
    bar[nb + 2] = ']', bar[nb + 3] = 0;
  }
  snprintf(sl->line, (size_t)width + 1, "%s%s%s", left, bar, right);
}

/* Step s's progress (not --quiet): piped, today's line on the first step, every sl->every steps and the
 * last; on a terminal, the line drawn again in place at most ten times a second (a fast model's
 * thousands of steps a second would be thousands of writes through mpirun), on the last step always,
 * and at once after a message erased it (progress_clear). */
static void progress(const Run *r, StepLog *sl, double loss, double sps, double elapsed, double eta) {
  int64_t s = r->step + 1;
  if (!g_tty) {
    if (s == sl->first_step + 1 || s % sl->every == 0 || s == r->a.steps)
      printf("step %lld/%lld  loss %.6f  %.1f samples/s  eta %.1f s\n", (long long)s, (long long)r->a.steps, loss, sps, eta);
    return;
  }
  compose_tty(r, sl, s, loss, elapsed, eta);
  double t = now();
  if (s == r->a.steps || !g_line_open || t - sl->t_drawn >= 0.1) {
    printf("\r%s\033[K", sl->line); /* erase to the end of the line: the new one may be shorter */
    g_line_open = 1;
    sl->t_drawn = t;
  }
}

/* Before a line on stdout during the run (validation, freezing), on a terminal: the progress line is
 * erased and the message takes its place; the loss rank draws it again below at its next step. */
void progress_clear(void) {
  if (!g_tty) return;
  fputs("\r\033[K", stdout);
  g_line_open = 0;
}

/* LOG.svg beside --log (plot.c), drawn from the whole log, a resumed run's earlier rows too: at each
 * checkpoint and at the end.  Not drawn when the log is not a regular file (--log /dev/stdout: nothing
 * to read back).  A picture that cannot be written is a warning on stderr, and the run goes on: the log
 * it is drawn from is whole. */
static void write_picture(const Run *r) {
  struct stat sb;
  char svg[4200], val[4200], msg[4400], prefix[64];
  if (stat(r->a.log, &sb) || !S_ISREG(sb.st_mode)) return;
  snprintf(val, sizeof val, "%s.val.csv", r->a.log);
  if (plot_name(r->a.log, svg, sizeof svg)) return; /* a --log name of 4 KiB: no room for its picture's */
  /* Without --val a LOG.val.csv there is an older run's, unless this run continues one. */
  int with_val = r->a.val || r->a.resume || r->a.resume_freeze;
  if (plot_log(r->a.log, with_val ? val : NULL, svg, msg, sizeof msg) == 0) return;
  snprintf(prefix, sizeof prefix, "piperun: %s: warning: ", who_am_i());
  put_line(prefix, msg);
}

/* --log FILE (the loss rank): the step rows, and with --val LOG.val.csv; a resumed run appends. */
void report_open(Run *r, StepLog *sl) {
  const PrStage *st = r->st;
  sl->log = NULL;
  sl->every = r->a.log_every ? r->a.log_every : default_every(r->a.steps);
  sl->line[0] = 0;
  g_tty = r->a.tty_cols > 0 && !r->a.quiet;
  if (!reports(st) || !r->a.log) return;
  int cont = r->a.resume || r->a.resume_freeze;
  sl->log = fopen(r->a.log, cont ? "a" : "w");
  if (!sl->log) die(2, "cannot write --log %s: %s", r->a.log, strerror(errno));
  fseeko(sl->log, 0, SEEK_END); /* ftello is the rows' end from the start (log_row_end), appending too */
  int fresh = !cont || ftello(sl->log) == 0; /* a resumed run's log in a new file gets its header too */
  if (fresh) fprintf(sl->log, "step,loss,samples_per_s,time_s\n");
  log_row_end(sl->log, fresh ? 0 : -1, r->a.log, "its header");
  if (r->a.val) { /* LOG.val.csv: the held-out set's loss and accuracy */
    size_t n = strlen(r->a.log) + sizeof ".val.csv";
    r->val_log_path = malloc(n);
    snprintf(r->val_log_path, n, "%s.val.csv", r->a.log);
    r->val_log = fopen(r->val_log_path, cont ? "a" : "w");
    if (!r->val_log) die(2, "cannot write %s: %s", r->val_log_path, strerror(errno));
    fseeko(r->val_log, 0, SEEK_END);
    int vfresh = !cont || ftello(r->val_log) == 0;
    if (vfresh) fprintf(r->val_log, "step,val_loss,val_accuracy\n");
    log_row_end(r->val_log, vfresh ? 0 : -1, r->val_log_path, "its header");
  }
}

void report_close(Run *r, StepLog *sl) {
  if (sl->log && fclose(sl->log)) die(2, "cannot write --log %s: %s", r->a.log, strerror(errno));
  if (r->val_log && fclose(r->val_log)) die(2, "cannot write %s: %s", r->val_log_path, strerror(errno));
  if (sl->log) write_picture(r);
  sl->log = r->val_log = NULL;
  free(r->val_log_path);
  r->val_log_path = NULL;
}

/* After step r->step (its loss summed over its micro-batches on the loss
 * rank, dt its seconds): the log line, the profile's warm-up, the checkpoint. */
void end_step(Run *r, StepLog *sl, double loss, double dt) {
  const PrStage *st = r->st;
  if (st->loss) replica_sums(&loss, NULL); /* --replicas: every replica's part of the batch, on replica 0 */
  if (reports(st)) {
    loss /= (double)(st->loss_rows * st->microbatches) * (g_nreplicas > 1 ? g_nreplicas : 1);
    if (!isfinite(loss)) die(3, "step %lld: the loss is %s; stopping (lower --lr?)", (long long)r->step + 1, isnan(loss) ? "NaN" : "Inf");
    if (r->step == sl->first_step) sl->first_loss = loss;
    sl->last_loss = loss;
    double elapsed = now() - sl->t_start, sps = global_batch(st) / dt;
    double eta = elapsed / (double)(r->step + 1 - sl->first_step) * (double)(r->a.steps - r->step - 1);
    if (sl->log) {
      char what[64];
      long long at = (long long)ftello(sl->log);
      snprintf(what, sizeof what, "step %lld's row", (long long)r->step + 1);
      fprintf(sl->log, "%lld,%.9g,%.1f,%.6f\n", (long long)r->step + 1, loss, sps, r->elapsed0 + elapsed); /* the run's time */
      log_row_end(sl->log, at, r->a.log, what);
    }
    if (!r->a.quiet) progress(r, sl, loss, sps, elapsed, eta);
    fflush(stdout);
  }
  /* The first steps warm caches and pages (a quarter of the run, at least one): not profiled. */
  if (st->nprof) prof_end_step(&r->prof, r->step >= sl->first_step + r->prof_warm);
  if (r->a.checkpoint && (r->step + 1) % r->a.ckpt_every == 0) {
    r->step++;
    save_checkpoint(r, r->a.checkpoint);
    r->step--;
    /* The picture so far, beside the rows a resumed run continues; drawn from the whole log, so at most
     * once a minute here (a million-row log takes 0.4 s to draw; the end of the run always draws it). */
    if (sl->log && now() - r->picture_at >= PICTURE_EVERY_S) write_picture(r), r->picture_at = now();
  }
  if (r->a.val && r->a.val_every && (r->step + 1) % r->a.val_every == 0) val_pass(r, r->step + 1);
  if (r->a.freeze_auto) auto_freeze(r);
  /* A freeze event that freezes more than this program has frozen ends the run after this step. */
  for (int k = 0; k < r->a.nfreeze; k++)
    if (r->a.freeze_step[k] == r->step + 1 && r->a.freeze_layers[k] > st->nfrozen && r->step + 1 < r->a.steps)
      r->freeze_to = r->a.freeze_layers[k], r->a.steps = r->step + 1;
}

/* What each rank sends the summary: its own wall time (another rank's would make comm+other negative). */
enum { NSUM = 15 };

/* The summary's lines before the table: the run, the bubble, threads, pinning, the offload file's copies. */
static void summary_head(const Run *r, const StepLog *sl, const double *all) {
  const PrStage *st = r->st;
  int64_t steps = r->a.steps - sl->first_step;
  /* The bubble (docs/cost.md): 1 - the ranks' busy time / the ranks' wall time, over the steps after the first. */
  double busy = 0, wall = 0;
  for (int s = 0; s < st->nstages; s++) busy += all[NSUM * s + 10], wall += all[NSUM * s + 11];
  printf("done: %lld steps in %.2f s, %.1f samples/s, loss %.6f -> %.6f\n", (long long)steps, r->t_total,
         steps ? (double)steps * global_batch(st) / r->t_total : 0, sl->first_loss, sl->last_loss);
  if (g_nreplicas > 1) printf("%d replicas of %d stages, %d samples per step each (pipecc --replicas)\n", g_nreplicas, st->nstages, st->batch);
  printf("step time %.3f ms measured, %.3f ms predicted; bubble %.1f%% measured\n", steps ? 1e3 * r->t_total / (double)steps : 0,
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
}

/* The summary: every stage's compute, wait and memory, on the loss rank (collective). */
void report_summary(Run *r, StepLog *sl) {
  const PrStage *st = r->st;
  double mine[NSUM] = {r->t_compute, r->t_wait, (double)st->arena_bytes, st->predicted_bytes, r->t_total, (double)r->rss_peak,
                       (double)r->rss_overhead, r->t_xfer_wait, r->sent_bytes, r->t_exposed, r->bub_busy, r->bub_wall, r->pinned_cpu,
                       r->xfer_how, replica_exposed()}, *all = NULL;
  if (reports(st) && g_tty && sl->line[0]) { /* the last step's line, drawn again (a message may have erased it; the last --val) and ended */
    compose_tty(r, sl, sl->shown, sl->shown_loss, sl->shown_elapsed, sl->shown_eta);
    printf("\r%s\033[K\n", sl->line);
    g_line_open = 0;
  }
  if (st->loss) all = malloc(sizeof(double) * NSUM * (size_t)st->nstages);
  MPI_Gather(mine, NSUM, MPI_DOUBLE, all, NSUM, MPI_DOUBLE, st->loss_rank, g_pipe);
  if (reports(st) && !r->a.quiet) {
    summary_head(r, sl, all);
    /* --replicas: reduce_s is REDUCE_WAIT's time, the gradients' sum over the replicas that the last backward did not hide. */
    printf("stage  compute_s  wait_s  comm+other_s  arena_bytes  predicted_bytes  rss_peak_bytes  rss_overhead_bytes  xfer_wait_s"
           "  sent_bytes  exposed_s%s\n", g_nreplicas > 1 ? "  reduce_s" : "");
    for (int s = 0; s < st->nstages; s++) {
      const double *x = &all[NSUM * s];
      printf("%5d  %9.3f  %6.3f  %12.3f  %11.0f  %15.0f  %14.0f  %18.0f  %11.3f  %10.0f  %9.3f", s, x[0], x[1], fmax(0, x[4] - x[0] - x[1]),
             x[2], x[3], x[5], x[6], x[7], x[8], x[9]);
      if (g_nreplicas > 1) printf("  %8.3f", x[14]);
      printf("\n");
    }
  }
  free(all);
}
