/* eval.c - running a forward-only stage program on inputs from files.
 *
 *   stage_0 INPUT_DIR OUTPUT_DIR
 *
 * Inputs are ONNX TensorProto files (input_0.pb, input_1.pb, ... in graph
 * input order), as ONNX's node conformance tests store them; each output is
 * written raw as OUTPUT_DIR/<k>.bin.  No MPI: one process, one stage. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.pb-c.h"
#include "device.h"
#include "piperun.h"

static int fail(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "piperun eval: error: ");
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, "\n");
  return 2;
}

static int elem_size(int dt) {
  switch (dt) {
  case 1: case 6: case 12: return 4;
  case 7: case 11: case 13: return 8;
  case 2: case 3: case 9: return 1;
  case 4: case 5: case 10: return 2;
  default: return 0;
  }
}

/* Copies a TensorProto's values into dst, which holds exactly `bytes`. */
static int tensor_bytes_into(const Onnx__TensorProto *t, unsigned char *dst, int64_t bytes, const char *name) {
  if (t->has_raw_data) {
    if ((int64_t)t->raw_data.len != bytes) return fail("input %s: %s", name, "size does not match the compiled shape");
    memcpy(dst, t->raw_data.data, (size_t)bytes);
    return 0;
  }
  int es = elem_size(t->data_type);
  if (!es) return fail("input %s: %s", name, "unsupported element type");
  int64_t n = bytes / es;
  size_t have = t->data_type == 1 ? t->n_float_data : t->data_type == 7 ? t->n_int64_data : t->data_type == 11 ? t->n_double_data
                                                                                           : t->n_int32_data;
  if ((int64_t)have != n) return fail("input %s: %s", name, "value count does not match the compiled shape");
  for (int64_t i = 0; i < n; i++) {
    if (t->data_type == 1) ((float *)dst)[i] = t->float_data[i];
    else if (t->data_type == 7) ((int64_t *)dst)[i] = t->int64_data[i];
    else if (t->data_type == 11) ((double *)dst)[i] = t->double_data[i];
    else if (es == 1) dst[i] = (unsigned char)t->int32_data[i];
    else if (es == 2) ((uint16_t *)dst)[i] = (uint16_t)t->int32_data[i];
    else ((int32_t *)dst)[i] = t->int32_data[i];
  }
  return 0;
}

int pr_eval(int argc, char **argv, const PrStage *st) {
  if (argc != 3) return fail("usage: %s INPUT_DIR OUTPUT_DIR%s", argv[0], "");
  cpu_set_t set;
  int cpus = sched_getaffinity(0, sizeof set, &set) ? 1 : CPU_COUNT(&set);
  if (st->threads > 1 && pr_par_init(st->threads, cpus)) return fail("cannot start the threads of pipecc --threads: %s%s", strerror(errno), "");
  char path[4096];
  snprintf(path, sizeof path, "%s/weights/stage_0.bin", pr_stage_dir());
  FILE *w = fopen(path, "rb");
  if (!w) return fail("cannot open %s: %s", path, strerror(errno));
  size_t got = st->weights_bytes ? fread(st->arena, 1, (size_t)st->weights_bytes, w) : 0;
  fclose(w);
  if ((int64_t)got != st->weights_bytes) return fail("%s is shorter than the stage's weights%s", path, "");
  /* The host arena stages what goes to the device and what comes back (device.h; the CPU's device arena
   * is the host's: nothing is copied). */
  if (pr_dev_open(0, st->precision)) return fail("no device of the kind this program was compiled for%s%s", "", "");
  unsigned char *dev = pr_dev_arena_alloc(st->arena, st->arena_bytes);
  if (!dev) return fail("no room on the device for the arena%s%s", "", "");
  if (st->dev_arena) *st->dev_arena = dev;
  pr_dev_from_host(dev, st->arena, st->weights_bytes);
  for (int v = 0; v < st->nrecv; v++) {
    snprintf(path, sizeof path, "%s/input_%d.pb", argv[1], v);
    FILE *f = fopen(path, "rb");
    if (!f) return fail("cannot open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)len + 1);
    int ok = buf && fread(buf, 1, (size_t)len, f) == (size_t)len;
    fclose(f);
    Onnx__TensorProto *t = ok ? onnx__tensor_proto__unpack(NULL, (size_t)len, buf) : NULL;
    free(buf);
    if (!t) return fail("%s is not a TensorProto%s", path, "");
    int rc = tensor_bytes_into(t, st->arena + st->recv[v].offset, st->recv[v].bytes, st->recv[v].name);
    onnx__tensor_proto__free_unpacked(t, NULL);
    if (rc) return rc;
    pr_dev_from_host(dev + st->recv[v].offset, st->arena + st->recv[v].offset, st->recv[v].bytes);
  }
  st->forward(0, -1, -1, -1); /* a forward-only program: no gradient or late ring */
  pr_dev_sync();
  for (int v = 0; v < st->nsend; v++) {
    pr_dev_to_host(st->arena + st->send[v].offset, dev + st->send[v].offset, st->send[v].bytes);
    snprintf(path, sizeof path, "%s/%d.bin", argv[2], v);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(st->arena + st->send[v].offset, 1, (size_t)st->send[v].bytes, f) != (size_t)st->send[v].bytes || fclose(f))
      return fail("cannot write %s: %s", path, strerror(errno));
  }
  pr_dev_arena_free(dev, st->arena);
  return 0;
}
