/* `ctuner bench step`: times forward + backward + AdamW of a preset on random
 * data after warm-up, and a large SGEMM in the same process, and prints one JSON
 * line. gflops counts the model's GEMM and attention work (ct_mmdit_flops, see
 * docs/performance.md). sgemm_gflops is OpenBLAS's cblas_sgemm on a 2048^3
 * product (the baseline), ct_sgemm_gflops our ct_sgemm on the same product
 * (docs/gemm.md), timed alternately; mfu_vs_sgemm = gflops / sgemm_gflops and
 * mfu_vs_ct_sgemm = gflops / ct_sgemm_gflops.
 * --profile puts the model on the profiling backend (ct_backend_profiled:
 * every op timed into its family) and prints a per-family table of the timed
 * steps before the JSON line, which then carries the same numbers under
 * "profile" (docs/performance.md). */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli/cli.h"
#include "ctuner/alloc.h"
#include "ctuner/backend.h"
#include "ctuner/kernels.h"
#include "ctuner/lora.h"
#include "ctuner/mmdit.h"
#include "ctuner/optim.h"
#include "ctuner/parallel.h"
#include "ctuner/rng.h"

void ct_cmd_bench_step_help(FILE *f) {
  fprintf(f,
          "usage: ctuner bench step [--preset NAME] [--steps N] [--warmup N] [--threads T]\n"
          "                         [--gradient_checkpointing N] [--profile]\n"
          "                         [--mixed_precision no|bf16] [--backend NAME]\n"
          "                         [--lora RANK [--base PRECISION]] [--res PX] [--batch B]\n"
          "                         [--txt_len T] [--sgemm_size N]\n"
          "\n"
          "Times one flow-matching training step (forward, backward, AdamW) of a preset\n"
          "(default bench; presets: %s) on random data and prints one JSON line:\n"
          "preset, threads, params, ms_per_step_median, ms_per_step_min, gflops,\n"
          "sgemm_gflops (OpenBLAS, an N^3 SGEMM in the same process, N = --sgemm_size,\n"
          "default 2048), mfu_vs_sgemm,\n"
          "ct_sgemm_gflops (our SGEMM, same product), mfu_vs_ct_sgemm, ct_sgemm_path,\n"
          "peak_rss_mb; and by CPU time (robust to other load; with --threads 1 the\n"
          "whole step's work): cpu_ms_per_step_median, gflops_per_cpu_s,\n"
          "ct_sgemm_gflops_core (ct_sgemm on one thread per CPU second, (N/2)^3) and\n"
          "mfu_cpu_vs_ct_sgemm = gflops_per_cpu_s / ct_sgemm_gflops_core.\n"
          "CT_GEMM=blas makes the model use OpenBLAS, CT_GEMM=avx2 our AVX2 kernel\n"
          "(docs/gemm.md).\n"
          "--gradient_checkpointing N recomputes every Nth block in the backward (1: every\n"
          "block; 0: off, the default; gradient_checkpointing_interval, docs/model.md).\n"
          "--profile times every op of the timed steps by family (gemm, attention, norm,\n"
          "rope, modulation, activation, optimizer, packing, other) and phase (forward,\n"
          "backward, step): a table, then the JSON line with \"profile\" added\n"
          "(ms per step per family and phase; docs/performance.md).\n"
          "--mixed_precision bf16 computes the linear layers' products with bf16\n"
          "operands and float32 sums (the cpu-bf16 backend, as training with\n"
          "mixed_precision bf16; docs/gemm.md); the weights, AdamW and everything else\n"
          "stay float32 here (training also stores the weights in bf16).\n"
          "--lora RANK trains rank-RANK adapters on every linear layer of a frozen base\n"
          "(flux_lora_target all) stored as --base says (no_change, bf16, int8-quanto,\n"
          "int8-torchao); gflop then counts the backward's dX products only. --res PX,\n"
          "--batch B, --txt_len T set the shape (needed by the shape-only flux-dev preset:\n"
          "--preset flux-dev --lora 16 --base bf16 --res 1024 --batch 1 --txt_len 512).\n"
          "--backend NAME runs the step on a compute backend (default cpu; cuda on an\n"
          "NVIDIA GPU, docs/cuda.md): the batch is uploaded each step, the loss and the\n"
          "AdamW update run there, and each step ends when the device is done; the\n"
          "JSON line adds backend and device. With a device backend --profile waits for\n"
          "every op (the times are then an upper bound with no overlap).\n"
          "--sgemm_size N sizes the SGEMM yardsticks (default 2048; the tests use a\n"
          "small one: unoptimised ASan builds took minutes on 2048^3).\n",
          ct_mmdit_preset_names());
}

