/* prmain.c - pr_main, the driver of a generated stage program's run: one
 * process per stage starts (the BLAS kernels, MPI, the checks every rank
 * agrees on), sets the run up (run.sh's flags, pinning, the arena on the
 * device, the weights, the data, a checkpoint to resume, the message and
 * transfer state), runs the steps (interp.c, or async.c for the async
 * schedule), and ends it (drains what is in flight, writes the trace, the
 * profile, the model, the summary).  The files of the runtime are listed in
 * run.h. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "actions.h"
#include "blas_core.h"
#include "run.h"

void openblas_set_num_threads(int);
char *openblas_get_corename(void);

RandCtx pr_rand = {1, 0, 0}; /* piperun.h; seed 1 is --seed's default */
unsigned char *pr_weights;   /* piperun.h: the arena's weights region, or an older version's (async) */
OptCtx pr_opt;               /* piperun.h: the optimizer's hyper-parameters, set at each UPDATE */

const char *pr_kind_name(int kind) { return pr_action_name(kind); }

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

/* Before MPI: the BLAS kernels (and oneDNN's thread count) are fixed before the libraries load, by
 * running the program again with them set where they differ. */
static void pin_libraries(char **argv, int argc) {
  const char *kernels = NULL;
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--blas-kernels")) kernels = argv[i + 1];
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
}

/* MPI and the checks before anything else: one rank per stage, started by run.sh, the same BLAS
 * kernels on every rank, tags enough for the runtime's.  0, or the exit status. */
static int start_mpi(int *argc, char ***argv, const PrStage *st) {
  MPI_Init(argc, argv);
  int size;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  signal(SIGTERM, on_signal);
  /* Past a file size limit (ulimit -f) a write fails with EFBIG, and the file's writer says so, removing
   * its temporary file; the signal's default would kill the rank mid-write with neither. */
  signal(SIGXFSZ, SIG_IGN);
  guard_data_reads();
  if (replica_start(st, size)) { /* --replicas: S x R ranks; g_rank becomes the stage within its replica */
    MPI_Finalize();
    return 2;
  }
#ifndef PR_NO_HOST_BLAS /* a GPU build computes nothing with the host's BLAS (templates/Makefile.in) */
  openblas_set_num_threads(1); /* --threads: gemm.c cuts the products over par.c's threads instead */
  check_blas_core(size);
#endif
#ifdef PR_DNNL
  pr_conv_lib_init(openblas_get_corename(), 1);
#endif
  int *tag_ub, flag;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
  if (flag && *tag_ub < TAG_SPAN + 4096 * 1024)
    die(2, "this MPI allows tags up to %d; piperun needs %d", *tag_ub, TAG_SPAN + 4096 * 1024);
  return 0;
}

/* The flags' checks that need no MPI and nothing but this program: run.sh makes them (stage_0
 * --check-args) before it starts mpirun, and so does every rank. */
static void check_flags(const Args *a, const PrStage *st) {
  if (a->profile && !st->nprof) usage_error("--profile: these stages have no timing marks; compile them with pipecc --profile%s", "");
  if (a->profile && a->steps < 2) usage_error("--profile needs --steps 2 or more (the first quarter, at least one step, only warms up)%s", "");
  if ((a->nfreeze || a->freeze_auto) && (st->staleness || st->role != PR_ROLE_BOTH))
    usage_error("--freeze-at / --freeze auto: async and pipefb programs do not freeze layers yet%s", "");
  if ((a->checkpoint || a->resume) && st->zero)
    usage_error("--checkpoint / --resume: programs of pipecc --zero 1 keep each replica's shard of the optimizer state, which a "
                "checkpoint does not gather yet (compile with --zero 0 to checkpoint)%s", "");
  if ((a->nfreeze || a->freeze_auto) && st->replicas > 1)
    usage_error("--freeze-at / --freeze auto: programs of several replicas (pipecc --replicas) do not freeze layers yet%s", "");
  if ((a->nfreeze || a->freeze_auto) && !a->freeze_dir) usage_error("--freeze-at and --freeze auto need --freeze-dir DIR (run.sh gives it)%s", "");
}

/* stage_0 --check-args FLAGS...: run.sh's flags parsed and checked as every rank will, without MPI
 * (usage_error then writes one line as run.sh's and exits 2): a usage error is run.sh's answer, not
 * every rank's under mpirun's abort report. */
