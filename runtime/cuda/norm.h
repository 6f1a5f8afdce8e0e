/* cuda/norm.h - (being written) */
