/* vae_trainer.c: `ctuner train` with model_type vae — an AutoencoderKL
 * trained on the images of the data loader (docs/vae.md).
 *
 * Per sample: mean, logvar = encode(x); z = mean + exp(logvar / 2) eps (eps
 * from Philox by sample id); x' = decode(z); loss = rec(x', x) + kl_weight *
 * KL, rec the mean absolute (l1) or squared (l2) error per element, KL =
 * 0.5 (mean² + exp(logvar) − 1 − logvar) summed over latent elements and
 * averaged over samples. Ranks each take their share of every global batch
 * (the data loader's sampler); gradients are all-reduced (averaged), then
 * clipped to max_grad_norm and stepped by the optimizer. Checkpoints hold the
 * VAE in diffusers' layout (vae/config.json, vae/diffusion_pytorch_model.
 * safetensors), the optimizer state, the training state and the sampler.
 * Validation writes a grid (originals over reconstructions) and the PSNR. At
 * the end, vae_stats_images images are encoded and the latent mean and
 * standard deviation become shift_factor and scaling_factor (1/std) in the
 * saved config.json. */
#define _GNU_SOURCE /* asprintf */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/codec.h"
#include "ctuner/health.h"
#include "ctuner/image.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/optim.h"
#include "ctuner/parallel.h"
#include "ctuner/rng.h"
#include "ctuner/safetensors.h"
#include "ctuner/vae.h"
#include "train_int.h"

#define CT_STREAM_VAE_EPS 0x5641454550530000ull

typedef struct vtrainer {
  const ct_config *cfg;
  ct_comm *comm;
  int rank, world, lead;
  ct_vae *vae;
  ct_dataset *ds;
  ct_optim *opt;
  ct_sched sched;
  ct_health *h;
  FILE *metrics;
  long step, opt_steps, total;
  /* per micro-batch buffers */
  float *mean, *logvar, *z, *rec, *drec, *dz, *dmean, *dlogvar;
  size_t nlat, npx;
  /* the validation batch (kept from the first batch of the run) */
  float *val;
  int nval, vh, vw;
} vtrainer;

static ct_status build_optim(vtrainer *t, ct_err *err) {
  const ct_config *cfg = t->cfg;
  ct_optim_kind kind;
  ct_status st = ct_optim_kind_parse(cfg->optimizer, &kind, err);
  if (st) return st;
  ct_optim_hp hp;
  ct_train_optim_hp(cfg, kind, &hp);
  size_t np;
  const ct_vae_param *tab = ct_vae_table(t->vae, &np);
  ct_optim_tensor *ot = calloc(np + 1, sizeof *ot);
  if (!ot) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < np; i++) {
    const ct_vae_param *p = &tab[i];
    int cols = 0;
    if (p->ndim >= 2) {
      cols = 1;
      for (int k = 1; k < p->ndim; k++) cols *= (int)p->shape[k];
    }
    ot[i] = (ct_optim_tensor){p->name, p->offset, p->numel, p->ndim >= 2 ? (int)p->shape[0] : 0, cols, 1, 1};
  }
  st = ct_optim_new(kind, &hp, ot, np, ct_vae_numel(t->vae), &t->opt, err);
  free(ot);
  return st;
}

/* ------------------------------------------------------------ checkpoints */

static ct_status save_vae_dir(const ct_vae *v, const ct_vae_config *c, const char *dir, ct_err *err) {
  char p[4200];
  ct_status st = ct_mkdir_p(dir, err);
  if (st) return st;
  snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
  st = ct_vae_save(v, p, err);
  char *cj = ct_vae_config_json(c);
  snprintf(p, sizeof p, "%s/config.json", dir);
  if (!st) st = cj ? ct_write_file_atomic(p, cj, strlen(cj), err) : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  free(cj);
  return st;
}