static int check_args_only(int argc, char **argv, const PrStage *st) {
  Args a;
  if (st->forward_only)
    usage_error("these are pipecc --forward-only programs: run %s/stage_0 INPUT_DIR OUTPUT_DIR, not run.sh", pr_stage_dir());
  parse_args(&a, argc - 1, argv + 1); /* from argv[2]: argv[1] is --check-args */
  check_flags(&a, st);
  return 0;
}

/* This rank's number among the ranks on its host (the GPU it takes). */
static int local_rank(void) {
  int k = 0;
  host_ranks_at(&k);
  return k;
}

/* The rank itself: flags, pinning, its threads, the profile, the arena on the device and its weights. */
static void setup_rank(Run *r, int argc, char **argv, int threads) {
  const PrStage *st = r->st;
  parse_args(&r->a, argc, argv);
  check_flags(&r->a, st); /* again: mpirun may have started the stages without run.sh */
  r->pinned_cpu = pin_rank(st, &r->a, &r->cpus);
  /* The kernels' own threads (par.h), after pinning: a pinned rank has one thread (the plan pins only then). */
  if (pr_par_init(threads, rank_cpus(threads))) die(2, "cannot start %d threads for this rank's kernels (pipecc --threads): %s", threads, strerror(errno));
  if (st->nprof) prof_init(st->nprof);
  pr_rand.seed = r->a.seed;
  agree(pr_dev_open(local_rank(), st->precision) == 0, "no device of the kind these stages were compiled for");
  r->dev = pr_dev_arena_alloc(st->arena, st->arena_bytes);
  agree(r->dev != NULL, "no room on the device for the arena");
  if (st->dev_arena) *st->dev_arena = r->dev;
  load_weights(r);
}

/* Everything before step 1, in the order every rank runs it (the collectives among it). */
static void setup_run(Run *r, int argc, char **argv, int threads) {
  const PrStage *st = r->st;
  setup_rank(r, argc, argv, threads);
  open_data(r);
  check_outputs(r);
  /* The watchdog: far beyond any wait a healthy step has, never under a minute. */
  r->timeout = r->a.timeout > 0 ? r->a.timeout : fmax(60, 100 * st->predicted_step_s);
  r->run_id = make_run_id();
  optstore_open(r);
  if (r->a.resume) load_checkpoint(r, r->a.resume);
  if (r->a.val) val_open(r);
  freeze_start(r);
  msg_open(r);
  replica_open(r);
  alloc_scratch(r);
  offload_open(r);
  optim_open(r);
  /* The trace: one span per action, and room for waits; capped (a very long run keeps its first events). */
  if (r->a.trace) {
    int64_t cap = (r->a.steps - r->step) * st->nactions * 4 + 16;
    trace_init(&r->trace, cap < (1 << 22) ? cap : (1 << 22));
    r->trace.running = &r->cur, r->trace.chunks = r->chunk, r->trace.nchunks = r->nchunks; /* chunks_open made them */
  }
  r->idx = malloc(sizeof(int64_t) * (size_t)global_batch(st)); /* the global batch's, then this replica's share first */
  if (!r->idx) die(2, "out of memory for the batch's sample indices%s", "");
}

/* Every rank starts its clock together; the trace counts from the earliest rank's start (on rank 0's
 * clock), on every rank, so that the ranks' spans line up and none is before 0. */
static void start_clocks(Run *r, StepLog *sl) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t_start = now(), start0 = t_start + r->clock[0];
  MPI_Allreduce(MPI_IN_PLACE, &start0, 1, MPI_DOUBLE, MPI_MIN, g_pipe);
  r->trace.start = start0 - r->clock[0];
  sl->t_start = t_start, sl->first_step = r->step, sl->first_loss = sl->last_loss = NAN;
  r->prof_warm = (r->a.steps - sl->first_step) / 4 > 1 ? (r->a.steps - sl->first_step) / 4 : 1;
}

/* --trace FILE: every rank's spans. */
static void write_trace(Run *r) {
  if (!r->a.trace) return;
  if (g_replica) { /* --replicas: replica 0's ranks write it (the others' lists are the same) */
    trace_free(&r->trace);
    return;
  }
  char msg[4400] = "";
  if (r->trace.dropped && g_rank == 0) fprintf(stderr, "piperun: the trace kept its first %lld events\n", (long long)r->trace.cap);
  /* Not a warning and exit 0: a run asked for its trace, and a script reading it must learn it is missing. */
  if (trace_write(&r->trace, r->a.trace, g_rank, r->st->nstages, msg, sizeof msg)) die(2, "%s", msg);
  trace_free(&r->trace);
}

