/* cuda/activation.h - (being written) */
