#include "train/metrics.h"

#include <math.h>
#include <string.h>

#include "util/check.h"

void expert_load_stats(const float *counts, int E, ExpertLoad *out) {
    double sum = 0, mx = 0, mn = INFINITY;
    int dead = 0;
    for (int e = 0; e < E; e++) {
        sum += counts[e];
        if (counts[e] > mx) mx = counts[e];
        if (counts[e] < mn) mn = counts[e];
        dead += counts[e] == 0;
    }
    double mean = sum / E, var = 0;
    for (int e = 0; e < E; e++) var += (counts[e] - mean) * (counts[e] - mean);
    var /= E;
    out->max_over_mean = mean > 0 ? mx / mean : 0;
    out->min_over_mean = mean > 0 ? mn / mean : 0;
    out->cv = mean > 0 ? sqrt(var) / mean : 0;
    out->dead = dead;
}

void gerrymander_init(Gerrymander *g, int layers, int window) {
    memset(g, 0, sizeof(*g));
    g->layers = layers;
    g->window = window;
    g->lb = mallocCheck((size_t)layers * window * sizeof(double) + 8);
    g->maxload = mallocCheck((size_t)layers * window * sizeof(double) + 8);
}

void gerrymander_free(Gerrymander *g) {
    free(g->lb);
    free(g->maxload);
    memset(g, 0, sizeof(*g));
}

// Least-squares slope of ring r (oldest at head) over n points.
static double slope(const double *r, int n, int head, int window) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        double y = r[(head + i) % window];
        sx += i; sy += y; sxx += (double)i * i; sxy += i * y;
    }
    double d = n * sxx - sx * sx;
    return d > 0 ? (n * sxy - sx * sy) / d : 0;
}

int gerrymander_push(Gerrymander *g, const double *lb, const double *maxload, int *flags) {
    int pos = g->n < g->window ? g->n : g->head;
    for (int l = 0; l < g->layers; l++) {
        g->lb[(size_t)l * g->window + pos] = lb[l];
        g->maxload[(size_t)l * g->window + pos] = maxload[l];
    }
    if (g->n < g->window) g->n++;
    else g->head = (g->head + 1) % g->window;
    int any = 0;
    for (int l = 0; l < g->layers; l++) {
        flags[l] = 0;
        if (g->n < g->window) continue;
        const double *rl = g->lb + (size_t)l * g->window, *rm = g->maxload + (size_t)l * g->window;
        double sl = slope(rl, g->n, g->head, g->window), sm = slope(rm, g->n, g->head, g->window);
        double first = rm[g->head];
        double rise = sm * (g->n - 1);
        if (sl < 0 && sm > 0 && first > 0 && rise / first >= 0.02) { flags[l] = 1; any++; }
    }
    return any;
}
