/* args.h - the command line (args.c). */
#ifndef PIPECC_ARGS_H
#define PIPECC_ARGS_H
#include "plan.h"

/* Parses pipecc's flags into o (the defaults for those not given; -o's
 * default MODEL.pipe).  -1 when the compiler should run; else the exit
 * status: 0 after --help, --version, --list-ops or --blas-kernels, 2 after
 * the one error line on stderr. */
int args_parse(int argc, char **argv, Options *o);
/* Prints the one error line ("pipecc: error: ..."), through err_set so that
 * a model path or name with a newline or an escape sequence in it is
 * escaped; returns the exit status, 2. */
/* Whether o's flags replicate (o->replicas > 1): 0, or -1 with why not yet in out ("--replicas R with ..."). */
int args_check_replicas(const Options *o, char *out, size_t len);
int report_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#endif
