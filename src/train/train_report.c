// What a training run reports: the run header, the description of the
// build and device that every record carries, each step's metrics.jsonl
// record and its console line (DESIGN.md §8).
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "train/memory.h"
#include "train/metrics.h"
#include "train/mfu.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/version.h"
#ifdef MOECORE_CUDA
#include "ops/cuda/ops_cuda.h"
#endif

double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

void fmt_duration(char *buf, size_t n, double s) {
    if (s < 0 || !isfinite(s)) { snprintf(buf, n, "?"); return; }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

// The run's description for its records: build, device, kernel choices.
json_object *run_info_json(const Trainer *tr) {
    const RunConfig *cfg = &tr->cfg;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "version", json_object_new_string(moecore_version()));
    json_object_object_add(o, "commit", json_object_new_string(moecore_commit()));
    json_object_object_add(o, "ranks", json_object_new_int(train_world_size));
    json_object_object_add(o, "device_type", json_object_new_string(tr->ops->name));
    json_object *mfu = json_object_new_object();
    json_object_object_add(mfu, "tflops", tr->peak > 0 ? json_object_new_double(tr->peak) : NULL);
    json_object_object_add(mfu, "source", json_object_new_string(tr->peak_source));
    json_object_object_add(o, "mfu_denominator", mfu);
#ifdef MOECORE_CUDA
    if (cfg->device.type == 1) {
        CudaDeviceInfo d;
        cuda_device_info(&d);
        char cc[16];
        snprintf(cc, sizeof cc, "%d.%d", d.cc_major, d.cc_minor);
        json_object_object_add(o, "device", json_object_new_string(d.name));
        json_object_object_add(o, "compute_capability", json_object_new_string(cc));
        json_object_object_add(o, "driver", json_object_new_string(d.driver));
        json_object_object_add(o, "cuda_driver_api", json_object_new_int(d.driver_api));
        json_object_object_add(o, "cuda_runtime", json_object_new_int(d.runtime));
        const CudaSettings *s = &cfg->device.cuda;
        json_object *c = json_object_new_object();
        json_object_object_add(c, "grouped_gemm", json_object_new_string(cuda_kernels_name(s->grouped_gemm)));
        json_object_object_add(c, "grouped_wgrad", json_object_new_string(cuda_kernels_name(s->grouped_wgrad)));
        json_object_object_add(c, "gemm_tma", json_object_new_boolean(s->gemm_tma));
        json_object_object_add(c, "attention_ds_mib", json_object_new_int(s->attention_ds_mib));
        json_object_object_add(c, "attention_fwd", json_object_new_string(cuda_kernels_name(s->attention_fwd)));
        json_object_object_add(c, "attention_bwd", json_object_new_string(cuda_kernels_name(s->attention_bwd)));
        json_object_object_add(c, "fp8_wgrad_gemm", json_object_new_boolean(s->fp8_wgrad_gemm));
        json_object_object_add(c, "attention_group", json_object_new_int(s->attention_group));
        json_object_object_add(o, "device_cuda", c);
        json_object_object_add(o, "cuda_graph", json_object_new_boolean(tr->use_graph));
    }
#else
    (void)cfg;
#endif
    return o;
}

// tr->peak and tr->peak_source: device.peak_tflops when set, else the GPU's
// dense BF16 peak from the table (0 for a GPU it does not know: MFU is then
// not reported), else the CPU's cached SGEMM rate, found by rank 0 alone (a
// measurement of every rank at once would measure contention).
static void mfu_denominator(Trainer *tr) {
    const RunConfig *cfg = &tr->cfg;
    char *src = tr->peak_source;
    size_t n = sizeof tr->peak_source;
    tr->peak = cfg->device.peak_tflops;
    if (tr->peak > 0) { snprintf(src, n, "device.peak_tflops"); return; }
#ifdef MOECORE_CUDA
    if (cfg->device.type == 1) {
        CudaDeviceInfo d;
        cuda_device_info(&d);
        const char *entry;
        tr->peak = mfu_gpu_peak_tflops(d.name, &entry);
        if (entry) snprintf(src, n, "%s: dense BF16 peak of the %s", d.name, entry);
        else snprintf(src, n, "%s is not in the table of src/train/mfu.c: MFU is not reported; "
                      "set device.peak_tflops to its dense BF16 peak", d.name);
        return;
    }
#endif
    if (train_rank0) {
        char path[1100];
        tr->peak = mfu_cpu_peak_tflops(mfu_cpu_cache_path(path, sizeof path) ? NULL : path, src, n);
    }
    comm_broadcast(tr->world, &tr->peak, 1, COMM_F64, 0);
}

