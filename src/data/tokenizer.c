// The byte-level tokenizer; see tokenizer.h for the vocabulary.
#include "data/tokenizer.h"

#include <limits.h>
#include <string.h>

int tokenizer_encode(const unsigned char *text, size_t len, uint16_t *out) {
    if (len > INT_MAX) return -1;
    for (size_t i = 0; i < len; i++) out[i] = text[i];
    return (int)len;
}

size_t tokenizer_decode(const int *ids, int n, char *out, size_t cap) {
    static const char eos[] = TOKENIZER_EOS_TEXT;
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        char byte;
        const char *piece = &byte;
        size_t piece_len = 1;
        if (ids[i] >= 0 && ids[i] < 256) {
            byte = (char)(unsigned char)ids[i];
        } else if (ids[i] == TOKENIZER_EOS) {
            piece = eos;
            piece_len = sizeof eos - 1;
        } else {
            byte = '?';
        }
        if (len < cap) {
            size_t room = cap - 1 - len;
            memcpy(out + len, piece, piece_len < room ? piece_len : room);
        }
        len += piece_len;
    }
    if (cap > 0) out[len < cap ? len : cap - 1] = '\0';
    return len;
}
