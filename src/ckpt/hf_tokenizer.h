// A Hugging Face tokenizer beside a run (data.tokenizer) and beside its
// export: the `tokenizers` library's tokenizer.json, as
// scripts/prepare-corpus.sh --bpe writes it.
//
// moecore never tokenizes with it; it only needs to know that the file is
// the one the token files were made with. The check is the vocabulary size:
// one more than the largest id of model.vocab and added_tokens, which must
// equal model.vocab_size (the unpadded size) both when a run starts and when
// export-hf copies the file. The export then also gets the two small files
// that make transformers.AutoTokenizer load it as a PreTrainedTokenizerFast
// (tokenizer_config.json, special_tokens_map.json), naming as eos_token the
// added special token whose id is data.eos_id.
#pragma once
#include <stddef.h>

#define HF_TOKENIZER_MAX_BYTES ((size_t)512 << 20)

typedef struct {
    int vocab_size;         // 1 + the largest id in model.vocab and added_tokens
    int n_added;            // entries of added_tokens
    char eos_token[256];    // content of the special added token with id eos_id; "" if there is none
} HfTokenizerInfo;

// Reads tokenizer.json at path. -1 with a message naming the path and what is
// wrong (unreadable, not JSON, no model.vocab, a bad id).
int hf_tokenizer_read(const char *path, int eos_id, HfTokenizerInfo *info, char *err, size_t errlen);

// The check a run and an export make: 0 when info->vocab_size is vocab_size,
// else -1 with "PATH has N tokens but model.vocab_size is M ...".
int hf_tokenizer_check_vocab(const char *path, const HfTokenizerInfo *info, int vocab_size, char *err,
                             size_t errlen);

// Into dir: tokenizer.json copied byte for byte from path, and
// tokenizer_config.json + special_tokens_map.json for info (model_max_length
// max_len). -1 with a message naming the file.
int hf_tokenizer_write(const char *path, const HfTokenizerInfo *info, int max_len, const char *dir, char *err,
                       size_t errlen);
