// The version and the commit this build came from, for run headers and
// benchmark records (the Makefile writes the commit into build/commit.h).
#pragma once

const char *moecore_version(void);
// `git describe --always --dirty` at build time, "unknown" outside a git checkout
const char *moecore_commit(void);
