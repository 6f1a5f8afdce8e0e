/* cuda/rnn.h - recurrent layers on the GPU: LSTM and GRU (ONNX's; forward, reverse or bidirectional,
 * layouts 0 and 1), kc_* for runtime/cpu/rnn.h's k_*, the same arguments and workspace (buffers in
 * device memory, the RnnShape a host struct). */
#ifndef PIPERUN_CUDA_RNN_H
#define PIPERUN_CUDA_RNN_H
#include "../shapes.h"

void kc_lstm(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0, float *y, float *yh,
             float *yc, float *work, const RnnShape *s);
void kc_lstm_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *c0, const float *dy,
                  const float *dyh, const float *dyc, float *dx, float *dw, float *dr, float *db, float *dh0, float *dc0, float *work,
                  const RnnShape *s, int acc);
void kc_gru(const float *x, const float *w, const float *r, const float *b, const float *h0, float *y, float *yh, float *work,
            const RnnShape *s);
void kc_gru_grad(const float *x, const float *w, const float *r, const float *b, const float *h0, const float *dy, const float *dyh,
                 float *dx, float *dw, float *dr, float *db, float *dh0, float *work, const RnnShape *s, int acc);
#endif
