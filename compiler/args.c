/* args.c - the pipecc command line: its flags parsed into Options, with
 * the one error line (exit status 2) for a bad one.
 *
 *   pipecc model.onnx -n 4 [--schedule gpipe|1f1b|zb1] [--microbatches M] [--batch B]
 *          [--mem-limit SIZE] [--devices FILE] [-o DIR] [--listing] [--dump-shapes] */
#include "args.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ops.h"
#include "schedule.h"

#define MAX_CHUNKS 16 /* --chunks: stages per rank */
#include "../runtime/blas_core.h"

static void usage(FILE *f) {
  fputs("usage: pipecc MODEL.onnx [-n STAGES] [options]\n"
        "\n"
        "Plans pipeline-parallel training of an ONNX model: splits it into STAGES\n"
        "pipeline stages, schedules the micro-batches and writes the plan to DIR.\n"
        "\n"
        "  -n N                  pipeline stages, one MPI rank each (default 1)\n"
        "  -o DIR                output directory (default: MODEL.pipe)\n"
        "  --ranks P             the planner chooses: every S stages x R replicas = P planned in full (each of\n"
        "                        gpipe, 1f1b, zb1 under --schedule auto), the fastest predicted step that fits kept\n"
        "  --zero 0|1            with replicas: 1 shards the optimizer state over them (ZeRO stage 1), each replica\n"
        "                        updating its shard and sending the new weights; the same bits as 0 (default 0)\n"
        "  --replicas R          R copies of the pipeline side by side (N x R ranks), each training B / R of the\n"
        "                        batch; a stage's weight gradients are summed over its R ranks in replica order\n"
        "                        before the update, overlapped with the last backward (default 1; docs/replicas.md)\n"
        "  --schedule KIND       gpipe, 1f1b, zb1 (zero-bubble ZB-H1), pipefb (forwards and backwards on\n"
        "                        different ranks), async (never drains; weights --staleness K old), or auto (gpipe,\n"
        "                        1f1b and zb1 each planned, the fastest predicted that fits kept); default 1f1b;\n"
        "                        interleaved (Megatron's interleaved 1F1B) and zbv (zero-bubble V) run --chunks\n"
        "                        stages on each rank\n"
        "  --chunks V            interleaved, zbv: cut the model into V x N stages, rank r running stages r, r + N, ...\n"
        "                        (zbv: r and 2N - 1 - r); default 2\n"
        "  --partition dag|chain how stages are cut: over the graph's downsets, reordering independent nodes\n"
        "                        (default), or ranges of the model's own node order\n"
        "  --split-layout auto|late|hold  zb1, zbv: where a micro-batch's values wait for W: held in its forward ring\n"
        "                        copy until W (hold), or only what W reads kept, the rest freed at I (late); auto\n"
        "                        (default): each stage the smaller (docs/schedules.md, zb1)\n"
        "  --fb-split NF         pipefb: the first NF ranks run forwards, the rest backwards (default: the planner's)\n"
        "  --frozen FILE         freeze the first N parameterised layers FILE names ('pipecc-frozen 1' then\n"
        "                        'layers N'): their weights become constants, with no gradient or optimizer state\n"
        "  --constant NAME[,NAME...]  initializers that are constants, never trained: buffers a model registered\n"
        "                        (a causal mask, positions); an initializer holding NaN or an infinity always is one\n"
        "  --route direct|relay  a value that skips ranks goes straight to the ranks that read it (default), or\n"
        "                        through every rank between (pipefb always relays)\n"
        "  --conv auto|gemm|dnnl  how convolutions run: oneDNN where it measured faster (default), im2col + GEMM\n"
        "                   everywhere, or oneDNN everywhere (a stage build without oneDNN runs im2col + GEMM)\n"
        "  --progress wait|poll  when MPI moves messages: while a rank waits for them (default), or also between\n"
        "                        the nodes of its forward and backward (docs/async.md, overlap)\n"
        "  --staleness K         async: step t computes on the weights of step t-K, and its gradient updates the\n"
        "                        newest weights (default 1, PipeDream-2BW; docs/async.md)\n"
        "  --batch B             samples per optimizer step (default: the model's batch, else 32)\n"
        "  --microbatches M      micro-batches per step; B must divide by M (default 2N)\n"
        "  --threads T           threads each rank computes on (default 1; for clusters that run one rank per\n"
        "                        node): GEMMs and pipecc's own kernels split over them, oneDNN's convolutions\n"
        "                        stay on one (docs/kernels.md, Threads)\n"
        "  --target cpu|cuda     the device the stages run on: the host's cores (default), or an NVIDIA GPU per\n"
        "                        rank (ranks on one host share its GPUs; docs/cuda.md)\n"
        "  --precision fp32|tf32|bf16  cuda: the matrix products in fp32 with TF32 off (default: the same\n"
        "                        numbers as the CPU within rounding), TF32, or bf16 inputs with fp32 sums\n"
        "  --mem-limit SIZE      memory per rank, e.g. 2G or 512M (default: unlimited; the GPU's with cuda)\n"
        "  --offload WHERE       where stashed activations may go to fit --mem-limit: auto (a peer rank with\n"
        "                        room, else recompute; default), none, peer, or file:DIR (a local directory)\n"
        "  --recompute auto|none whether stashed activations may be recomputed to fit --mem-limit (default auto)\n"
        "  --offload-optimizer WHERE  where a stage's optimizer state (momentum, Adam's moments) may live between\n"
        "                        updates to fit --mem-limit: none (default) or file:DIR; the update streams it\n"
        "                        through a small buffer, overlapping the copies with its compute (docs/memory.md)\n"
        "  --devices FILE        per-rank speed/memory and per-link figures (docs/devices.md)\n"
        "  --profile             stage programs that time each node (run.sh --profile FILE writes the times)\n"
        "  --costs FILE          plan with the node times of such a profile instead of FLOPs (docs/cost.md)\n"
        "  --optimizer NAME      sgd, adam or adamw (default sgd): sizes optimizer state\n"
        "  --lr X --momentum X --weight-decay X   optimizer hyper-parameters\n"
        "  --listing             print the plan listing (always written to DIR/schedule.txt)\n"
        "  --dump-shapes         print every tensor's inferred type and shape, write nothing\n"
        "  --plan-only           write the plan and listing but no stage programs\n"
        "  --list-ops            print the operator table (trainable / forward only / compile-time only) and exit\n"
        "  --blas-kernels        print the OpenBLAS kernels the stage programs run on this machine and exit\n"
        "  --forward-only        programs that run the forward pass on given inputs (no loss, no training)\n"
        "  --no-fuse             run every node as its own call (by default a Relu that alone reads a\n"
        "                        BatchNormalization's output runs inside it, with the same bits, and an\n"
        "                        exported decomposed LayerNorm or GELU, or a MatMul and its bias, runs as one\n"
        "                        op, rounded as that op)\n"
        "  --untie               a weight that nodes of one kind share (an exporter merged equal initializers)\n"
        "                        gets a copy per reading node instead of being trained as one tied weight\n"
        "  --loss xent|mse       softmax cross-entropy on integer labels (default), or mean squared error\n"
        "                        against their one-hot encoding\n"
        "  -h, --help            this text;  --version  the version\n",
        f);
}

