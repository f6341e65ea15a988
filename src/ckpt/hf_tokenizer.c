#include "ckpt/hf_tokenizer.h"

#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/hf.h"
#include "util/check.h"
#include "util/fs.h"

// An id of a JSON value: a non-negative integer below 2^31; -1 otherwise.
static int json_id(json_object *v) {
    if (!v || !json_object_is_type(v, json_type_int)) return -1;
    int64_t x = json_object_get_int64(v);
    return x >= 0 && x < INT_MAX ? (int)x : -1;
}

int hf_tokenizer_read(const char *path, int eos_id, HfTokenizerInfo *info, char *err, size_t errlen) {
    memset(info, 0, sizeof *info);
    char *text = fs_read_text(path, HF_TOKENIZER_MAX_BYTES, err, errlen);
    if (!text) return -1;
    json_object *o = hf_parse_json(text, path, err, errlen), *model, *vocab, *added;
    free(text);
    if (!o) return -1;
    int rc = -1, top = -1;
    if (!json_object_object_get_ex(o, "model", &model) || !json_object_is_type(model, json_type_object) ||
        !json_object_object_get_ex(model, "vocab", &vocab) || !json_object_is_type(vocab, json_type_object))
        FAIL_GOTO("%s: no model.vocab mapping: not a tokenizer.json of the tokenizers library", path);
    json_object_object_foreach(vocab, token, idv) {
        int id = json_id(idv);
        if (id < 0) FAIL_GOTO("%s: model.vocab[\"%.40s\"] is %s, not a token id", path, token, json_object_to_json_string(idv));
        if (id > top) top = id;
    }
    if (json_object_object_get_ex(o, "added_tokens", &added) && added) {
        if (!json_object_is_type(added, json_type_array)) FAIL_GOTO("%s: added_tokens is not a list", path);
        info->n_added = (int)json_object_array_length(added);
        for (int i = 0; i < info->n_added; i++) {
            json_object *t = json_object_array_get_idx(added, i), *idv, *content, *special;
            int id = json_object_object_get_ex(t, "id", &idv) ? json_id(idv) : -1;
            if (id < 0 || !json_object_object_get_ex(t, "content", &content) ||
                !json_object_is_type(content, json_type_string))
                FAIL_GOTO("%s: added_tokens[%d] has no id and content", path, i);
            if (id > top) top = id;
            int is_special = json_object_object_get_ex(t, "special", &special) && json_object_get_boolean(special);
            const char *s = json_object_get_string(content);
            if (id == eos_id && is_special && strlen(s) < sizeof info->eos_token) strcpy(info->eos_token, s);
        }
    }
    if (top < 0) FAIL_GOTO("%s: the vocabulary is empty", path);
    info->vocab_size = top + 1;
    rc = 0;
fail:
    json_object_put(o);
    return rc;
}

int hf_tokenizer_check_vocab(const char *path, const HfTokenizerInfo *info, int vocab_size, char *err,
                             size_t errlen) {
    if (info->vocab_size == vocab_size) return 0;
    return errorf(err, errlen,
                  "%s has %d tokens but model.vocab_size is %d: the tokenizer is not the one the model's "
                  "token files were made with", path, info->vocab_size, vocab_size);
}

static int write_json(const char *dir, const char *name, json_object *o, char *err, size_t errlen) {
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                                          JSON_C_TO_STRING_NOSLASHESCAPE);
    size_t n = strlen(s);
    char *text = mallocCheck(n + 2);
    memcpy(text, s, n);
    strcpy(text + n, "\n");
    int rc = fs_write_text(path, text, err, errlen);
    free(text);
    return rc;
}

int hf_tokenizer_write(const char *path, const HfTokenizerInfo *info, int max_len, const char *dir, char *err,
                       size_t errlen) {
    char dst[4096 + 64];
    char *text = fs_read_text(path, HF_TOKENIZER_MAX_BYTES, err, errlen);
    if (!text) return -1;
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    int rc = fs_write_text(dst, text, err, errlen);
    free(text);
    if (rc) return -1;

    // PreTrainedTokenizerFast reads everything else from tokenizer.json; no
    // BOS is added and decoding keeps the spaces as the text had them.
    json_object *cfg = json_object_new_object(), *map = json_object_new_object();
    json_object_object_add(cfg, "tokenizer_class", json_object_new_string("PreTrainedTokenizerFast"));
    json_object_object_add(cfg, "model_max_length", json_object_new_int(max_len));
    json_object_object_add(cfg, "clean_up_tokenization_spaces", json_object_new_boolean(0));
    if (info->eos_token[0]) {
        json_object_object_add(cfg, "eos_token", json_object_new_string(info->eos_token));
        json_object_object_add(map, "eos_token", json_object_new_string(info->eos_token));
    }
    rc = write_json(dir, "tokenizer_config.json", cfg, err, errlen);
    if (!rc) rc = write_json(dir, "special_tokens_map.json", map, err, errlen);
    json_object_put(cfg);
    json_object_put(map);
    return rc;
}
