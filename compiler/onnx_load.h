/* onnx_load.h - ONNX ModelProto (protobuf-c) -> Graph. */
#ifndef PIPECC_ONNX_LOAD_H
#define PIPECC_ONNX_LOAD_H
#include "ir.h"

/* Loads `path`; external-data files are resolved next to it.  Returns 0, or
 * -1 with err_set() describing the problem (the graph is then freed). */
int onnx_load_file(const char *path, Graph *g);
/* Loads from memory; `dir` is where external data lives (NULL: none allowed). */
int onnx_load_buffer(const uint8_t *data, size_t len, const char *name, const char *dir, Graph *g);
/* The loaded model with --untie's copies as initializers and without the data of the initializers
 * strip[tensor] marks (NULL: none), packed (malloc'd bytes). */
int onnx_pack_model(const Graph *g, const char *strip, uint8_t **out, size_t *len);
#endif
