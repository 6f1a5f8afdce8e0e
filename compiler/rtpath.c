/* rtpath.c - finding pipecc's runtime (libpiperun) for the generated Makefile.
 *
 * Two layouts hold one: the checkout's, where bin/pipecc sits beside runtime/ (its sources, which each
 * generated directory compiles), and make install's (docs/install.md), where PREFIX/bin/pipecc sits
 * beside PREFIX/lib/pipecc/runtime/ (headers and a library built at install time, with
 * prebuilt-<target>.mk saying how it was built).  Both are found from this binary's own path, so an
 * installed pipecc needs no checkout and a DESTDIR-staged tree works wherever it is unpacked. */
#include "rtpath.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

static int has_file(const char *dir, const char *name) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return access(path, R_OK) == 0;
}

/* An installed runtime must hold the library of the target asked for: make install builds the CUDA one
 * only where it found nvcc. */
static int installed_target(RtPath *rt, const char *target) {
  char mk[64];
  snprintf(mk, sizeof mk, "prebuilt-%s.mk", target);
  if (!has_file(rt->dir, mk))
    return err_set("--target %s: the installed runtime %s holds no %s library (%s): %s; run pipecc's make install "
                   "again where it is", target, rt->dir, target, mk,
                   strcmp(target, "cuda") ? "it was not installed" : "nvcc was not found when pipecc was installed");
  char real[PATH_MAX];
  if (!realpath(rt->dir, real)) return err_set("the installed runtime %s: cannot resolve its path", rt->dir);
  snprintf(rt->dir, sizeof rt->dir, "%s", real);
  return 0;
}

static int from_env(RtPath *rt, const char *env, const char *target) {
  snprintf(rt->dir, sizeof rt->dir, "%s", env);
  rt->installed = has_file(env, "prebuilt-cpu.mk");
  if (rt->installed) return installed_target(rt, target);
  if (!has_file(env, "piperun.h"))
    return err_set("PIPECC_RUNTIME=%s: not pipecc's runtime (no piperun.h there); point it at a checkout's runtime/ "
                   "or an installed PREFIX/lib/pipecc/runtime", env);
  return 0;
}

int rtpath_find(const char *target, RtPath *rt) {
  memset(rt, 0, sizeof *rt);
  ssize_t n = readlink("/proc/self/exe", rt->exe, sizeof rt->exe - 1);
  rt->exe[n > 0 ? n : 0] = 0;
  const char *env = getenv("PIPECC_RUNTIME");
  if (env && *env) return from_env(rt, env, target);
  if (n <= 0) return err_set("cannot read /proc/self/exe to find pipecc's runtime beside it; set PIPECC_RUNTIME to its directory");
  char bindir[PATH_MAX];
  snprintf(bindir, sizeof bindir, "%s", rt->exe);
  char *slash = strrchr(bindir, '/');
  if (slash) *slash = 0;
  /* Installed first: prebuilt-cpu.mk is make install's alone, where a runtime/ beside a PREFIX could be anyone's. */
  snprintf(rt->dir, sizeof rt->dir, "%.*s/../lib/pipecc/runtime", PATH_MAX - 32, bindir);
  if (has_file(rt->dir, "prebuilt-cpu.mk")) {
    rt->installed = 1;
    return installed_target(rt, target);
  }
  snprintf(rt->dir, sizeof rt->dir, "%.*s/../runtime", PATH_MAX - 32, bindir);
  if (has_file(rt->dir, "piperun.h")) return 0;
  return err_set("cannot find pipecc's runtime: neither %s/../lib/pipecc/runtime (make install's) nor %s/../runtime (a "
                 "checkout's) holds it; run make install again, or set PIPECC_RUNTIME to its directory",
                 bindir, bindir);
}
