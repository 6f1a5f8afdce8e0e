/* emit.h - the stage programs as C, and the files beside them (emit.c). */
#ifndef PIPECC_EMIT_H
#define PIPECC_EMIT_H
#include "stageprog.h"

struct OutDir;
/* Writes DIR's sources; -1 with err_set. */
int emit_all(Plan *p, StageProg *progs, struct OutDir *d);
/* Stage s's C source alone, into o (the fuzzer renders without writing files). */
void emit_stage(const Plan *p, const StageProg *progs, int s, Buf *o);
#endif