// This rank's memory line (train/memory.h), from the config and the layout;
// what was allocated must agree with it, or the line says where it does not.
static void print_memory(Trainer *tr) {
    const Mesh *mesh = &tr->mesh;
    const ParamStore *ps = &tr->m.store;
    char err[400];
    MemoryLayout l;
    memory_layout_for_run(&l, &tr->cfg, tr->ops, comm_rank(mesh->dp_comm), comm_rank(mesh->ep_dp_comm),
                          tr->pipe.on ? &tr->pipe.stage : NULL, tr->pipe.on ? tr->pipe.n_slots : 1, tr->M,
                          tr->cfg.device.type == 1);
    l.pp_rank = tr->pipe.on ? tr->pipe.rank : 0;
    // the dispatch the model runs (symmetric memory may be unavailable), and
    // the receive rows it chose (a device may have cut them to its memory)
    const Model *m = &tr->m;
    l.act.ep_sym = m->ep_sym;
    size_t routed = (size_t)tr->MB * tr->T * m->cfg.top_k;
    if (m->ep_sym && (size_t)m->max_rows_local != (size_t)mesh->ep * routed)
        l.act.ep_recv_factor = ((double)m->max_rows_local - 0.5) / (double)routed;
    // NCCL's buffers: the groups of more than one rank of a launched GPU job
    if (l.gpu && tr->launch.kind != LAUNCH_SINGLE) {
        Comm *g[] = {tr->world, mesh->dp_comm, mesh->ep_comm, mesh->ep_dp_comm, mesh->pp_comm};
        l.n_comms = 0;
        for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) l.n_comms += g[i] && comm_is_nccl(g[i]) && comm_size(g[i]) > 1;
    }
    MemoryPlan p;
    if (memory_plan(&p, &tr->m.cfg, &l, err, sizeof err)) {
        printf("rank %d: memory: no accounting: %s\n", comm_rank(tr->world), err);
        fflush(stdout);
        return;
    }
    if (tr->m.fp8) memory_plan_fp8(&p, &tr->m.cfg, &l);
    memory_print(stdout, comm_rank(tr->world), &p);
    memory_print_plan(stdout, comm_rank(tr->world), &p);
    // the plan's activations are the arena's own measure (model_arena_plan);
    // on a GPU the symmetric buffers may have been cut to its free memory
    if (p.arena != tr->m.arena_bytes || (p.dispatch != tr->m.sym_bytes && !l.gpu))
        printf("rank %d: memory: warning: the plan's activations (%zu B, dispatch %zu B) differ from the arena "
               "allocated (%zu B, dispatch %zu B)\n", comm_rank(tr->world), p.arena, p.dispatch, tr->m.arena_bytes,
               tr->m.sym_bytes);
    if (l.gpu)
        printf("rank %d: memory: the GPU had %.1f MiB in use before the first allocation (the CUDA context; "
               "the plan allows %.0f MiB for the context, cuBLASLt and loaded kernels)\n", comm_rank(tr->world),
               tr->start_dev_mib, MEMORY_CONTEXT_MIB);
    tr->mem_plan_mib[0] = memory_total(&p) / 1048576.0;
    tr->mem_plan_mib[1] = p.peak / 1048576.0;
    size_t held[N_CLASSES] = {p.dense, p.expert}, opt[N_CLASSES] = {p.dense_opt, p.expert_opt};
    size_t main[N_CLASSES] = {p.dense_main, p.expert_main};
    for (int c = 0; c < N_CLASSES; c++) {
        size_t main_held = ps->wact[c] == (void *)ps->params[c] ? 0 : ps->main_end[c] - ps->main_begin[c];
        if (held[c] != ps->table.class_numel[c] || opt[c] != tr->adamw.end[c] - tr->adamw.begin[c] || main[c] != main_held)
            printf("rank %d: memory: warning: the %s accounting (%zu parameters, %zu with moments, %zu with main weights) "
                   "differs from what was allocated (%zu, %zu, %zu)\n", comm_rank(tr->world),
                   c == CLASS_DENSE ? "dense" : "expert", held[c], opt[c], main[c], ps->table.class_numel[c],
                   tr->adamw.end[c] - tr->adamw.begin[c], main_held);
    }
    fflush(stdout);
}

