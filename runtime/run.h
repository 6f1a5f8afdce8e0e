/* run.h - libpiperun's private header: the state of one rank's run, which
 * every file of the runtime works on, and what each file offers the others.
 * Generated programs never include it (they see piperun.h only).
 *
 * The files, by job (runtime/README.md):
 *   prmain.c   pr_main, the driver: start-up, the run, the end
 *   fail.c     stopping the job with a message, every rank agreeing first
 *   args.c     run.sh's flags, and that the outputs can be written
 *   host.c     clocks, pinning, threads, the BLAS kernels every rank runs, memory use
 *   load.c     the weights file, the data set, the loader into the slots (under the SIGBUS guard)
 *   msg.c      messages between the stages, waits under the watchdog, exposed communication
 *   offload.c  the memory plan's transfers (to a peer rank or the offload file)
 *   interp.c   the action interpreter and the synchronous step loop
 *   async.c    the async schedule's step loop
 *   optim.c    the optimizer step, tied weights' sums, NaN checks, zeroing the gradients
 *   replica.c  --replicas: the communicators, the gradients' sum over the replicas, --zero 1's shards
 *   ckpt.c     checkpoints: write, commit, resume
 *   freeze.c   freezing layers: the freeze checkpoint, resuming it, --freeze auto
 *   val.c      run.sh --val: the held-out set
 *   report.c   the progress lines, --log, the end-of-run summary
 *   plot.c     the picture of --log (LOG.svg)
 * and device.h with cpu/device.c: the memory the arena lives in. */
#ifndef PIPERUN_RUN_H
#define PIPERUN_RUN_H
#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>

#include "data.h"
#include "device.h"
#include "piperun.h"
#include "trace.h"
#include "xfer.h"

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
  const char *data_x, *data_y; /* --data-x NAME, --data-y NAME: the NumPy arrays' names (x, y when not given) */
  const char *val;     /* --val PATH: a held-out set evaluated every val_every steps (0: at the end) */
  int64_t val_every;
  int64_t steps, ckpt_every, warmup;
  uint64_t seed;
  int shuffle, quiet;
  /* Progress (report.c): piped, a line on the first step, every log_every steps (0: report.c's default)
   * and the last; tty_cols > 0 (run.sh --progress tty, its stdout a terminal): one line that updates in place. */
  int64_t log_every;
  int tty_cols;
  double lr, momentum, weight_decay, min_lr, timeout;
  int have_lr, have_momentum, have_wd;
  int no_pin;          /* --no-pin: leave the ranks where Linux puts them (pin_rank) */
} Args;

/* Exposed communication, per chunk (msg.c): the peers its forward values come from (fsrc) and go to
 * (fdst), its gradients come from (gsrc) and go to (gdst), each at most once; per slot (or gslot) and
 * peer, the time sent or received and its request. */
typedef struct ChunkMsg {
  int *fsrc, nfsrc, *fdst, nfdst, *gsrc, ngsrc, *gdst, ngdst;
  double *tsent_f, *tgot_f, *tsent_g, *tgot_g;
  MPI_Request *tsreq_f, *trreq_f, *tsreq_g, *trreq_g;
} ChunkMsg;

#define PR_MAX_CHUNKS 16 /* pipecc --chunks' largest */

