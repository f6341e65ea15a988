#include "dist/ddp.h"

#include <math.h>
#include <string.h>

#include "util/check.h"

static void on_ready(void *ctx, int first, int end);

void ddp_shard_range(size_t total, int n, int r, size_t *begin, size_t *end) {
    *begin = total * r / n;
    *end = total * (r + 1) / n;
}

void ddp_init(Ddp *d, ParamStore *s, Comm *dense_group, Comm *expert_group, Comm *world, int sharded,
              size_t bucket_elems) {
    memset(d, 0, sizeof(*d));
    d->store = s;
    d->group[CLASS_DENSE] = dense_group;
    d->group[CLASS_EXPERT] = expert_group;
    d->world = world;
    d->sharded = sharded;
    d->norm_acc = s->ops->alloc(sizeof(double));
    for (int c = 0; c < N_CLASSES; c++) {
        int n = comm_size(d->group[c]), r = comm_rank(d->group[c]);
        size_t total = s->table.class_numel[c], b, e;
        d->shard_counts[c] = mallocCheck(n * sizeof(size_t));
        d->shard_act_bytes[c] = mallocCheck(n * sizeof(size_t));
        for (int i = 0; i < n; i++) {
            ddp_shard_range(total, n, i, &b, &e);
            d->shard_counts[c][i] = e - b;
            d->shard_act_bytes[c][i] = (e - b) * s->ops->act_bytes;
        }
        ddp_shard_range(total, n, r, &d->shard_begin[c], &d->shard_end[c]);
        if (sharded) d->grad_shard[c] = s->ops->alloc((d->shard_end[c] - d->shard_begin[c]) * sizeof(float) + 4);
    }
    // the distributed optimizer keeps FP32 main weights for the shard only
    // (a no-op where they are the compute weights)
    if (sharded) param_store_shard_main(s, d->shard_begin, d->shard_end);
    // buckets: per class, whole tensors in reverse table order
    const ParamTable *t = &s->table;
    d->entry_bucket = mallocCheck(t->n * sizeof(int));
    d->buckets = mallocCheck((t->n + 1) * sizeof(Bucket));
    for (int c = 0; c < N_CLASSES; c++) {
        Bucket *b = NULL;
        for (int i = t->n - 1; i >= 0; i--) {
            const ParamEntry *e = &t->entries[i];
            if (e->cls != c) continue;
            if (!b || b->hi - b->lo >= bucket_elems) {
                b = &d->buckets[d->n_buckets++];
                memset(b, 0, sizeof(*b));
                b->cls = c;
                b->lo = b->hi = e->offset + e->numel;
                b->first = b->end = i + 1;
            }
            // tensors of a class are laid out in table order: contiguous going down
            b->lo = e->offset;
            b->first = i;
            b->pending++;
            d->entry_bucket[i] = (int)(b - d->buckets);
        }
    }
    // launch order: by the highest table entry first (the order grads become final)
    for (int i = 0; i < d->n_buckets; i++)
        for (int j = i + 1; j < d->n_buckets; j++)
            if (d->buckets[j].end > d->buckets[i].end) {
                Bucket tmp = d->buckets[i]; d->buckets[i] = d->buckets[j]; d->buckets[j] = tmp;
            }
    for (int i = 0; i < d->n_buckets; i++)
        for (int e = d->buckets[i].first; e < d->buckets[i].end; e++)
            if (t->entries[e].cls == d->buckets[i].cls) d->entry_bucket[e] = i;
}

void ddp_free(Ddp *d) {
    for (int c = 0; c < N_CLASSES; c++) {
        free(d->shard_counts[c]);
        free(d->shard_act_bytes[c]);
        if (d->grad_shard[c]) d->store->ops->free(d->grad_shard[c]);
    }
    d->store->ops->free(d->norm_acc);
    free(d->buckets);
    free(d->entry_bucket);
    memset(d, 0, sizeof(*d));
}

