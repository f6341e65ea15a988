// A strict safetensors reader and writer, so checkpoints can be exchanged
// with the Python ecosystem and written by many ranks at once.
//
// Format: u64 little-endian N, then N bytes of UTF-8 JSON (padded with
// spaces), then the data buffer. The JSON maps tensor name ->
// {"dtype", "shape", "data_offsets": [begin, end]} plus an optional
// "__metadata__" object of string -> string. Offsets are relative to the
// data buffer, which starts at file offset 8 + N.
//
// Layout is kept apart from data I/O: every rank builds the same StFile from
// the same tensor list (st_init, st_add, st_set_meta, st_finalize), one rank
// writes the header (st_write_header), and each rank pwrites its own byte
// ranges (st_write_range) in any order. Readers st_open a file, then pread
// byte ranges of tensors (st_read_range). The range calls only read the
// StFile, so threads may share one.
//
// Invariants of an StFile, checked by st_open/st_parse_header and kept by
// st_add: names are unique, non-empty, valid UTF-8; each tensor's bytes are
// end - begin = numel * dtype size; the tensors tile [0, data_size) with no
// holes, overlaps or trailing bytes. The reader rejects anything else
// (duplicate JSON keys, unknown or missing fields, non-integer numbers, ...),
// each error a message "PATH: ..." naming the tensor and the problem.
//
// Writers emit tensors in insertion order with "__metadata__" first and
// offsets assigned in insertion order, so the header is a function of the
// tensor list alone. All functions that can fail return -1 with a message in
// err (err may be NULL), 0 or an index on success.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum {
    ST_F64, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_I16, ST_I8,
    ST_U64, ST_U32, ST_U16, ST_U8, ST_BOOL, ST_F8_E4M3, ST_F8_E5M2,
    ST_NDTYPES
} StDtype;

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER 100000000u   // bytes; the limit Python's reader applies too

typedef struct {
    char *name;
    StDtype dtype;
    int ndim;                      // 0 for a scalar
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;           // byte offsets within the data buffer
} StTensor;

typedef struct {
    StTensor *tensors;             // in header order
    int n, cap;
    char **meta_keys, **meta_vals;
    int n_meta;
    uint64_t header_len;           // N: JSON bytes incl. padding; 0 = not finalized
    uint64_t data_size;            // bytes in the data buffer
    int *slots, n_slots;           // private: name hash index for st_find
} StFile;

size_t st_dtype_size(StDtype dt);          // bytes per element; 0 if invalid
const char *st_dtype_name(StDtype dt);     // "F32", ...; "?" if invalid
static inline uint64_t st_nbytes(const StTensor *t) { return t->end - t->begin; }

// Building a layout. st_add appends a tensor whose bytes follow the previous
// one's and returns its index; shape may be NULL when ndim is 0. st_set_meta
// adds or replaces a metadata entry. Both make the header stale.
void st_init(StFile *f);
int st_add(StFile *f, const char *name, StDtype dt, int ndim, const int64_t *shape,
           char *err, size_t errlen);
int st_set_meta(StFile *f, const char *key, const char *val, char *err, size_t errlen);
// Serialises the header to fix header_len, the data start 8 + header_len.
// Needed before st_write_range on ranks that do not call st_write_header.
int st_finalize(StFile *f, char *err, size_t errlen);
int st_find(const StFile *f, const char *name);           // index or -1
const char *st_get_meta(const StFile *f, const char *key);  // NULL if absent
void st_free(StFile *f);                                  // leaves f as st_init does

// Writing. st_write_header finalizes, writes length + JSON + padding at
// offset 0 and sets the file's size to 8 + N + data_size (one rank, once).
// st_write_range pwrites nbytes at byte_off within tensor idx. path only
// names the file in messages.
int st_write_header(int fd, const char *path, StFile *f, char *err, size_t errlen);
int st_write_range(int fd, const char *path, const StFile *f, int idx, uint64_t byte_off,
                   const void *data, uint64_t nbytes, char *err, size_t errlen);
// Creates (truncates) path and writes every tensor, datas[i] holding tensor
// i's bytes (NULL allowed for an empty tensor), then fsyncs.
int st_save(const char *path, StFile *f, const void *const *datas, char *err, size_t errlen);

// Reading. st_open reads and validates the header; on success *fd_out is an
// open descriptor the caller closes and f must be st_free'd. On failure f is
// left empty and nothing is open.
int st_open(const char *path, int *fd_out, StFile *f, char *err, size_t errlen);
int st_read_range(int fd, const char *path, const StFile *f, int idx, uint64_t byte_off,
                  void *data, uint64_t nbytes, char *err, size_t errlen);
// Validates header JSON from memory: json/len are the N header bytes,
// file_size the whole file's size (8 + N + data bytes). path names the
// source in messages (NULL: "<memory>"). Same contract on f as st_open.
int st_parse_header(const char *json, size_t len, uint64_t file_size, const char *path,
                    StFile *f, char *err, size_t errlen);

// Checks that tensor name exists with this dtype and shape; returns its
// index, or -1 and "PATH: tensor NAME has dtype BF16 shape [4, 8], expected
// F32 [4, 9]" or "PATH: missing tensor NAME".
int st_expect(const StFile *f, const char *path, const char *name, StDtype dt, int ndim,
              const int64_t *shape, char *err, size_t errlen);
