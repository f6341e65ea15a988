// dlopen of NCCL (nccl_api.h).
#include "dist/nccl_api.h"
#ifdef MOECORE_CUDA
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/check.h"

#ifndef MOECORE_CUDA_LIB_DIR
#define MOECORE_CUDA_LIB_DIR "/usr/local/cuda/lib64"
#endif

const NcclApi *nccl_api(char *err, size_t errlen) {
    static NcclApi api;
    static int loaded;
    if (loaded) return &api;
    // NCCL_HOME first, then the loader's search (LD_LIBRARY_PATH), then the toolkit's
    char home[600] = "";
    if (getenv("NCCL_HOME")) snprintf(home, sizeof home, "%s/lib/libnccl.so.2", getenv("NCCL_HOME"));
    const char *names[] = {home, "libnccl.so.2", MOECORE_CUDA_LIB_DIR "/libnccl.so.2",
                           MOECORE_CUDA_LIB_DIR "/../lib/libnccl.so.2", NULL};
    void *h = NULL;
    const char *why = "not found";
    for (int i = 0; names[i] && !h; i++) {
        if (!names[i][0]) continue;
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) snprintf(api.path, sizeof api.path, "%s", names[i]);
        else why = dlerror();
    }
    if (!h) {
        errorf(err, errlen, "cannot load NCCL (libnccl.so.2): %s; put its lib/ on LD_LIBRARY_PATH or set NCCL_HOME "
               "(PyTorch's: python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')", why);
        return NULL;
    }
#define NCCL_LOAD(f)                                                                                       \
    api.f = (__typeof__(api.f))dlsym(h, #f);                                                               \
    if (!api.f) {                                                                                          \
        errorf(err, errlen, "%s lacks %s (moecore needs NCCL 2.28 or newer)", api.path, #f);               \
        dlclose(h);                                                                                        \
        return NULL;                                                                                       \
    }
    NCCL_FUNCS(NCCL_LOAD)
#undef NCCL_LOAD
    if (api.ncclGetVersion(&api.version) != ncclSuccess) api.version = 0;
    api.dl = h;
    loaded = 1;
    return &api;
}
#endif