static void launch(Ddp *d, Bucket *b) {
    Comm *g = d->group[b->cls];
    float *grads = d->store->grads[b->cls];
    b->launched = 1;
    if (!d->sharded) {
        b->req = comm_iallreduce(g, grads + b->lo, b->hi - b->lo, COMM_F32);
        return;
    }
    // reduce-scatter the bucket: rank r gets the part inside its shard
    int n = comm_size(g);
    size_t counts[n], lo = b->lo, mine = 0;
    size_t sb = d->shard_begin[b->cls];
    for (int r = 0; r < n; r++) {
        size_t rb = 0;
        for (int q = 0; q < r; q++) rb += d->shard_counts[b->cls][q];
        size_t re = rb + d->shard_counts[b->cls][r];
        size_t a = lo > rb ? lo : rb, z = b->hi < re ? b->hi : re;
        counts[r] = z > a ? z - a : 0;
        if (r == comm_rank(g)) mine = a;
    }
    float *recv = d->grad_shard[b->cls] + (counts[comm_rank(g)] ? mine - sb : 0);
    b->req = comm_ireduce_scatter(g, grads + b->lo, recv, counts, COMM_F32);
}

// Launches, in the fixed bucket order, every bucket whose tensors are final.
static void launch_ready(Ddp *d) {
    while (d->next_launch < d->n_buckets && d->buckets[d->next_launch].pending == 0)
        launch(d, &d->buckets[d->next_launch++]);
}

static void on_ready(void *ctx, int first, int end) {
    Ddp *d = ctx;
    for (int e = first; e < end; e++) d->buckets[d->entry_bucket[e]].pending--;
    launch_ready(d);
}

void ddp_arm(Ddp *d, int hooks) {
    d->next_launch = 0;
    for (int i = 0; i < d->n_buckets; i++) {
        Bucket *b = &d->buckets[i];
        b->launched = 0;
        b->req = NULL;
        b->pending = 0;
        for (int e = b->first; e < b->end; e++) b->pending += d->store->table.entries[e].cls == b->cls;
    }
    d->store->grads_ready = hooks ? on_ready : NULL;
    d->store->grads_ready_ctx = d;
}

void ddp_finish(Ddp *d) {
    for (int i = 0; i < d->n_buckets; i++) d->buckets[i].pending = 0;
    launch_ready(d);
    for (int i = 0; i < d->n_buckets; i++) {
        comm_wait(d->buckets[i].req);
        d->buckets[i].req = NULL;
    }
    d->store->grads_ready = NULL;
}

void ddp_optimizer_grads(Ddp *d, float **grads) {
    for (int c = 0; c < N_CLASSES; c++)
        grads[c] = d->sharded ? d->grad_shard[c] : d->store->grads[c];
}

double ddp_grad_norm(Ddp *d) {
    double s = 0;
    d->store->ops->zero(d->norm_acc, sizeof(double));
    for (int c = 0; c < N_CLASSES; c++) {
        if (c == CLASS_EXPERT && d->expert_slots) {
            d->store->ops->sum_f64(d->norm_acc, d->expert_slots, d->n_expert_slots);
            continue;
        }
        size_t n = d->shard_end[c] - d->shard_begin[c];
        const float *g = d->sharded ? d->grad_shard[c] : d->store->grads[c] + d->shard_begin[c];
        d->store->ops->sum_squares(d->norm_acc, g, n);
    }
    // shards partition the parameters across the world: sum once over it,
    // on the device (NCCL) before the one read
    comm_allreduce(d->world, d->norm_acc, 1, COMM_F64);
    d->store->ops->to_host(&s, d->norm_acc, sizeof(double));
    return sqrt(s);
}

int ddp_expert_grads_final(const Ddp *d) {
    return d->store->ops->sum_f64 && comm_size(d->group[CLASS_EXPERT]) == 1 &&
           d->shard_end[CLASS_EXPERT] - d->shard_begin[CLASS_EXPERT] == d->store->table.class_numel[CLASS_EXPERT];
}

void ddp_use_wgrad_slots(Ddp *d, const double *slots, size_t n) {
    d->expert_slots = slots;
    d->n_expert_slots = n;
}

void ddp_gather_params(Ddp *d) {
    if (!d->sharded) return;
    ParamStore *s = d->store;
    for (int c = 0; c < N_CLASSES; c++) {
        if (s->wact[c] == (void *)s->params[c]) // FP32 compute weights are the (whole) main weights
            comm_all_gather(d->group[c], s->params[c], d->shard_counts[c], COMM_F32);
        else // the optimizer wrote its shard's compute weights (BF16): gather those
            comm_all_gather(d->group[c], s->wact[c], d->shard_act_bytes[c], COMM_BYTE);
    }
}
