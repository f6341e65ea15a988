// The header of a NumPy .npy file (numpy.lib.format, versions 1.0, 2.0 and
// 3.0), so that token arrays written by np.save load as they are:
//
//   "\x93NUMPY" major minor  header length (uint16 LE in 1.x, uint32 LE in 2.x, 3.x)
//   "{'descr': '<u4', 'fortran_order': False, 'shape': (N,), }"  padded with
//   spaces and a newline; the data follows, N items of the dtype.
//
// Only what a token file can be is accepted: a 1-D array of little-endian
// uint16 ('<u2') or uint32 ('<u4'), C order. Olmo-core's token files are
// usually named *.npy but are bare np.memmap arrays without this header; a
// file that does not start with the magic is such a raw file.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_PREAMBLE 12          // the bytes to read to know the header length (10 in 1.x)
#define NPY_MAX_HEADER (1 << 20) // longer headers are refused (numpy writes < 200 bytes)

typedef struct {
    int major, minor;
    int64_t data_offset;         // bytes before the first item
    int64_t n_items;             // the shape's one dimension
    int item_size;               // 2 ('<u2') or 4 ('<u4')
    char descr[32];
} NpyHeader;

// Whether the n bytes at buf (the start of a file) begin with the magic.
int npy_has_magic(const unsigned char *buf, size_t n);
// The header's total length (preamble included) from the first
// NPY_PREAMBLE bytes; -1 with a message for an unknown version or a length
// over NPY_MAX_HEADER.
int64_t npy_header_size(const unsigned char *pre, size_t n, char *err, size_t errlen);
// Parses the whole header (size bytes from the file's start). -1 with a
// message saying what is wrong and what moecore reads instead.
int npy_parse(const unsigned char *buf, size_t size, NpyHeader *h, char *err, size_t errlen);
