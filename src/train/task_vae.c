/* The VAE task: model_type vae, an AutoencoderKL trained on the images of
 * the data loader (docs/vae.md), on the same loop, strategies, EMA,
 * checkpoints and health checks as the MMDiT.
 *
 * Per sample: mean, logvar = encode(x); z = mean + exp(logvar / 2) eps (eps
 * from Philox by sample id); x' = decode(z); loss = rec(x', x) + kl_weight *
 * KL, rec the mean absolute (l1) or squared (l2) error per element, KL =
 * 0.5 (mean^2 + exp(logvar) - 1 - logvar) summed over latent elements and
 * averaged over samples. Loss parts: [0] reconstruction, [1] KL, each already
 * divided by the global batch, so their sums over ranks are the step's.
 * Checkpoints hold the VAE in diffusers' layout (vae/config.json,
 * vae/diffusion_pytorch_model.safetensors). Validation writes a grid
 * (originals over reconstructions) and the PSNR. After the last checkpoint,
 * vae_stats_images images are encoded and the latent mean and standard
 * deviation become shift_factor and scaling_factor (1/std) in the saved
 * config.json. The VAE has no segment hooks: ZeRO-2/3, bf16 storage and
 * offload_param are refused by name (ct_trainer_shard and configure). */
#define _GNU_SOURCE /* asprintf */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/image.h"
#include "ctuner/log.h"
#include "ctuner/parallel.h"
#include "ctuner/rng.h"
#include "ctuner/vae.h"
#include "trainer_int.h"

#define CT_STREAM_VAE_EPS 0x5641454550530000ull

typedef struct vtrainer {
  const ct_config *cfg;
  ct_comm *comm;
  int rank, world, lead;
  ct_vae *vae; /* the model's impl */
  ct_dataset *ds;
  long step;
  /* per micro-batch buffers */
  float *mean, *logvar, *z, *rec, *drec, *dz, *dmean, *dlogvar;
  size_t nlat, npx;
  /* the validation batch (kept from the first batch of the run) */
  float *val;
  int nval, vh, vw;
} vtrainer;

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
  float *mean = malloc((size_t)n * lat * sizeof(float)),
        *rec = malloc((size_t)n * per * sizeof(float));
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
      memcpy(grid.px + ((size_t)y * grid.w + (size_t)i * W) * 3, a + (size_t)y * W * 3,
             (size_t)W * 3);
      memcpy(grid.px + ((size_t)(y + H) * grid.w + (size_t)i * W) * 3, b + (size_t)y * W * 3,
             (size_t)W * 3);
    }
    free(a), free(b);
  }
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/validation_images", t->cfg->output_dir);
  if (!st) st = ct_mkdir_p(dir, err);
  if (ct_pathf(path, pn, "%s/step_%06ld_reconstruction.png", dir, t->step))
    st = ct_errf(err, CT_ERR_RANGE, "output_dir path too long");
  if (!st) st = ct_image_save_png(path, &grid, err);
  ct_image_free(&grid);
  free(mean), free(rec);
  return st;
}

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
    for (size_t i = 0; !st && i < (size_t)b->B * lat; i++)
      acc[0] += mean[i], acc[1] += (double)mean[i] * mean[i];
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
    CT_INFO(
        "vae: latent statistics over %ld image(s) per rank: mean %.6g, std %.6g -> shift_factor "
        "%.6g, "
        "scaling_factor %.6g",
        seen, mu, sqrt(var > 0 ? var : 0), *shift, *scale);
  return CT_OK;
}