typedef struct Run {
  const PrStage *st;
  /* The chunks this rank runs: the descriptor's (pipecc --chunks), or one made of its own functions
   * (`one`).  The message state is per chunk and slot: request and event arrays are indexed by the
   * chunk's slot block, chunk * nslots + slot (eslot). */
  const PrChunk *chunk;
  int nchunks;
  PrChunk one;
  ChunkMsg *cm;
  int *lslot, *lgslot; /* local copies: per RECV (SEND) row and micro-batch, the slot (gslot) its receive was posted into, -1 */
  int *lto_send, *lto_recv; /* ... and per SEND (RECV) row of a local value, the RECV (SEND) row it lands in, -1 */
  Args a;
  int rank;
  /* The arena on the device (device.h): every offset of the stage table is into it.  The CPU's is
   * the program's own arena, st->arena. */
  unsigned char *dev;
  /* The device's work that fills a slot (F) or a gradient slot (B, I), recorded when the action ends and
   * awaited before the slot's bytes are sent; the CPU's work is done when the call returns. */
  PrDevEvent *slot_done, *gslot_done;
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
  MPI_Request *xsreq;  /* [nxslots][nsend]: the sends of a value that leaves, from its xslot (SEND) */
  /* PipeFB: stashed values to and from the other chain, per slot, and the weights; their own communicator. */
  MPI_Comm fcomm;
  MPI_Request *ssreq, *srreq, *wreq; /* [nslots][nstash_send], [nslots][nstash_recv], [max(nwsend, nwrecv)] */
  PrXfer *xfer;
  void **xview;        /* per xslot: the host view the file's copy reads or writes (device.h), NULL when none */
  int *xview_mode;     /* ... and its PR_VIEW_* */
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
   * times (the peers and times per chunk: cm).  clock[r]: rank r's clock
   * minus this rank's (measured at start). */
  MPI_Comm tcomm;
  double *clock, t_exposed;
  int freeze_to;       /* a freeze event after this step: the layers frozen from now on (0: none) */
  int in_val;          /* inside val_pass: forwards are the eval forward */
  double elapsed0;     /* wall seconds of the run before this program (a re-planned run goes on counting) */
  double *gnorm, *gprev; /* --freeze auto: per layer, this interval's summed gradient norms and the last interval's */
  DataSet val;         /* --val: the held-out set (on the ranks that read data) */
  FILE *val_log;       /* --val with --log: LOG.val.csv */
  char *val_log_path;
  int have_prev;
  double val_acc;      /* the last --val accuracy, for the progress line (have_val_acc) */
  int have_val_acc;
  double picture_at;   /* when --log's picture was last drawn at a checkpoint (report.c) */
  int npoll_req; /* --progress poll: outstanding requests tested between nodes */
  int xfer_how;        /* how the offload file's copies ran: 0 no file, 1 io_uring, 2 an I/O thread (the summary) */
} Run;

/* The log and the losses of the steps (report.c). */
typedef struct StepLog {
  FILE *log;
  double t_start;
  int64_t first_step;
  double first_loss, last_loss;
  int64_t every;       /* piped progress: a line every this many steps */
  double t_drawn;      /* the terminal's line: when last drawn, and the newest step's line (drawn or not) */
  char line[512];
  int64_t shown;       /* ... and what it shows: the step, its loss, the seconds so far and to go */
  double shown_loss, shown_elapsed, shown_eta;
} StepLog;

/* The message state's index of an action's slot and gslot: its chunk's block (see Run.chunk). */
static inline int eslot(const Run *r, const PrAction *a) { return a->chunk * r->st->nslots + a->slot; }
static inline int egslot(const Run *r, const PrAction *a) { return a->chunk * r->st->ngslots + a->gslot; }

/* Byte off of the device arena. */
static inline unsigned char *dev_at(const Run *r, int64_t off) { return r->dev + off; }

extern int g_rank; /* this process's rank, for messages (-1 before MPI starts) */
/* run.sh --progress tty: the job's stdout is a terminal, where the loss rank's progress line updates in
 * place; g_line_open: this rank's line is drawn and not ended (a message first ends or erases it). */
extern int g_tty;
extern volatile sig_atomic_t g_line_open;

