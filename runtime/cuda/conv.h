/* cuda/conv.h - (being written) */