int report_error(const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  err_clear();
  err_set("%s", msg);
  fprintf(stderr, "pipecc: error: %s\n", err_msg());
  return 2;
}

static int bad(const char *fmt, const char *a, const char *b) {
  char msg[1500];
  snprintf(msg, sizeof msg, fmt, a, b);
  return report_error("%s (see pipecc --help)", msg);
}

static int parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int parse_double(const char *s, double lo, double *out) {
  char *end;
  double v = strtod(s, &end);
  /* Finite as a float too: the value is printed into the stage programs as one. */
  if (end == s || *end || !isfinite(v) || v < lo || v > FLT_MAX) return -1;
  *out = v;
  return 0;
}

static char *default_outdir(const char *model) {
  const char *base = strrchr(model, '/');
  base = base ? base + 1 : model;
  size_t len = strlen(base);
  if (len > 5 && !strcmp(base + len - 5, ".onnx")) len -= 5;
  char *d = malloc(len + 6);
  if (!d) abort();
  memcpy(d, base, len);
  strcpy(d + len, ".pipe");
  return d;
}

/* Keeps argv[from .. to) (a flag and its value) for run.sh's re-planning, but for the flags that name
 * this run's output and frozen layers (a freeze event gives its own) and the listing. */
static void keep_flag(Options *o, char **argv, int from, int to) {
  if (from < 0) return;
  const char *a = argv[from];
  if (!strcmp(a, "-o") || !strcmp(a, "--frozen") || !strcmp(a, "--listing")) return;
  for (int i = from; i < to; i++) ((const char **)o->args)[o->nargs++] = argv[i];
}
/* The flags that print something and exit: the exit status, or -2 when a is none of them. */
static int flag_info(const char *a) {
  if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
    usage(stdout);
  } else if (!strcmp(a, "--list-ops")) {
    op_list_print();
  } else if (!strcmp(a, "--blas-kernels")) { /* the OpenBLAS kernels stages pin here (tests run PyTorch on them too) */
    const char *k = getenv("OPENBLAS_CORETYPE");
    puts(k && *k ? k : blas_core_for_cpu());
  } else if (!strcmp(a, "--version")) {
    printf("pipecc %s\n", PIPECC_VERSION);
  } else {
    return -2;
  }
  return 0;
}

