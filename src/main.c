// The moecore command: subcommands for training and for looking at models.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/hf.h"
#include "data/tokenizer.h"
#include "dist/comm.h"
#include "dist/pp_schedule.h"
#include "config/config.h"
#include "model/model.h"
#include "train/plan.h"
#include "train/train.h"

#ifndef MOECORE_VERSION
#define MOECORE_VERSION "dev"
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: moecore COMMAND [ARGS]\n"
            "\n"
            "commands:\n"
            "  train CONFIG.yaml [--resume] [--section.key=value ...]\n"
            "                                    train a model (see configs/reference.yaml)\n"
            "  bench CONFIG.yaml [...] [--steps=N] throughput of whole steps on synthetic tokens\n"
            "  tokenize --out OUT.bin FILE...    byte-level tokenize text files (see --help)\n"
            "  detokenize FILE.bin               print token files as text\n"
            "  export-hf CKPT_DIR OUT_DIR [...]  write a checkpoint as a Hugging Face olmoe / flex_olmo model (docs/hf.md)\n"
            "  import-hf HF_DIR CKPT_DIR [...]   read a Hugging Face olmoe / flex_olmo model into a checkpoint\n"
            "  params [CONFIG.yaml] [--device=cpu|cuda] [--model.KEY=VALUE ...]\n"
            "                                    validate a model config (a run config's model\n"
            "                                    section, then overrides), print its parameter table\n"
            "                                    and counts\n"
            "  plan CONFIG.yaml --gpus N [--gpu NAME] [--explain LAYOUT] [...]\n"
            "                                    rank the layouts of CONFIG on N GPUs by predicted\n"
            "                                    tokens/s per GPU, with their memory (see --help)\n"
            "  schedule --pp N --micro M --kind gpipe|1f1b|interleaved|zb1 [--virtual V]\n"
            "                                    print a pipeline schedule and its simulated bubble\n"
            "  --version                        version and compiled backends\n"
            "  --help                           this text\n"
            "\n"
            "Model keys (docs/model.md): %s",
            "");
    for (int i = 0; model_config_keys[i]; i++) fprintf(f, "%s%s", i ? ", " : "", model_config_keys[i]);
    fprintf(f, "\n");
}

