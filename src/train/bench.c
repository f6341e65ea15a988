// `moecore bench CONFIG...`: throughput of whole optimizer steps on
// synthetic tokens, one row per config: the training loop itself (so the
// numbers include data, optimizer and logging), median over the steps after
// a warm-up.
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/launch.h"
#include "train/train.h"
#include "util/check.h"
#include "util/fs.h"

static const char *bench_usage =
    "usage: moecore bench CONFIG.yaml [CONFIG.yaml ...] [--steps=N] [--warmup=N] [--record=FILE]\n"
    "                     [--breakdown] [--section.key=value ...]\n"
    "  Trains each config for N steps (default 12) on synthetic tokens, without checkpoints\n"
    "  or eval, and prints the median tokens/s, TFLOP/s and MFU of the steps after the\n"
    "  first W (default 3), and the loss of the last step. --record appends one JSON object\n"
    "  per config to FILE: the numbers, every step's loss, the overrides, and the run's\n"
    "  commit, device, compute capability, driver and device.cuda kernel choices.\n"
    "  --breakdown (cuda device only) times every op with CUDA events, without the CUDA graph,\n"
    "  and prints the GPU ms per step of each op and class of op (expert GEMMs, attention, ...)\n"
    "  over the steps after the first W; the events and the missing graph slow the steps.\n";

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

