// libFuzzer target for the two config parsers that read user text: the run
// config's YAML reader and validation (src/config/config.c), and the model
// config's JSON reader (src/config/model_config.c, used for checkpoints). Any
// input must give 0 or -1 with a message, never a crash, leak, hang or
// undefined behaviour.
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[1024];
    RunConfig c;
    run_config_defaults(&c);
    if (run_config_load_yaml_string(&c, (const char *)data, size, "fuzz.yaml", err, sizeof err) == 0)
        run_config_validate(&c, 1, err, sizeof err);
    run_config_free(&c);

    // the JSON reader takes a C string: a NUL-terminated copy
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    ModelConfig m;
    model_config_from_json(&m, text, err, sizeof err);
    free(text);
    return 0;
}
