/* host.c - the host a rank runs on: the clock, pinning ranks that share
 * cores, the CPUs its threads can count on, the BLAS kernels every rank must
 * agree on, the clocks of the other ranks, memory in use. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "blas_core.h"
#include "run.h"

char *openblas_get_corename(void);

/* CLOCK_MONOTONIC, not MPI_Wtime: Open MPI's MPI_Wtime counts from each process's own start, and
 * the ranks of one host then read clocks 0.1-2 ms apart (measure_clocks). */
double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Bytes of [p, p + n) in memory now (whole pages). */
int64_t resident_bytes(const void *p, int64_t n) {
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
int64_t rss_anon(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long long kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "RssAnon: %lld kB", &kb) == 1) break;
  if (f) fclose(f);
  return (int64_t)kb * 1024;
}

/* How many ranks run on this host, and where rank is not NULL this rank's number among them (the GPU
 * it takes); collective over every rank. */
int host_ranks_at(int *rank) {
  MPI_Comm node;
  int here = 1;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &here);
  if (rank) MPI_Comm_rank(node, rank);
  MPI_Comm_free(&node);
  return here;
}
int host_ranks(void) { return host_ranks_at(NULL); }

/* More ranks than cores on one host: the plan chose which ranks share a core
 * (compiler/schedule.c, schedule_pin) and timed the step so; each rank pins
 * itself to its core, the pin_core-th of the CPUs it may run on (its I/O
 * thread, started later, may run on any of them: see xfer_open's caller).
 * Only where the plan's assumption holds: every rank on this host, and as
 * many CPUs allowed as the plan's cores (a rank mpirun bound with --bind-to,
 * or a host with more cores, is left alone).  Returns the CPU, or -1. */
int pin_rank(const PrStage *st, const Args *a, cpu_set_t *before) {
  if (st->pin_cores <= 0 || a->no_pin) return -1;
  int here = host_ranks(), world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  cpu_set_t set, one;
  /* --replicas R: the plan shared pin_cores among one replica's stages; replica k takes the k-th R-th of the CPUs. */
  int R = g_nreplicas > 1 ? g_nreplicas : 1, at = g_replica * st->pin_cores + st->pin_core;
  if (here != world || sched_getaffinity(0, sizeof set, &set) || CPU_COUNT(&set) != st->pin_cores * R) return -1;
  for (int cpu = 0, k = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, &set) || k++ != at) continue;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    *before = set;
    return sched_setaffinity(0, sizeof one, &one) ? -1 : cpu;
  }
  return -1;
}

/* The CPUs this rank's threads (pipecc --threads) can count on: those it may run on, shared with the
 * other ranks of its host when they may all run on every CPU (mpirun --bind-to none). */
int rank_cpus(int threads) {
  if (threads <= 1) return 1;
  int here = host_ranks();
  cpu_set_t set;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int cpus = sched_getaffinity(0, sizeof set, &set) ? 1 : CPU_COUNT(&set);
  if (online > 0 && cpus >= online && here > 1) cpus /= here;
  return cpus > 0 ? cpus : 1;
}

/* Every rank must run the same BLAS kernels (blas_core.h), on a CPU that has
 * their instructions: other kernels round other ways, and the run would not
 * be the one the same job gives on one host. */
#ifndef PR_NO_HOST_BLAS
void check_blas_core(int nranks) {
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
#endif

/* Every rank's clock against this one's: rank 0 runs 8 round trips with
 * each rank and keeps the least delayed (its clock offset), then tells
 * everyone.  Ranks on one host read one clock (now): their offsets are 0
 * and are not measured, because round trips between ranks that share a
 * core take a time slice or more, and the estimate would be off by as
 * much (ms). */
void measure_clocks(Run *r) {
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

/* Names this run's checkpoint directories apart from any earlier run's. */
uint32_t make_run_id(void) {
  uint32_t id = (uint32_t)data_mix64((uint64_t)time(NULL) ^ (uint64_t)getpid() << 32 ^ (uint64_t)(now() * 1e9));
  MPI_Bcast(&id, 1, MPI_UINT32_T, 0, MPI_COMM_WORLD);
  return id;
}