/* Takes a flag's value (argv[*i + 1], val), or fails with the one error line. */
#define NEEDVAL() \
  do { \
    if (!val) return bad("flag '%s' needs a value%s", a, ""); \
    (*i)++; \
  } while (0)

/* The flags that shape the plan: -1 when a is one of them (taken), -2 when it is none, else the
 * exit status.  *moves_given: --offload or --recompute, if given. */
static int flag_plan(Options *o, const char *a, const char *val, int *i, const char **moves_given) {
  long v;
  if (!strcmp(a, "-n")) {
    NEEDVAL();
    if (parse_int(val, 1, MAX_RANKS, &v)) return bad("-n '%s': expected a whole number of stages from 1 to 1024%s", val, "");
    o->nstages = (int)v, o->nstages_given = 1;
  } else if (!strcmp(a, "--ranks")) {
    NEEDVAL();
    if (parse_int(val, 1, MAX_RANKS, &v)) return bad("--ranks '%s': expected a whole number of ranks from 1 to 1024%s", val, "");
    o->ranks = (int)v;
  } else if (!strcmp(a, "--zero")) {
    NEEDVAL();
    if (strcmp(val, "0") && strcmp(val, "1")) return bad("--zero '%s': expected 0 (every replica keeps all the optimizer state) or 1 (each its shard)%s", val, "");
    o->zero = val[0] == '1', o->zero_given = 1;
  } else if (!strcmp(a, "--replicas")) {
    NEEDVAL();
    if (parse_int(val, 1, MAX_RANKS, &v)) return bad("--replicas '%s': expected a whole number of pipeline copies from 1 to 1024%s", val, "");
    o->replicas = (int)v;
  } else if (!strcmp(a, "-o")) {
    NEEDVAL();
    if (!*val) return bad("-o needs a directory name%s%s", "", "");
    o->outdir = val;
  } else if (!strcmp(a, "--schedule")) {
    NEEDVAL();
    o->schedule_auto = 0;
    if (!strcmp(val, "gpipe")) o->schedule = SCHED_GPIPE;
    else if (!strcmp(val, "auto")) o->schedule = SCHED_1F1B, o->schedule_auto = 1;
    else if (!strcmp(val, "1f1b")) o->schedule = SCHED_1F1B;
    else if (!strcmp(val, "zb1")) o->schedule = SCHED_ZB1;
    else if (!strcmp(val, "pipefb")) o->schedule = SCHED_PIPEFB;
    else if (!strcmp(val, "async")) o->schedule = SCHED_ASYNC;
    else if (!strcmp(val, "interleaved")) o->schedule = SCHED_INTERLEAVED;
    else if (!strcmp(val, "zbv")) o->schedule = SCHED_ZBV;
    else return bad("--schedule '%s': expected gpipe, 1f1b, zb1, interleaved, zbv, pipefb, async or auto%s", val, "");
  } else if (!strcmp(a, "--chunks")) {
    NEEDVAL();
    if (parse_int(val, 1, MAX_CHUNKS, &v)) return bad("--chunks '%s': expected a whole number of stages per rank from 1 to 16%s", val, "");
    o->chunks = (int)v;
  } else if (!strcmp(a, "--split-layout")) {
    NEEDVAL();
    if (!strcmp(val, "auto")) o->split_layout = SPLIT_AUTO;
    else if (!strcmp(val, "late")) o->split_layout = SPLIT_LATE;
    else if (!strcmp(val, "hold")) o->split_layout = SPLIT_HOLD;
    else return bad("--split-layout '%s': expected auto, late or hold%s", val, "");
  } else if (!strcmp(a, "--partition")) {
    NEEDVAL();
    if (!strcmp(val, "dag")) o->partition = PARTITION_DAG;
    else if (!strcmp(val, "chain")) o->partition = PARTITION_CHAIN;
    else return bad("--partition '%s': expected dag or chain%s", val, "");
  } else if (!strcmp(a, "--batch")) {
    NEEDVAL();
    if (parse_int(val, 1, 1L << 30, &v)) return bad("--batch '%s': expected a positive whole number%s", val, "");
    o->batch = v;
  } else if (!strcmp(a, "--microbatches")) {
    NEEDVAL();
    if (parse_int(val, 1, 1 << 20, &v)) return bad("--microbatches '%s': expected a positive whole number%s", val, "");
    o->microbatches = (int)v;
  } else if (!strcmp(a, "--threads")) {
    NEEDVAL();
    if (parse_int(val, 1, 256, &v)) return bad("--threads '%s': expected a whole number of threads per rank from 1 to 256%s", val, "");
    o->threads = (int)v;
  } else if (!strcmp(a, "--mem-limit")) {
    NEEDVAL();
    o->mem_limit = parse_size(val);
    if (o->mem_limit <= 0) return bad("--mem-limit '%s': expected a size such as 2G, 512M or 100000%s", val, "");
  } else if (!strcmp(a, "--offload")) {
    NEEDVAL();
    *moves_given = a;
    if (!strcmp(val, "auto")) o->offload = OFFLOAD_AUTO;
    else if (!strcmp(val, "none")) o->offload = OFFLOAD_NONE;
    else if (!strcmp(val, "peer")) o->offload = OFFLOAD_PEER;
    else if (!strncmp(val, "file:", 5) && val[5]) o->offload = OFFLOAD_FILE, o->offload_dir = val + 5;
    else return bad("--offload '%s': expected auto, none, peer or file:DIR%s", val, "");
  } else if (!strcmp(a, "--offload-optimizer")) {
    NEEDVAL();
    if (!strcmp(val, "none")) o->opt_offload = OPTOFF_NONE;
    else if (!strncmp(val, "file:", 5) && val[5]) o->opt_offload = OPTOFF_FILE, o->opt_offload_dir = val + 5;
    else if (!strcmp(val, "host") || !strcmp(val, "peer"))
      return bad("--offload-optimizer %s: not supported yet (a CPU stage's arena is already in host memory, and a peer's "
                 "memory cannot serve it while the peer runs its own update); use file:DIR%s", val, "");
    else return bad("--offload-optimizer '%s': expected none or file:DIR%s", val, "");
  } else if (!strcmp(a, "--recompute")) {
    NEEDVAL();
    *moves_given = a;
    if (!strcmp(val, "auto")) o->recompute = 1;
    else if (!strcmp(val, "none")) o->recompute = 0;
    else return bad("--recompute '%s': expected auto or none%s", val, "");
  } else if (!strcmp(a, "--fb-split")) {
    NEEDVAL();
    if (parse_int(val, 1, 1 << 20, &v)) return bad("--fb-split '%s': expected a positive whole number (forward ranks)%s", val, "");
    o->fb_split = (int)v;
  } else if (!strcmp(a, "--frozen")) {
    NEEDVAL();
    o->frozen = val;
  } else if (!strcmp(a, "--constant")) {
    NEEDVAL();
    if (!*val) return bad("--constant needs initializer names (NAME[,NAME...])%s%s", "", "");
    o->constants[o->nconstants++] = val; /* the names are checked against the model once it is loaded (driver.c) */
  } else if (!strcmp(a, "--route")) {
    NEEDVAL();
    if (!strcmp(val, "direct")) o->relay = 0;
    else if (!strcmp(val, "relay")) o->relay = 1;
    else return bad("--route '%s': expected direct (a value goes only to the ranks that read it) or relay (through every rank between)%s", val, "");
  } else {
    return -2;
  }
  return -1;
}