/* fail.c */
void put_line(const char *prefix, const char *msg);
const char *who_am_i(void);
void die(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
void agree(int ok, const char *msg);
void on_signal(int sig);
/* run.sh --val's pass in progress (val.c sets it), which a kernel's stop (pr_bad_index) names instead of
 * the training step: after, the step it follows (from 1); -1 while training. */
typedef struct ValAt {
  int64_t after, batch;
  int mb;
} ValAt;
extern ValAt g_val_at;

/* args.c */
void usage_error(const char *fmt, const char *arg) __attribute__((noreturn));
void parse_args(Args *a, int argc, char **argv);
void check_outputs(Run *r);

/* host.c */
double now(void);
int host_ranks(void);
int host_ranks_at(int *rank);
int pin_rank(const PrStage *st, const Args *a, cpu_set_t *before);
int rank_cpus(int threads);
void check_blas_core(int nranks);
void measure_clocks(Run *r);
int64_t resident_bytes(const void *p, int64_t n);
int64_t rss_anon(void);
uint32_t make_run_id(void);

/* load.c */
void load_weights(Run *r);
void weights_to_host(Run *r);
int needs_data(const PrStage *st);
void open_data(Run *r);
int check_arrays(const PrStage *st, const DataSet *d, char *msg, size_t len);
void guard_data_reads(void);
void load_guarded(Run *r, const PrValue *pv, int mb, int slot, int64_t *labels);
void alloc_scratch(Run *r);

/* msg.c */
#define TAG_SPAN (64 * 256 * 64 * 2) /* tag_of's tags are below it */
unsigned char *ring(const Run *r, int64_t off, int64_t bytes, int slot);
void wait_watched(const Run *r, MPI_Request *req, int n, int peer, const char *what);
void wait_all(Run *r, MPI_Request *req, int n, int peer, const char *what);
void wait_sends(Run *r, const PrAction *a);
void wait_grad_sends(Run *r, const PrAction *a);
void chunks_open(Run *r);
void wait_message(Run *r, MPI_Request *req, int n, MPI_Request *treq, const double *sent, const int *peers, int np, const char *what);
void msg_open(Run *r);
void msg_poll_start(Run *r);
void msg_drain(Run *r);
void msg_close(Run *r);
void do_recv(Run *r, const PrAction *a);
void do_send(Run *r, const PrAction *a);
void do_recv_grad(Run *r, const PrAction *a);
void do_send_grad(Run *r, const PrAction *a);
void do_send_stash(Run *r, const PrAction *a);
void do_recv_stash(Run *r, const PrAction *a);
void do_send_weights(Run *r);
void do_recv_weights(Run *r);
/* After an action's receives completed: their bytes to the device (device.h), before the call reading them. */
void landed_values(Run *r, const PrAction *a);
void landed_grads(Run *r, const PrAction *a);
void landed_stash(Run *r, const PrAction *a);

/* offload.c */
void offload_open(Run *r);
void offload_close(Run *r);
/* --offload-optimizer: the optimizer state's file (optstore.c), opened before a checkpoint is resumed. */
void optstore_open(Run *r);
void optstore_drain(Run *r);
void optstore_fresh(Run *r); /* a step begins: the stored gradients are zeros until their first backward */
void optstore_close(Run *r);
/* Copies bytes of the state's file at off to host (write 0) or from it (1), once the update's copies are done. */
void optstore_io(Run *r, int write, void *host, int64_t bytes, int64_t off);
void wait_xslot_free(Run *r, int xslot);
void wait_xslot_sends(Run *r, int xslot);
void wait_xslot_in(Run *r, int xslot);
void do_offload(Run *r, const PrAction *a);
void do_prefetch(Run *r, const PrAction *a);
void do_hold(Run *r, const PrAction *a);
void do_return(Run *r, const PrAction *a);

/* interp.c */
double do_forward(Run *r, const PrAction *a);
double timed_action(Run *r, const PrAction *a, int64_t step);
void bubble_step(Run *r, int64_t step, int64_t first, double busy0, double wall);
void run_sync(Run *r, StepLog *sl);

/* async.c */
void run_async(Run *r, StepLog *sl);

/* optim.c */
void do_update(Run *r);
void zero_grads(Run *r);
void optim_open(Run *r);
int weights_finite(const Run *r, const char *what, char *msg, size_t len);

/* ckpt.c */
void save_checkpoint(Run *r, const char *dir);
void load_checkpoint(Run *r, const char *dir);
int ckpt_lock(const char *dir, char *msg, size_t len);

/* freeze.c */
void freeze_start(Run *r);
void freeze_write(Run *r);
void auto_freeze(Run *r);

/* val.c */
void val_open(Run *r);
void val_pass(Run *r, int64_t after);

/* replica.c: pipecc --replicas.  g_pipe: this replica's stages (a rank's number there, g_rank, is its stage);
 * g_replica of g_nreplicas; g_world_rank: its rank in MPI_COMM_WORLD. */
extern MPI_Comm g_pipe;
extern int g_replica, g_nreplicas, g_world_rank;
int replica_start(const PrStage *st, int size);
void replica_open(Run *r);
void do_reduce(Run *r);
void do_reduce_wait(Run *r);
double replica_exposed(void);
void replica_shard(const Run *r, const float **base, int64_t *lo, int64_t *hi);
void replica_gather(Run *r);
void replica_sums(double *loss, double *hits);
void replica_indices(int64_t *idx, int batch);
void replica_close(void);
/* The samples of a global batch (every replica's share). */
static inline int global_batch(const PrStage *st) { return st->batch * (g_nreplicas > 1 ? g_nreplicas : 1); }
/* Whether this rank reports the run: the loss rank of replica 0. */
static inline int reports(const PrStage *st) { return st->loss != NULL && g_replica == 0; }

/* report.c */
void report_open(Run *r, StepLog *sl);
void end_step(Run *r, StepLog *sl, double loss, double dt);
void report_close(Run *r, StepLog *sl);
void log_row_end(FILE *f, long long at, const char *path, const char *what);
void report_summary(Run *r, StepLog *sl);
void progress_clear(void);

/* plot.c */
int plot_log(const char *log, const char *val, const char *svg, char *msg, size_t len);
int plot_name(const char *log, char *svg, size_t len);
#define PLOT_MAX_POINTS 2000 /* a curve of more rows is drawn through this many of them (plot.c) */
#endif
