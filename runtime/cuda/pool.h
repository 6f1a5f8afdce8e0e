/* cuda/pool.h - (being written) */