static int cmd_params(int argc, char **argv) {
    char msg[512], err[2048];
    if (argc > 0 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        printf("usage: moecore params [CONFIG.yaml] [--device=cpu|cuda] [--model.KEY=VALUE ...]\n"
               "  Validates a model config and prints its parameter table. With a run config whose\n"
               "  device.type is cuda, or --device=cuda, it also checks the CUDA kernels' limits\n"
               "  (head dim, expert count, ...) at the config's train.micro_batch (default 1).\n");
        return 0;
    }
    // a run config's model section (when a file is given), then the
    // arguments; the run config remembers which set what, for messages
    RunConfig rc;
    run_config_defaults(&rc);
    if (argc > 0 && strncmp(argv[0], "--", 2) != 0) {
        if (run_config_load_yaml(&rc, argv[0], err, sizeof err)) {
            fprintf(stderr, "moecore: error: %s\n", err);
            run_config_free(&rc);
            return 2;
        }
        argc--;
        argv++;
    } else {
        rc.train.micro_batch = 1;
    }
    // the backend whose limits the config must meet
    int device = rc.device.type;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--device=cuda") || !strcmp(a, "--device=cpu")) {
            device = !strcmp(a, "--device=cuda");
            continue;
        }
        if (strncmp(a, "--", 2) || !strchr(a, '=') || strncmp(a, "--model.", 8)) {
            if (strncmp(a, "--", 2) || !strchr(a, '='))
                fprintf(stderr, "moecore: error: argument '%s': expected --section.key=value\n", a);
            else
                fprintf(stderr, "moecore: error: unknown key '%.*s' (this command takes model.* keys)\n",
                        (int)(strchr(a, '=') - a - 2), a + 2);
            run_config_free(&rc);
            return 2;
        }
        if (run_config_override(&rc, a, err, sizeof err)) {
            fprintf(stderr, "moecore: error: %s\n", err);
            run_config_free(&rc);
            return 2;
        }
    }
    ModelConfig cfg = rc.model;
    int micro_batch = rc.train.micro_batch, ep = rc.parallel.ep;
    // the table alone (no buffers: OLMoE-1B-7B's would need 55 GB)
    ParamTable table;
    if (param_table_for_config(&cfg, &table, msg, sizeof msg)) {
        run_config_blame(&rc, msg, err, sizeof err);
        fprintf(stderr, "moecore: error: invalid model config: %s\n", err);
        run_config_free(&rc);
        return 2;
    }
    if (device == 1) {
#ifdef MOECORE_CUDA
        // validated by model_param_table: this fills the derived sizes
        model_config_validate(&cfg, msg, sizeof msg);
        if (model_config_check_backend(&cfg, &ops_cuda, micro_batch, ep, msg, sizeof msg)) {
            run_config_blame(&rc, msg, err, sizeof err);
            fprintf(stderr, "moecore: error: %s\n", err);
            param_table_free(&table);
            run_config_free(&rc);
            return 2;
        }
#else
        fprintf(stderr, "moecore: error: device cuda: this build has no CUDA backend (nvcc was not found when it was built)\n");
        param_table_free(&table);
        run_config_free(&rc);
        return 2;
#endif
    }
    run_config_free(&rc);
    printf("%-44s %-20s %12s  %s\n", "name", "shape", "elements", "class");
    for (int i = 0; i < table.n; i++) {
        const ParamEntry *e = &table.entries[i];
        char shape[64];
        int n = snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < e->ndim; d++)
            n += snprintf(shape + n, sizeof shape - n, "%s%lld", d ? ", " : "", (long long)e->shape[d]);
        snprintf(shape + n, sizeof shape - n, "]");
        printf("%-44s %-20s %12zu  %s\n", e->name, shape, e->numel, e->cls == CLASS_EXPERT ? "expert" : "dense");
    }
    size_t total = param_total(&table);
    printf("\nparameters: %zu total (%zu dense, %zu expert); %.0f matmul parameters active per token\n",
           total, table.class_numel[CLASS_DENSE], table.class_numel[CLASS_EXPERT],
           model_active_matmul_params(&cfg));
    param_table_free(&table);
    return 0;
}

int main(int argc, char **argv) {
    // OpenMP threads that spin while idle starve OpenBLAS's own threads (3x
    // slower on 2 cores). The OpenMP runtime reads its settings when it is
    // loaded, before main, so set the policy and start again once.
    if (!getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv("/proc/self/exe", argv);
        // exec failed: carry on with the spinning default
    }
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("moecore %s\nbackends: cpu (FP32, OpenBLAS, OpenMP)", MOECORE_VERSION);
#ifdef MOECORE_CUDA
        printf(", cuda (BF16, cuBLASLt, sm_90a)");
#endif
        printf("\nruntimes: MPI (Open MPI) for data and expert parallelism\n");
        return 0;
    }
    if (!strcmp(argv[1], "params")) return cmd_params(argc - 2, argv + 2);
    if (!strcmp(argv[1], "train")) {
        comm_init(&argc, &argv);
        int rc = cmd_train(argc - 2, argv + 2);
        comm_finalize();
        return rc;
    }
    if (!strcmp(argv[1], "bench")) { // under mpirun as train is: every rank runs the configs, rank 0 reports
        comm_init(&argc, &argv);
        int rc = cmd_bench(argc - 2, argv + 2);
        comm_finalize();
        return rc;
    }
    if (!strcmp(argv[1], "schedule")) return cmd_schedule(argc - 2, argv + 2);
    if (!strcmp(argv[1], "plan")) return cmd_plan(argc - 2, argv + 2);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(argv[1], "detokenize")) return cmd_detokenize(argc - 2, argv + 2);
    if (!strcmp(argv[1], "export-hf")) return cmd_export_hf(argc - 2, argv + 2);
    if (!strcmp(argv[1], "import-hf")) return cmd_import_hf(argc - 2, argv + 2);
    fprintf(stderr, "moecore: error: unknown command '%s' (see moecore --help)\n", argv[1]);
    return 2;
}
