/* cuda/loss.h - (being written) */
