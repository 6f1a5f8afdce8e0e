/* cuda/device.cu - the device layer (device.h) for an NVIDIA GPU.
 *
 * The arena is one cudaMalloc of the size the compiler laid out, at the same offsets; the stage
 * program's calls run on pr_cu_stream (common.cu) in the order it makes them.  The program's host
 * arena (the static array the C target computes in) is the arena's host image here: every view and
 * every message goes through the same offsets of it, so a value has one host address wherever the
 * runtime looks at it and no second buffer is ever allocated.
 *
 * Messages: Debian's Open MPI is not CUDA-aware, so a send copies its bytes from the device into the
 * host image (after the work enqueued before it, which wrote them) and MPI sends from there; a
 * receive lands in the host image and is copied to the device when the runtime says it has landed,
 * before the call that reads it.  The host image's message ranges are page-locked once (cudaHostRegister)
 * so that these copies run at the link's speed.
 *
 * Events are CUDA events on the compute stream: recorded after the F or B that fills a slot, awaited
 * (host-side) before its send is staged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

extern "C" {
#include "../device.h"
}

static unsigned char *dev_base, *host_base;


/* The host image's address of device bytes dev. */
static unsigned char *host_of(const unsigned char *dev) { return host_base + (dev - dev_base); }

extern "C" const char *pr_dev_name(void) { return "cuda"; }

extern "C" int pr_dev_open(int local_rank, int precision) {
  pr_cu_init(local_rank, precision);
  return 0;
}

extern "C" unsigned char *pr_dev_arena_alloc(unsigned char *host, int64_t bytes) {
  void *d = NULL;
  if (cudaMalloc(&d, (size_t)(bytes > 0 ? bytes : 256)) != cudaSuccess) {
    (void)cudaGetLastError(); /* the failure is the caller's to report: no room */
    return NULL;
  }
  /* Zeroed, as the C target's static arena is: gradients and optimizer slots start at 0. */
  PR_CU(cudaMemsetAsync(d, 0, (size_t)(bytes > 0 ? bytes : 256), pr_cu_stream));
  PR_CU(cudaStreamSynchronize(pr_cu_stream));
  dev_base = (unsigned char *)d, host_base = host;
  return dev_base;
}

extern "C" void pr_dev_arena_free(unsigned char *dev, unsigned char *host) {
  (void)host;
  if (!dev) return;
  PR_CU(cudaStreamSynchronize(pr_cu_stream));
  PR_CU(cudaFree(dev));
  if (dev == dev_base) dev_base = NULL, host_base = NULL;
}

extern "C" void pr_dev_from_host(unsigned char *dst, const void *src, int64_t bytes) {
  if (bytes <= 0) return;
  PR_CU(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyHostToDevice, pr_cu_stream));
  PR_CU(cudaStreamSynchronize(pr_cu_stream)); /* src may be freed or changed when this returns */
}
extern "C" void pr_dev_to_host(void *dst, const unsigned char *src, int64_t bytes) {
  if (bytes <= 0) return;
  PR_CU(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost, pr_cu_stream));
  PR_CU(cudaStreamSynchronize(pr_cu_stream));
  pr_dev_check(); /* the bytes may be a Gather's output, 0 where an index was bad */
}
extern "C" void pr_dev_copy(unsigned char *dst, const unsigned char *src, int64_t bytes) {
  if (bytes > 0) PR_CU(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, pr_cu_stream));
}
extern "C" void pr_dev_memset(unsigned char *dst, int byte, int64_t bytes) {
  if (bytes > 0) PR_CU(cudaMemsetAsync(dst, byte, (size_t)bytes, pr_cu_stream));
}

/* A view is the host image's bytes: filled from the device for a read, copied back on release for a write. */
extern "C" void *pr_dev_view(unsigned char *dev, int64_t bytes, int mode) {
  unsigned char *h = host_of(dev);
  if (mode & PR_VIEW_READ) pr_dev_to_host(h, dev, bytes);
  return h;
}
extern "C" void pr_dev_release(void *view, unsigned char *dev, int64_t bytes, int mode) {
  if (mode & PR_VIEW_WRITE) pr_dev_from_host(dev, view, bytes);
}

/* Messages through the host image (above). */
extern "C" void *pr_dev_msg_out(unsigned char *dev, int64_t bytes) {
  unsigned char *h = host_of(dev);
  pr_dev_to_host(h, dev, bytes);
  return h;
}
/* A landed message's copy to the device is queued on the stream, behind the work before it: the next
 * receive into the same host bytes must wait for that copy, not for the whole stream.  One event per
 * message address (a stage has a few: its rings' slots), found by open addressing. */
enum { NLANDING = 4096 };
static struct Landing {
  const unsigned char *dev;
  cudaEvent_t copied;
} landing[NLANDING];
static int landing_full; /* an address found no entry: its receives wait for the whole stream */
static struct Landing *landing_of(const unsigned char *dev, int add) {
  uint64_t h = (uint64_t)(uintptr_t)dev * 0x9E3779B97F4A7C15ull;
  for (int k = 0; k < NLANDING; k++) {
    struct Landing *l = &landing[((h >> 52) + (uint64_t)k) & (NLANDING - 1)];
    if (l->dev == dev) return l;
    if (!l->dev) {
      if (!add) return NULL;
      l->dev = dev;
      PR_CU(cudaEventCreateWithFlags(&l->copied, cudaEventDisableTiming));
      return l;
    }
  }
  if (add) landing_full = 1;
  return NULL; /* full: the callers fall back to the stream */
}

