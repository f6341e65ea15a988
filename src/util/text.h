// Small text helpers shared by the config parsers.
#pragma once
#include <stddef.h>

// Edit distance between a and b (insert, delete, substitute; cost 1 each).
int edit_distance(const char *a, const char *b);
// The entry of the NULL-terminated list nearest to key, or NULL when none
// is within a few edits (so a hint is only given when it is likely right).
const char *nearest_key(const char *key, const char *const *list);
