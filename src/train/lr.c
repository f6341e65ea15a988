// The learning-rate schedule: linear warmup, then the schedule of
// train.lr_schedule. One pure function of the step, so that a resumed run
// and the unit tests see the same values. The schedules are those of
// Olmo-core's optim/scheduler.py (CosWithWarmup, LinearWithWarmup,
// InvSqrtWithWarmup, WSD), with lo = min_lr_ratio x the peak as the floor.
#include <math.h>

#include "train/train.h"

double lr_at(const TrainSection *t, double base, int64_t step) {
    if (step < t->warmup_steps) return base * (double)(step + 1) / (double)t->warmup_steps;
    double lo = base * t->min_lr_ratio;
    int64_t span = t->steps - t->warmup_steps;
    double p = span > 0 ? (double)(step - t->warmup_steps) / (double)span : 1.0;
    if (p > 1) p = 1;
    switch (t->lr_schedule) {
    case LR_COSINE: return lo + (base - lo) * 0.5 * (1 + cos(M_PI * p));
    case LR_LINEAR: return base + (lo - base) * p;
    case LR_INV_SQRT: {
        // lo + (peak - lo) sqrt(W / n) for step number n = step + 1 > W: the
        // peak where warmup ends, lo as n grows; open-ended (train.steps
        // plays no part); a timescale of 1 step without warmup
        double w = t->warmup_steps > 0 ? (double)t->warmup_steps : 1.0;
        return lo + (base - lo) * sqrt(w / (double)(step + 1));
    }
    case LR_WSD: {
        // warmup, stable, then a decay of train.decay_shape over the last
        // decay_fraction of all steps
        double decay_start = 1.0 - (t->decay_fraction * t->steps) / (double)(span > 0 ? span : 1);
        if (p <= decay_start || t->decay_fraction <= 0) return base;
        double x = p - decay_start, len = 1 - decay_start; // q = x / len of the decay done
        switch (t->decay_shape) {
        case DECAY_COSINE: return base + (lo - base) * 0.5 * (1 - cos(M_PI * x / len));
        case DECAY_1_SQRT: return base + (lo - base) * sqrt(x / len);
        default: return base + (lo - base) * x / len; // linear: this order keeps earlier runs bit-exact
        }
    }
    default: return base;
    }
}
