/* cuda/kernels.h - the GPU's kernels, one per kernel of compiler/kernels.def: kc_<name> for k_<name>,
 * the same arguments with every buffer in device memory (cuda/common.cuh has the conventions).  A CUDA
 * stage program (compiler/render_cuda.c) calls these; tests/gpu/kernels.c checks each against its CPU
 * kernel.  C prototypes, implemented in the family's .cu file. */
#ifndef PIPERUN_CUDA_KERNELS_H
#define PIPERUN_CUDA_KERNELS_H
#include <stdint.h>

#include "../shapes.h"
#include "precision.h"
#ifdef __cplusplus
extern "C" {
#endif
#include "gemm.h"
#include "conv.h"
#include "pool.h"
#include "activation.h"
#include "binary.h"
#include "movement.h"
#include "reduce.h"
#include "norm.h"
#include "loss.h"
#include "dropout.h"
#include "optim.h"
#include "rnn.h"
#ifdef __cplusplus
}
#endif
#endif
