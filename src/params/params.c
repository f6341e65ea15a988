#include "params/params.h"

#include <stdio.h>
#include <string.h>

#include "util/check.h"

int param_add(ParamTable *t, const char *name, int cls, int kind, int ndim, const int64_t *shape) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->entries = reallocCheck(t->entries, t->cap * sizeof(ParamEntry));
    }
    ParamEntry *e = &t->entries[t->n];
    memset(e, 0, sizeof(*e));
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ndim = ndim;
    e->numel = 1;
    for (int i = 0; i < ndim; i++) {
        e->shape[i] = e->global_shape[i] = shape[i];
        e->numel *= (size_t)shape[i];
    }
    e->cls = cls;
    e->kind = kind;
    e->offset = t->class_numel[cls];
    e->global_index = t->n;
    t->class_numel[cls] += e->numel;
    return t->n++;
}

int param_find(const ParamTable *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->entries[i].name, name)) return i;
    return -1;
}

size_t param_total(const ParamTable *t) {
    size_t s = 0;
    for (int c = 0; c < N_CLASSES; c++) s += t->class_numel[c];
    return s;
}

void param_table_free(ParamTable *t) {
    free(t->entries);
    memset(t, 0, sizeof(*t));
}

size_t param_global_numel(const ParamEntry *e) {
    return e->ndim ? e->numel / (size_t)e->shape[0] * (size_t)e->global_shape[0] : e->numel;
}

size_t param_global_offset(const ParamEntry *e) {
    return e->ndim ? e->numel / (size_t)e->shape[0] * (size_t)e->slice0 : 0;
}