/* --profile FILE: the nodes' times over the measured steps. */
static void write_profile(Run *r, int threads) {
  const PrStage *st = r->st;
  char msg[1024] = "";
  if (!r->a.profile || g_replica) return; /* --replicas: replica 0's */
  if (prof_steps() == 0)
    die(2, "--profile: no step was measured (the run's first %lld step%s only warm up); run more --steps", (long long)r->prof_warm,
        r->prof_warm == 1 ? "" : "s");
  int64_t params = 0;
  for (int i = 0; i < st->nparams; i++) params += st->params[i].count;
  int rc = prof_write(r->a.profile, st->model, st->prof_nodes, st->nprof, params, r->prof_warm, st->mb_size, st->microbatches,
                      st->prof_rate, st->prof_conv, threads, g_rank, st->nstages, msg, sizeof msg);
  if (rc) die(2, "%s", msg);
}

/* After the last step: what is in flight, memory in use, the trace, the profile, the model, the summary. */
static void finish_run(Run *r, StepLog *sl, int threads) {
  const PrStage *st = r->st;
  char msg[1024] = "";
  /* The held-out set after the last step, unless --val-every just did it (or a freeze event stopped the run). */
  if (r->a.val && !r->freeze_to && !(r->a.val_every && r->step % r->a.val_every == 0)) val_pass(r, r->step);
  msg_drain(r);
  pr_dev_sync(); /* the last step's work, and any bad input its kernels recorded (device.h, pr_dev_check) */
  offload_close(r);
  /* The arena is static and the step loop allocates nothing: the end is the
   * peak.  What is not the arena (MPI's buffers, BLAS's, the loader's, the
   * libraries') is the runtime's overhead, the same whatever the plan. */
  r->rss_peak = rss_anon();
  r->rss_overhead = r->rss_peak - resident_bytes(st->arena, st->arena_bytes);
  r->t_total = now() - sl->t_start;
  /* The trained weights first: a trace, log or profile that cannot be written (a full disk) stops the
   * run with an error, and must not cost the weights on its way. */
  if (r->freeze_to) freeze_write(r); /* and no --save: the run goes on in the re-planned program */
  else if (r->a.save) {
    agree(weights_finite(r, "the model (--save)", msg, sizeof msg) == 0, msg);
    if (!g_replica) { /* --replicas: every replica holds the same weights; replica 0's stages write them */
      weights_to_host(r);
      pr_save_onnx(st, r->a.save, pr_stage_dir());
    }
  }
  optstore_close(r); /* after a freeze event's checkpoint, which writes the optimizer state from its file */
  write_trace(r);
  report_close(r, sl);
  write_profile(r, threads);
  report_summary(r, sl);
}

int pr_main(int argc, char **argv, const PrStage *st) {
  if (argc == 2 && !strcmp(argv[1], "--blas-core")) { /* run.sh asks which kernels this host runs best */
    puts(blas_core_for_cpu());
    return 0;
  }
  if (argc >= 2 && !strcmp(argv[1], "--check-args")) return check_args_only(argc, argv, st);
  int threads = st->threads > 0 ? st->threads : 1;
  pin_libraries(argv, argc);
  if (st->forward_only) return pr_eval(argc, argv, st);
  int rc = start_mpi(&argc, &argv, st);
  if (rc) return rc;
  Run r;
  memset(&r, 0, sizeof r);
  r.st = st;
  r.rank = g_world_rank; /* 0: the one rank that checks the outputs (args.c) */
  chunks_open(&r);
  setup_run(&r, argc, argv, threads);
  StepLog sl;
  report_open(&r, &sl);
  start_clocks(&r, &sl);
  pr_weights = r.dev;
  msg_poll_start(&r);
  if (st->staleness) run_async(&r, &sl);
  else run_sync(&r, &sl);
  finish_run(&r, &sl, threads);
  if (r.have_data) data_close(&r.data);
  data_close(&r.val);
  msg_close(&r);
  replica_close();
  free(r.idx), free(r.in_labels), free(r.in_y), free(r.lab_x), free(r.lab_img), free(r.tie_req);
  pr_dev_arena_free(r.dev, st->arena);
  MPI_Finalize();
  return 0; /* a freeze event too: its FREEZE file tells run.sh to re-plan */
}
