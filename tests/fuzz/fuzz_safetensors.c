// libFuzzer target for the strict safetensors reader (src/ckpt/safetensors.c):
// the input is a whole file. st_parse_header sees its header bytes with the
// input's size as the file size, as st_open would; st_open then reads the
// same bytes from a memfd, and every tensor the header accepts is read back
// with st_read_range. Any input must be accepted or refused with a message,
// never a crash, leak, hang or undefined behaviour.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt/safetensors.h"

static int memfd = -1;

// Reads every tensor's bytes, and checks the layout invariants the reader promises.
static void read_all(int fd, const char *path, const StFile *f, uint64_t file_size) {
    char err[512];
    uint64_t total = 0;
    for (int i = 0; i < f->n; i++) {
        const StTensor *t = &f->tensors[i];
        if (st_find(f, t->name) != i) abort();
        uint64_t n = st_nbytes(t);
        total += n;
        if (fd < 0 || n > (1u << 20)) continue;
        void *buf = malloc(n ? n : 1);
        if (st_read_range(fd, path, f, i, 0, buf, n, err, sizeof err)) abort();
        free(buf);
    }
    if (total != f->data_size || 8 + f->header_len + f->data_size != file_size) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    StFile f;
    if (size >= 8) {
        uint64_t n = 0;
        for (int i = 0; i < 8; i++) n |= (uint64_t)data[i] << (8 * i);
        // st_parse_header reads len bytes: hand it only what the input holds
        if (n <= size - 8 && st_parse_header((const char *)data + 8, n, size, "fuzz", &f, err, sizeof err) == 0) {
            read_all(-1, "fuzz", &f, size);
            st_free(&f);
        }
    }

    if (memfd < 0) memfd = memfd_create("fuzz_safetensors", MFD_CLOEXEC);
    if (memfd < 0 || ftruncate(memfd, 0) || pwrite(memfd, data, size, 0) != (ssize_t)size) return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    int fd;
    if (st_open(path, &fd, &f, err, sizeof err) == 0) {
        read_all(fd, path, &f, size);
        st_free(&f);
        close(fd);
    }
    return 0;
}