static ct_status save_checkpoint(vtrainer *t, char *path, size_t pn, ct_err *err) {
  const ct_config *cfg = t->cfg;
  char tmp[4096], p[4300];
  ct_status st = ct_checkpoint_prepare(cfg->output_dir, t->step, tmp, sizeof tmp, err);
  if (st) return st;
  snprintf(p, sizeof p, "%s/vae", tmp);
  st = save_vae_dir(t->vae, ct_vae_cfg(t->vae), p, err);
  /* optimizer state */
  ct_st_writer *w = NULL;
  if (!st && ct_st_writer_new(&w)) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; !st && i < ct_optim_nstate(t->opt); i++) {
    const char *name;
    float *s = ct_optim_state(t->opt, i, &name);
    int64_t shape[1] = {(int64_t)ct_optim_numel(t->opt)};
    st = ct_st_writer_add_f32(w, name, 1, shape, s, CT_DTYPE_F32, err);
  }
  snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp);
  if (!st) st = ct_st_writer_write(w, p, err);
  ct_st_writer_free(w);
  char *sj = ct_dataset_state_json(t->ds), *ts = NULL;
  if (!st && (!sj || asprintf(&ts, "{\"model_type\": \"vae\", \"global_step\": %ld, \"opt_steps\": %ld, "
                                   "\"optimizer\": \"%s\"}\n",
                              t->step, t->opt_steps, cfg->optimizer) < 0))
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
  snprintf(p, sizeof p, "%s/training_state.json", tmp);
  if (!st) st = ct_write_file_atomic(p, ts, strlen(ts), err);
  snprintf(p, sizeof p, "%s/sampler_state.json", tmp);
  if (!st) st = ct_write_file_atomic(p, sj, strlen(sj), err);
  free(sj);
  free(ts);
  char *cj = ct_config_to_json(cfg);
  snprintf(p, sizeof p, "%s/config.json", tmp);
  if (!st) st = cj ? ct_write_file_atomic(p, cj, strlen(cj), err) : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  free(cj);
  if (!st) st = ct_checkpoint_commit(cfg->output_dir, tmp, t->step, cfg->checkpoints_total_limit, path, pn, err);
  return st;
}

static ct_status load_checkpoint(vtrainer *t, const char *dir, ct_err *err) {
  char p[4300];
  snprintf(p, sizeof p, "%s/vae/diffusion_pytorch_model.safetensors", dir);
  ct_status st = ct_vae_load(t->vae, p, err);
  if (st) return st;
  snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
  ct_st_file *f = NULL;
  st = ct_st_open(p, &f, err);
  for (size_t i = 0; !st && i < ct_optim_nstate(t->opt); i++) {
    const char *name;
    float *s = ct_optim_state(t->opt, i, &name);
    const ct_st_tensor *x = ct_st_find(f, name);
    if (!x || x->numel != ct_optim_numel(t->opt))
      st = ct_errf(err, CT_ERR_FORMAT, "%s: no %s state of %zu floats (a different optimizer or VAE?)", p, name,
                   ct_optim_numel(t->opt));
    else
      st = ct_st_to_f32(x, s, x->numel, err);
  }
  ct_st_close(f);
  if (st) return st;
  char *text = NULL;
  size_t n;
  snprintf(p, sizeof p, "%s/training_state.json", dir);
  ct_json *j = NULL;
  st = ct_json_parse_file(p, 1 << 20, &j, err);
  const ct_json *gs = j ? ct_json_get(j, "global_step") : NULL, *os = j ? ct_json_get(j, "opt_steps") : NULL;
  if (!st && (!gs || !gs->is_int || !os || !os->is_int))
    st = ct_errf(err, CT_ERR_FORMAT, "%s: global_step and opt_steps are required", p);
  if (!st) t->step = (long)gs->i64, t->opt_steps = (long)os->i64;
  ct_json_free(j);
  if (st) return st;
  snprintf(p, sizeof p, "%s/sampler_state.json", dir);
  st = ct_read_file(p, 1 << 24, &text, &n, err);
  if (!st) st = ct_dataset_state_restore(t->ds, text, err);
  free(text);
  return st;
}

/* ------------------------------------------------------------ validation */

static double psnr(const float *a, const float *b, size_t n) {
  double se = 0;
  for (size_t i = 0; i < n; i++) { /* in 8-bit units: [-1, 1] -> [0, 255] */
    double x = fmin(fmax(a[i], -1), 1), y = fmin(fmax(b[i], -1), 1);
    const double d = (x - y) * 127.5;
    se += d * d;
  }
  const double mse = se / (double)(n ? n : 1);
  return mse > 0 ? 10 * log10(255.0 * 255.0 / mse) : 99.0;
}