static double thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* GFLOP/s of ct_sgemm on one thread per second of that thread's CPU time,
 * best of 3 on n^3 (1024 by default): the per-core rate that other load barely
 * changes. */
static double sgemm_core_gflops(int n) {
  float *a = ct_alloc(CT_MEM_BUFFERS, (size_t)n * n * 4),
        *b = ct_alloc(CT_MEM_BUFFERS, (size_t)n * n * 4),
        *c = ct_alloc(CT_MEM_BUFFERS, (size_t)n * n * 4);
  double best = 0;
  if (a && b && c) {
    ct_rng_fill_normal(a, (size_t)n * n, 1, 1, 0, 0, 1);
    ct_rng_fill_normal(b, (size_t)n * n, 1, 2, 0, 0, 1);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    for (int r = 0; r < 4; r++) {
      double t0 = thread_cpu();
      ct_sgemm(0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      double g = 2.0 * n * n * n / (thread_cpu() - t0) / 1e9;
      if (r > 0 && g > best) best = g;
    }
    omp_set_num_threads(saved);
  }
  ct_free(a);
  ct_free(b);
  ct_free(c);
  return best;
}

/* Best GFLOP/s of OpenBLAS (*blas) and ct_sgemm (*ours) on C = A B^T, n^3
 * (2048 by default), run alternately so that load from other processes hits
 * both alike. */
static void sgemm_gflops(int n, double *blas, double *ours) {
  const double flop = 2.0 * n * n * n;
  float *a = ct_alloc(CT_MEM_BUFFERS, (size_t)n * n * 4),
        *b = ct_alloc(CT_MEM_BUFFERS, (size_t)n * n * 4),
        *c = ct_alloc(CT_MEM_BUFFERS, (size_t)n * n * 4);
  *blas = *ours = 0;
  if (a && b && c) {
    ct_rng_fill_normal(a, (size_t)n * n, 1, 1, 0, 0, 1);
    ct_rng_fill_normal(b, (size_t)n * n, 1, 2, 0, 0, 1);
    for (int r = 0; r < 4; r++) { /* r == 0 warms up */
      double t0 = ct_time_now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      double t1 = ct_time_now();
      ct_sgemm(0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      double t2 = ct_time_now();
      if (r > 0 && flop / (t1 - t0) / 1e9 > *blas) *blas = flop / (t1 - t0) / 1e9;
      if (r > 0 && flop / (t2 - t1) / 1e9 > *ours) *ours = flop / (t2 - t1) / 1e9;
    }
  }
  ct_free(a);
  ct_free(b);
  ct_free(c);
}

/* The profile of `steps` timed steps taking `total` wall and `cpu` process
 * CPU seconds in all: a table (wall ms per step by family and phase, CPU ms
 * per step, shares of the step) on stdout, and the same as a JSON object
 * written to js. */
static void profile_report(long steps, double total, double cpu, char *js, size_t jn) {
  ct_prof_counts pc;
  ct_prof_read(&pc);
  double per = 1e3 / (double)steps, acc = 0, acc_cpu = 0;
  printf("%-11s %9s %9s %8s %9s %6s %9s %6s %6s\n", "family", "fwd ms", "bwd ms", "step ms",
         "wall ms", "share", "cpu ms", "share", "calls");
  size_t o = (size_t)snprintf(js, jn, "{");
  for (int f = 0; f < CT_PROF_NFAMILIES; f++) {
    double ph[CT_PROF_NPHASES], sum = 0, sc = 0;
    long nc = 0;
    for (int p = 0; p < CT_PROF_NPHASES; p++) {
      ph[p] = pc.seconds[p][f] * per;
      sum += ph[p];
      sc += pc.cpu_seconds[p][f] * per;
      nc += pc.calls[p][f];
    }
    acc += sum, acc_cpu += sc;
    if (!nc) continue;
    printf("%-11s %9.2f %9.2f %8.2f %9.2f %5.1f%% %9.2f %5.1f%% %6.0f\n", ct_prof_family_name(f),
           ph[0], ph[1], ph[2], sum, 100.0 * sum / (total * per), sc, 100.0 * sc / (cpu * per),
           (double)nc / (double)steps);
    if (o < jn)
      o += (size_t)snprintf(js + o, jn - o,
                            "%s\"%s\": {\"forward_ms\": %.3f, \"backward_ms\": %.3f, "
                            "\"step_ms\": %.3f, \"cpu_ms\": %.3f, \"calls_per_step\": %.1f}",
                            o > 1 ? ", " : "", ct_prof_family_name(f), ph[0], ph[1], ph[2], sc,
                            (double)nc / (double)steps);
  }
  double rest = total * per - acc, rest_cpu = cpu * per - acc_cpu;
  printf("%-11s %9s %9s %8s %9.2f %5.1f%% %9.2f %5.1f%%\n", "untimed", "", "", "", rest,
         100.0 * rest / (total * per), rest_cpu, 100.0 * rest_cpu / (cpu * per));
  printf("%-11s %9s %9s %8s %9.2f %6s %9.2f\n", "step", "", "", "", total * per, "", cpu * per);
  if (o < jn)
    snprintf(js + o, jn - o,
             "%s\"untimed_ms\": %.3f, \"step_ms\": %.3f, \"untimed_cpu_ms\": %.3f, "
             "\"step_cpu_ms\": %.3f}",
             o > 1 ? ", " : "", rest, total * per, rest_cpu, cpu * per);
}

typedef struct step_args {
  const ct_mmdit_preset *p;
  long steps, warmup, threads, ckpt, sgemm_n;
  int profile, bf16;
  const char *backend;
  long lora, res, batch, txt_len; /* 0: full fine-tune / the preset's shape */
  const char *base;               /* base_model_precision of a LoRA's frozen base */
  ct_mmdit_preset shape;          /* the preset with the shape options applied */
} step_args;

/* bench step's options into *a; -1 to go on, else the exit code. */
static int step_args_parse(int argc, char **argv, step_args *a) {
  const char *preset = "bench", *v, *mp = "no";
  *a = (step_args){
      .p = NULL, .steps = 10, .warmup = 3, .sgemm_n = 2048, .backend = "cpu", .base = "no_change"};
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_bench_step_help(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--profile")) {
      a->profile = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "preset", &preset))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "steps", &v))) {
      if (r < 0 || ct_cli_int("steps", v, 1, 100000, &a->steps)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "warmup", &v))) {
      if (r < 0 || ct_cli_int("warmup", v, 0, 100000, &a->warmup)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "gradient_checkpointing", &v))) {
      if (r < 0 || ct_cli_int("gradient_checkpointing", v, 0, 1000, &a->ckpt)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "mixed_precision", &mp))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "backend", &a->backend))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "base", &a->base))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "lora", &v))) {
      if (r < 0 || ct_cli_int("lora", v, 1, 4096, &a->lora)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "res", &v))) {
      if (r < 0 || ct_cli_int("res", v, 16, 8192, &a->res)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "batch", &v))) {
      if (r < 0 || ct_cli_int("batch", v, 1, 4096, &a->batch)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "txt_len", &v))) {
      if (r < 0 || ct_cli_int("txt_len", v, 1, 4096, &a->txt_len)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "threads", &v))) {
      if (r < 0 || ct_cli_int("threads", v, 1, 1024, &a->threads)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "sgemm_size", &v))) {
      if (r < 0 || ct_cli_int("sgemm_size", v, 16, 16384, &a->sgemm_n)) return 2;
    } else {
      fprintf(stderr, "ctuner bench step: unknown option '%s'\n", argv[i]);
      ct_cmd_bench_step_help(stderr);
      return 2;
    }
  }
  if (strcmp(mp, "no") && strcmp(mp, "bf16")) {
    fprintf(stderr, "ctuner bench step: --mixed_precision %s: use no or bf16\n", mp);
    return 2;
  }
  a->bf16 = !strcmp(mp, "bf16");
  a->p = ct_mmdit_preset_find(preset);
  if (!a->p) {
    fprintf(stderr, "ctuner bench step: unknown preset '%s'; presets: %s\n", preset,
            ct_mmdit_preset_names());
    return 2;
  }
  a->shape = *a->p;
  if (a->res) { /* pixels per side: the VAE's 8x down, FLUX's 2x2 packing on the latent */
    if (a->res % 16) {
      fprintf(stderr, "ctuner bench step: --res %ld: use a multiple of 16\n", a->res);
      return 2;
    }
    a->shape.lat_h = a->shape.lat_w = (int)(a->res / 8);
  }
  if (a->batch) a->shape.batch = (int)a->batch;
  if (a->txt_len) a->shape.txt_len = (int)a->txt_len;
  if (!a->shape.batch || !a->shape.lat_h || !a->shape.txt_len) {
    fprintf(stderr,
            "ctuner bench step: preset '%s' is shape-only: give --res, --batch and --txt_len (or "
            "choose tiny, small or bench)\n",
            preset);
    return 2;
  }
  if (!a->lora && strcmp(a->base, "no_change")) {
    fprintf(stderr, "ctuner bench step: --base %s needs --lora RANK (a frozen base)\n", a->base);
    return 2;
  }
  a->p = &a->shape;
  return -1;
}

