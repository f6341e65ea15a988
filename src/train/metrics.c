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

// Least-squares slope of ring r (oldest at head) over n points, and its
// t statistic (slope / standard error), so that noise is not a trend.
static double slope(const double *r, int n, int head, int window, double *tstat) {
    double mx = (n - 1) / 2.0, my = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) my += r[(head + i) % window];
    my /= n;
    for (int i = 0; i < n; i++) {
        double dx = i - mx, dy = r[(head + i) % window] - my;
        sxx += dx * dx;
        sxy += dx * dy;
    }
    double b = sxy / sxx, rss = 0;
    for (int i = 0; i < n; i++) {
        double e = r[(head + i) % window] - my - b * (i - mx);
        rss += e * e;
    }
    double se = sqrt(rss / (n - 2) / sxx);
    *tstat = se > 0 ? b / se : (b != 0 ? copysign(INFINITY, b) : 0);
    return b;
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
        double tl, tm;
        slope(rl, g->n, g->head, g->window, &tl);
        double sm = slope(rm, g->n, g->head, g->window, &tm);
        double mean = 0;
        for (int i = 0; i < g->n; i++) mean += rm[i];
        mean /= g->n;
        double rise = sm * (g->n - 1);
        if (tl < -3 && tm > 3 && mean > 0 && rise / mean >= 0.05) { flags[l] = 1; any++; }
    }
    return any;
}
