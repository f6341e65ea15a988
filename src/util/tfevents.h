// TensorBoard event files, written without TensorFlow or a protobuf
// library: a file is a sequence of TFRecords (little-endian uint64 length,
// masked CRC32C of those 8 bytes, the data, masked CRC32C of the data), each
// holding one serialized tensorflow.Event. The first carries file_version
// "brain.Event:2"; each later one a step's scalars:
//   Event   { double wall_time = 1; int64 step = 2; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// Only these fields are written, hand-encoded (tfevents.c).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct TfEvents TfEvents;

// Creates DIR/events.out.tfevents.<unix seconds>.<host>.<pid>.moecore (a
// new file each time, as TensorBoard expects of a restarted writer) and
// writes the file_version event. NULL with a message naming the file.
TfEvents *tfevents_open(const char *dir, char *err, size_t errlen);
const char *tfevents_path(const TfEvents *w);
// One event per step: begin, any number of scalars, end (which writes the
// record and flushes it, so that TensorBoard sees each step as it comes).
// end returns -1 with a message when the write fails.
void tfevents_begin(TfEvents *w, int64_t step);
void tfevents_scalar(TfEvents *w, const char *tag, double value);
int tfevents_end(TfEvents *w, char *err, size_t errlen);
// Closes the file; -1 when that fails (NULL is a no-op).
int tfevents_close(TfEvents *w);

// CRC-32C (Castagnoli), as TFRecord uses it before masking.
uint32_t crc32c(const void *data, size_t n);
