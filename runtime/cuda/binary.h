/* cuda/binary.h - (being written) */
