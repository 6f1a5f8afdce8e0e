/* cuda/gemm.h - (being written) */