/* The flags of the programs and their run: -1 when a is one of them (taken), -2 when it is none,
 * else the exit status. */
static int flag_run(Options *o, const char *a, const char *val, int *i) {
  long v;
  if (!strcmp(a, "--conv")) {
    NEEDVAL();
    if (!strcmp(val, "auto")) o->conv_impl = CONV_AUTO;
    else if (!strcmp(val, "gemm")) o->conv_impl = CONV_GEMM;
    else if (!strcmp(val, "dnnl")) o->conv_impl = CONV_DNNL;
    else return bad("--conv '%s': expected auto, gemm (im2col + GEMM) or dnnl (oneDNN)%s", val, "");
  } else if (!strcmp(a, "--target")) {
    NEEDVAL();
    if (strcmp(val, "cpu") && strcmp(val, "cuda")) return bad("--target '%s': expected cpu or cuda%s", val, "");
    o->target = val;
  } else if (!strcmp(a, "--precision")) {
    NEEDVAL();
    if (!strcmp(val, "fp32")) o->precision = PREC_FP32;
    else if (!strcmp(val, "tf32")) o->precision = PREC_TF32;
    else if (!strcmp(val, "bf16")) o->precision = PREC_BF16;
    else return bad("--precision '%s': expected fp32, tf32 or bf16%s", val, "");
  } else if (!strcmp(a, "--progress")) {
    NEEDVAL();
    if (!strcmp(val, "poll")) o->poll = 1;
    else if (!strcmp(val, "wait")) o->poll = 0;
    else return bad("--progress '%s': expected wait (messages move when a rank waits for them) or poll (also between nodes)%s", val, "");
  } else if (!strcmp(a, "--staleness")) {
    NEEDVAL();
    if (parse_int(val, 1, 64, &v))
      return bad("--staleness '%s': expected a whole number of steps from 1 to 64 (how many updates old the weights a step "
                 "computes on may be)%s", val, "");
    o->staleness = (int)v;
  } else if (!strcmp(a, "--profile")) {
    o->profile = 1;
  } else if (!strcmp(a, "--costs")) {
    NEEDVAL();
    o->costs = val;
  } else if (!strcmp(a, "--devices")) {
    NEEDVAL();
    o->devices = val;
  } else if (!strcmp(a, "--optimizer")) {
    NEEDVAL();
    if (strcmp(val, "sgd") && strcmp(val, "adam") && strcmp(val, "adamw"))
      return bad("--optimizer '%s': expected sgd, adam or adamw%s", val, "");
    o->optimizer = val;
  } else if (!strcmp(a, "--lr") || !strcmp(a, "--momentum") || !strcmp(a, "--weight-decay")) {
    NEEDVAL();
    double x;
    if (parse_double(val, 0, &x)) return bad("%s '%s': expected a finite, non-negative number (at most 3.4e38, a float)", a, val);
    if (a[2] == 'l') o->lr = x, o->have_lr = 1;
    else if (a[2] == 'm') o->momentum = x;
    else o->weight_decay = x;
  } else if (!strcmp(a, "--listing")) {
    o->listing = 1;
  } else if (!strcmp(a, "--dump-shapes")) {
    o->dump_shapes = 1;
  } else if (!strcmp(a, "--plan-only")) {
    o->plan_only = 1;
  } else if (!strcmp(a, "--forward-only")) {
    o->forward_only = 1;
  } else if (!strcmp(a, "--untie")) {
    o->untie = 1;
  } else if (!strcmp(a, "--no-fuse")) {
    o->no_fuse = 1;
  } else if (!strcmp(a, "--loss")) {
    NEEDVAL();
    if (!strcmp(val, "mse")) o->loss_mse = 1;
    else if (strcmp(val, "xent")) return bad("--loss '%s': expected xent or mse%s", val, "");
  } else {
    return -2;
  }
  return -1;
}
#undef NEEDVAL