void print_memory_measured(const Trainer *tr) {
    double measured;
    const char *what;
    if (tr->ops == &ops_cpu) {
        size_t live, peak;
        ops_cpu_alloc_stats(&live, &peak);
        measured = peak / 1048576.0;
        what = "CPU backend allocations, peak";
    } else if (tr->ops->device_memory_used) {
        measured = tr->peak_dev_mib;
        what = "GPU memory in use (cudaMemGetInfo), peak of the logged steps";
    } else {
        return;
    }
    printf("rank %d: memory measured: %.2f MiB (%s); plan %.2f MiB peak (%+.2f%%)\n", comm_rank(tr->world), measured,
           what, tr->mem_plan_mib[1], tr->mem_plan_mib[1] > 0 ? 100.0 * (tr->mem_plan_mib[1] / measured - 1) : 0.0);
    fflush(stdout);
}

// The run header: what trains on what, with which layout and kernels.
void print_header(Trainer *tr) {
    const RunConfig *cfg = &tr->cfg;
    const TrainSection *t = &cfg->train;
    const Model *m = &tr->m;
    const Mesh *mesh = &tr->mesh;
    mfu_denominator(tr);
    tr->fpt = flops_per_token(&m->cfg);
    char desc[1024];
    if (tr->train) data_describe(tr->train, desc, sizeof desc);
    else snprintf(desc, sizeof desc, "synthetic: uniformly random tokens from seed %llu", (unsigned long long)t->seed);
    SAY("moecore train: %s (moecore %s, commit %s)\n", tr->config_path, moecore_version(), moecore_commit());
    ParamTable whole; // the whole model's (a pipeline stage holds part of it)
    char terr[300];
    memset(&whole, 0, sizeof whole);
    param_table_for_config(&m->cfg, &whole, terr, sizeof terr);
    SAY("model: %zu parameters (%zu dense, %zu expert), %d layers (%d MoE, E=%d top-%d), vocab %d (padded %d)\n",
        whole.class_numel[CLASS_DENSE] + whole.class_numel[CLASS_EXPERT], whole.class_numel[CLASS_DENSE],
        whole.class_numel[CLASS_EXPERT],
        m->cfg.n_layers, m->n_moe, m->cfg.n_experts, m->cfg.top_k, m->cfg.vocab_size, m->cfg.padded_vocab);
    SAY("data: %s\n", desc);
    SAY("batch: %d x %d tokens per step (%d ranks x %d micro-batches of %d), %lld steps; %.3g FLOP/token\n",
        tr->G, tr->T, mesh->dp, tr->M, tr->MB, (long long)t->steps, tr->fpt);
    if (tr->peak > 0) SAY("MFU denominator: %.3f TFLOP/s per device (%s)\n", tr->peak, tr->peak_source);
    else SAY("MFU denominator: unknown (%s)\n", tr->peak_source);
    SAY("parallel: %d ranks, dp %d = ep %d x ep_dp %d, pp %d; optimizer %s\n", train_world_size, mesh->dp, mesh->ep,
        mesh->ep_dp, mesh->pp, cfg->optim_sharded ? "sharded over the data-parallel groups" : "replicated");
    param_table_free(&whole);
    if (tr->pipe.on) {
        const Pipeline *pl = &tr->pipe;
        SAY("pipeline: %s, %d stages (%d ranks x %d chunks), %d micro-batches per step, layers per stage",
            pp_schedule_kind_name(pl->sched.kind), pl->n_stages, pl->pp, pl->virt, tr->M);
        for (int s = 0; s < pl->n_stages; s++) SAY("%s%d", s ? "," : " ", pl->split[s]);
        SAY("; bubble in theory %.1f%%%s\n", 100 * pl->theory,
            pl->sched.kind == PP_ZB1 ? " (unit costs F 1, Bi 1, W 1; here Bi is the whole backward and W empty)" : "");
        SAY("pipeline hand-offs: %s\n", pl->at_receiver ? "each send in the slot where its receiver takes it, one group "
            "with that slot's receive" : "each send after its action, each receive posted one action ahead");
        // every rank: its layers and the micro-batches it keeps in flight
        printf("rank %d: pipeline stage %d: layers", comm_rank(tr->world), pl->rank);
        for (int c = 0; c < pl->virt; c++) printf(" %d-%d", pl->stage.begin[c], pl->stage.end[c] - 1);
        printf("%s%s, %d activation slots of %zu B\n", pl->stage.embed ? ", embedding" : "",
               pl->stage.head ? ", final norm + LM head" : "", pl->n_slots, tr->m.slot_bytes);
        fflush(stdout);
    }
#ifdef MOECORE_CUDA
    if (cfg->device.type == 1) {
        CudaDeviceInfo d;
        cuda_device_info(&d);
        const CudaSettings *s = &cfg->device.cuda;
        SAY("device: %s (sm_%d%d, %d SMs, %.1f GiB), driver %s, CUDA runtime %d.%d\n", d.name, d.cc_major,
            d.cc_minor, d.sms, d.memory_gib, d.driver, d.runtime / 1000, d.runtime % 1000 / 10);
        SAY("device.cuda: grouped_gemm %s, grouped_wgrad %s, gemm_tma %s, attention_ds_mib %d, attention_fwd %s, "
            "attention_bwd %s, fp8_wgrad_gemm %s, attention_group %d\n",
            cuda_kernels_name(s->grouped_gemm), cuda_kernels_name(s->grouped_wgrad), s->gemm_tma ? "true" : "false",
            s->attention_ds_mib, cuda_kernels_name(s->attention_fwd), cuda_kernels_name(s->attention_bwd),
            s->fp8_wgrad_gemm ? "true" : "false", s->attention_group);
    }
#endif
    print_memory(tr);
    comm_barrier(tr->world);
    SAY("run dir: %s, checkpoints: %s%s\n", cfg->logging.run_dir, cfg->checkpoint.dir,
        tr->tb ? ", TensorBoard events in the run dir" : "");
    SAY("console: loss = ce + %g x lb + %g x z (model.lb_coef, model.z_coef); lb = the load-balancing loss "
        "(1 per layer when balanced), z = the router z-loss, each unscaled and summed over the %d MoE layers; "
        "load max/mean of the worst layer\n", m->cfg.lb_coef, m->cfg.z_coef, m->n_moe);
}

