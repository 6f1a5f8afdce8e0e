/* fuzz_loader.c - libFuzzer target: the ONNX loader and every pass after it
 * on arbitrary bytes - shape inference, constant folding, costs, the
 * partition and the schedule for 2 stages, autodiff, the memory plan and the
 * C source of every stage.  It must reject what is wrong with a message and
 * never crash, overrun or leak.
 *
 * FUZZ_KEEP_DIR=DIR: every input the compiler accepts is also written there
 * as DIR/accepted-<hash>.onnx, so a test can build what the fuzzer's accepted
 * inputs produce (tests/fuzz_build.sh). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "onnx_load.h"
#include "driver.h"
#include "emit.h"

static char devices[4096];

/* Fixed machine figures, so no case probes the machine. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(devices, sizeof devices, "%s/pipecc-fuzz-devices-%d.txt", tmp, (int)getpid());
  FILE *f = fopen(devices, "w");
  if (!f) abort();
  fputs("rank * flops=50G mem=8G\nlink * bandwidth=5G latency=2us\nmemcpy bandwidth=10G\n", f);
  fclose(f);
  return 0;
}

/* Give symbolic or missing input dims a small size so later passes run too. */
static void fix_inputs(Graph *g) {
  for (int i = 0; i < g->ninputs; i++) {
    Tensor *t = &g->t[g->inputs[i]];
    if (t->declared_rank < 0 || t->declared_rank > MAX_RANK) continue;
    for (int d = 0; d < t->declared_rank; d++) {
      if (t->declared_dims[d] <= 0 || t->declared_dims[d] >= 64) t->declared_dims[d] = 2;
      t->declared_params[d] = NULL;
    }
  }
}

static void keep(const uint8_t *data, size_t size) {
  const char *dir = getenv("FUZZ_KEEP_DIR");
  if (!dir) return;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 1099511628211ull;
  char path[4200];
  snprintf(path, sizeof path, "%s/accepted-%016llx.onnx", dir, (unsigned long long)h);
  FILE *f = fopen(path, "wb");
  if (f) fwrite(data, 1, size, f), fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Plan p;
  memset(&p, 0, sizeof p);
  p.opt.nstages = 2, p.opt.schedule = size % 3, p.opt.batch = 4, p.opt.microbatches = 2;
  p.opt.devices = devices, p.opt.model = "fuzz.onnx";
  err_clear();
  if (onnx_load_buffer(data, size, "fuzz.onnx", NULL, &p.g)) return 0;
  fix_inputs(&p.g);
  if (!plan_from_graph(&p) && !plan_programs(&p) && p.progs) {
    for (int s = 0; s < p.opt.nstages; s++) {
      Buf src = {0};
      emit_stage(&p, p.progs, s, &src);
      buf_free(&src);
    }
    keep(data, size);
  }
  err_clear();
  plan_free(&p);
  return 0;
}
