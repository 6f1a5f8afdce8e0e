/* cuda/precision.h - the precision the GPU's matrix products run in (run.sh --precision, pipecc
 * --precision): fp32 with TF32 off (the parity mode, the default), TF32 tensor cores, or bf16 inputs with
 * fp32 accumulation.  Weights, optimizer state and every other kernel stay fp32. */
#ifndef PIPERUN_CUDA_PRECISION_H
#define PIPERUN_CUDA_PRECISION_H
enum { PR_PREC_FP32 = 0, PR_PREC_TF32 = 1, PR_PREC_BF16 = 2 };
extern int pr_cu_precision;
/* Picks the GPU (the local rank's, modulo the GPUs there are), makes the stream and the cuBLAS handle
 * and sets the precision.  Once per process, before the first kernel. */
void pr_cu_init(int device, int precision);
#endif