extern "C" void *pr_dev_msg_in(unsigned char *dev, int64_t bytes) {
  (void)bytes;
  struct Landing *l = landing_of(dev, 0);
  if (l) PR_CU(cudaEventSynchronize(l->copied));
  else if (landing_full) PR_CU(cudaStreamSynchronize(pr_cu_stream));
  return host_of(dev);
}
extern "C" void pr_dev_msg_landed(unsigned char *dev, int64_t bytes) {
  if (bytes <= 0) return;
  PR_CU(cudaMemcpyAsync(dev, host_of(dev), (size_t)bytes, cudaMemcpyHostToDevice, pr_cu_stream));
  struct Landing *l = landing_of(dev, 1);
  if (l) PR_CU(cudaEventRecord(l->copied, pr_cu_stream));
  else PR_CU(cudaStreamSynchronize(pr_cu_stream)); /* no event to wait on later: wait now */
}
extern "C" void pr_dev_pin(unsigned char *dev, int64_t bytes) {
  if (bytes <= 0) return;
  /* Whole pages.  Where CUDA cannot lock them (a limit on locked memory), the copies still run, from
   * pageable memory, more slowly: not an error. */
  uintptr_t lo = (uintptr_t)host_of(dev) & ~(uintptr_t)4095, hi = ((uintptr_t)host_of(dev) + (uintptr_t)bytes + 4095) & ~(uintptr_t)4095;
  if (cudaHostRegister((void *)lo, hi - lo, cudaHostRegisterDefault) != cudaSuccess) (void)cudaGetLastError();
}

extern "C" void pr_dev_record(PrDevEvent *e) {
  if (!e->impl) {
    cudaEvent_t ev;
    PR_CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    e->impl = (void *)ev;
  }
  PR_CU(cudaEventRecord((cudaEvent_t)e->impl, pr_cu_stream));
}
extern "C" void pr_dev_await(PrDevEvent *e) {
  if (e->impl) PR_CU(cudaEventSynchronize((cudaEvent_t)e->impl));
  pr_dev_check();
}
extern "C" void pr_dev_sync(void) {
  PR_CU(cudaStreamSynchronize(pr_cu_stream));
  pr_dev_check();
}

/* A kernel's bad input (common.cuh, PrCuFault): a load from host memory the GPU wrote, no copy or wait.
 * Only a record whose writer has finished (ready, set behind a system-wide fence) is read; it is cleared
 * before the report, which stops the run (a test harness's returns, and may see the next). */
extern "C" void pr_dev_check(void) {
  PrCuFault *f = pr_cu_fault_host;
  if (!f || !f->ready) return;
  PrCuFault seen = *f;
  f->ready = 0;
  __atomic_store_n(&f->claimed, 0, __ATOMIC_SEQ_CST);
  RandCtx when = {0, seen.step, seen.mb};
  pr_bad_index(seen.node, seen.what == PR_CU_FAULT_GATHER_GRAD ? "Gather's gradient" : "Gather", seen.at, seen.index, seen.rows, &when);
}

/* The first index of a non-finite element: each thread keeps the least it saw, one atomicMin per
 * thread on an integer (the least index is the same whatever order they land in). */
__global__ static void nonfinite_kernel(const float *x, int64_t n, unsigned long long *first) {
  unsigned long long mine = ~0ull;
  PR_CU_FOR(i, n) {
    if (!isfinite(x[i])) {
      mine = (unsigned long long)i;
      break;
    }
  }
  if (mine != ~0ull) atomicMin(first, mine);
}
static int64_t cuda_nonfinite(const float *x, int64_t n) {
  if (n <= 0) return -1;
  unsigned long long *d = (unsigned long long *)pr_cu_scratch(sizeof *d), h = ~0ull;
  PR_CU(cudaMemsetAsync(d, 0xff, sizeof *d, pr_cu_stream));
  nonfinite_kernel<<<pr_cu_blocks(n, PR_CU_THREADS), PR_CU_THREADS, 0, pr_cu_stream>>>(x, n, d);
  PR_CU_LAUNCHED();
  PR_CU(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, pr_cu_stream));
  PR_CU(cudaStreamSynchronize(pr_cu_stream));
  return h == ~0ull ? -1 : (int64_t)h;
}

/* The sum of squares in double, element by element in order, on the host: the same bits as the CPU's
 * (--freeze auto's gradient norms, once per layer per check; not a hot path). */
static double cuda_sumsq(const float *x, int64_t n) {
  if (n <= 0) return 0;
  float *h = (float *)malloc((size_t)n * sizeof *h);
  if (!h) pr_cu_fail("sum of squares", "out of host memory", __FILE__, __LINE__);
  pr_dev_to_host(h, (const unsigned char *)x, n * (int64_t)sizeof *h);
  double acc = 0;
  for (int64_t k = 0; k < n; k++) acc += (double)h[k] * h[k];
  free(h);
  return acc;
}

extern "C" const PrDevKernels pr_dev_kernels = {cuda_nonfinite, cuda_sumsq};