/* --chunks V: the interleaved and zbv schedules cut the model into V x n stages, V on each rank; o->nstages
 * becomes that count and o->nranks keeps -n.  -1 when all is well, else the exit status. */
static int check_chunks(Options *o, const char *moves_given) {
  char nbuf[32], vbuf[32];
  snprintf(nbuf, sizeof nbuf, "%d", o->nstages), snprintf(vbuf, sizeof vbuf, "%d", o->chunks);
  o->nranks = o->nstages;
  if (!sched_chunked(o->schedule)) {
    if (o->chunks > 1)
      return bad("--chunks %s: only --schedule interleaved and zbv run several stages per rank (got --schedule %s)", vbuf,
                 o->schedule_auto ? "auto" : schedule_name(o->schedule));
    o->chunks = 1;
    return -1;
  }
  const char *kind = schedule_name(o->schedule);
  if (!o->chunks) o->chunks = 2;
  if (o->schedule == SCHED_ZBV && o->chunks != 2) return bad("--chunks %s with --schedule zbv: the V shape has exactly 2 chunks per rank%s", vbuf, "");
  if (o->chunks < 2) return bad("--chunks %s with --schedule %s: interleaving needs 2 or more chunks per rank", vbuf, kind);
  if (o->forward_only) return bad("--schedule %s trains; --forward-only programs have no schedule to interleave%s", kind, "");
  if (moves_given) return bad("%s with --schedule %s: stages of several chunks per rank do not offload or recompute stashed activations yet", moves_given, kind);
  if (o->nstages * o->chunks > MAX_RANKS) return bad("-n %s x --chunks %s: more than 1024 stages", nbuf, vbuf);
  o->nstages *= o->chunks;
  return -1;
}