/* The step's buffers: host inputs drawn each step, and the model's inputs,
 * output, gradient of the loss and AdamW moments in the backend's memory. */
typedef struct step_bufs {
  const ct_backend_ops *be;
  size_t nx, ntxt, ny, n;
  float *x0, *eps, *xt_h, *tgt_h, *t_h;                  /* host */
  float *xt, *tgt, *vp, *dv, *t, *txt, *y, *g, *om, *ov; /* backend (g: guidance) */
  float *P, *G; /* what AdamW steps: the model's or the adapters' parameters and gradients */
} step_bufs;

static void step_bufs_free(step_bufs *b) {
  float *host[] = {b->x0, b->eps, b->xt_h, b->tgt_h, b->t_h};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) ct_free(host[i]);
  float *dev[] = {b->xt, b->tgt, b->vp, b->dv, b->t, b->txt, b->y, b->g, b->om, b->ov};
  for (size_t i = 0; b->be && i < sizeof dev / sizeof dev[0]; i++) b->be->free(dev[i]);
}

/* 0 on success; the text, pooled vector and zero moments are uploaded once */
static int step_bufs_alloc(step_bufs *b, const ct_mmdit_preset *p, size_t n) {
  const ct_mmdit_config *c = &p->cfg;
  const ct_backend_ops *be = b->be;
  size_t B = (size_t)p->batch;
  b->nx = B * c->in_channels * p->lat_h * p->lat_w;
  b->ntxt = B * p->txt_len * c->context_in_dim, b->ny = B * c->vec_in_dim, b->n = n;
  b->x0 = ct_alloc(CT_MEM_BUFFERS, b->nx * 4), b->eps = ct_alloc(CT_MEM_BUFFERS, b->nx * 4);
  b->xt_h = ct_alloc(CT_MEM_BUFFERS, b->nx * 4), b->tgt_h = ct_alloc(CT_MEM_BUFFERS, b->nx * 4);
  b->t_h = ct_alloc(CT_MEM_BUFFERS, B * 4);
  b->xt = be->alloc(CT_MEM_BUFFERS, b->nx * 4), b->tgt = be->alloc(CT_MEM_BUFFERS, b->nx * 4);
  b->vp = be->alloc(CT_MEM_BUFFERS, b->nx * 4), b->dv = be->alloc(CT_MEM_BUFFERS, b->nx * 4);
  b->t = be->alloc(CT_MEM_BUFFERS, B * 4), b->txt = be->alloc(CT_MEM_BUFFERS, b->ntxt * 4);
  b->y = be->alloc(CT_MEM_BUFFERS, b->ny * 4), b->g = be->alloc(CT_MEM_BUFFERS, B * 4);
  b->om = be->alloc(CT_MEM_OPTIMIZER, n * 4), b->ov = be->alloc(CT_MEM_OPTIMIZER, n * 4);
  float *txt_h = ct_alloc(CT_MEM_BUFFERS, b->ntxt * 4), *y_h = ct_alloc(CT_MEM_BUFFERS, b->ny * 4);
  int bad = !b->x0 || !b->eps || !b->xt_h || !b->tgt_h || !b->t_h || !b->xt || !b->tgt || !b->vp ||
            !b->dv || !b->t || !b->txt || !b->y || !b->om || !b->ov || !txt_h || !y_h;
  if (!bad) {
    ct_rng_fill_normal(b->x0, b->nx, 1, 10, 0, 0, 1);
    ct_rng_fill_normal(txt_h, b->ntxt, 1, 11, 0, 0, 1);
    ct_rng_fill_normal(y_h, b->ny, 1, 12, 0, 0, 1);
    be->copy_in(b->txt, txt_h, b->ntxt * 4);
    be->copy_in(b->y, y_h, b->ny * 4);
    for (size_t i = 0; i < B; i++) txt_h[i] = 3.5f; /* FluxPipeline's default guidance */
    be->copy_in(b->g, txt_h, B * 4);
    be->zero(n, b->om);
    be->zero(n, b->ov);
  }
  ct_free(txt_h);
  ct_free(y_h);
  return bad;
}

