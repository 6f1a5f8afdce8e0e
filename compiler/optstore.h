/* optstore.h - the weights' side leaves the arena (--offload-optimizer, optstore.c). */
#ifndef PIPECC_OPTSTORE_H
#define PIPECC_OPTSTORE_H
#include "stageprog.h"

/* The most floats of one weight's state the update streams at a time (a block; two are in flight). */
#define OPT_BLOCK_MAX 16384

/* What leaves: nothing, the optimizer state, the state and the gradients optstore_grad_ok allows, or those with
 * a Gemm's weight gradient brought in bands of GRAD_BAND_ROWS rows. */
enum { OPTSTORE_NONE, OPTSTORE_STATE, OPTSTORE_GRADS, OPTSTORE_BANDS };
#define GRAD_BAND_ROWS 96

/* Bytes of optimizer state stage sp keeps (momentum, Adam's moments), 0 when none. */
int64_t optstore_state_bytes(const StageProg *sp);
/* May weight i's gradient live in the file (one backward call writes it, and no other gradient)? */
int optstore_grad_ok(const StageProg *sp, int i);
/* Bytes of the gradients that may leave. */
int64_t optstore_grad_bytes(const StageProg *sp);
/* The most sp may move under the plan's flags: OPTSTORE_NONE, _STATE or _GRADS. */
int optstore_modes(const Plan *p, const StageProg *sp);
/* Marks what of sp lives in the store (mode OPTSTORE_*): memplan lays it out so, with the update's staging
 * blocks (opt_stage_bytes) and the backward's two gradient copies (grad_stage_bytes). */
void optstore_set(StageProg *sp, int mode);
/* Seconds the streamed update adds to the stage's update (update_s: its compute) at the store's
 * bandwidth bw (bytes out and back per second) and latency lat. */
double optstore_time(const StageProg *sp, double update_s, double bw, double lat);
/* ... and that each micro-batch's backward (bwd_s: its compute) waits for stored gradients. */
double optstore_bwd_time(const StageProg *sp, double bwd_s, double bw, double lat);
/* Once the plan keeps sp's state (and gradients) in the store: the update calls stream them (k_sgd_stream,
 * k_adam_stream), each stored gradient's backward call works on a staging copy between a fetch and a
 * write-back, and its zeroing goes; memplan lays the program out again. */
void optstore_finish(StageProg *sp, Pool *pool);
#endif
