// The parameter table (DESIGN.md §4): every parameter tensor is a view
// {offset, shape} into one flat buffer per shard class. Names are canonical
// and stable (docs/model.md); they are the checkpoint and export names.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { CLASS_DENSE = 0, CLASS_EXPERT = 1, N_CLASSES = 2 } ShardClass;
// What a tensor is, for optimizer rules (weight decay) and initialisation.
typedef enum { PARAM_MATRIX = 0, PARAM_NORM = 1, PARAM_EMBEDDING = 2 } ParamKind;

#define PARAM_NAME_MAX 96
#define PARAM_MAX_DIMS 4

typedef struct {
    char name[PARAM_NAME_MAX];
    int ndim;
    int64_t shape[PARAM_MAX_DIMS];
    size_t numel;
    size_t offset;  // in elements, into its class buffer
    int cls;        // ShardClass
    int kind;       // ParamKind
    // Global tensor (checkpoint) view: expert tensors hold a slice of their
    // experts along dim 0 on each expert-parallel rank.
    int64_t global_shape[PARAM_MAX_DIMS];
    int64_t slice0;  // first global index along dim 0 held here
    // Its index in the table of the whole model: its own index, except in a
    // pipeline stage's table (params/layout.h), which holds some of them.
    int global_index;
} ParamEntry;

typedef struct {
    ParamEntry *entries;
    int n, cap;
    size_t class_numel[N_CLASSES];
} ParamTable;

// Appends a tensor at the end of its class buffer; returns its index.
int param_add(ParamTable *t, const char *name, int cls, int kind, int ndim, const int64_t *shape);
// Elements of the global tensor; and the element offset of this rank's slice in it.
size_t param_global_numel(const ParamEntry *e);
size_t param_global_offset(const ParamEntry *e);
int param_find(const ParamTable *t, const char *name);
void param_table_free(ParamTable *t);
size_t param_total(const ParamTable *t);
