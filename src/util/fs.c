#include "util/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/check.h"

int fs_mkdirs(const char *path, int last, char *err, size_t errlen) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) goto fail;
        *p = '/';
    }
    if (last && mkdir(buf, 0755) && errno != EEXIST) goto fail;
    return 0;
fail:
    if (err) {
        int e = errno;
        snprintf(err, errlen, "mkdir %s: %s", buf, strerror(e));
        errno = e;
    }
    return -1;
}

int fs_remove_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    char p[4096];
    int rc = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        rc |= unlink(p);
    }
    closedir(d);
    return rc | rmdir(path);
}

int fs_fresh_dir(const char *path, char *err, size_t errlen) {
    if (fs_remove_dir(path) && errno != ENOENT) return errorf(err, errlen, "cannot remove stale %s: %s", path, strerror(errno));
    if (mkdir(path, 0755)) return errorf(err, errlen, "mkdir %s: %s", path, strerror(errno));
    return 0;
}

int fs_write_text(const char *path, const char *text, char *err, size_t errlen) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errorf(err, errlen, "cannot create %s: %s", path, strerror(errno));
    size_t len = strlen(text), off = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            errorf(err, errlen, "write %s: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        off += (size_t)w;
    }
    if (fsync(fd) || close(fd)) return errorf(err, errlen, "fsync/close %s: %s", path, strerror(errno));
    return 0;
}

char *fs_read_text(const char *path, size_t limit, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fd, &st)) {
        snprintf(err, errlen, "%s: fstat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if ((size_t)st.st_size > limit) {
        snprintf(err, errlen, "%s: %lld bytes, more than the %zu-byte limit for a JSON file", path,
                 (long long)st.st_size, limit);
        close(fd);
        return NULL;
    }
    char *buf = mallocCheck((size_t)st.st_size + 1);
    size_t off = 0;
    while (off < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + off, (size_t)st.st_size - off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snprintf(err, errlen, "%s: read: %s", path, r < 0 ? strerror(errno) : "unexpected end of file");
            free(buf);
            close(fd);
            return NULL;
        }
        off += (size_t)r;
    }
    buf[off] = 0;
    close(fd);
    return buf;
}

void fs_sync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) { fsync(fd); close(fd); }
}

int fs_lock_file(const char *path, char *holder, size_t holderlen, char *err, size_t errlen) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644), e;
    if (fd < 0) {
        e = errno;
        errorf(err, errlen, "cannot create %s: %s", path, strerror(e));
        errno = e;
        return -1;
    }
    struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_SETLK, &lk) == 0) {
        char host[256] = "?", text[320];
        gethostname(host, sizeof host);
        host[sizeof host - 1] = 0;
        int n = snprintf(text, sizeof text, "pid %ld on host %s\n", (long)getpid(), host);
        if (ftruncate(fd, 0) == 0 && pwrite(fd, text, (size_t)n, 0) == n) return fd;
        e = errno;
        errorf(err, errlen, "write %s: %s", path, strerror(e));
    } else if ((e = errno) == EAGAIN || e == EACCES) {
        // held: the holder wrote who it is; F_GETLK knows its pid when it is local
        char text[320] = "";
        ssize_t n = pread(fd, text, sizeof text - 1, 0);
        text[n > 0 ? n : 0] = 0;
        text[strcspn(text, "\n")] = 0;
        struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (!text[0] && fcntl(fd, F_GETLK, &q) == 0 && q.l_type != F_UNLCK) snprintf(text, sizeof text, "pid %ld", (long)q.l_pid);
        snprintf(holder, holderlen, "%s", text[0] ? text : "an unknown process");
        close(fd);
        return -2;
    } else {
        errorf(err, errlen, "cannot lock %s: %s", path, strerror(e));
    }
    close(fd);
    errno = e;
    return -1;
}
