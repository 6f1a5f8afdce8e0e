/* xfer.h - the file side of the memory plan: copies a micro-batch's offloaded
 * activations to a file and back while compute goes on (compiler/stash.c plans
 * when), as io_uring requests or on an I/O thread (xfer.c says which, and why). */
#ifndef PIPERUN_XFER_H
#define PIPERUN_XFER_H
#include <stddef.h>
#include <stdint.h>

typedef struct PrXfer PrXfer;

/* Opens DIR/pipecc-<what>-<stage>-<pid>.bin (what: "offload" for the
 * activations, "optstate" for the optimizer state; removed from the directory
 * at once: nothing is left behind, even by a crash) and sets up the copies; a
 * copy that waits timeout_s for the ones before it fails (xfer_error).
 * NULL with msg set on failure. */
PrXfer *xfer_open(const char *dir, const char *what, int stage, int nxslots, double timeout_s, char *msg, size_t len);
/* Sizes the file to bytes (zeros where nothing was written); 0, or -1 with msg naming the file. */
int xfer_size(PrXfer *x, int64_t bytes, char *msg, size_t len);
/* "io_uring" or "an I/O thread": what runs the copies. */
const char *xfer_kind(const PrXfer *x);
/* Queues a copy of bytes from buf to the file at off (write) or back (read);
 * xslot names the block it belongs to. */
void xfer_submit(PrXfer *x, int write, int xslot, void *buf, int64_t bytes, int64_t off);
/* Copies still queued or running for xslot. */
int xfer_pending(PrXfer *x, int xslot);
/* Waits up to about a millisecond for a copy to finish. */
void xfer_nap(PrXfer *x);
/* The first failure ("write: No space left on device"), or NULL. */
const char *xfer_error(PrXfer *x);
void xfer_close(PrXfer *x);
#endif