/* --replicas R: S x R ranks, and the combinations not supported yet.  -1 when all is well, else the exit status. */
int args_check_replicas(const Options *o, char *out, size_t len) {
  const char *why = o->forward_only ? "--forward-only: its programs do not train"
                    : o->schedule == SCHED_ASYNC ? "--schedule async: its updates are not summed over replicas yet"
                    : o->schedule == SCHED_PIPEFB ? "--schedule pipefb: its backward ranks are not replicated yet"
                    : sched_chunked(o->schedule) ? "--schedule interleaved or zbv: stages of several chunks per rank are not replicated yet"
                    : o->opt_offload != OPTOFF_NONE ? "--offload-optimizer: gradients in a file are not summed over replicas yet"
                    : !strcmp(o->target, "cuda") ? "--target cuda: the GPU's gradients are not summed over replicas yet"
                    : NULL;
  if (!why) return 0;
  snprintf(out, len, "--replicas %d with %s", o->replicas, why);
  return -1;
}

static int check_replicas(Options *o) {
  if (!o->replicas) o->replicas = 1;
  char rbuf[32], nbuf[32], why[320];
  if (o->ranks) {
    snprintf(rbuf, sizeof rbuf, "%d", o->ranks);
    if (o->nstages_given || o->replicas > 1) return bad("--ranks %s chooses -n and --replicas itself; give either --ranks or those%s", rbuf, "");
    if (sched_chunked(o->schedule) || o->schedule == SCHED_ASYNC || o->schedule == SCHED_PIPEFB || o->forward_only)
      return bad("--ranks %s: the planner compares gpipe, 1f1b and zb1 layouts (--schedule auto: all three); not %s", rbuf,
                 o->forward_only ? "--forward-only" : schedule_name(o->schedule));
    return -1;
  }
  if (o->replicas == 1) {
    if (o->zero) return bad("--zero 1 shards the optimizer state over replicas: it needs --replicas 2 or more (or --ranks)%s%s", "", "");
    return -1;
  }
  snprintf(rbuf, sizeof rbuf, "%d", o->replicas), snprintf(nbuf, sizeof nbuf, "%d", opt_ranks(o));
  if ((long)opt_ranks(o) * o->replicas > MAX_RANKS) return bad("-n %s x --replicas %s: more than 1024 ranks", nbuf, rbuf);
  if (args_check_replicas(o, why, sizeof why)) return bad("%s%s", why, "");
  return -1;
}

