// The learning-rate schedule: linear warmup, then the schedule of
// train.lr_schedule. One pure function of the step, so that a resumed run
// and the unit tests see the same values.
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
    case LR_WSD: {
        // warmup, stable, then linear decay over the last decay_fraction of all steps
        double decay_start = 1.0 - (t->decay_fraction * t->steps) / (double)(span > 0 ? span : 1);
        if (p <= decay_start || t->decay_fraction <= 0) return base;
        return base + (lo - base) * (p - decay_start) / (1 - decay_start);
    }
    default: return base;
    }
}
