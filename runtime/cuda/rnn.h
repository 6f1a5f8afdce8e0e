/* cuda/rnn.h - (being written) */
