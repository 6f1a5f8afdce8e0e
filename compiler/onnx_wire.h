/* onnx_wire.h - a model's weights out of its protobuf, read once.
 *
 * protobuf-c copies every bytes field it unpacks, so unpacking a file read
 * into memory holds its weights twice.  wire_split walks the protobuf's wire
 * format instead and writes a small copy of the model without the payloads
 * of the graph's initializers' raw_data, noting where each payload lies in
 * the file; the loader unpacks that and copies each payload from the mapped
 * file into its tensor, dropping the file's pages as it goes. */
#ifndef PIPECC_ONNX_WIRE_H
#define PIPECC_ONNX_WIRE_H
#include <stddef.h>
#include <stdint.h>

typedef struct WireSplit {
  uint8_t *skeleton; /* the model without the initializers' raw_data payloads (malloc'd) */
  size_t len;
  size_t ninit;      /* graph initializers, in the file's order */
  size_t *off, *plen; /* initializer i's raw_data payload: file bytes [off, off + plen) */
  char *has;         /* initializer i has raw_data */
} WireSplit;

/* 0, or -1 when buf is not a model this walk handles (bad wire format, a graph or raw_data given
 * twice, groups): the caller then unpacks the whole file, which says what is wrong with it. */
int wire_split(const uint8_t *buf, size_t len, WireSplit *w);
void wire_free(WireSplit *w);
#endif
