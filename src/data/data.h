// The training data loader: fixed-length instances cut from raw token files,
// addressed by a global instance index so that resuming and data-parallel
// slicing are arithmetic (Olmo-core / Dolma conventions).
//
// Files. Flat little-endian uint16 or uint32 token arrays, documents
// separated by EOS (the loader does not look at EOS): either raw, with no
// header (Olmo-core's np.memmap files, usually named *.npy), or written by
// np.save, whose header (npy.h) must say the dtype data.dtype names and a
// 1-D shape; tokens then start after the header. A file is an .npy file
// when it starts with the magic "\x93NUMPY", whatever its name. Paths may be
// glob(3) patterns; each pattern's matches are sorted bytewise (strcmp), and
// patterns keep their given order. A file of n tokens gives floor(n/seq_len)
// instances at token offsets 0, seq_len, 2*seq_len, ...; the rest is dropped.
//
// Checks at open. The first MiB of tokens of the first file of every path or
// pattern is read and (a) every id in it must be < vocab_size, else an error
// that says what to change: data.dtype when the bytes read at the other
// width are all < vocab_size (a uint16 file read as uint32 gives ids of
// 65536 and more), otherwise model.vocab_size; (b) read as uint16 from a raw
// file whose size is a multiple of 4, at least 256 pairs of ids where every
// second one (the high halves of uint32 ids) is <= (vocab_size - 1) >> 16
// while the others are not all that small is a uint32 file read as uint16
// (its ids are all in range, so (a) cannot see it): an error naming
// data.dtype: uint32. Real uint16 text never has half of its ids 0 or 1 in
// alternating positions. Other files meet (a) as each instance is read, and
// data.validate checks (a) on every token and (b) on every file.
// An instance is exactly seq_len tokens x[0..T-1]; its targets are
// y[t] = x[t+1] for t < T-1 and y[T-1] = -1 (masked).
//
// The stream. Global index g = 0, 1, 2, ...; epoch e = g / N and slot
// k = g % N, where N is the number of instances per epoch. The trainer only
// remembers the next g, and rank r of a data-parallel group reads its slice
// of a global batch by index. With shuffle on, slot k of epoch e holds epoch
// position P(seed, e)(k), where P is a keyed permutation of [0, N): a 6-round
// Feistel network over splitmix64, cycle-walked down to N. It depends only on
// (seed, e, N), costs no memory and maps any g in O(1) (a Fisher-Yates table
// would cost 8 bytes per instance on every rank). With shuffle off (the eval
// set) slot k is position k: file order.
//
// Mixture. Without weights every instance of every file is one epoch
// position, in file order. With weights (every source's weight > 0; mixing
// weighted and unweighted sources is an error), let T = all instances of all
// sources and W = the sum of weights; source s then fills
//     c_s = llround(T * w_s / W)
// consecutive epoch positions (so N = sum c_s, which may differ from T by
// rounding). Source s, holding n_s instances, reads them as an endless
// stream of passes: its j-th position in epoch e is stream item
// q = e*c_s + j, which is item q % n_s of pass q / n_s, each pass being a
// keyed permutation P(seed, pass, s) of its n_s instances. So a source with
// c_s >= n_s repeats each instance floor or ceil(c_s/n_s) times per epoch,
// and a downsampled one sees all its data before any instance repeats.
//
// Reading. data_read preads exactly the bytes of each instance and checks
// every token against vocab_size. Files are stat'ed at open and opened on
// first read; their descriptors stay open until data_close (when the process
// runs out of descriptors, the loader closes the ones it holds and retries).
// A file whose size changed since data_open is an error. A loader is not
// thread-safe: use one per thread.
//
// Errors: functions that can fail return -1 (NULL for data_open) with a
// message "what and where" in err (err may be NULL); nothing exits but
// running out of memory (mallocCheck).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { TOKENS_U16, TOKENS_U32 } TokenDtype;

// "uint16" | "uint32"; 0 on success, -1 if unknown.
int tokens_dtype_parse(const char *s, TokenDtype *dt);
const char *tokens_dtype_name(TokenDtype dt);   // "uint16", "uint32", "?"
size_t tokens_dtype_size(TokenDtype dt);        // bytes per token; 0 if invalid

// One source: file paths or glob patterns, a weight (<= 0: unweighted) and
// an optional name for logs (NULL: "source<i>").
typedef struct {
    const char *name;
    const char *const *patterns;
    int n_patterns;
    double weight;
} DataSource;

typedef struct {
    const char *name;
    int n_files;
    int64_t n_tokens;        // in its files, remainders included
    int64_t n_instances;     // cut from its files
    int64_t per_epoch;       // epoch positions it fills (c_s; n_instances if unweighted)
    double weight;           // as given; <= 0 if unweighted
} DataSourceSummary;

typedef struct {
    int n_files, n_sources, seq_len, weighted, shuffle;
    TokenDtype dtype;
    int64_t n_tokens;               // in all files
    int64_t n_instances;            // cut from all files
    int64_t instances_per_epoch;    // N
    int64_t tokens_per_epoch;       // N * seq_len
    uint64_t fingerprint;           // of the file sizes, counts, seq_len, dtype, seed, shuffle:
                                    // equal fingerprints give the same stream over equal files
    const DataSourceSummary *sources;
} DataSummary;

typedef struct DataLoader DataLoader;

// Opens a loader over n_sources sources. seed keys the shuffle and the
// mixture passes; shuffle = 0 reads instances in file order (eval sets).
// Errors: a missing file, a pattern matching nothing, a file that is not a
// multiple of the token size, no complete instance at all, bad weights.
DataLoader *data_open(const DataSource *sources, int n_sources, TokenDtype dt, int seq_len,
                      int vocab_size, uint64_t seed, int shuffle, char *err, size_t errlen);
void data_close(DataLoader *d);

// Fills tokens[i*seq_len + t] and targets[i*seq_len + t] (targets may be
// NULL) for the count global instances g_start .. g_start+count-1.
// A token >= vocab_size is an error naming the file, byte offset and value.
int data_read(DataLoader *d, int64_t g_start, int count, int *tokens, int *targets,
              char *err, size_t errlen);

// Where global instance g (>= 0) comes from: file index and its first token's
// index in that file (byte offset = .npy header + token * dtype size).
void data_locate(const DataLoader *d, int64_t g, int *file, int64_t *token);
const char *data_file_path(const DataLoader *d, int file);   // NULL if out of range
int data_file_source(const DataLoader *d, int file);         // -1 if out of range

// Reads every token of every file once (remainders too) and checks it
// against vocab_size; the first bad token is the error.
int data_validate_all(DataLoader *d, char *err, size_t errlen);

int64_t data_instances_per_epoch(const DataLoader *d);
const DataSummary *data_summary(const DataLoader *d);
// One line for the log, e.g. "3 files in 2 sources, 1200 tokens, 9 instances/epoch x 128 tokens
// = 1152 tokens/epoch, shuffled; web: 2 files, 6 instances -> 6/epoch (weight 0.5); ...".
void data_describe(const DataLoader *d, char *buf, size_t len);
