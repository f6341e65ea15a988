// Hugging Face interop (docs/hf.md): a moecore checkpoint <-> a transformers
// model directory of the OLMoE family,
//
//   OUT_DIR/config.json                         model_type olmoe | flex_olmo
//   OUT_DIR/model.safetensors                   one file, or
//   OUT_DIR/model-0000K-of-0000N.safetensors    shards above the size limit
//   OUT_DIR/model.safetensors.index.json        + {"weight_map": name -> shard}
//   OUT_DIR/tokenizer.json, tokenizer_config.json, special_tokens_map.json
//                                               when the run named data.tokenizer (hf_tokenizer.h)
//
// Norm placement picks the family: `pre` is OlmoeForCausalLM (input_layernorm,
// post_attention_layernorm before each half), `post` is FlexOlmoForCausalLM
// (post_attention_layernorm, post_feedforward_layernorm on each half's
// output). Stacked experts [E, ...] become one tensor per expert,
// model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight. config.json
// vocab_size is the padded vocabulary, so the embedding and lm_head keep their
// shapes; the full moecore model config rides along as
// "moecore_model_config" so that a round trip restores it exactly.
//
// Invariants: tensors stream through in chunks of at most HF_CHUNK_ELEMS
// elements (memory does not grow with the model); output directories are
// written under NAME.tmp and renamed when complete, so a failure leaves no
// OUT_DIR; a config transformers cannot express is refused before anything
// is written, with the model.* key that stands in the way. FP32 round trips
// are bit-exact; BF16 export rounds to nearest even.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "ckpt/safetensors.h"
#include "config/model_config.h"
#include "params/params.h"

typedef enum { HF_AUTO = 0, HF_OLMOE = 1, HF_FLEX_OLMO = 2 } HfFormat;

#define HF_CHUNK_ELEMS ((size_t)1 << 22)          // 16 MiB of FP32 per read
#define HF_DEFAULT_SHARD_BYTES 5000000000ull      // transformers' default "5GB"

typedef struct {
    HfFormat format;            // HF_AUTO: from model.norm
    StDtype dtype;              // ST_F32 or ST_BF16
    uint64_t max_shard_bytes;   // tensor bytes per shard; a larger tensor gets a shard alone
    int force;                  // replace an existing OUT_DIR (plain files only)
    int quiet;
    const char *tokenizer;      // tokenizer.json to copy; NULL: data.tokenizer of the checkpoint's config.yaml
    int no_tokenizer;           // export no tokenizer files
} HfExportOptions;

typedef struct {
    uint64_t seed;              // train_state.json seed of the new checkpoint
    int force;                  // replace an existing CKPT_DIR (plain files only)
    int quiet;
} HfImportOptions;

void hf_export_defaults(HfExportOptions *o);
void hf_import_defaults(HfImportOptions *o);

const char *hf_format_name(HfFormat f);           // "olmoe", "flex_olmo", "auto"
// Resolves HF_AUTO from the norm placement and checks that c can be written
// as format f; -1 with a message naming the model.* key otherwise.
int hf_check_config(const ModelConfig *c, HfFormat *f, char *err, size_t errlen);
// Parses JSON text into an object; NULL with "PATH: not valid JSON (...)"
// or "PATH: not a JSON object" in err (hf_config.c).
struct json_object;
struct json_object *hf_parse_json(const char *text, const char *path, char *err, size_t errlen);
// config.json text for c (malloc'd); c must have passed hf_check_config.
// eos_token_id < 0 writes null.
char *hf_config_json(const ModelConfig *c, HfFormat f, StDtype dtype, int eos_token_id);
// Reads config.json text into a moecore model config (validated) and the
// format; *hf_vocab is the embedding rows of the HF model and *tied its
// tie_word_embeddings. -1 with a message naming the config.json field.
int hf_config_parse(const char *json, const char *path, ModelConfig *c, HfFormat *f, int *hf_vocab,
                    int *tied, char *err, size_t errlen);

// One HF tensor: a contiguous element range of one moecore tensor.
typedef struct {
    char name[160];             // HF name
    int param;                  // index into the moecore table
    size_t offset, numel;       // elements within that tensor
    int ndim;
    int64_t shape[2];           // HF shape
} HfTensor;

// The HF tensors of a model whose moecore table is t, in table order (experts
// in index order). hf_vocab <= padded_vocab is the HF embedding rows; with
// tied, lm_head reads model.embed_tokens.weight (import only). *out is
// malloc'd. -1 with a message for a table entry with no HF name.
int hf_tensor_map(const ParamTable *t, HfFormat f, int hf_vocab, int tied,
                  HfTensor **out, int *n, char *err, size_t errlen);

// ckpt_dir: a checkpoint (step-N with train_state.json), or a checkpoint
// directory, whose newest committed step is taken.
int hf_export(const char *ckpt_dir, const char *out_dir, const HfExportOptions *o, char *err, size_t errlen);
// Writes ckpt_dir (named step-N) as a committed checkpoint at step 0 with
// zero optimizer moments; *cfg_out (may be NULL) receives the model config.
int hf_import(const char *hf_dir, const char *ckpt_dir, const HfImportOptions *o, ModelConfig *cfg_out,
              char *err, size_t errlen);

// The two subcommands (src/ckpt/hf_cmd.c); argv excludes the command name.
int cmd_export_hf(int argc, char **argv);
int cmd_import_hf(int argc, char **argv);

// FP32 -> BF16, round to nearest even (NaN stays NaN); BF16/F16 -> FP32, exact.
uint16_t hf_f32_to_bf16(float x);
float hf_bf16_to_f32(uint16_t h);
float hf_f16_to_f32(uint16_t h);
