// The byte-level tokenizer and the token-file format.
//
// Vocabulary: ids 0..255 are the bytes 0x00..0xFF, id 256 is EOS (end of
// document); TOKENIZER_VOCAB_SIZE = 257 (the model pads it to 384). There is
// no merging and no normalisation, so any byte string encodes and decodes
// back exactly, whatever its encoding, and the same text always gives the
// same ids, independent of locale.
//
// A token file (.bin) is a bare array of uint16 ids, little-endian, with no
// header: its size in bytes is 2 x the number of tokens. Each document is
// followed by one EOS; `moecore tokenize` writes these files and
// `moecore detokenize` prints them back as text.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define TOKENIZER_VOCAB_SIZE 257
#define TOKENIZER_EOS 256
// How EOS reads when decoded (ids out of range read as "?").
#define TOKENIZER_EOS_TEXT "\n<|eos|>\n"
// The longest text one id decodes to, for sizing buffers.
#define TOKENIZER_MAX_PIECE (sizeof(TOKENIZER_EOS_TEXT) - 1)

// Encodes len bytes of text into out (room for len ids). Returns the number
// of ids written (= len), or -1 when len exceeds INT_MAX. Never adds EOS.
int tokenizer_encode(const unsigned char *text, size_t len, uint16_t *out);

// Decodes n ids into out like snprintf: writes at most cap - 1 bytes and a
// terminating NUL (when cap > 0), and returns the length of the whole
// decoding, so a result >= cap means it was cut. Bytes are written as they
// are (the text may hold NULs), EOS as TOKENIZER_EOS_TEXT and any id outside
// 0..256 as '?'.
size_t tokenizer_decode(const int *ids, int n, char *out, size_t cap);

// The subcommands (src/data/tokenize_cmd.c); argv excludes the command name.
// Both return 0 on success, 2 on a usage error and 1 on any other error,
// with a message naming the path.
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
