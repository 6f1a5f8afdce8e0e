/* cuda/movement.h - (being written) */