/* Originals over reconstructions (deterministic: the mean, no sampling). */
static ct_status validate(vtrainer *t, double *out_psnr, char *path, size_t pn, ct_err *err) {
  const ct_vae_config *c = ct_vae_cfg(t->vae);
  const int f = ct_vae_factor(c), n = t->nval, H = t->vh, W = t->vw;
  const size_t per = (size_t)3 * H * W, lat = (size_t)c->latent_channels * (H / f) * (W / f);
  float *mean = malloc((size_t)n * lat * sizeof(float)), *rec = malloc((size_t)n * per * sizeof(float));
  ct_image grid = {0};
  ct_status st = mean && rec ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  if (!st) st = ct_vae_encode(t->vae, n, H, W, t->val, mean, NULL, err);
  if (!st) st = ct_vae_decode(t->vae, n, H / f, W / f, mean, rec, err);
  if (!st) *out_psnr = psnr(rec, t->val, (size_t)n * per);
  if (!st) st = ct_image_alloc(W * n, H * 2, &grid, err);
  for (int i = 0; !st && i < n; i++) {
    uint8_t *a = malloc(per), *b = malloc(per);
    if (!a || !b) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    if (!st) st = ct_pixel_decode(t->val + (size_t)i * per, W, H, 1, a, err);
    if (!st) st = ct_pixel_decode(rec + (size_t)i * per, W, H, 1, b, err);
    for (int y = 0; !st && y < H; y++) {
      memcpy(grid.px + ((size_t)y * grid.w + (size_t)i * W) * 3, a + (size_t)y * W * 3, (size_t)W * 3);
      memcpy(grid.px + ((size_t)(y + H) * grid.w + (size_t)i * W) * 3, b + (size_t)y * W * 3, (size_t)W * 3);
    }
    free(a), free(b);
  }
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/validation_images", t->cfg->output_dir);
  if (!st) st = ct_mkdir_p(dir, err);
  if (ct_pathf(path, pn, "%s/step_%06ld_reconstruction.png", dir, t->step)) st = ct_errf(err, CT_ERR_RANGE, "output_dir path too long");
  if (!st) st = ct_image_save_png(path, &grid, err);
  ct_image_free(&grid);
  free(mean), free(rec);
  return st;
}

/* ----------------------------------------------------------- statistics */

/* Latent mean and std over up to vae_stats_images images of the data (the
 * distributions' means), all ranks together: shift = mean, scale = 1/std. */
static ct_status latent_stats(vtrainer *t, float *shift, float *scale, ct_err *err) {
  const ct_vae_config *c = ct_vae_cfg(t->vae);
  const int f = ct_vae_factor(c);
  double acc[3] = {0, 0, 0}; /* sum, sum of squares, count */
  long seen = 0;
  ct_status st = CT_OK;
  /* every rank draws the same number of micro-batches (the sampler's shares) */
  const long per = (long)t->cfg->train_batch_size * t->world;
  const long rounds = (t->cfg->vae_stats_images + per - 1) / per;
  for (long r = 0; !st && r < rounds; r++) {
    ct_batch *b = NULL;
    st = ct_dataset_next(t->ds, &b, err);
    if (st) break;
    const size_t lat = (size_t)c->latent_channels * (b->h / f) * (b->w / f);
    float *mean = malloc((size_t)b->B * lat * sizeof(float));
    if (!mean) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    if (!st) st = ct_vae_encode(t->vae, b->B, b->h, b->w, b->x0, mean, NULL, err);
    for (size_t i = 0; !st && i < (size_t)b->B * lat; i++) acc[0] += mean[i], acc[1] += (double)mean[i] * mean[i];
    acc[2] += st ? 0 : (double)b->B * lat;
    free(mean);
    seen += b->B;
  }
  if (!st && t->world > 1) st = ct_comm_allreduce_f64(t->comm, acc, 3, err);
  if (st) return st;
  const double mu = acc[0] / acc[2], var = acc[1] / acc[2] - mu * mu;
  *shift = (float)mu;
  *scale = (float)(1.0 / sqrt(var > 1e-12 ? var : 1e-12));
  if (t->lead)
    CT_INFO("vae: latent statistics over %ld image(s) per rank: mean %.6g, std %.6g -> shift_factor %.6g, "
            "scaling_factor %.6g",
            seen, mu, sqrt(var > 0 ? var : 0), *shift, *scale);
  return CT_OK;
}

