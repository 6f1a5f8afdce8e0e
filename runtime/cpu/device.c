/* cpu/device.c - the device layer (device.h) for the CPU: the device's memory
 * is the host's, so the arena is the program's own, a view is the bytes
 * themselves, a copy is memcpy and every call is done when it returns.  The
 * runtime's kernels are kernels.h's, the ones the stage programs were
 * always trained with, so the weights come out the same to the bit. */
#include "device.h"

#include <math.h>
#include <string.h>

#include "kernels.h"

const char *pr_dev_name(void) { return "cpu"; }

/* One device, the host's cores; its products run in fp32 (the precision is the GPU's choice). */
int pr_dev_open(int local_rank, int precision) {
  (void)local_rank, (void)precision;
  return 0;
}

/* The compiler laid the arena out in the program's own memory: nothing to allocate, nothing to copy. */
unsigned char *pr_dev_arena_alloc(unsigned char *host, int64_t bytes) {
  (void)bytes;
  return host;
}
void pr_dev_arena_free(unsigned char *dev, unsigned char *host) { (void)dev, (void)host; }

void pr_dev_from_host(unsigned char *dst, const void *src, int64_t bytes) {
  if (bytes > 0 && dst != src) memcpy(dst, src, (size_t)bytes);
}
void pr_dev_to_host(void *dst, const unsigned char *src, int64_t bytes) {
  if (bytes > 0 && dst != src) memcpy(dst, src, (size_t)bytes);
}
void pr_dev_copy(unsigned char *dst, const unsigned char *src, int64_t bytes) {
  if (bytes > 0) memcpy(dst, src, (size_t)bytes);
}
void pr_dev_memset(unsigned char *dst, int byte, int64_t bytes) {
  if (bytes > 0) memset(dst, byte, (size_t)bytes);
}

void *pr_dev_view(unsigned char *dev, int64_t bytes, int mode) {
  (void)bytes, (void)mode;
  return dev;
}
void pr_dev_release(void *view, unsigned char *dev, int64_t bytes, int mode) { (void)view, (void)dev, (void)bytes, (void)mode; }

void *pr_dev_msg_out(unsigned char *dev, int64_t bytes) {
  (void)bytes;
  return dev;
}
void *pr_dev_msg_in(unsigned char *dev, int64_t bytes) {
  (void)bytes;
  return dev;
}
void pr_dev_msg_landed(unsigned char *dev, int64_t bytes) { (void)dev, (void)bytes; }
void pr_dev_pin(unsigned char *dev, int64_t bytes) { (void)dev, (void)bytes; }

/* The CPU runs each call to its end before returning: there is nothing to wait for. */
void pr_dev_record(PrDevEvent *e) { e->impl = NULL; }
void pr_dev_await(PrDevEvent *e) { (void)e; }
void pr_dev_sync(void) {}
/* The kernels stop the run themselves (pr_bad_index): nothing is ever pending. */
void pr_dev_check(void) {}

/* A pass over the exponent bits that vectorises (all ones: Inf or NaN); the element is looked for only
 * when there is one. */
static int64_t cpu_nonfinite(const float *x, int64_t n) {
  const uint32_t *b = (const uint32_t *)x;
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad |= (b[i] & 0x7f800000u) == 0x7f800000u;
  if (!bad) return -1;
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return i;
  return -1;
}

static double cpu_sumsq(const float *x, int64_t n) {
  double acc = 0;
  for (int64_t k = 0; k < n; k++) acc += (double)x[k] * x[k];
  return acc;
}

const PrDevKernels pr_dev_kernels = {cpu_nonfinite, cpu_sumsq};