/* A model given, the flags that only some schedules take, and --offload file:'s directory: -1 when
 * all is well, else the exit status. */
static int check_flags(Options *o, const char *moves_given) {
  if (!o->model) return bad("no model given%s%s", "", "");
  char nbuf[32], fbuf[32];
  snprintf(nbuf, sizeof nbuf, "%d", o->nstages), snprintf(fbuf, sizeof fbuf, "%d", o->fb_split);
  if (o->split_layout != SPLIT_AUTO && !sched_splits(o->schedule) && !o->schedule_auto)
    return bad("--split-layout %s: only zb1 and zbv split the backward into I and W%s", o->split_layout == SPLIT_LATE ? "late" : "hold", "");
  if (o->fb_split && o->schedule != SCHED_PIPEFB) return bad("--fb-split %s: only --schedule pipefb splits ranks into forward and backward ones%s", fbuf, "");
  char kbuf[32];
  snprintf(kbuf, sizeof kbuf, "%d", o->staleness);
  if (o->staleness && o->schedule != SCHED_ASYNC)
    return bad("--staleness %s: only --schedule async computes on stale weights (the synchronous schedules are exact)%s", kbuf, "");
  if (o->frozen && (o->schedule == SCHED_ASYNC || o->schedule == SCHED_PIPEFB))
    return bad("--frozen with --schedule %s: frozen layers are planned for gpipe, 1f1b and zb1 only yet%s",
               o->schedule == SCHED_ASYNC ? "async" : "pipefb", "");
  if (check_chunks(o, moves_given) >= 0) return 2;
  if (o->schedule == SCHED_ASYNC) {
    if (!o->staleness) o->staleness = 1;
    if (o->forward_only) return bad("--schedule async trains; --forward-only programs have no updates to delay%s%s", "", "");
    if (moves_given)
      return bad("%s with --schedule async: async does not offload or recompute stashed activations yet%s", moves_given, "");
  }
  if (o->schedule == SCHED_PIPEFB) {
    if (o->nstages < 2) return bad("--schedule pipefb needs -n 2 or more (forward ranks and backward ranks); got -n %s%s", nbuf, "");
    if (o->fb_split >= o->nstages)
      return bad("--fb-split %s: with -n %s it must be below -n (at least one backward rank)", fbuf, nbuf);
    if (o->forward_only) return bad("--schedule pipefb trains; --forward-only programs have no backward ranks%s%s", "", "");
    if (moves_given)
      return bad("%s with --schedule pipefb: pipefb does not offload or recompute stashed activations yet (a rank keeps two "
                 "micro-batches of them at most; a memory limit is met by its cuts alone)%s", moves_given, "");
  }
  if (strcmp(o->target, "cuda")) {
    if (o->precision != PREC_FP32) return bad("--precision %s: only --target cuda has another precision (the CPU computes in fp32)%s",
                                              o->precision == PREC_TF32 ? "tf32" : "bf16", "");
  } else {
    /* The GPU runs every convolution as im2col + cuBLAS, in the workspace the plan gives it. */
    if (o->conv_impl == CONV_DNNL) return bad("--conv dnnl with --target cuda: oneDNN is the CPU's; the GPU runs im2col + cuBLAS%s%s", "", "");
    o->conv_impl = CONV_GEMM;
    if (o->profile)
      return bad("--profile with --target cuda: the profile's marks time the host's calls, which on a GPU only queue "
                 "the kernels; not supported yet%s%s", "", "");
  }
  if (o->opt_offload != OPTOFF_NONE) {
    const char *why = o->forward_only ? "--forward-only: its programs have no optimizer"
                      : o->schedule == SCHED_ASYNC ? "--schedule async: not supported yet"
                      : o->schedule == SCHED_PIPEFB ? "--schedule pipefb: not supported yet"
                      : sched_chunked(o->schedule) ? "--schedule interleaved or zbv: stages of several chunks per rank have no memory plan yet"
                      : !strcmp(o->target, "cuda") ? "--target cuda: the GPU streams nothing to a file yet"
                      : NULL;
    if (why) return bad("--offload-optimizer with %s%s", why, "");
    struct stat st;
    if (stat(o->opt_offload_dir, &st) || !S_ISDIR(st.st_mode) || access(o->opt_offload_dir, W_OK | X_OK))
      return bad("--offload-optimizer file:%s: not a writable directory%s", o->opt_offload_dir, "");
  }
  if (check_replicas(o) >= 0) return 2;
  if (o->offload == OFFLOAD_FILE) {
    struct stat st;
    if (stat(o->offload_dir, &st) || !S_ISDIR(st.st_mode) || access(o->offload_dir, W_OK | X_OK))
      return bad("--offload file:%s: not a writable directory%s", o->offload_dir, "");
  }
  return -1;
}