/* One timed step s: the noisy batch drawn on the host and uploaded, forward,
 * loss, backward and AdamW on the backend; returns when the backend is done. */
static ct_status bench_one_step(ct_mmdit *m, const ct_mmdit_preset *p, step_bufs *b, long s,
                                int profile, ct_err *err) {
  const ct_backend_ops *be = b->be;
  const size_t B = (size_t)p->batch, nx = b->nx, per = nx / B;
  ct_prof_set_phase(CT_PROF_STEP);
  double t0 = ct_time_now(), c0 = ct_prof_cpu_now();
  ct_rng_fill_normal(b->eps, nx, 2, (uint64_t)s, 0, 0, 1);
  for (size_t i = 0; i < B; i++) {
    float z = ct_rng_normal(3, (uint64_t)s, i);
    b->t_h[i] = 1.0f / (1.0f + expf(-z));
  }
  for (size_t i = 0; i < nx; i++) {
    float tt = b->t_h[i / per];
    b->xt_h[i] = (1 - tt) * b->x0[i] + tt * b->eps[i];
    b->tgt_h[i] = b->eps[i] - b->x0[i];
  }
  /* the host's part; what follows goes through the (profiled) table */
  if (profile) ct_prof_add(CT_PROF_OTHER, ct_time_now() - t0, ct_prof_cpu_now() - c0);
  be->copy_in(b->xt, b->xt_h, nx * 4);
  be->copy_in(b->tgt, b->tgt_h, nx * 4);
  be->copy_in(b->t, b->t_h, B * 4);
  be->zero(b->n, b->G);
  ct_mmdit_batch in = {(int)B,     p->lat_h, p->lat_w,
                       p->txt_len, b->xt,    b->t,
                       b->txt,     b->y,     p->cfg.guidance_embed ? b->g : NULL};
  ct_prof_set_phase(CT_PROF_FORWARD);
  ct_status st = ct_mmdit_forward(m, &in, b->vp, err);
  if (st) return st;
  ct_prof_set_phase(CT_PROF_STEP);
  be->mse_fwd_bwd(nx, b->vp, b->tgt, 1.0f, b->dv);
  ct_prof_set_phase(CT_PROF_BACKWARD);
  if ((st = ct_mmdit_backward(m, b->dv, err))) return st;
  ct_prof_set_phase(CT_PROF_STEP);
  be->adam_update(b->n, b->P, b->G, b->om, b->ov, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, s + 1);
  be->synchronize();
  return be->check ? be->check(err) : CT_OK;
}

