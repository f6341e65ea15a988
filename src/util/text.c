#include "util/text.h"

#include <string.h>

#include "util/check.h"

int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    int *row = mallocCheck((lb + 1) * sizeof(int));
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    int d = row[lb];
    free(row);
    return d;
}

const char *nearest_key(const char *key, const char *const *list) {
    const char *best = NULL;
    int bd = 1 << 30;
    for (int i = 0; list[i]; i++) {
        int d = edit_distance(key, list[i]);
        if (d < bd) { bd = d; best = list[i]; }
    }
    int limit = (int)strlen(key) / 3 + 1;
    return bd <= limit ? best : NULL;
}
