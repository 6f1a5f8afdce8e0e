/* fail.c - stopping the job: one message line per failure, every rank agreeing
 * before the first step, and a rank killed from outside saying so. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run.h"

int g_rank = -1;
int g_tty;
volatile sig_atomic_t g_line_open;

/* Before a message on stderr, the loss rank ends its half-drawn progress line (run.sh --progress tty).
 * mpirun forwards a rank's stdout and stderr through separate pipes, and a stderr line written just
 * after stdout's newline overtook it in some runs (Open MPI 4.1, measured in a pty): the newline gets a
 * moment to go first.  Only on a terminal, and only once a line is open. */
static void end_progress_line(void) {
  if (!g_line_open) return;
  g_line_open = 0;
  fputs("\n", stdout);
  fflush(stdout);
  usleep(50000);
}

/* Writes one message line: tensor names come from the model, so a newline or
 * a terminal escape in one is printed as \n or \xNN, never raw. */
/* "stage S", or with replicas "stage S of replica K": who a message is from (a static buffer). */
const char *who_am_i(void) {
  static char b[48];
  if (g_nreplicas > 1) snprintf(b, sizeof b, "stage %d of replica %d", g_rank, g_replica);
  else snprintf(b, sizeof b, "stage %d", g_rank);
  return b;
}

void put_line(const char *prefix, const char *msg) {
  /* One write() per line: stderr is unbuffered and the stages share one
     terminal or pipe, so a line written piecewise interleaves with another
     stage's.  Lines under PIPE_BUF (4096 bytes) are written atomically. */
  char line[4096];
  size_t n = 0, cap = sizeof line - 2;
  end_progress_line();
  /* On a terminal another rank's progress line may be half drawn where this message lands: the message
   * erases it (carriage return, erase to the end of the line) and starts at the line's beginning. */
  if (g_tty) memcpy(line, "\r\033[K", 4), n = 4;
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

void die(int code, const char *fmt, ...) {
  char msg[2048], prefix[64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(prefix, sizeof prefix, "piperun: %s: error: ", who_am_i());
  put_line(prefix, msg);
  MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

/* All ranks learn whether any failed, and print the first failure's message. */
void agree(int ok, const char *msg) {
  int bad = ok ? INT32_MAX : g_world_rank, first; /* the world's numbering: the Bcast's root */
  MPI_Allreduce(&bad, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == INT32_MAX) return;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", msg ? msg : "");
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, first, MPI_COMM_WORLD);
  char prefix[96];
  snprintf(prefix, sizeof prefix, "piperun: %s: error: %s", who_am_i(), first == g_world_rank ? "" : "(reported by another stage) ");
  put_line(prefix, buf);
  MPI_Finalize();
  exit(2);
}

ValAt g_val_at = {-1, 0, 0};

/* shapes.h: a kernel's bad input, which ONNX calls an error (a Gather index outside its table).  Token
 * ids are checked against the vocabulary when loaded, so an index that gets here was computed from the
 * data by the model (a Cast, an ArgMax): the message names the node and where in the run. */
void pr_bad_index(const char *node, const char *what, int64_t at, int64_t index, int64_t rows, const RandCtx *when) {
  char where[128];
  if (g_val_at.after >= 0)
    snprintf(where, sizeof where, "validation after step %lld, held-out batch %lld, micro-batch %d", (long long)g_val_at.after,
             (long long)g_val_at.batch + 1, g_val_at.mb);
  else
    snprintf(where, sizeof where, "step %lld, micro-batch %lld", (long long)when->step + 1, (long long)when->mb);
  die(5, "%s: node '%s' (%s): index %lld at position %lld of its indices is outside its table of %lld rows (ONNX takes %lld to %lld; "
         "indices computed from the data must stay in that range); stopping",
      where, node, what, (long long)index, (long long)at, (long long)rows, (long long)-rows, (long long)rows - 1);
}

void on_signal(int sig) {
  char msg[96];
  if (g_line_open && write(1, "\n", 1) < 0) _exit(1); /* the progress line ends before the message */
  int n = snprintf(msg, sizeof msg, "piperun: %s: stopped by signal %d (another stage failed?)\n", who_am_i(), sig);
  if (write(2, msg, (size_t)n) < 0) _exit(1);
  _exit(1);
}
