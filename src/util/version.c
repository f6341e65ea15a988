#include "util/version.h"

#include "commit.h" // build/commit.h, written by the Makefile

#ifndef MOECORE_VERSION
#define MOECORE_VERSION "dev"
#endif

const char *moecore_version(void) { return MOECORE_VERSION; }
const char *moecore_commit(void) { return MOECORE_BUILD_COMMIT; }