static ct_status micro_batch(vtrainer *t, const ct_batch *b, double scale, double *rec_loss,
                             double *kl_loss, ct_err *err) {
  const ct_vae_config *c = ct_vae_cfg(t->vae);
  const int f = ct_vae_factor(c), B = b->B, H = b->h, W = b->w;
  if (b->C != 3)
    return ct_errf(err, CT_ERR_SHAPE, "model_type vae trains on RGB images (3 channels), got %d",
                   b->C);
  const size_t lat = (size_t)c->latent_channels * (H / f) * (W / f), px = (size_t)3 * H * W;
  ct_vae_tape *te = NULL, *td = NULL;
  ct_status st = ct_vae_encode_fwd(t->vae, B, H, W, b->x0, t->mean, t->logvar, &te, err);
  /* z = mean + exp(logvar / 2) eps, eps a function of (seed, sample id), kept in dmean until the
   * backward */
  for (int i = 0; !st && i < B; i++)
    ct_rng_fill_normal(t->dmean + (size_t)i * lat, lat, (uint64_t)t->cfg->seed, CT_STREAM_VAE_EPS,
                       b->ids[i] * lat, 0, 1);
  for (size_t i = 0; !st && i < (size_t)B * lat; i++)
    t->z[i] = t->mean[i] + expf(0.5f * t->logvar[i]) * t->dmean[i];
  if (!st) st = ct_vae_decode_fwd(t->vae, B, H / f, W / f, t->z, t->rec, &td, err);
  if (!st) {
    /* reconstruction: mean over elements of this micro-batch; scale spreads it over the global
     * batch */
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

/* ------------------------------------------------------------ the task */

static vtrainer *V(const trainer *tr) {
  return tr->tk;
}

/* What the VAE cannot do, refused by name before anything is made. */
static ct_status configure(trainer *tr, ct_err *err) {
  const ct_config *c = tr->cfg;
  if (c->offload_param && !strcmp(c->offload_param, "nvme"))
    return ct_errf(
        err, CT_ERR_UNSUPPORTED,
        "model_type vae: offload_param nvme needs zero_stage 3, which the VAE does not support; "
        "offload_optimizer nvme works");
  if (c->zero_stage >= 2)
    return ct_errf(
        err, CT_ERR_UNSUPPORTED,
        "model_type vae: zero_stage %ld shards gradients or weights inside the backward through "
        "segment hooks the VAE does not have; use zero_stage 0 or 1 (ZeRO-1 shards its optimizer "
        "state)",
        c->zero_stage);
  if (!strcmp(c->mixed_precision, "bf16"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_type vae: mixed_precision bf16 keeps bf16 weights through segment hooks "
                   "the VAE does not "
                   "have; use mixed_precision no");
  vtrainer *t = calloc(1, sizeof *t);
  if (!t) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  *t = (vtrainer){
      .cfg = c, .comm = tr->comm, .rank = tr->rank, .world = tr->world, .lead = tr->rank == 0};
  tr->tk = t;
  return CT_OK;
}

/* The VAE (a pretrained one to fine-tune, or a new one from its config),
 * then the images at multiples of its factor. */
static ct_status open_task(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  vtrainer *t = V(tr);
  ct_status st;
  if (cfg->pretrained_vae_model_name_or_path) {
    st = ct_vae_from_pretrained(cfg->pretrained_vae_model_name_or_path, &t->vae, err);
  } else {
    ct_vae_config vc;
    st = ct_vae_config_load(cfg->vae_config, &vc, err);
    if (!st) st = ct_vae_new(&vc, (uint64_t)cfg->seed, &t->vae, err);
  }
  const ct_vae_config *c0 = st ? NULL : ct_vae_cfg(t->vae);
  if (c0 && (c0->in_channels != 3 || c0->out_channels != 3)) { /* the data loader gives RGB */
    st = ct_errf(
        err, CT_ERR_UNSUPPORTED,
        "model_type vae: in_channels %d, out_channels %d: training reads RGB images, so the VAE "
        "must have 3 of each",
        c0->in_channels, c0->out_channels);
    ct_vae_free(t->vae);
    t->vae = NULL;
  }
  if (!st) st = ct_model_vae(t->vae, &tr->model, err); /* owns the VAE from here */
  if (st) {
    t->vae = NULL;
    return st;
  }
  const ct_vae_config *vc = ct_vae_cfg(t->vae);
  const int f = ct_vae_factor(vc);
  if (t->lead)
    CT_INFO(
        "vae: %zu parameters (block_out_channels x%d, latent %d channels, factor %d), %s loss, "
        "kl_weight %g",
        ct_vae_numel(t->vae), vc->nblocks, vc->latent_channels, f, cfg->vae_loss,
        cfg->vae_kl_weight);
  ct_data_opts dopt = {
      .cfg = cfg,
      .comm = tr->comm,
      .codec_scale = 1,
      .size_multiple = f,
      .text = NULL,
      .prefetch = cfg->dataloader_prefetch ? (int)cfg->dataloader_prefetch_qlen : 0};
  st = ct_dataset_open(cfg->data_backend_config, &dopt, &tr->ds, err);
  t->ds = tr->ds;
  return st;
}

static ct_status new_model(trainer *tr, ct_err *err) {
  if (!ct_vae_grads(V(tr)->vae))
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for the VAE's gradients");
  return ct_trainer_shard(tr, err);
}

static ct_status alloc(trainer *tr, ct_err *err) {
  vtrainer *t = V(tr);
  const ct_vae_config *vc = ct_vae_cfg(t->vae);
  const int f = ct_vae_factor(vc);
  const size_t B = (size_t)tr->cfg->train_batch_size, maxlat = ct_dataset_max_latent(tr->ds);
  t->npx = maxlat; /* max_latent is pixels x 3 here (codec scale 1) */
  t->nlat = maxlat / 3 / (size_t)(f * f) * (size_t)vc->latent_channels + 1;
  float **bufs[] = {&t->mean, &t->logvar, &t->z, &t->dz, &t->dmean, &t->dlogvar};
  ct_status st = CT_OK;
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (!(*bufs[i] = ct_alloc(CT_MEM_BUFFERS, B * t->nlat * sizeof(float)))) st = CT_ERR_NOMEM;
  if (!(t->rec = ct_alloc(CT_MEM_BUFFERS, B * t->npx * sizeof(float)))) st = CT_ERR_NOMEM;
  if (!(t->drec = ct_alloc(CT_MEM_BUFFERS, B * t->npx * sizeof(float)))) st = CT_ERR_NOMEM;
  return st ? ct_errf(err, CT_ERR_NOMEM, "out of memory for the batch buffers") : CT_OK;
}

static ct_status task_micro_batch(trainer *tr, ct_train_state *s, int accum, long step,
                                  double *parts, ct_err *err) {
  vtrainer *t = V(tr);
  const double scale =
      1.0 / ((double)accum * (double)tr->cfg->train_batch_size * (double)tr->world);
  ct_batch *b = NULL;
  ct_status st = ct_dataset_next(tr->ds, &b, err);
  if (st) return st;
  tr->data_wait += b->wait_s;
  if (!t->val && t->lead &&
      !tr->cfg->disable_validation) { /* the first batch is the validation set */
    t->nval = b->B < 4 ? b->B : 4, t->vh = b->h, t->vw = b->w;
    t->val = malloc((size_t)t->nval * 3 * b->h * b->w * sizeof(float));
    if (t->val) memcpy(t->val, b->x0, (size_t)t->nval * 3 * b->h * b->w * sizeof(float));
  }
  st = micro_batch(t, b, scale, &parts[0], &parts[1], err);
  if (ct_fault_nan(step)) parts[0] = NAN;
  s->samples_seen = (long)ct_dataset_samples_seen(tr->ds);
  s->epoch = ct_dataset_epoch(tr->ds);
  s->epoch_pos = 0;
  return st;
}

static double loss(const trainer *tr, const double *parts) {
  return parts[0] + tr->cfg->vae_kl_weight * parts[1];
}

static void metrics(const trainer *tr, const double *parts, char *buf, size_t n) {
  snprintf(buf, n, "\"rec_loss\": %.9g, \"kl\": %.9g, ", parts[0], parts[1]);
}

static ct_status task_validate(trainer *tr, long step, int *nimg, char *where, size_t wn, char *ev,
                               size_t evn, ct_err *err) {
  vtrainer *t = V(tr);
  *nimg = 0;
  if (!t->val || tr->cfg->disable_validation) return CT_OK;
  double ps = 0;
  t->step = step;
  ct_status st = validate(t, &ps, where, wn, err);
  if (st) return st;
  char line[128];
  snprintf(line, sizeof line, "{\"step\": %ld, \"validation_psnr\": %.4f}\n", step, ps);
  ct_trainer_log_metrics(tr, step, line);
  CT_INFO("vae: step %ld: reconstruction PSNR %.2f dB on %d validation image(s) (%s)", step, ps,
          t->nval, where);
  snprintf(ev, evn, "validation: PSNR %.2f dB, %s", ps, where);
  *nimg = 1;
  return CT_OK;
}

/* After the last checkpoint: the latent statistics (their batches must not
 * move the sampler state it saved) go into its vae/config.json and into
 * output_dir/vae, each written atomically. Every rank encodes its share. */
static ct_status checkpoint_done(trainer *tr, const char *path, int last, ct_err *err) {
  vtrainer *t = V(tr);
  if (!last) return CT_OK;
  float shift = 0, sc = 1;
  ct_status st = latent_stats(t, &shift, &sc, err);
  if (st) return st;
  ct_vae_set_scaling(t->vae, sc, shift);
  char vd[4200], cp[4300];
  snprintf(vd, sizeof vd, "%s/vae", tr->cfg->output_dir);
  if (t->lead) st = ct_model_vae_save_dir(t->vae, vd, err);
  char *cj = t->lead && !st ? ct_vae_config_json(ct_vae_cfg(t->vae)) : NULL;
  snprintf(cp, sizeof cp, "%s/vae/config.json", path);
  if (cj) st = ct_write_file_atomic(cp, cj, strlen(cj), err);
  free(cj);
  if (!st && t->lead) CT_INFO("vae: the trained VAE is in %s (diffusers layout)", vd);
  return st;
}

static void task_free(trainer *tr) {
  vtrainer *t = V(tr);
  if (!t) return;
  ct_free(t->mean), ct_free(t->logvar), ct_free(t->z), ct_free(t->dz), ct_free(t->dmean),
      ct_free(t->dlogvar);
  ct_free(t->rec), ct_free(t->drec);
  free(t->val);
  free(t);
  tr->tk = NULL;
}

const ct_task_ops ct_task_vae = {.name = "vae",
                                 .configure = configure,
                                 .open = open_task,
                                 .new_model = new_model,
                                 .build_optim = ct_trainer_optim_table,
                                 .alloc = alloc,
                                 .nparts = 2,
                                 .micro_batch = task_micro_batch,
                                 .loss = loss,
                                 .metrics = metrics,
                                 .validate = task_validate,
                                 .extra = NULL,
                                 .checkpoint_done = checkpoint_done,
                                 .free = task_free};
