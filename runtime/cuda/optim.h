/* cuda/optim.h - (being written) */
