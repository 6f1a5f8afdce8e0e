/* cuda/dropout.h - (being written) */
