/* main.c - the pipecc command line: the flags (args.c), then the whole
 * pipeline (driver.c).
 *
 * Any problem with the input is one line on stderr, exit status 2, and no
 * output directory. */
#include "args.h"
#include "driver.h"
#include "../runtime/blas_core.h"

int main(int argc, char **argv) {
  /* The probe times the BLAS kernels the stage programs will run. */
  blas_core_pin(argv, NULL);
  Options o;
  int rc = args_parse(argc, argv, &o);
  return rc >= 0 ? rc : driver_run(&o);
}
