// MFU denominators: the GPU table and the cached CPU measurement (mfu.h).
#include "train/mfu.h"

#include <cblas.h>
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "util/check.h"
#include "util/clock.h"
#include "util/fs.h"

// Dense (no 2:4 sparsity) BF16 tensor-core peaks, TFLOP/s per GPU: half the
// "with sparsity" figures of NVIDIA's datasheets. A100 (SXM4 and PCIe): 312,
// A100 datasheet. H100: SXM 1,979 / PCIe 1,513 / NVL 1,671 sparse, H100
// datasheet. H200: SXM 1,979 / NVL 1,671 sparse, H200 datasheet. B200 and
// B300: HGX B200 and HGX B300 specifications, FP16/BF16 36 PFLOPS with
// sparsity for 8 GPUs, i.e. 2.25 PFLOPS dense per GPU (the B300 gained FP4,
// not BF16). torchtitan's and llm.c's tables agree where they overlap.
// A row matches when the name (CUDA's, e.g. "NVIDIA H100 80GB HBM3" for the
// SXM part, "NVIDIA A100-SXM4-80GB", "NVIDIA H200") has the model as one of
// its words (split at spaces and hyphens, case ignored) and, when given, the
// variant word; the first match wins, so variants come before their model.
// "GB200" is not "B200": its peak differs, and it is not in the table.
typedef struct {
    const char *model, *variant, *entry;
    double tflops;
} GpuPeak;
static const GpuPeak gpu_peaks[] = {
    {"A100", NULL, "A100 (SXM4, PCIe)", 312},
    {"H100", "PCIe", "H100 PCIe", 756},
    {"H100", "NVL", "H100 NVL", 835},
    {"H100", NULL, "H100 SXM", 989},
    {"H200", "NVL", "H200 NVL", 835},
    {"H200", NULL, "H200 SXM", 989},
    {"B200", NULL, "B200", 2250},
    {"B300", NULL, "B300", 2250},
};

static int has_word(const char *name, const char *word) {
    size_t n = strlen(word);
    for (const char *p = name; *p;) {
        size_t len = strcspn(p, " -_");
        if (len == n && !strncasecmp(p, word, n)) return 1;
        p += len;
        if (*p) p++;
    }
    return 0;
}

double mfu_gpu_peak_tflops(const char *device_name, const char **entry) {
    if (entry) *entry = NULL;
    for (size_t i = 0; i < sizeof gpu_peaks / sizeof gpu_peaks[0]; i++) {
        const GpuPeak *g = &gpu_peaks[i];
        if (has_word(device_name, g->model) && (!g->variant || has_word(device_name, g->variant))) {
            if (entry) *entry = g->entry;
            return g->tflops;
        }
    }
    return 0;
}

int mfu_cpu_cache_path(char *buf, size_t n) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int len;
    if (xdg && *xdg) len = snprintf(buf, n, "%s/moecore/cpu-peak.json", xdg);
    else if (home && *home) len = snprintf(buf, n, "%s/.cache/moecore/cpu-peak.json", home);
    else return -1;
    return len > 0 && (size_t)len < n ? 0 : -1;
}


// Single-precision GEMM rate, TFLOP/s: the best of 10 products of 1024^3
// after one to warm up (threads, pages), on the BLAS threads of training.
static double measure_sgemm_tflops(void) {
    int n = 1024;
    float *a = mallocCheck((size_t)n * n * 4), *b = mallocCheck((size_t)n * n * 4), *c = mallocCheck((size_t)n * n * 4);
    for (int i = 0; i < n * n; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; }
    double best = 1e30;
    for (int r = 0; r < 11; r++) {
        double t0 = clock_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        double dt = clock_now_s() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    free(a); free(b); free(c);
    return 2.0 * n * n * n / best / 1e12;
}

// What the measurement depends on: the CPU, how many there are, how many
// threads OpenBLAS uses and which kernels it picked.
static void machine_key(char *buf, size_t n) {
    char model[256] = "unknown CPU", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *v = strchr(line, ':');
        if (v) {
            snprintf(model, sizeof model, "%s", v + 1 + (v[1] == ' '));
            model[strcspn(model, "\n")] = 0;
        }
        break;
    }
    if (f) fclose(f);
    snprintf(buf, n, "%s | %ld CPUs | %d BLAS threads | %s", model, sysconf(_SC_NPROCESSORS_ONLN),
             openblas_get_num_threads(), openblas_get_config());
}

// Adds this machine's entry to the cache (written to a temporary file and
// renamed, so that a reader never sees half of it). 0, or -1 with a reason.
static int cache_store(const char *path, json_object *cache, const char *key, double tflops, char *err,
                       size_t errlen) {
    char date[32];
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    json_object *e = json_object_new_object();
    json_object_object_add(e, "tflops", json_object_new_double(tflops));
    json_object_object_add(e, "measured", json_object_new_string(date));
    json_object_object_add(e, "method", json_object_new_string("best of 10 SGEMM 1024^3 (OpenBLAS)"));
    json_object_object_add(cache, key, e);
    char dir[1100], tmp[1100];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = 0;
        if (fs_mkdirs(dir, 1, err, errlen)) return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    if (fs_write_text(tmp, json_object_to_json_string_ext(cache, JSON_C_TO_STRING_PRETTY), err, errlen)) return -1;
    if (rename(tmp, path)) {
        snprintf(err, errlen, "rename %s: %s", tmp, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

double mfu_cpu_peak_tflops(const char *cache_path, char *how, size_t howlen) {
    char key[1024];
    machine_key(key, sizeof key);
    json_object *cache = NULL, *e, *v;
    const char *problem = "";
    if (cache_path && access(cache_path, F_OK) == 0) {
        cache = json_object_from_file(cache_path);
        if (!cache || !json_object_is_type(cache, json_type_object)) {
            if (cache) json_object_put(cache);
            cache = NULL;
            problem = "replaced an unreadable cache, ";
        } else if (json_object_object_get_ex(cache, key, &e) && json_object_object_get_ex(e, "tflops", &v) &&
                   json_object_get_double(v) > 0) {
            double tflops = json_object_get_double(v);
            const char *date = json_object_object_get_ex(e, "measured", &v) ? json_object_get_string(v) : "?";
            snprintf(how, howlen, "CPU SGEMM rate measured %s, cached in %s", date, cache_path);
            json_object_put(cache);
            return tflops;
        }
    }
    if (!cache) cache = json_object_new_object();
    double tflops = measure_sgemm_tflops();
    char err[1200];
    if (!cache_path) snprintf(how, howlen, "CPU SGEMM rate measured now, not cached (no cache file: set HOME)");
    else if (cache_store(cache_path, cache, key, tflops, err, sizeof err))
        snprintf(how, howlen, "CPU SGEMM rate measured now, not cached: %s", err);
    else snprintf(how, howlen, "CPU SGEMM rate measured now, %scached in %s", problem, cache_path);
    json_object_put(cache);
    return tflops;
}