/* bench's frozen base, drawn segment by segment (ct_mmdit_quantize_from): the same
 * numbers as ct_rng_fill_normal over the whole flat buffer */
static ct_status random_base(void *user, size_t lo, size_t hi, float *out, ct_err *err) {
  (void)user, (void)err;
  ct_rng_fill_normal(out, hi - lo, 7, 0, lo, 0.0f, 0.02f);
  return CT_OK;
}

/* The model the step trains on be: the MMDiT with random weights (full
 * fine-tune), or with --lora a frozen one (stored as --base says) with rank-r
 * adapters on every linear layer (flux_lora_target all, peft's init with B
 * drawn too so that no gradient is zero); *P, *G, *n: what AdamW steps. */
static ct_status build_model(const step_args *a, const ct_backend_ops *be, ct_mmdit **m,
                             ct_lora **l, float **P, float **G, size_t *n, ct_err *err) {
  const ct_mmdit_config *c = &a->p->cfg;
  const int narrow = a->lora && strcmp(a->base, "no_change");
  ct_status st =
      ct_mmdit_new(c, 0, narrow ? CT_MMDIT_NO_PARAMS : CT_MMDIT_GRADS * !a->lora, m, err);
  if (st) return st;
  if (narrow)
    st = ct_mmdit_quantize_from(*m, a->base, 1, random_base, NULL, err);
  else /* random but non-trivial weights everywhere so that no path is zero */
    ct_rng_fill_normal(ct_mmdit_params(*m), ct_mmdit_numel(*m), 7, 0, 0, 0.0f, 0.02f);
  if (!st && a->lora) {
    const ct_lora_opts o = {(int)a->lora, (double)a->lora, 0.0, 0, 0};
    st = ct_lora_new(c, ct_lora_preset("all"), &o, CT_LORA_GRADS, l, err);
    if (!st) {
      *n = ct_lora_numel(*l);
      ct_rng_fill_normal(ct_lora_params(*l), *n, 9, 0, 0, 0.0f, 0.01f);
      ct_mmdit_set_lora(*m, *l);
      ct_mmdit_set_frozen(*m, 1);
      st = ct_lora_set_backend(*l, be, err);
    }
  }
  /* drawn on the host, then moved to the backend */
  if (!st) st = ct_mmdit_set_backend(*m, be, err);
  if (!st && a->lora)
    *P = ct_lora_params(*l), *G = ct_lora_grads(*l);
  else if (!st)
    *n = ct_mmdit_numel(*m), *P = ct_mmdit_params(*m), *G = ct_mmdit_grads(*m);
  return st;
}