// The step's metrics.jsonl record (rank 0 writes it); fills the per-layer
// max/mean loads, returns the worst one and whether gerrymandering is flagged.
json_object *step_record(Trainer *tr, const StepResult *r, double *worst_max, double *dropped_total,
                                double *rows_total, int *flagged) {
    const Model *m = &tr->m;
    const TrainState *st = &tr->st;
    const Ops *ops = tr->ops;
    int L = tr->L, E = tr->E;
    double tps = (double)tr->G * tr->T / r->dt, tflops = tps * tr->fpt / 1e12 / train_world_size;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "step", json_object_new_int64(st->step));
    json_object_object_add(o, "loss", json_object_new_double(r->loss));
    json_object_object_add(o, "ce", json_object_new_double(r->ce));
    json_object_object_add(o, "lb", json_object_new_double(m->cfg.lb_coef * r->lb_raw));
    json_object_object_add(o, "lb_raw", json_object_new_double(r->lb_raw));
    json_object_object_add(o, "z_loss", json_object_new_double(m->cfg.z_coef * r->z_raw));
    json_object_object_add(o, "z_loss_raw", json_object_new_double(r->z_raw));
    json_object_object_add(o, "lr", json_object_new_double(r->lr));
    json_object_object_add(o, "grad_norm", json_object_new_double(r->gnorm));
    json_object_object_add(o, "clip_scale", json_object_new_double(r->clip_scale));
    json_object_object_add(o, "skipped", json_object_new_boolean(r->skipped));
    json_object_object_add(o, "skipped_total", json_object_new_int64(st->skipped_steps));
    json_object_object_add(o, "tokens", json_object_new_int64(st->tokens_seen));
    json_object_object_add(o, "tokens_per_s", json_object_new_double(tps));
    json_object_object_add(o, "tokens_per_s_device", json_object_new_double(tps / train_world_size));
    json_object_object_add(o, "tflops_per_device", json_object_new_double(tflops));
    json_object_object_add(o, "mfu", json_object_new_double(tflops / tr->peak));
    json_object_object_add(o, "mfu_denominator_tflops", json_object_new_double(tr->peak));
    json_object_object_add(o, "peak_mem_mib", json_object_new_double(peak_rss_mib()));
    if (ops->device_memory_used) {
        double used = ops->device_memory_used() / 1048576.0;
        if (used > tr->peak_dev_mib) tr->peak_dev_mib = used;
        json_object_object_add(o, "device_mem_mib", json_object_new_double(tr->peak_dev_mib));
    }
    // the memory plan's steady state and peak beside what was measured:
    // the CPU backend's allocation counters, or the GPU's memory in use
    json_object_object_add(o, "mem_plan_mib", json_object_new_double(tr->mem_plan_mib[0]));
    json_object_object_add(o, "mem_plan_peak_mib", json_object_new_double(tr->mem_plan_mib[1]));
    if (ops == &ops_cpu) {
        size_t live, peak;
        ops_cpu_alloc_stats(&live, &peak);
        json_object_object_add(o, "alloc_live_mib", json_object_new_double(live / 1048576.0));
        json_object_object_add(o, "alloc_peak_mib", json_object_new_double(peak / 1048576.0));
    }
    json_object_object_add(o, "step_time_s", json_object_new_double(r->dt));
    if (tr->pipe.on) { // the measured bubble beside the schedule's theory (pipeline.c)
        const Pipeline *pl = &tr->pipe;
        json_object_object_add(o, "pp_bubble", json_object_new_double(pl->bubble));
        json_object_object_add(o, "pp_bubble_theory", json_object_new_double(pl->theory));
        json_object_object_add(o, "pp_bubble_sim", json_object_new_double(pl->bubble_sim));
        json_object *idle = json_object_new_array();
        for (int p = 0; p < pl->pp; p++) json_object_array_add(idle, json_object_new_double(pl->idle[p]));
        json_object_object_add(o, "pp_idle_in_span", idle);
        json_object *wait = json_object_new_array(), *other = json_object_new_array();
        for (int p = 0; p < pl->pp; p++) {
            json_object_array_add(wait, json_object_new_double(pl->wait[p]));
            json_object_array_add(other, json_object_new_double(pl->other[p]));
        }
        json_object_object_add(o, "pp_wait_in_span", wait);
        json_object_object_add(o, "pp_other_in_span", other);
    }
    json_object *layers = json_object_new_array();
    *worst_max = *dropped_total = *rows_total = 0;
    for (int l = 0; l < L; l++) {
        ExpertLoad el;
        expert_load_stats(tr->counts_host + (size_t)l * E, E, &el);
        tr->maxload[l] = el.max_over_mean;
        if (el.max_over_mean > *worst_max) *worst_max = el.max_over_mean;
        *dropped_total += m->step_dropped[l];
        *rows_total += m->step_rows[l];
        json_object *lo = json_object_new_object();
        json_object_object_add(lo, "lb_raw", json_object_new_double(tr->lb_step[l]));
        json_object_object_add(lo, "z_raw", json_object_new_double(tr->z_step[l]));
        json_object_object_add(lo, "load_max_over_mean", json_object_new_double(el.max_over_mean));
        json_object_object_add(lo, "load_min_over_mean", json_object_new_double(el.min_over_mean));
        json_object_object_add(lo, "load_cv", json_object_new_double(el.cv));
        json_object_object_add(lo, "dead_experts", json_object_new_int(el.dead));
        json_object_object_add(lo, "dropped_rows", json_object_new_double(m->step_dropped[l]));
        json_object_object_add(lo, "routed_rows", json_object_new_double(m->step_rows[l]));
        json_object_object_add(lo, "dropped_fraction",
                               json_object_new_double(m->step_rows[l] > 0 ? m->step_dropped[l] / m->step_rows[l] : 0));
        json_object_array_add(layers, lo);
    }
    *flagged = L ? gerrymander_push(&tr->gm, tr->lb_step, tr->maxload, tr->gflags) : 0;
    for (int l = 0; l < L; l++)
        json_object_object_add(json_object_array_get_idx(layers, l), "gerrymander_flag",
                               json_object_new_boolean(tr->gflags[l]));
    json_object_object_add(o, "moe_layers", layers);
    json_object_object_add(o, "dropped_fraction", json_object_new_double(*rows_total > 0 ? *dropped_total / *rows_total : 0));
    // the all-to-all dispatch's rows and payload bytes, all ranks, the step's
    // forwards (the symmetric dispatch's sizes stay on the device)
    if (m->par.ep_size > 1 && !m->ep_sym) {
        json_object_object_add(o, "ep_dispatch_rows", json_object_new_double(m->step_dispatch_rows));
        json_object_object_add(o, "ep_dispatch_bytes", json_object_new_double(m->step_dispatch_bytes));
    }
    json_object_object_add(o, "gerrymander_flag", json_object_new_boolean(*flagged > 0));
    // an unknown device peak (mfu.h): no MFU rather than a guess
    if (!(tr->peak > 0)) {
        json_object_object_add(o, "mfu", NULL);
        json_object_object_add(o, "mfu_denominator_tflops", NULL);
    }
    if (!tr->run_info_written) {
        json_object_object_add(o, "run", run_info_json(tr));
        tr->run_info_written = 1;
    }
    return o;
}

