/* kernels.h - the compute kernels stage programs call, one per op and
 * direction.  static inline so that the generated code's constant shapes
 * specialise them; GEMM goes through CBLAS (OpenBLAS, one thread per rank).
 *
 * Conventions: row-major float32, NCHW.  Every backward kernel takes `acc`:
 * 0 = write the gradient, 1 = add to what is there (a tensor read by several
 * ops, or a weight gradient summed over micro-batches).  The order of those
 * additions is fixed by the compiler, which is what makes -n 1 and -n 4
 * produce bit-identical weights. */
#ifndef PIPERUN_KERNELS_H
#define PIPERUN_KERNELS_H
/* The kernels, by family (runtime/cpu/): each header includes cpu/common.h, which it builds on. */
#include "cpu/common.h"
#include "cpu/gemm.h"
#include "cpu/activation.h"
#include "cpu/movement.h"
#include "cpu/conv.h"
#include "cpu/pool.h"
#include "cpu/binary.h"
#include "cpu/norm.h"
#include "cpu/reduce.h"
#include "cpu/loss.h"
#include "cpu/dropout.h"
#include "cpu/rnn.h"
#include "cpu/optim.h"
#endif
