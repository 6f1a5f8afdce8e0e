/* cuda/reduce.h - (being written) */
