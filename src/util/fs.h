// Small file-system helpers shared by the checkpoint writer, the Hugging Face
// export and the trainer's run directory.
#pragma once
#include <stddef.h>

// mkdir -p: creates path's missing parents and, when last, path itself
// (existing directories are fine). 0 on success; -1 with errno set and, when
// err is not NULL, "mkdir DIR: reason" in it for the directory that failed.
int fs_mkdirs(const char *path, int last, char *err, size_t errlen);
// Removes a directory of plain files; absent is fine. 0 on success.
int fs_remove_dir(const char *path);
