#include "util/fs.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