int ct_cmd_bench_step(int argc, char **argv) {
  step_args sa;
  const int prc = step_args_parse(argc, argv, &sa);
  if (prc >= 0) return prc;
  const ct_mmdit_preset *p = sa.p;
  const long steps = sa.steps, warmup = sa.warmup, threads = sa.threads, ckpt = sa.ckpt;
  const int profile = sa.profile;
  ct_threads_set((int)threads);
  int nthreads = ct_threads_get();
  ct_err err = {0};
  ct_mmdit *m = NULL;
  ct_lora *lora = NULL;
  int rc = 1;
  const ct_mmdit_config *c = &p->cfg;
  const size_t B = (size_t)p->batch;
  step_bufs bufs = {0};
  double *times = calloc((size_t)steps, sizeof(double));
  double *cpus = calloc((size_t)steps, sizeof(double));
  const ct_backend_ops *be = NULL;
  if (ct_backend_get(sa.backend, &be, &err) ||
      (sa.bf16 && ct_backend_with_compute(be, CT_COMPUTE_BF16, &be, &err))) {
    fprintf(stderr, "ctuner bench step: %s\n", err.msg);
    free(times);
    free(cpus);
    return 2;
  }
  /* the CPU's SGEMM rates are the CPU's yardstick; a device backend is measured by bench peak */
  double sg = 0, csg = 0, core_sg = 0;
  if (be->host_memory) {
    sgemm_gflops((int)sa.sgemm_n, &sg, &csg);
    core_sg = sgemm_core_gflops((int)sa.sgemm_n / 2);
  }
  const ct_backend_ops *run_be = profile ? ct_backend_profiled(be) : be;
  size_t n = 0;
  if (build_model(&sa, run_be, &m, &lora, &bufs.P, &bufs.G, &n, &err)) {
    fprintf(stderr, "ctuner bench step: %s\n", err.msg);
    goto out;
  }
  ct_mmdit_set_checkpointing(m, (int)ckpt);
  bufs.be = profile ? ct_backend_profiled(be) : be;
  if (!times || !cpus || step_bufs_alloc(&bufs, p, n)) {
    fprintf(stderr, "ctuner bench step: out of %s memory\n", be->host_memory ? "host" : be->name);
    goto out;
  }
  double prof_total = 0, prof_cpu = 0;
  for (long s = 0; s < warmup + steps; s++) {
    if (profile && s == warmup) ct_prof_reset();
    double t0 = ct_time_now(), c0 = ct_prof_cpu_now();
    if (bench_one_step(m, p, &bufs, s, profile, &err)) {
      fprintf(stderr, "ctuner bench step: %s\n", err.msg);
      goto out;
    }
    double t3 = ct_time_now(), c3 = ct_prof_cpu_now();
    double dt = t3 - t0;
    if (s >= warmup)
      times[s - warmup] = dt, cpus[s - warmup] = c3 - c0, prof_total += dt, prof_cpu += c3 - c0;
  }
  qsort(times, (size_t)steps, sizeof(double), cmp_double);
  qsort(cpus, (size_t)steps, sizeof(double), cmp_double);
  double cpu_med = cpus[steps / 2];
  double med = times[steps / 2], fwd, bwd;
  ct_mmdit_flops(c, (int)B, p->lat_h, p->lat_w, p->txt_len, &fwd, &bwd);
  if (sa.lora) { /* a frozen base: no weight gradients, bwd = dX products + the attention's four */
    const double L = (double)(p->lat_h / 2) * (p->lat_w / 2) + p->txt_len;
    const double att = 4.0 * (double)B * L * L * c->hidden * (c->depth_double + c->depth_single);
    bwd -= fwd - att;
  }
  double gf = (fwd + bwd) / med / 1e9;
  char pjs[2048] = "";
  if (profile) profile_report(steps, prof_total, prof_cpu, pjs, sizeof pjs);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const char *ct = getenv("OPENBLAS_CORETYPE");
  size_t nreal = 0, np;
  const ct_param *tab = ct_mmdit_table(m, &np);
  for (size_t i = 0; i < np; i++) nreal += tab[i].numel;
  ct_mem_stats ds;
  ct_mem_get_device_stats(&ds);
  printf(
      "{\"preset\": \"%s\", \"backend\": \"%s\", \"device\": \"%s\", \"threads\": %d, "
      "\"batch\": %d, \"latent\": %d, \"txt_len\": %d, \"lora_rank\": %ld, \"base\": \"%s\", "
      "\"trained_params\": %zu, \"params\": %zu, \"steps\": %ld, \"ms_per_step_median\": %.3f, "
      "\"ms_per_step_min\": %.3f, \"gflop_per_step\": %.2f, \"gflops\": %.2f, \"sgemm_gflops\": "
      "%.2f, \"mfu_vs_sgemm\": %.3f, \"ct_sgemm_gflops\": %.2f, \"mfu_vs_ct_sgemm\": %.3f, "
      "\"ct_sgemm_path\": \"%s\", \"activation_mb\": %.1f, \"peak_rss_mb\": %.1f, "
      "\"device_peak_mb\": %.1f, \"openblas_coretype\": \"%s\", "
      "\"gradient_checkpointing\": %ld, \"cpu_ms_per_step_median\": %.2f, "
      "\"gflops_per_cpu_s\": %.2f, \"ct_sgemm_gflops_core\": %.2f, \"mfu_cpu_vs_ct_sgemm\": "
      "%.3f, \"mixed_precision\": \"%s\"%s%s}\n",
      p->name, be->name, be->host_memory ? "host" : be->description, nthreads, p->batch, p->lat_h,
      p->txt_len, sa.lora, sa.base, bufs.n, nreal, steps, med * 1e3, times[0] * 1e3,
      (fwd + bwd) / 1e9, gf, sg, sg > 0 ? gf / sg : 0, csg, csg > 0 ? gf / csg : 0,
      be->host_memory ? ct_sgemm_path() : "none", ct_mmdit_activation_bytes(m) / 1048576.0,
      ru.ru_maxrss / 1024.0, ds.total_peak / 1048576.0, ct ? ct : "", ckpt, cpu_med * 1e3,
      (fwd + bwd) / cpu_med / 1e9, core_sg, core_sg > 0 ? (fwd + bwd) / cpu_med / 1e9 / core_sg : 0,
      sa.bf16 ? (be->host_memory ? ct_sgemm_bf16_path() : "bf16") : "no",
      profile ? ", \"profile\": " : "", pjs);
  rc = 0;
out:
  free(times);
  free(cpus);
  step_bufs_free(&bufs);
  ct_mmdit_free(m);
  ct_lora_free(lora);
  return rc;
}
