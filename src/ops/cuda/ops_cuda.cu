// The CUDA backend's device state: one stream, the cuBLASLt handle and
// workspace, and memory. Everything runs on cuda_stream().
#define BLASLT_NO_REDIRECT // this file loads the table
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/ops_cuda.h"

#include <dlfcn.h>
#include <string.h>

#ifndef MOECORE_CUDA_LIB_DIR
#define MOECORE_CUDA_LIB_DIR "/usr/local/cuda/lib64"
#endif

const BlasLtApi &blaslt_api(void) {
    static BlasLtApi api;
    static int loaded = 0;
    if (loaded) return api;
    const char *names[] = {"libcublasLt.so.13", MOECORE_CUDA_LIB_DIR "/libcublasLt.so.13", "libcublasLt.so", NULL};
    void *h = NULL;
    for (int i = 0; names[i] && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "moecore: cannot load cuBLASLt (libcublasLt.so.13): %s\n"
                        "  put the CUDA toolkit's lib64 (or python's nvidia/cublas/lib) on LD_LIBRARY_PATH\n", dlerror());
        exit(3);
    }
#define BLASLT_LOAD(f)                                                                   \
    api.f = (decltype(api.f))dlsym(h, #f);                                               \
    if (!api.f) { fprintf(stderr, "moecore: cuBLASLt lacks %s\n", #f); exit(3); }
    BLASLT_FUNCS(BLASLT_LOAD)
#undef BLASLT_LOAD
    loaded = 1;
    return api;
}

static cudaStream_t stream;
static cublasLtHandle_t blaslt;
static void *workspace;
static size_t workspace_bytes = 64u << 20;
static int num_sms;

static void init_once(void) {
    if (stream) return;
    cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cublasCheck(blaslt_api().cublasLtCreate(&blaslt));
    cudaCheck(cudaMalloc(&workspace, workspace_bytes));
    int dev;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
}

// The kernel choices (device.cuda.*): the defaults until cuda_configure.
static CudaSettings settings = cuda_settings_default();
extern "C" void cuda_configure(const CudaSettings *s) { settings = *s; }
extern "C" const CudaSettings *cuda_settings(void) { return &settings; }

// Queried once: the run header, the MFU table and the records all ask.
extern "C" void cuda_device_info(CudaDeviceInfo *out) {
    static CudaDeviceInfo info;
    static int known;
    if (known) { *out = info; return; }
    CudaDeviceInfo *d = &info;
    memset(d, 0, sizeof *d);
    int dev;
    cudaCheck(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    snprintf(d->name, sizeof d->name, "%s", prop.name);
    d->cc_major = prop.major;
    d->cc_minor = prop.minor;
    d->sms = prop.multiProcessorCount;
    d->memory_gib = prop.totalGlobalMem / 1073741824.0;
    cudaCheck(cudaDriverGetVersion(&d->driver_api));
    cudaCheck(cudaRuntimeGetVersion(&d->runtime));
    // the kernel module's version: the first token like 580.95.05 of the first line
    snprintf(d->driver, sizeof d->driver, "?");
    char line[512], *save = NULL;
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (f) {
        if (fgets(line, sizeof line, f))
            for (char *tok = strtok_r(line, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save))
                if (tok[0] >= '0' && tok[0] <= '9' && strchr(tok, '.')) {
                    snprintf(d->driver, sizeof d->driver, "%s", tok);
                    break;
                }
        fclose(f);
    }
    known = 1;
    *out = info;
}

extern "C" cudaStream_t cuda_stream(void) { init_once(); return stream; }
extern "C" cublasLtHandle_t cuda_blaslt(void) { init_once(); return blaslt; }
extern "C" void *cuda_blaslt_workspace(size_t *bytes) { init_once(); *bytes = workspace_bytes; return workspace; }
extern "C" int cuda_num_sms(void) { init_once(); return num_sms; }

extern "C" void *cuda_alloc(size_t bytes) {
    init_once();
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        size_t free_b = 0, total = 0;
        cudaMemGetInfo(&free_b, &total);
        fprintf(stderr, "moecore: cannot allocate %.3f GiB on the GPU (%.3f GiB free of %.3f): %s\n",
                bytes / 1073741824.0, free_b / 1073741824.0, total / 1073741824.0, cudaGetErrorString(e));
        exit(3);
    }
    cudaCheck(cudaMemsetAsync(p, 0, bytes, stream));
    return p;
}
extern "C" void cuda_free(void *p) { if (p) cudaCheck(cudaFree(p)); }
extern "C" void *cuda_alloc_host(size_t bytes) {
    init_once();
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        fprintf(stderr, "moecore: cannot allocate %.3f MiB of page-locked host memory: %s\n", bytes / 1048576.0,
                cudaGetErrorString(e));
        exit(3);
    }
    memset(p, 0, bytes);
    return p;
}
extern "C" void cuda_free_host(void *p) { if (p) cudaCheck(cudaFreeHost(p)); }
// Host -> device. Synchronous for now: callers may free the source at once.
extern "C" void cuda_to_device(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_stream()));
    cudaCheck(cudaStreamSynchronize(stream));
}
extern "C" void cuda_to_host(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream()));
    cudaCheck(cudaStreamSynchronize(stream));
}
extern "C" void cuda_zero(void *p, size_t bytes) {
    if (bytes) cudaCheck(cudaMemsetAsync(p, 0, bytes, cuda_stream()));
}
extern "C" void cuda_synchronize(void) { cudaCheck(cudaStreamSynchronize(cuda_stream())); }

extern "C" void cuda_capture_begin(void) {
    cudaCheck(cudaStreamBeginCapture(cuda_stream(), cudaStreamCaptureModeThreadLocal));
}

extern "C" void *cuda_capture_end(char *err, size_t errlen) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(stream, &graph);
    if (e != cudaSuccess || !graph) {
        snprintf(err, errlen, "stream capture failed: %s (a host synchronisation or allocation inside the step?)",
                 cudaGetErrorString(e));
        cudaGetLastError();
        return NULL;
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "graph instantiation failed: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return NULL;
    }
    return exec;
}

extern "C" void cuda_graph_launch(void *exec) { cudaCheck(cudaGraphLaunch((cudaGraphExec_t)exec, cuda_stream())); }
extern "C" void cuda_graph_free(void *exec) { if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec); }

extern "C" void *cuda_event_record(void) {
    cudaEvent_t ev;
    cudaCheck(cudaEventCreate(&ev));
    cudaCheck(cudaEventRecord(ev, cuda_stream()));
    return ev;
}
extern "C" float cuda_event_elapsed_ms(void *start, void *stop) {
    cudaCheck(cudaEventSynchronize((cudaEvent_t)stop));
    float ms = 0;
    cudaCheck(cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)stop));
    cudaEventDestroy((cudaEvent_t)start);
    cudaEventDestroy((cudaEvent_t)stop);
    return ms;
}

extern "C" size_t cuda_device_memory_free(void) {
    size_t free_b = 0, total = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total));
    return free_b;
}

extern "C" size_t cuda_device_memory_used(void) {
    size_t free_b = 0, total = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total));
    return total - free_b;
}
