/* templates.h - the text the emitters fill (templates/NAME.in, embedded at build
 * time as build/gen/templates.inc) and the {{NAME}} substitution. */
#ifndef PIPECC_TEMPLATES_H
#define PIPECC_TEMPLATES_H
#include "util.h"

extern const char TMPL_MAKEFILE[], TMPL_RUN_SH[], TMPL_STAGE_MAIN[];

/* Appends tmpl to b with each {{KEY}} replaced by its value; keys[i]/vals[i], n pairs.
 * A key alone on its line whose value is empty writes no line.  An unknown key is a programming
 * error and aborts. */
void tmpl_fill(Buf *b, const char *tmpl, const char *const *keys, const char *const *vals, int n);
#endif
