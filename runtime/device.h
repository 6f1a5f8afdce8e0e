/* device.h - what the runtime needs from the device a stage computes on.
 *
 * The arena (every buffer the compiler laid out: weights, gradients,
 * optimizer state, the rings of values that cross the cuts) lives in the
 * device's memory.  The runtime never dereferences it itself: it reads and
 * writes it through host views (the loader, checkpoints, the checks), copies
 * within it, sends and receives it through MPI, and runs its own two kernels
 * on it (the NaN scan, sums of squares), all declared here; the optimizer
 * step and tied weights' sums are the stage program's own calls.  One
 * implementation per device, in a folder of its own: cpu/device.c, where the
 * device's memory is the host's, a view is the bytes themselves and a copy
 * is memcpy, so the CPU pays nothing for the layer.  A GPU's (cuda/) copies
 * views in and out, orders its copies and kernels on a stream and sends
 * from device memory (staging through pinned host buffers where the MPI is
 * not CUDA-aware, as Debian's is not), without a change to the common files. */
#ifndef PIPERUN_DEVICE_H
#define PIPERUN_DEVICE_H
#include <stdint.h>

/* The device, named in the end-of-run summary ("cpu"). */
const char *pr_dev_name(void);

/* Opens the device for this rank before anything else touches it: the GPU of its local rank (modulo
 * the GPUs there are; ranks may share one) and the precision its matrix products run in (PR_PREC_*,
 * cuda/precision.h; the CPU has one).  0, or -1 when there is no such device. */
int pr_dev_open(int local_rank, int precision);

/* The arena on the device, for a program whose arena the compiler laid out in host memory (host, bytes
 * long; the CPU: host itself, nothing allocated).  NULL when the device has no room. */
unsigned char *pr_dev_arena_alloc(unsigned char *host, int64_t bytes);
void pr_dev_arena_free(unsigned char *dev, unsigned char *host);

/* Copies: host to device, device to host, within the device; memset on the device.  Ordered after the
 * device work enqueued before them, done when they return. */
void pr_dev_from_host(unsigned char *dst, const void *src, int64_t bytes);
void pr_dev_to_host(void *dst, const unsigned char *src, int64_t bytes);
void pr_dev_copy(unsigned char *dst, const unsigned char *src, int64_t bytes);
void pr_dev_memset(unsigned char *dst, int byte, int64_t bytes);

/* A host view of bytes bytes of device memory, for the runtime's own reads (PR_VIEW_READ: filled from
 * the device) and writes (PR_VIEW_WRITE: copied to the device when released).  The CPU: the bytes
 * themselves.  Every view is released, with the same arguments. */
enum { PR_VIEW_READ = 1, PR_VIEW_WRITE = 2, PR_VIEW_RW = 3 };
void *pr_dev_view(unsigned char *dev, int64_t bytes, int mode);
void pr_dev_release(void *view, unsigned char *dev, int64_t bytes, int mode);

/* Messages.  MPI sends from and receives into host memory where it is not CUDA-aware (Debian's): a
 * send's bytes are staged out of the device (pr_dev_msg_out, after the work that wrote them: await its
 * event first), a receive's land in host memory (pr_dev_msg_in) and go to the device once it has
 * completed (pr_dev_msg_landed, before the call that reads them).  The CPU: dev itself, no copy.
 * pr_dev_pin: the arena's host image, page-locked once where that speeds the copies (a stage with messages). */
void *pr_dev_msg_out(unsigned char *dev, int64_t bytes);
void *pr_dev_msg_in(unsigned char *dev, int64_t bytes);
void pr_dev_msg_landed(unsigned char *dev, int64_t bytes);
void pr_dev_pin(unsigned char *dev, int64_t bytes);

/* Events order the device's work against the host: recorded after the work that fills a buffer,
 * awaited before the buffer is sent or read.  The CPU's work is done when its call returns: an event
 * is always complete. */
typedef struct PrDevEvent {
  void *impl; /* the device's own event; NULL on the CPU */
} PrDevEvent;
void pr_dev_record(PrDevEvent *e);
void pr_dev_await(PrDevEvent *e);
/* Awaits all the device's work (the end of a step's update, before weights are sent or written). */
void pr_dev_sync(void);

/* Stops the run if a kernel found input it cannot compute on (a Gather index outside its table:
 * shapes.h, pr_bad_index), naming the node, the step and micro-batch it ran in, and the stage.  The
 * CPU's kernels stop at once, so its check does nothing.  A GPU's cannot without a sync per call: they
 * record the first in host memory the GPU writes (touching nothing outside the table meanwhile), and
 * this reads it, at no cost.  Every call above that waits for the device (pr_dev_to_host, a read view, a
 * message staged out, pr_dev_await, pr_dev_sync) checks after its wait, so a fault stops the run at the
 * next message, loss or update; the runtime checks once more when the run ends. */
void pr_dev_check(void);

/* The runtime's own kernels on device memory (floats): the first element that is not finite (-1:
 * none), the sum of squares (in double, in order: --freeze auto's gradient norms, the same on every
 * device).  The optimizer step, zeroing and tied sums are the stage program's own calls. */
typedef struct PrDevKernels {
  int64_t (*nonfinite)(const float *x, int64_t n);
  double (*sumsq)(const float *x, int64_t n);
} PrDevKernels;
extern const PrDevKernels pr_dev_kernels;
#endif