/* ------------------------------------------------------------ one step */

static ct_status micro_batch(vtrainer *t, const ct_batch *b, double scale, double *rec_loss, double *kl_loss,
                             ct_err *err) {
  const ct_vae_config *c = ct_vae_cfg(t->vae);
  const int f = ct_vae_factor(c), B = b->B, H = b->h, W = b->w;
  if (b->C != 3) return ct_errf(err, CT_ERR_SHAPE, "model_type vae trains on RGB images (3 channels), got %d", b->C);
  const size_t lat = (size_t)c->latent_channels * (H / f) * (W / f), px = (size_t)3 * H * W;
  ct_vae_tape *te = NULL, *td = NULL;
  ct_status st = ct_vae_encode_fwd(t->vae, B, H, W, b->x0, t->mean, t->logvar, &te, err);
  /* z = mean + exp(logvar / 2) eps, eps a function of (seed, sample id), kept in dmean until the backward */
  for (int i = 0; !st && i < B; i++)
    ct_rng_fill_normal(t->dmean + (size_t)i * lat, lat, (uint64_t)t->cfg->seed, CT_STREAM_VAE_EPS, b->ids[i] * lat, 0, 1);
  for (size_t i = 0; !st && i < (size_t)B * lat; i++) t->z[i] = t->mean[i] + expf(0.5f * t->logvar[i]) * t->dmean[i];
  if (!st) st = ct_vae_decode_fwd(t->vae, B, H / f, W / f, t->z, t->rec, &td, err);
  if (!st) {
    /* reconstruction: mean over elements of this micro-batch; scale spreads it over the global batch */
    const int l1 = !strcmp(t->cfg->vae_loss, "l1");
    const size_t n = (size_t)B * px;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
      const double d = (double)t->rec[i] - b->x0[i];
      sum += l1 ? fabs(d) : d * d;
      t->drec[i] = (float)(scale * (l1 ? (d > 0) - (d < 0) : 2 * d) / (double)px);
    }
    *rec_loss += sum / (double)px * scale;
    st = ct_vae_decode_bwd(t->vae, td, t->drec, t->dz, err);
  }
  if (!st) {
    /* through the sample into mean/logvar, plus the KL term */
    const double kw = t->cfg->vae_kl_weight;
    double kl = 0;
    for (int i = 0; i < B; i++) {
      for (size_t k = 0; k < lat; k++) {
        const size_t j = (size_t)i * lat + k;
        const double m = t->mean[j], lv = t->logvar[j], sd = exp(0.5 * lv), eps = t->dmean[j];
        kl += 0.5 * (m * m + exp(lv) - 1 - lv);
        t->dmean[j] = (float)(t->dz[j] + scale * kw * m);
        t->dlogvar[j] = (float)(t->dz[j] * 0.5 * sd * eps + scale * kw * 0.5 * (exp(lv) - 1));
      }
    }
    *kl_loss += kl * scale;
    st = ct_vae_encode_bwd(t->vae, te, t->dmean, t->dlogvar, NULL, err);
  }
  ct_vae_tape_free(te);
  ct_vae_tape_free(td);
  return st;
}

/* --------------------------------------------------------------- the run */

