/* blas_core.h - one OpenBLAS kernel for every process of a run.
 *
 * Debian's OpenBLAS is built for many CPUs and picks its kernels when it is
 * loaded, from the CPU's model number.  Two things follow.  A CPU newer than
 * the library falls back to the oldest kernels (this machine's Xeon gets
 * "Prescott": 15 GFLOP/s where its AVX-512 kernels run 120), and two hosts
 * of a cluster with different CPUs run different kernels, whose sums round
 * differently: the same job gives other bits.
 *
 * So the choice is made here, from the instruction sets the CPU has, and
 * pinned with OPENBLAS_CORETYPE, which OpenBLAS reads at load time: a
 * process that starts without it sets it and executes itself again before
 * anything else runs.  run.sh asks a stage program on the launching host for
 * its choice and gives it to every rank as `--blas-kernels NAME` (a flag, not
 * the environment, which a remote host's own settings would override), and
 * the runtime checks that all ranks run the same kernels, on CPUs that have
 * the instructions they need.
 *
 * Header-only: pipecc's probe (which times the kernels the stages will run)
 * and the stage programs include it. */
#ifndef PIPERUN_BLAS_CORE_H
#define PIPERUN_BLAS_CORE_H
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Whether this CPU has the instructions the named kernels need: 1 or 0, -1
 * for a name this check does not know (OpenBLAS's own choice on other CPUs). */
static inline int blas_core_runs_here(const char *name) {
  __builtin_cpu_init();
  if (!strcasecmp(name, "SkylakeX") || !strcasecmp(name, "Cooperlake"))
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           (strcasecmp(name, "Cooperlake") || __builtin_cpu_supports("avx512bf16"));
  if (!strcasecmp(name, "Haswell") || !strcasecmp(name, "Zen"))
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!strcasecmp(name, "Sandybridge")) return __builtin_cpu_supports("avx");
  if (!strcasecmp(name, "Nehalem")) return __builtin_cpu_supports("sse4.2");
  if (!strcasecmp(name, "Prescott")) return __builtin_cpu_supports("sse3");
  return -1;
}

/* The newest kernels this CPU can run. */
static inline const char *blas_core_for_cpu(void) {
  static const char *const order[] = {"SkylakeX", "Haswell", "Sandybridge", "Nehalem", "Prescott"};
  for (size_t i = 0; i < sizeof order / sizeof *order; i++)
    if (blas_core_runs_here(order[i]) == 1) return order[i];
  return "Prescott";
}

/* Pins OPENBLAS_CORETYPE to `want` (NULL: keep a value already set, else
 * this CPU's newest kernels) and, when that changes it, runs this program
 * again so that OpenBLAS loads with it.  Returns when it is already pinned
 * (or the exec failed, leaving OpenBLAS's own choice: the runtime's check
 * then says so). */
static inline void blas_core_pin(char **argv, const char *want) {
  const char *set = getenv("OPENBLAS_CORETYPE");
  if (!want) want = set && *set ? set : blas_core_for_cpu();
  if (set && !strcmp(set, want)) return;
  if (setenv("OPENBLAS_CORETYPE", want, 1)) return;
  execv("/proc/self/exe", argv);
}
#endif
