// Small file-system helpers shared by the checkpoint writer, the Hugging Face
// export and import, and the trainer's run directory.
#pragma once
#include <stddef.h>

// mkdir -p: creates path's missing parents and, when last, path itself
// (existing directories are fine). 0 on success; -1 with errno set and, when
// err is not NULL, "mkdir DIR: reason" in it for the directory that failed.
int fs_mkdirs(const char *path, int last, char *err, size_t errlen);
// Removes a directory of plain files; absent is fine. 0 on success.
int fs_remove_dir(const char *path);
// Removes a stale path (a directory of plain files) and creates it empty.
// -1 with "cannot remove stale PATH: reason" or "mkdir PATH: reason".
int fs_fresh_dir(const char *path, char *err, size_t errlen);
// Writes text as the whole file path, durably (fsync). -1 with a message
// naming the path and the call.
int fs_write_text(const char *path, const char *text, char *err, size_t errlen);
// Reads a whole text file of at most limit bytes into a malloc'd,
// NUL-terminated buffer; NULL with "PATH: cannot open: reason", "PATH: N
// bytes, more than the L-byte limit for a JSON file" or a read error.
char *fs_read_text(const char *path, size_t limit, char *err, size_t errlen);
// fsyncs a directory, so that the names created or renamed in it last.
void fs_sync_dir(const char *path);
// An exclusive lock on the file path (created if missing), held while the
// returned descriptor stays open. It is an fcntl record lock: the kernel
// drops it when the process ends, so a crashed holder leaves no stale lock,
// and it works on NFS. The holder writes "pid N on host H" into the file.
// Returns the descriptor; -2 when another process holds the lock, with its
// "pid N on host H" in holder; -1 with a message when the file cannot be
// created or locked (errno kept: ENOLCK where the file system has no locks).
int fs_lock_file(const char *path, char *holder, size_t holderlen, char *err, size_t errlen);