int cmd_bench(int argc, char **argv) {
    int steps = 12, warmup = 3, breakdown = 0;
    const char *record = NULL;
    const char *configs[32];
    char *overrides[64];
    int nc = 0, no = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(bench_usage, stdout); return 0; }
        if (!strncmp(argv[i], "--steps=", 8)) steps = atoi(argv[i] + 8);
        else if (!strncmp(argv[i], "--warmup=", 9)) warmup = atoi(argv[i] + 9);
        else if (!strncmp(argv[i], "--record=", 9)) record = argv[i] + 9;
        else if (!strcmp(argv[i], "--breakdown")) breakdown = 1;
        else if (!strncmp(argv[i], "--", 2) && no < 60) overrides[no++] = argv[i];
        else if (nc < 32) configs[nc++] = argv[i];
    }
    if (!nc || steps <= warmup || warmup < 0) {
        fputs(bench_usage, stderr);
        return 2;
    }
    TrainOptions opt = {0};
    if (breakdown) {
#ifndef MOECORE_CUDA
        fprintf(stderr, "moecore: bench --breakdown needs the cuda device (this build has no CUDA backend)\n");
        return 2;
#endif
        // the timed op table; its times are reset as step warmup + 1 starts
        opt.timed_ops = 1;
        opt.timed_from = warmup;
    }
    // several ranks (mpirun, torchrun, srun: one per GPU): each runs every
    // config in its own temporary run directory; rank 0 prints and records
    LaunchInfo li;
    char lerr[256];
    int quiet = launch_detect(&li, lerr, sizeof lerr) == 0 && li.rank != 0;
    char rows[32][256];
    int rc = 0;
    for (int c = 0; c < nc; c++) {
        char dir[] = "/tmp/moecore-bench-XXXXXX";
        if (!mkdtemp(dir)) { perror("moecore: bench: mkdtemp"); return 2; }
        char a_steps[64], a_dir[128];
        snprintf(a_steps, sizeof a_steps, "--train.steps=%d", steps);
        snprintf(a_dir, sizeof a_dir, "--logging.run_dir=%s/run", dir);
        char *args[80];
        int n = 0;
        args[n++] = (char *)configs[c];
        args[n++] = "--data.synthetic=true";
        args[n++] = "--checkpoint.save_final=false";
        args[n++] = "--checkpoint.interval=0";
        args[n++] = "--train.eval_interval=0";
        args[n++] = a_steps;
        args[n++] = a_dir;
        for (int i = 0; i < no; i++) args[n++] = overrides[i];
        // events time each op only when the ops are launched one by one;
        // last, so that it wins over an override
        if (breakdown) args[n++] = "--device.cuda_graph=false";
        if (!quiet) printf("== bench %s\n", configs[c]);
        fflush(stdout);
        int r = train_run(n, args, &opt);
        if (r) { rc = r; snprintf(rows[c], sizeof rows[c], "%-36s failed (exit %d)", configs[c], r); continue; }
        char path[256];
        snprintf(path, sizeof path, "%s/run/metrics.jsonl", dir);
        FILE *f = fopen(path, "r");
        double tps[4096], tfl[4096], mfu[4096], mem = 0, mem_host = 0, last_loss = NAN;
        int k = 0, mfu_known = 1;
        char line[1 << 16];
        // the run's description (build, device, kernel choices) from the first
        // record, and every step's loss, go into the bench record
        json_object *run = NULL, *losses = json_object_new_array();
        while (f && fgets(line, sizeof line, f) && k < 4096) {
            json_object *o = json_tokener_parse(line), *v;
            if (!o) continue;
            if (!run && json_object_object_get_ex(o, "run", &v)) run = json_object_get(v);
            if (json_object_object_get_ex(o, "loss", &v)) {
                last_loss = json_object_get_double(v);
                json_object_array_add(losses, json_object_new_double(last_loss));
            }
            int step = json_object_object_get_ex(o, "step", &v) ? json_object_get_int(v) : 0;
            if (step > warmup) {
                json_object_object_get_ex(o, "tokens_per_s", &v); tps[k] = json_object_get_double(v);
                json_object_object_get_ex(o, "tflops_per_device", &v); tfl[k] = json_object_get_double(v);
                // null: the device's peak is unknown (train/mfu.h)
                if (!json_object_object_get_ex(o, "mfu", &v) || !v) mfu_known = 0;
                mfu[k] = json_object_get_double(v);
                if (json_object_object_get_ex(o, "device_mem_mib", &v)) mem = json_object_get_double(v);
                if (json_object_object_get_ex(o, "peak_mem_mib", &v)) mem_host = json_object_get_double(v);
                k++;
            }
            json_object_put(o);
        }
        if (f) fclose(f);
        double mt = median(tps, k), mf = median(tfl, k), mm = median(mfu, k);
        char mfu_s[16] = "n/a";
        if (mfu_known) snprintf(mfu_s, sizeof mfu_s, "%.1f%%", 100 * mm);
        snprintf(rows[c], sizeof rows[c], "%-36s %12.0f %10.1f %8s %10.1f GiB %10.6f", configs[c], mt, mf,
                 mfu_s, (mem > 0 ? mem : mem_host) / 1024, last_loss);
        if (record && !quiet) {
            FILE *rf = fopen(record, "a");
            if (!rf) { fprintf(stderr, "moecore: bench: cannot append to %s\n", record); rc = 2; }
            else {
                char date[32];
                time_t now = time(NULL);
                strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
                json_object *o = json_object_new_object();
                json_object_object_add(o, "date", json_object_new_string(date));
                json_object_object_add(o, "config", json_object_new_string(configs[c]));
                json_object *ov = json_object_new_array();
                for (int i = 0; i < no; i++) json_object_array_add(ov, json_object_new_string(overrides[i]));
                json_object_object_add(o, "overrides", ov);
                json_object_object_add(o, "steps", json_object_new_int(steps));
                json_object_object_add(o, "warmup", json_object_new_int(warmup));
                json_object_object_add(o, "tokens_per_s", json_object_new_double(mt));
                json_object_object_add(o, "tflops_per_device", json_object_new_double(mf));
                json_object_object_add(o, "mfu", mfu_known ? json_object_new_double(mm) : NULL);
                json_object_object_add(o, "memory_mib", json_object_new_double(mem > 0 ? mem : mem_host));
                json_object_object_add(o, "losses", json_object_get(losses));
                // commit, version, device, compute capability, driver, device.cuda
                if (run) json_object_object_add(o, "run", json_object_get(run));
                fprintf(rf, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
                json_object_put(o);
                fclose(rf);
            }
        }
        json_object_put(losses);
        if (run) json_object_put(run);
        // leaving a temporary directory behind is harmless
        snprintf(path, sizeof path, "%s/run", dir);
        if (fs_remove_dir(path) == 0) fs_remove_dir(dir);
    }
    if (quiet) return rc;
    printf("\n%-36s %12s %10s %8s %14s %10s\n", "config", "tokens/s", "TFLOP/s", "MFU", "memory", "last loss");
    for (int c = 0; c < nc; c++) printf("%s\n", rows[c]);
    return rc;
}