static void null_nonfinite(json_object *v, const char *path, json_object *names) {
    char p[256];
    if (json_object_is_type(v, json_type_object)) {
        json_object_object_foreach(v, key, val) {
            snprintf(p, sizeof p, "%s%s%s", path, *path ? "." : "", key);
            if (json_object_is_type(val, json_type_double) && !isfinite(json_object_get_double(val))) {
                json_object_object_add(v, key, NULL); // replaces the value in place
                json_object_array_add(names, json_object_new_string(p));
            } else {
                null_nonfinite(val, p, names);
            }
        }
    } else if (json_object_is_type(v, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(v); i++) {
            json_object *e = json_object_array_get_idx(v, i);
            snprintf(p, sizeof p, "%s.%zu", path, i);
            if (json_object_is_type(e, json_type_double) && !isfinite(json_object_get_double(e))) {
                json_object_array_put_idx(v, i, NULL);
                json_object_array_add(names, json_object_new_string(p));
            } else {
                null_nonfinite(e, p, names);
            }
        }
    }
}

void record_null_nonfinite(json_object *o) {
    json_object *names = json_object_new_array();
    null_nonfinite(o, "", names);
    if (json_object_array_length(names)) json_object_object_add(o, "nonfinite", names);
    else json_object_put(names);
}

