// `moecore schedule`: print a pipeline schedule's table and what its
// unit-cost simulation gives, beside the theory.
#include <stdlib.h>
#include <string.h>

#include "dist/pp_schedule.h"

static void schedule_usage(FILE *f) {
    fprintf(f, "usage: moecore schedule --pp N --micro M --kind gpipe|1f1b|interleaved|zb1 [--virtual V]\n"
               "                        [--costs F,B,BI,W]\n"
               "  Prints the pipeline schedule's table (rank rows, slot columns), then replays it with the\n"
               "  costs (time units per action of a whole rank's layers; default 1,2,1,1) and prints each\n"
               "  rank's idle time, its peak in-flight micro-batches and the bubble beside the theory.\n");
}

// --key VALUE or --key=VALUE; NULL when argv[*i] is not --key.
static const char *option(int argc, char **argv, int *i, const char *key) {
    size_t n = strlen(key);
    if (strncmp(argv[*i], key, n)) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] || *i + 1 >= argc) return NULL;
    return argv[++*i];
}

static int parse_int(const char *s, const char *key, int *out) {
    char *end;
    long x = strtol(s, &end, 10);
    if (*s == '\0' || *end || x < -1000000 || x > 1000000) {
        fprintf(stderr, "moecore: error: %s '%s' is not an integer\n", key, s);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int cmd_schedule(int argc, char **argv) {
    int pp = 0, micro = 0, virt = 1;
    const char *kind_name = NULL, *v;
    PPCosts costs = pp_costs_unit();
    char err[512];
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            schedule_usage(stdout);
            return 0;
        }
        if ((v = option(argc, argv, &i, "--pp"))) {
            if (parse_int(v, "--pp", &pp)) return 2;
        } else if ((v = option(argc, argv, &i, "--micro"))) {
            if (parse_int(v, "--micro", &micro)) return 2;
        } else if ((v = option(argc, argv, &i, "--virtual"))) {
            if (parse_int(v, "--virtual", &virt)) return 2;
        } else if ((v = option(argc, argv, &i, "--kind"))) {
            kind_name = v;
        } else if ((v = option(argc, argv, &i, "--costs"))) {
            if (sscanf(v, "%lf,%lf,%lf,%lf", &costs.f, &costs.b, &costs.bi, &costs.w) != 4 || costs.f <= 0 ||
                costs.b <= 0 || costs.bi <= 0 || costs.w <= 0) {
                fprintf(stderr, "moecore: error: --costs '%s': expected four positive numbers F,B,BI,W\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "moecore: error: schedule: unknown or incomplete argument '%s'\n", argv[i]);
            schedule_usage(stderr);
            return 2;
        }
    }
    if (!pp || !micro || !kind_name) {
        fprintf(stderr, "moecore: error: schedule needs --pp, --micro and --kind\n");
        schedule_usage(stderr);
        return 2;
    }
    PPScheduleKind kind;
    PPSchedule s;
    PPSimResult r;
    if (pp_schedule_kind_parse(kind_name, &kind, err, sizeof err) ||
        pp_schedule_build(&s, kind, pp, micro, virt, err, sizeof err)) {
        fprintf(stderr, "moecore: error: %s\n", err);
        return 2;
    }
    pp_schedule_print(stdout, &s);
    if (pp_schedule_validate(&s, costs, &r, err, sizeof err)) {
        fprintf(stderr, "moecore: error: the %s schedule fails its check: %s\n", kind_name, err);
        pp_schedule_free(&s);
        return 1;
    }
    printf("\nsimulated with costs F %g, B %g, Bi %g, W %g time units (communication free; not a measurement):\n",
           costs.f, costs.b, costs.bi, costs.w);
    for (int p = 0; p < pp; p++)
        printf("rank %-2d busy %8.3f, idle %8.3f time units between its first and last action, "
               "peak %d (micro-batch, chunk) activation sets held\n",
               p, r.busy[p], r.idle[p], r.peak_inflight[p]);
    printf("makespan %.3f time units; bubble %.2f%% of the step (theory %.2f%%)\n", r.makespan,
           100 * r.bubble_fraction, 100 * pp_schedule_theory_bubble(kind, pp, micro, virt, costs));
    pp_schedule_free(&s);
    return 0;
}