/* The output directory when -o is not given: MODEL.pipe beside the current directory.  Held by a
 * static so that it lives (reachable) to the exit, like the kept flags. */
static const char *outdir_for(const char *model) {
  static char *d;
  free(d);
  d = default_outdir(model);
  return d;
}

int args_parse(int argc, char **argv, Options *o) {
  memset(o, 0, sizeof *o);
  /* The flags run.sh re-plans with; held by a static so it lives (reachable) to the exit. */
  static const char **kept;
  free(kept);
  kept = calloc((size_t)argc + 1, sizeof *kept);
  if (!kept) return 2;
  o->args = kept;
  static const char **constants; /* --constant's values, likewise */
  free(constants);
  constants = calloc((size_t)argc + 1, sizeof *constants);
  if (!constants) return 2;
  o->constants = constants;
  o->nstages = 1;
  o->schedule = SCHED_1F1B;
  o->recompute = 1;
  o->target = "cpu";
  int last_flag = -1;
  const char *moves_given = NULL; /* --offload or --recompute, if given */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    /* The flags (with their values) run.sh re-plans with; the previous one's, now that it is parsed. */
    if (i > 1) keep_flag(o, argv, last_flag, i);
    last_flag = a[0] == '-' ? i : -1;
    int rc = flag_info(a);
    if (rc == -2) rc = flag_plan(o, a, val, &i, &moves_given);
    if (rc == -2) rc = flag_run(o, a, val, &i);
    if (rc != -2) {
      if (rc >= 0) return rc;
    } else if (a[0] == '-' && a[1]) {
      return bad("unknown flag '%s'%s", a, "");
    } else if (o->model) {
      return bad("more than one model given ('%s' and '%s')", o->model, a);
    } else {
      o->model = a;
    }
  }
  keep_flag(o, argv, last_flag, argc);
  int rc = check_flags(o, moves_given);
  if (rc >= 0) return rc;
  if (!o->outdir) o->outdir = outdir_for(o->model);
  return -1;
}