// The console line of a logged step: losses, lr, grad norm, throughput over
// the log window (avg_tps), MFU, expert load, memory and the ETA.
void print_step_line(const Trainer *tr, const StepResult *r, double avg_tps, double eta_s, double worst_max,
                     double dropped_total, double rows_total, int flagged) {
    const TrainSection *t = &tr->cfg.train;
    double fpt = tr->fpt, peak = tr->peak;
    char eta[32];
    fmt_duration(eta, sizeof eta, eta_s);
    char drop[48] = "";
    if (dropped_total > 0) snprintf(drop, sizeof drop, " | dropped %.2f%%", 100 * dropped_total / rows_total);
    char bubble[64] = "";
    if (tr->pipe.on) snprintf(bubble, sizeof bubble, " | bubble %.1f%% (theory %.1f%%)", 100 * tr->pipe.bubble, 100 * tr->pipe.theory);
    char mem[48];
    if (tr->ops->device_memory_used) snprintf(mem, sizeof mem, "%.1f GiB GPU", tr->peak_dev_mib / 1024);
    else snprintf(mem, sizeof mem, "%.0f MiB RSS", peak_rss_mib());
    char mfu[32] = "n/a";
    if (peak > 0) snprintf(mfu, sizeof mfu, "%.1f%%", 100 * avg_tps * fpt / 1e12 / train_world_size / peak);
    SAY("step %5lld/%lld | loss %.4f | ce %.4f | lb(sum of %d layers) %.4f | z(sum of %d layers) %.4f | lr %.2e | "
        "gnorm %.3f%s | %.0f tok/s | %.3f TFLOP/s/dev | MFU %s | load max/mean %.2f%s%s%s | %s | ETA %s\n",
        (long long)tr->st.step, (long long)t->steps, r->loss, r->ce, tr->L, r->lb_raw, tr->L, r->z_raw, r->lr, r->gnorm,
        r->skipped ? " SKIPPED" : "", avg_tps, avg_tps * fpt / 1e12 / train_world_size, mfu, worst_max, drop,
        flagged ? " GERRYMANDER?" : "", bubble, mem, eta);
}
