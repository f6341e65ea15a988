// logging.tensorboard: each metrics.jsonl record also as TensorBoard
// scalars, under the names Olmo-core logs (its trainer's train/, optim/ and
// throughput/ namespaces, from its train module, MoE router and speed
// monitor), so that curves of both read alike. Values come from the record
// itself, so the two logs cannot disagree; a key that is absent or null in
// the record (eval_ce, an unknown MFU) writes no scalar.
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>

#include "train/trainer.h"
#include "util/tfevents.h"

static int number(json_object *o, const char *key, double *v) {
    json_object *x;
    if (!json_object_object_get_ex(o, key, &x) || !x) return 0;
    if (!json_object_is_type(x, json_type_double) && !json_object_is_type(x, json_type_int) &&
        !json_object_is_type(x, json_type_boolean))
        return 0;
    *v = json_object_get_double(x);
    if (json_object_is_type(x, json_type_boolean)) *v = json_object_get_boolean(x);
    return 1;
}

// The record's key as a scalar named tag, times scale.
static void scalar(TfEvents *w, json_object *o, const char *key, const char *tag, double scale) {
    double v;
    if (number(o, key, &v)) tfevents_scalar(w, tag, scale * v);
}

int tb_write_record(TfEvents *w, const ModelConfig *c, json_object *rec, char *err, size_t errlen) {
    double step = 0, v;
    number(rec, "step", &step);
    tfevents_begin(w, (int64_t)step);
    // Olmo-core's names; "load balancing loss" and "router Z loss" are the
    // sums over MoE layers of the losses times their coefficients,
    // "unscaled" without them, as in its router
    scalar(w, rec, "ce", "train/CE loss", 1);
    if (number(rec, "ce", &v)) tfevents_scalar(w, "train/PPL", exp(v));
    scalar(w, rec, "lb", "train/load balancing loss", 1);
    scalar(w, rec, "lb_raw", "train/load balancing loss unscaled", 1);
    scalar(w, rec, "z_loss", "train/router Z loss", 1);
    scalar(w, rec, "z_loss_raw", "train/router Z loss unscaled", 1);
    scalar(w, rec, "lr", "optim/LR (group 0)", 1);
    scalar(w, rec, "grad_norm", "optim/total grad norm", 1);
    scalar(w, rec, "skipped", "optim/step skipped", 1);
    scalar(w, rec, "tokens", "throughput/total tokens", 1);
    scalar(w, rec, "tokens_per_s_device", "throughput/device/TPS", 1);
    scalar(w, rec, "mfu", "throughput/device/MFU", 100); // Olmo-core's is in percent
    // moecore's own, in the same namespaces
    scalar(w, rec, "loss", "train/total loss", 1);
    scalar(w, rec, "clip_scale", "optim/clip scale", 1);
    scalar(w, rec, "tflops_per_device", "throughput/device/TFLOPS", 1);
    scalar(w, rec, "eval_ce", "eval/CE loss", 1);
    // per MoE block, named by its layer index like Olmo-core's "block 03/";
    // "train/load imbalance" is the worst block's max/mean load
    json_object *layers;
    if (json_object_object_get_ex(rec, "moe_layers", &layers) && json_object_is_type(layers, json_type_array)) {
        double worst = 0;
        int li = 0, n = (int)json_object_array_length(layers);
        for (int l = 0; l < c->n_layers && li < n; l++) {
            if (!model_is_moe_layer(c, l)) continue;
            json_object *o = json_object_array_get_idx(layers, li++);
            char tag[96];
#define BLOCK(key, name, scale)                                              \
    do {                                                                     \
        snprintf(tag, sizeof tag, "train/block %02d/%s", l, name);           \
        scalar(w, o, key, tag, scale);                                       \
    } while (0)
            BLOCK("load_max_over_mean", "load imbalance", 1);
            BLOCK("lb_raw", "load balancing loss", c->lb_coef);
            BLOCK("lb_raw", "load balancing loss unscaled", 1);
            BLOCK("z_raw", "router Z loss", c->z_coef);
            BLOCK("z_raw", "router Z loss unscaled", 1);
            BLOCK("dead_experts", "dead experts", 1);
            BLOCK("dropped_fraction", "dropped fraction", 1);
            BLOCK("gerrymander_flag", "gerrymander flag", 1);
#undef BLOCK
            if (number(o, "load_max_over_mean", &v) && v > worst) worst = v;
        }
        if (li) tfevents_scalar(w, "train/load imbalance", worst);
    }
    return tfevents_end(w, err, errlen);
}