ct_status ct_vae_train_run(const ct_config *cfg, ct_comm *comm, ct_step_cb cb, void *user, ct_train_summary *sum,
                           ct_err *err) {
  const double t_start = ct_time_now();
  memset(sum, 0, sizeof *sum);
  vtrainer T = {0}, *t = &T;
  t->cfg = cfg;
  t->comm = comm;
  t->rank = ct_comm_rank(comm);
  t->world = ct_comm_size(comm);
  t->lead = t->rank == 0;
  ct_status st = ct_config_validate(cfg, err);
  if (!st && !cfg->data_backend_config)
    st = ct_errf(err, CT_ERR_INVALID, "data_backend_config is required: a multidatabackend.json listing the images");
  if (!st && cfg->num_threads > 0) omp_set_num_threads((int)cfg->num_threads);
  if (!st && t->lead) st = ct_mkdir_p(cfg->output_dir, err);
  if (!st && t->lead) ct_checkpoint_clean_tmp(cfg->output_dir);
  if (!st) st = ct_comm_barrier(comm, err);
  if (!st) st = ct_health_open(cfg, comm, &t->h, err);
  /* the VAE: a pretrained one to fine-tune, or a new one from its config */
  if (!st && cfg->pretrained_vae_model_name_or_path) {
    st = ct_vae_from_pretrained(cfg->pretrained_vae_model_name_or_path, &t->vae, err);
  } else if (!st) {
    ct_vae_config vc;
    st = ct_vae_config_load(cfg->vae_config, &vc, err);
    if (!st) st = ct_vae_new(&vc, (uint64_t)cfg->seed, &t->vae, err);
  }
  if (st) goto out;
  const ct_vae_config *vc = ct_vae_cfg(t->vae);
  const int f = ct_vae_factor(vc);
  sum->params = ct_vae_numel(t->vae);
  ct_health_stage(t->h, "init_data_backend", "Loading data backends and caches", "running", 0);
  ct_data_opts dopt = {.cfg = cfg, .comm = comm, .codec_scale = 1, .size_multiple = f, .text = NULL,
                       .prefetch = cfg->dataloader_prefetch ? (int)cfg->dataloader_prefetch_qlen : 0};
  st = ct_dataset_open(cfg->data_backend_config, &dopt, &t->ds, err);
  if (st) goto out;
  ct_health_stage(t->h, "init_data_backend", "Loading data backends and caches", "completed", 100);
  {
    ct_data_stats ds;
    ct_dataset_stats(t->ds, &ds);
    sum->images = ds.kept;
  }
  long per_epoch = ct_dataset_steps_per_epoch(t->ds);
  if (per_epoch < 1) per_epoch = 1;
  t->total = cfg->max_train_steps ? cfg->max_train_steps : per_epoch * cfg->num_train_epochs;
  sum->total_steps = t->total;
  st = build_optim(t, err);
  if (!st) st = ct_train_build_sched(cfg, t->total, &t->sched, err);
  if (!st && !ct_vae_grads(t->vae)) st = ct_errf(err, CT_ERR_NOMEM, "out of memory for the VAE's gradients");
  if (st) goto out;
  if (t->lead)
    CT_INFO("vae: %zu parameters (block_out_channels x%d, latent %d channels, factor %d), %s loss, kl_weight %g",
            ct_vae_numel(t->vae), vc->nblocks, vc->latent_channels, f, cfg->vae_loss, cfg->vae_kl_weight);
  /* resume */
  if (strcmp(cfg->resume_from_checkpoint, "none")) {
    char dir[4096] = "";
    long cs = 0;
    ct_err e2 = {0};
    int have = !strcmp(cfg->resume_from_checkpoint, "latest")
                   ? ct_checkpoint_latest(cfg->output_dir, dir, sizeof dir, &cs, &e2) == CT_OK
                   : (snprintf(dir, sizeof dir, "%s", cfg->resume_from_checkpoint), 1);
    if (have) {
      st = load_checkpoint(t, dir, err);
      if (st) {
        ct_err_prefix(err, "resume_from_checkpoint %s: ", dir);
        goto out;
      }
      if (t->lead) CT_INFO("resumed from %s at step %ld", dir, t->step);
    }
  }
  sum->start_step = t->step;
  if (t->lead && !(t->metrics = ct_train_open_metrics(cfg->output_dir, t->step))) {
    st = ct_errf(err, CT_ERR_IO, "%s/metrics.jsonl: cannot open", cfg->output_dir);
    goto out;
  }
  const size_t B = (size_t)cfg->train_batch_size, maxlat = ct_dataset_max_latent(t->ds);
  /* max_latent is pixels x 3 here (codec scale 1) */
  t->npx = maxlat;
  t->nlat = maxlat / 3 / (size_t)(f * f) * (size_t)vc->latent_channels + 1;
  float **bufs[] = {&t->mean, &t->logvar, &t->z, &t->dz, &t->dmean, &t->dlogvar};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (!(*bufs[i] = ct_alloc(CT_MEM_BUFFERS, B * t->nlat * sizeof(float)))) st = CT_ERR_NOMEM;
  if (!(t->rec = ct_alloc(CT_MEM_BUFFERS, B * t->npx * sizeof(float)))) st = CT_ERR_NOMEM;
  if (!(t->drec = ct_alloc(CT_MEM_BUFFERS, B * t->npx * sizeof(float)))) st = CT_ERR_NOMEM;
  if (st) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory for the batch buffers");
    goto out;
  }
  float *w = ct_vae_params(t->vae), *g = ct_vae_grads(t->vae);
  const size_t nw = ct_vae_numel(t->vae);
  const int accum = (int)cfg->gradient_accumulation_steps;
  const double scale = 1.0 / ((double)accum * (double)B * (double)t->world);
  while (t->step < t->total) {
    const double t0 = ct_time_now();
    const long step = t->step + 1;
    memset(g, 0, nw * sizeof(float));
    double red[3] = {0, 0, 0}; /* rec, kl, breaker */
    for (int m = 0; !st && m < accum; m++) {
      ct_batch *b = NULL;
      st = ct_dataset_next(t->ds, &b, err);
      if (st) break;
      sum->data_wait_seconds += b->wait_s;
      if (!t->val && t->lead) { /* the first batch is the validation set */
        t->nval = b->B < 4 ? b->B : 4, t->vh = b->h, t->vw = b->w;
        t->val = malloc((size_t)t->nval * 3 * b->h * b->w * sizeof(float));
        if (t->val) memcpy(t->val, b->x0, (size_t)t->nval * 3 * b->h * b->w * sizeof(float));
      }
      st = micro_batch(t, b, scale, &red[0], &red[1], err);
    }
    if (st) goto out;
    red[2] = ct_health_is_open(t->h);
    if (t->world > 1) {
      st = ct_comm_allreduce_f32(comm, g, nw, err);
      if (!st) st = ct_comm_allreduce_f64(comm, red, 3, err);
      if (st) goto out;
    }
    if (red[2] > 0) {
      sum->joint_stop = 1;
      st = ct_errf(err, CT_ERR_HEALTH, "circuit breaker open before step %ld%s%s; stopped without a checkpoint", step,
                   ct_health_is_open(t->h) ? ": " : " (another rank)", ct_health_reason(t->h));
      goto out;
    }
    const double loss = (red[0] + cfg->vae_kl_weight * red[1]);
    double gn = sqrt(ct_train_sumsq(g, nw));
    const double lr = ct_sched_lr(&t->sched, t->step);
    if (!isfinite(loss) || !isfinite(gn)) {
      st = ct_errf(err, CT_ERR_HEALTH, "step %ld: the VAE's loss or gradient is not finite; lower learning_rate",
                   step);
      ct_health_runtime_fault(t->h, "nonfinite_loss", "FloatingPointError", err->msg, t->lead);
      sum->joint_stop = 1;
      goto out;
    }
    if (cfg->max_grad_norm > 0 && gn > cfg->max_grad_norm) {
      const float cl = (float)(cfg->max_grad_norm / (gn + 1e-6));
      for (size_t i = 0; i < nw; i++) g[i] *= cl;
    }
    t->opt_steps++;
    st = ct_optim_step(t->opt, w, g, (float)lr, t->opt_steps, err);
    if (st) goto out;
    t->step = step;
    sum->last_loss = loss;
    ct_step_info info = {step, t->total, ct_dataset_epoch(t->ds), loss, lr, gn, ct_time_now() - t0, 0, 0, NULL};
    sum->loop_seconds += info.seconds;
    info.samples_per_s = (double)B * accum * t->world / (info.seconds > 0 ? info.seconds : 1e-9);
    if (t->lead) {
      fprintf(t->metrics,
              "{\"step\": %ld, \"epoch\": %ld, \"loss\": %.9g, \"rec_loss\": %.9g, \"kl\": %.9g, \"lr\": %.9g, "
              "\"grad_norm\": %.9g, \"seconds\": %.4f}\n",
              step, info.epoch + 1, loss, red[0], red[1], lr, gn, info.seconds);
      fflush(t->metrics);
      if (cb) cb(&info, user);
    }
    const int last = step == t->total;
    char ev[4300];
    if (t->lead && t->val && ((cfg->validation_step_interval && step % cfg->validation_step_interval == 0) || last)) {
      double ps = 0;
      char png[4200];
      st = validate(t, &ps, png, sizeof png, err);
      if (st) goto out;
      fprintf(t->metrics, "{\"step\": %ld, \"validation_psnr\": %.4f}\n", step, ps);
      fflush(t->metrics);
      CT_INFO("vae: step %ld: reconstruction PSNR %.2f dB on %d validation image(s) (%s)", step, ps, t->nval, png);
      ct_health_validation(t->h, step, 1, png);
      if (cb) {
        snprintf(ev, sizeof ev, "validation: PSNR %.2f dB, %s", ps, png);
        ct_step_info e = info;
        e.event = ev;
        cb(&e, user);
      }
    }
    if ((cfg->checkpoint_step_interval && step % cfg->checkpoint_step_interval == 0) || last) {
      if (t->lead) {
        ct_health_stage(t->h, "checkpoint_save", "Saving checkpoint", "running", 0);
        st = save_checkpoint(t, sum->last_checkpoint, sizeof sum->last_checkpoint, err);
        if (!st) {
          ct_health_stage(t->h, "checkpoint_save", "Saving checkpoint", "completed", 100);
          ct_health_checkpoint(t->h, sum->last_checkpoint, step, last);
        }
      }
      double bad = st ? 1 : 0;
      if (t->world > 1) {
        ct_status cs = ct_comm_broadcast(comm, &bad, sizeof bad, 0, err);
        if (!st) st = cs;
      }
      if (!st && bad) st = ct_errf(err, CT_ERR_IO, "rank 0 could not write the checkpoint");
      if (st) goto out;
      if (last) {
        /* The latent statistics, after the checkpoint (their batches must not
         * move the sampler state it saved), go into its vae/config.json and
         * into output_dir/vae, each written atomically. */
        float shift = 0, sc = 1;
        st = latent_stats(t, &shift, &sc, err);
        if (st) goto out;
        ct_vae_set_scaling(t->vae, sc, shift);
        char vd[4200], cp[4300];
        snprintf(vd, sizeof vd, "%s/vae", cfg->output_dir);
        if (t->lead) st = save_vae_dir(t->vae, ct_vae_cfg(t->vae), vd, err);
        char *cj = t->lead && !st ? ct_vae_config_json(ct_vae_cfg(t->vae)) : NULL;
        snprintf(cp, sizeof cp, "%s/vae/config.json", sum->last_checkpoint);
        if (cj) st = ct_write_file_atomic(cp, cj, strlen(cj), err);
        free(cj);
        if (st) goto out;
        if (t->lead) CT_INFO("vae: the trained VAE is in %s (diffusers layout)", vd);
      }
      if (cb && t->lead) {
        snprintf(ev, sizeof ev, "checkpoint: %s", sum->last_checkpoint);
        ct_step_info e = info;
        e.event = ev;
        cb(&e, user);
      }
    }
  }
out:
  if (st == CT_OK)
    ct_health_stage(t->h, "training_complete", "Training complete", "completed", 100);
  else if (t->h && (!sum->joint_stop || t->lead)) {
    char title[96];
    snprintf(title, sizeof title, "Training failed: %s", ct_status_name(st));
    ct_health_error(t->h, title, err->msg);
  }
  sum->end_step = t->step;
  sum->seconds = ct_time_now() - t_start;
  if (t->metrics) fclose(t->metrics);
  ct_health_close(t->h);
  ct_optim_free(t->opt);
  ct_dataset_free(t->ds);
  ct_vae_free(t->vae);
  ct_free(t->mean), ct_free(t->logvar), ct_free(t->z), ct_free(t->dz), ct_free(t->dmean), ct_free(t->dlogvar);
  ct_free(t->rec), ct_free(t->drec);
  free(t->val);
  return st;
}
