/* rtpath.h - where pipecc's runtime (libpiperun) is, for the generated Makefile (rtpath.c). */
#ifndef PIPECC_RTPATH_H
#define PIPECC_RTPATH_H
#include <limits.h>

typedef struct RtPath {
  char dir[PATH_MAX];      /* the runtime's directory: absolute when installed */
  int installed;           /* make install's: headers and a library built at install time, no sources */
  char exe[PATH_MAX];      /* this pipecc, absolute ("" when /proc/self/exe cannot be read) */
} RtPath;

/* Finds the runtime that stages of `target` (cpu, cuda) build against: $PIPECC_RUNTIME, else an
 * installed one beside this binary (PREFIX/bin/pipecc -> PREFIX/lib/pipecc/runtime), else the
 * checkout's (bin/pipecc -> runtime/).  0, or -1 with err_set naming where it looked. */
int rtpath_find(const char *target, RtPath *rt);
#endif
