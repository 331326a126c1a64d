/* SDXL's task (docs/sdxl.md, "Training"): a full fine-tune of the U-net of a
 * StableDiffusionXLPipeline directory (pretrained_model_name_or_path) with
 * the DDPM objective (ddpm.c) as SimpleTuner trains it:
 *  - per sample, from Philox of (seed, sample id) as the FLUX.1 task: the
 *    timestep t ~ U{0..num_train_timesteps-1} and the noise (ct_ddpm_draw);
 *  - x_t = DDPMScheduler.add_noise(x0, noise, t) over the scheduler config's
 *    alphas_cumprod; the target is the noise (epsilon) or get_velocity
 *    (v_prediction), scheduler_config.json's prediction_type;
 *  - the U-net reads the text (77 x 2048: both CLIP encoders' penultimate
 *    states), the pooled CLIP-G vector (1280) and time_ids from the sample's
 *    bucket placement (collate.py compute_time_ids); a dropped caption gets
 *    zero text, pooled and time_ids (force_zeros_for_empty_prompt);
 *  - loss = mean ((pred - target)^2), backward into the U-net's gradients.
 * The text embeddings are cached as FLUX.1's (the text cache: "seq" 77 x
 * 2048, "pooled" 1280), the latents with the pipeline's VAE (its
 * scaling_factor, no shift). The U-net has no segment hooks: ZeRO-2/3, bf16
 * storage and gradient checkpointing are refused by name. model_type lora
 * trains peft LoRA adapters on the frozen U-net instead (model_unet_lora.c:
 * the adapters are the trained buffer, the checkpoints'
 * pytorch_lora_weights.safetensors), as the FLUX.1 task does on the MMDiT.
 * After the last checkpoint output_dir/pipeline is the trained pipeline
 * (unet/ from the checkpoint, the frozen components linked to the
 * source's); a LoRA run's is output_dir/pytorch_lora_weights.safetensors.
 * Validation images come from StableDiffusionXLPipeline's loop over the
 * training U-net (sdxl_sampler.c), adapters applied. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/fs.h"
#include "ctuner/hash.h"
#include "ctuner/image.h"
#include "ctuner/log.h"
#include "ctuner/safetensors.h"
#include "ctuner/unet.h"
#include "ctuner/vae.h"
#include "trainer_int.h"

typedef struct sdxl_task {
  ct_sdxl_pipe pipe;
  int pipe_open;
  ct_unet *u;            /* tr->model's U-net (the frozen base under LoRA) */
  ct_unet_lora *l;       /* model_type lora: the adapters on u (tr->model's), else NULL */
  ct_sdxl_sampler *vs;   /* rank 0: the validation sampler over u, opened at first use */
  int multiple;          /* image sides: multiples of the VAE factor x the down-sampling */
  ct_ddpm_config vsched; /* validation's: the pipeline's, of validation_noise_scheduler's kind */
  float ac[CT_DDPM_MAX_STEPS]; /* alphas_cumprod */
  ct_ddpm_objective obj;
  int T, D, P, factor;
  int dumped; /* micro-batches the CTUNER_SDXL_DUMP hook saw */
  /* batch buffers (host) */
  long *ts;
  float *ft, *noise, *noise_in, *xt, *pred, *target, *grad, *txt, *pooled, *tids;
  /* their twins on a compute backend without host memory (else NULL) */
  float *d_xt, *d_ft, *d_txt, *d_pooled, *d_tids, *d_pred, *d_grad;
} sdxl_task;

static sdxl_task *S(const trainer *tr) {
  return tr->tk;
}

/* ---- text conditioning: encode_prompt, "" as zeros ---- */

static ct_status text_encode(void *ctx, const char *const *caps, int n, float *seq, float *pooled,
                             ct_err *err) {
  sdxl_task *t = ctx;
  const size_t sd = (size_t)t->T * (size_t)t->D;
  for (int i = 0; i < n; i++) {
    /* StableDiffusionXLPipeline.encode_prompt: an empty (dropped) prompt is
     * zeros under force_zeros_for_empty_prompt (pipeline_stable_diffusion_xl.py) */
    if (!caps[i][0] && t->pipe.force_zeros_for_empty_prompt) {
      memset(seq + (size_t)i * sd, 0, sd * sizeof(float));
      memset(pooled + (size_t)i * (size_t)t->P, 0, (size_t)t->P * sizeof(float));
      continue;
    }
    ct_status st = ct_sdxl_encode_prompt(t->pipe.text, &caps[i], 1, seq + (size_t)i * sd,
                                         pooled + (size_t)i * (size_t)t->P, NULL, NULL, err);
    if (st) return st;
  }
  return CT_OK;
}

/* The text cache's encoder: its tag digests its output on probe captions,
 * so other weights or tokenizers name other cache files. */
static ct_status text_fn(trainer *tr, ct_err *err) {
  sdxl_task *t = S(tr);
  static const char *const probe[2] = {"a small red circle at the top left",
                                       "ctuner text cache probe 0123"};
  const size_t sd = (size_t)t->T * (size_t)t->D;
  float *seq = malloc(2 * sd * sizeof(float)), *pooled = malloc(2 * (size_t)t->P * sizeof(float));
  ct_status st = seq && pooled ? text_encode(t, probe, 2, seq, pooled, err)
                               : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  if (!st) {
    char h1[65], h2[65];
    ct_sha256_hex(seq, 2 * sd * sizeof(float), h1);
    ct_sha256_hex(pooled, 2 * (size_t)t->P * sizeof(float), h2);
    tr->text_fn =
        (ct_text_encoder_fn){.ctx = t, .T = t->T, .d = t->D, .dp = t->P, .encode = text_encode};
    snprintf(tr->text_fn.tag, sizeof tr->text_fn.tag, "sdxl-%.8s%.8s%d", h1, h2,
             t->pipe.force_zeros_for_empty_prompt);
  }
  free(seq);
  free(pooled);
  return st;
}

/* ---- the task table ---- */

/* What the U-net's LoRA cannot do yet, refused by name. */
static ct_status lora_refusals(const ct_config *c, ct_err *err) {
  if (!strcmp(c->lora_type, "lycoris"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_family sdxl: lora_type lycoris: LyCORIS on the U-net is not yet in this "
                   "build; use lora_type standard (peft LoRA)");
  if (c->use_dora)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_family sdxl: use_dora: DoRA on the U-net is not yet in this build; set "
                   "use_dora false");
  if (c->given[CT_KEY_lora_dropout] && c->lora_dropout > 0)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_family sdxl: lora_dropout %g: the U-net's LoRA has no dropout yet; set "
                   "lora_dropout 0",
                   c->lora_dropout);
  if (strcmp(c->base_model_precision, "no_change"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_family sdxl: base_model_precision %s: the U-net has no quantised "
                   "storage yet; use base_model_precision no_change",
                   c->base_model_precision);
  return CT_OK;
}

/* What the U-net cannot do yet, refused by name before anything is opened. */
static ct_status refusals(const ct_config *c, ct_err *err) {
  if (!strcmp(c->model_type, "lora")) {
    ct_status st = lora_refusals(c, err);
    if (st) return st;
  }
  if (c->zero_stage >= 2)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_family sdxl: zero_stage %ld shards gradients or weights inside the "
                   "backward through segment hooks the U-net does not have yet; use zero_stage 0 "
                   "or 1 (ZeRO-1 shards the optimizer state)",
                   c->zero_stage);
  if (c->offload_param && !strcmp(c->offload_param, "nvme"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_family sdxl: offload_param nvme needs zero_stage 3, which the U-net "
                   "does not support yet; offload_optimizer nvme works");
  if (!strcmp(c->mixed_precision, "bf16"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_family sdxl: mixed_precision bf16 keeps bf16 weights through segment "
                   "hooks the U-net does not have yet; use mixed_precision no");
  if (c->gradient_checkpointing)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_family sdxl: gradient_checkpointing is not yet in the U-net (its "
                   "backward keeps every activation); set gradient_checkpointing false");
  if (!c->pretrained_model_name_or_path)
    return ct_errf(err, CT_ERR_INVALID,
                   "model_family sdxl needs pretrained_model_name_or_path: a "
                   "StableDiffusionXLPipeline directory (model_index.json, unet/, text_encoder/, "
                   "text_encoder_2/, both tokenizers, vae/, scheduler/)");
  return CT_OK;
}

/* model_type lora: what differs from SimpleTuner's SDXL LoRA, one warning each. */
static void lora_notes(const ct_config *c) {
  if (!c->given[CT_KEY_lora_dropout])
    CT_WARN(
        "model_family sdxl: SimpleTuner's default lora_dropout %g is not applied (the U-net's "
        "LoRA has no dropout yet); the adapters train without dropout",
        c->lora_dropout);
  if (c->given[CT_KEY_flux_lora_target])
    CT_WARN(
        "flux_lora_target has no effect on SDXL: the U-net's adapters are on SimpleTuner's SDXL "
        "targets (" CT_UNET_LORA_DEFAULT ")");
  if (c->given[CT_KEY_validation_lycoris_strength])
    CT_WARN("validation_lycoris_strength has no effect with lora_type standard");
}

static ct_status configure(trainer *tr, ct_err *err) {
  const ct_config *c = tr->cfg;
  ct_status st = refusals(c, err);
  if (st) return st;
  sdxl_task *t = calloc(1, sizeof *t);
  if (!t) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  tr->tk = t;
  st = ct_sdxl_pipe_open(c->pretrained_model_name_or_path, &t->pipe, err);
  if (st) return st;
  t->pipe_open = 1;
  st = ct_ddpm_alphas_cumprod(&t->pipe.sched, t->ac, err);
  if (st) return st;
  /* prediction_type unset: the scheduler config's, as SimpleTuner (the
   * model's default, which for SDXL is the scheduler's) */
  const ct_prediction pred = !c->prediction_type ? t->pipe.sched.prediction_type
                             : !strcmp(c->prediction_type, "v_prediction") ? CT_PRED_V
                                                                           : CT_PRED_EPSILON;
  t->obj = (ct_ddpm_objective){.prediction_type = pred,
                               .snr_gamma = c->snr_gamma,
                               .snr_weight = c->snr_weight,
                               .noise_offset = c->offset_noise ? c->noise_offset : 0,
                               .noise_offset_probability = c->noise_offset_probability,
                               .input_perturbation = c->input_perturbation,
                               .input_perturbation_steps = c->input_perturbation_steps};
  if (tr->rank == 0 && !c->offset_noise &&
      (c->given[CT_KEY_noise_offset] || c->given[CT_KEY_noise_offset_probability]))
    CT_WARN(
        "noise_offset, noise_offset_probability: no effect without offset_noise true (as "
        "SimpleTuner's --offset_noise)");
  if (tr->rank == 0 && c->given[CT_KEY_input_perturbation_steps] && !(c->input_perturbation > 0))
    CT_WARN("input_perturbation_steps has no effect with input_perturbation 0");
  if (tr->rank == 0 && c->snr_gamma > 0 && c->given[CT_KEY_snr_weight])
    CT_WARN("snr_weight has no effect with snr_gamma set (the min-SNR weights replace it)");
  ct_sdxl_text_dims(t->pipe.text, &t->T, &t->D, &t->P);
  if (tr->rank == 0 && !strcmp(c->model_type, "lora")) lora_notes(c);
  return CT_OK;
}

/* The text cache's encoder, the pipeline's VAE as the codec, the dataset at
 * multiples of the VAE factor x the U-net's down-sampling. */
static ct_status open_task(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  sdxl_task *t = S(tr);
  ct_status st = text_fn(tr, err);
  if (st) return st;
  char p[3300];
  snprintf(p, sizeof p, "%s/vae", t->pipe.root);
  st = ct_codec_vae(p, (int)cfg->vae_tile, (uint64_t)cfg->seed, &tr->codec, err);
  if (st) return st;
  t->factor = tr->codec.factor;
  ct_unet_config uc;
  snprintf(p, sizeof p, "%s/config.json", t->pipe.unet_dir);
  st = ct_unet_config_load(p, &uc, err);
  if (st) return st;
  if (uc.cross_attention_dim != t->D || ct_unet_pooled_dim(&uc) != t->P ||
      uc.in_channels != tr->codec.channels)
    return ct_errf(err, CT_ERR_INVALID,
                   "%s: the U-net reads %d-wide text, %d pooled and %d latent channels; the "
                   "pipeline's encoders give %d and %d, its VAE %d",
                   t->pipe.unet_dir, uc.cross_attention_dim, ct_unet_pooled_dim(&uc),
                   uc.in_channels, t->D, t->P, tr->codec.channels);
  t->multiple = tr->codec.factor * (1 << (uc.nblocks - 1));
  /* validation's default side: resolution, else the pipeline's (sample_size x the VAE factor) */
  tr->g.resolution = cfg->resolution ? (int)cfg->resolution : uc.sample_size * tr->codec.factor;
  if (tr->rank == 0)
    CT_INFO(
        "sdxl: text %d x %d + pooled %d (both CLIP encoders), codec vae: %d channels, "
        "factor %d; objective %s",
        t->T, t->D, t->P, tr->codec.channels, tr->codec.factor,
        t->obj.prediction_type == CT_PRED_V ? "v_prediction" : "epsilon");
  ct_data_opts dopt = {
      .cfg = cfg,
      .comm = tr->comm,
      .codec_scale = tr->codec.factor,
      .codec = &tr->codec,
      .size_multiple = t->multiple,
      .text = &tr->text_fn,
      .prefetch = cfg->dataloader_prefetch ? (int)cfg->dataloader_prefetch_qlen : 0};
  return ct_dataset_open(cfg->data_backend_config, &dopt, &tr->ds, err);
}

/* The validation prompts and size (rank 0 samples them): the size a multiple
 * the U-net takes, refused before the first step otherwise. */
static ct_status validation_init(trainer *tr, ct_err *err) {
  sdxl_task *t = S(tr);
  const char *vns = tr->cfg->validation_noise_scheduler;
  t->vsched = t->pipe.sched;
  ct_err ignored = {0};
  if (vns && ct_dsched_kind_parse(vns, &t->vsched.kind, &ignored) && tr->rank == 0)
    CT_WARN(
        "validation_noise_scheduler %s has no effect: SDXL validation samples with euler, ddim "
        "or dpm++ (DPM++ 2M); the pipeline's scheduler samples",
        vns);
  ct_status st = ct_validation_init(tr, err);
  if (st || !tr->vp.n || tr->cfg->disable_validation) return st;
  if (tr->vw % t->multiple || tr->vh % t->multiple)
    return ct_errf(err, CT_ERR_INVALID,
                   "validation_resolution %dx%d: SDXL validation images need sides that are "
                   "multiples of %d (the VAE's factor x the U-net's down-sampling)",
                   tr->vw, tr->vh, t->multiple);
  return CT_OK;
}

/* model_type lora: peft LoRA adapters (rank lora_rank, alpha lora_alpha, on
 * SimpleTuner's SDXL targets) on the frozen unet/ as the trained model,
 * initialised as lora_init_type says or from init_lora's file. */
static ct_status new_lora_model(trainer *tr, ct_err *err) {
  const ct_config *c = tr->cfg;
  sdxl_task *t = S(tr);
  ct_unet *u = NULL;
  ct_unet_lora *l = NULL;
  const double alpha = c->lora_alpha > 0 ? c->lora_alpha : (double)c->lora_rank;
  ct_status st = ct_unet_from_pretrained(t->pipe.unet_dir, &u, err);
  if (!st) st = ct_unet_lora_new(ct_unet_cfg(u), NULL, (int)c->lora_rank, alpha, &l, err);
  if (st) {
    ct_unet_free(u);
    return st;
  }
  st = ct_model_unet_lora(u, l, c->lora_init_type, (uint64_t)c->seed, &tr->model, err);
  if (st) return st; /* u and l freed */
  t->u = u, t->l = l;
  if (!ct_unet_lora_grads(l))
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for the LoRA adapters' gradients");
  if (c->init_lora && (st = ct_unet_lora_load(l, c->init_lora, err)))
    ct_err_prefix(err, "init_lora: ");
  size_t nad;
  ct_unet_lora_adapters(l, &nad);
  if (!st && tr->rank == 0)
    CT_INFO("sdxl: LoRA on the U-net of %s: %zu adapters (" CT_UNET_LORA_DEFAULT
            "), rank %ld, alpha %g, %zu parameters%s%s; the U-net's %zu frozen",
            t->pipe.unet_dir, nad, c->lora_rank, alpha, ct_unet_lora_numel(l),
            c->init_lora ? " from " : "", c->init_lora ? c->init_lora : "", ct_unet_numel(u));
  if (!st) st = ct_trainer_shard(tr, err);
  return st ? st : validation_init(tr, err);
}

/* The pipeline's unet/ as the trained model (float32). */
static ct_status new_model(trainer *tr, ct_err *err) {
  sdxl_task *t = S(tr);
  if (!strcmp(tr->cfg->model_type, "lora")) return new_lora_model(tr, err);
  ct_status st = ct_unet_from_pretrained(t->pipe.unet_dir, &t->u, err);
  if (!st) st = ct_model_unet(t->u, &tr->model, err); /* owns the U-net from here */
  if (st) {
    t->u = NULL;
    return st;
  }
  if (!ct_unet_grads(t->u))
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for the U-net's gradients");
  if (tr->rank == 0)
    CT_INFO("sdxl: U-net of %s, %zu parameters, full fine-tune", t->pipe.unet_dir,
            ct_unet_numel(t->u));
  st = ct_trainer_shard(tr, err);
  return st ? st : validation_init(tr, err);
}

static ct_status alloc(trainer *tr, ct_err *err) {
  sdxl_task *t = S(tr);
  const size_t B = (size_t)tr->cfg->train_batch_size, lat = ct_dataset_max_latent(tr->ds);
  const size_t sd = (size_t)t->T * (size_t)t->D, P = (size_t)t->P;
  t->ts = calloc(B, sizeof *t->ts);
  struct {
    float **h, **d;
    size_t n;
  } b[] = {{&t->ft, &t->d_ft, B},
           {&t->noise, NULL, B * lat},
           {&t->noise_in, NULL, B * lat},
           {&t->xt, &t->d_xt, B * lat},
           {&t->pred, &t->d_pred, B * lat},
           {&t->target, NULL, B * lat},
           {&t->grad, &t->d_grad, B * lat},
           {&t->txt, &t->d_txt, B * sd},
           {&t->pooled, &t->d_pooled, B * P},
           {&t->tids, &t->d_tids, B * 6}};
  const ct_backend_ops *be = ct_trainer_be(tr);
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
    *b[i].h = ct_alloc(CT_MEM_BUFFERS, b[i].n * sizeof(float));
    if (!*b[i].h) return ct_errf(err, CT_ERR_NOMEM, "out of memory for the batch buffers");
    if (be->host_memory || !b[i].d) continue;
    *b[i].d = be->alloc(CT_MEM_BUFFERS, b[i].n * sizeof(float));
    if (!*b[i].d)
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for the batch buffers on compute backend %s",
                     be->name);
  }
  return t->ts ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory for the batch buffers");
}

/* n floats of host data where the U-net reads them (dev NULL: host memory). */
static const float *upload(const trainer *tr, float *dev, const float *host, size_t n) {
  if (!dev) return host;
  ct_trainer_be(tr)->copy_in(dev, host, n * sizeof(float));
  return dev;
}

/* The draws, x_t, the target and the conditioning of a batch. */
static ct_status prepare(trainer *tr, const ct_batch *bt, long step, const float **txt,
                         const float **pooled, ct_err *err) {
  sdxl_task *t = S(tr);
  const int B = bt->B;
  const size_t hw = (size_t)bt->h * (size_t)bt->w, lat = (size_t)bt->C * hw;
  for (int b = 0; b < B; b++) {
    ct_ddpm_draw(&t->obj, t->pipe.sched.num_train_timesteps, (uint64_t)tr->cfg->seed, bt->ids[b],
                 step, bt->C, hw, &t->ts[b], t->noise + b * lat, t->noise_in + b * lat);
    t->ft[b] = (float)t->ts[b];
    const ct_img_geom *g = &bt->geom[b];
    ct_sdxl_time_ids(g->inter_h, g->inter_w, g->crop_y, g->crop_x, bt->h, bt->w, t->factor,
                     bt->dropped[b], t->tids + 6 * b);
  }
  ct_ddpm_add_noise(t->ac, t->ts, B, lat, bt->x0, t->noise_in, t->xt);
  ct_ddpm_target(&t->obj, t->ac, t->ts, B, lat, bt->x0, t->noise, t->target);
  *txt = bt->txt, *pooled = bt->pooled; /* from the text cache */
  if (*txt) return CT_OK;
  *txt = t->txt, *pooled = t->pooled;
  return text_encode(t, bt->caps, B, t->txt, t->pooled, err);
}

/* Test hook: CTUNER_SDXL_DUMP=FILE writes the run's first micro-batch's
 * inputs and outputs (the U-net as loaded) as safetensors, for the check against
 * diffusers' UNet2DConditionModel + DDPMScheduler
 * (scripts/sdxl_train_golden.py, docs/sdxl.md "Training"). */
static ct_status dump(sdxl_task *t, const ct_batch *bt, const float *txt, const float *pooled,
                      double l, ct_err *err) {
  const char *path = getenv("CTUNER_SDXL_DUMP");
  if (!path || !*path || t->dumped++) return CT_OK;
  const int64_t B = bt->B, C = bt->C, h = bt->h, w = bt->w;
  const float loss = (float)l;
  float ft[64];
  for (int b = 0; b < B && b < 64; b++) ft[b] = (float)t->ts[b];
  const struct {
    const char *name;
    int ndim;
    int64_t shape[4];
    const float *data;
  } T[] = {{"latents", 4, {B, C, h, w}, bt->x0},
           {"noise", 4, {B, C, h, w}, t->noise},
           {"noise_in", 4, {B, C, h, w}, t->noise_in},
           {"noisy_latents", 4, {B, C, h, w}, t->xt},
           {"timesteps", 1, {B}, ft},
           {"encoder_hidden_states", 3, {B, t->T, t->D}, txt},
           {"text_embeds", 2, {B, t->P}, pooled},
           {"time_ids", 2, {B, 6}, t->tids},
           {"target", 4, {B, C, h, w}, t->target},
           {"model_pred", 4, {B, C, h, w}, t->pred},
           {"loss", 1, {1}, &loss}};
  ct_st_writer *wr = NULL;
  ct_status st = B <= 64 ? ct_st_writer_new(&wr) : CT_ERR_RANGE;
  if (st) return ct_errf(err, st, "CTUNER_SDXL_DUMP: cannot dump a batch of %lld", (long long)B);
  for (size_t i = 0; i < sizeof T / sizeof T[0] && !st; i++)
    st = ct_st_writer_add_f32(wr, T[i].name, T[i].ndim, T[i].shape, T[i].data, CT_DTYPE_F32, err);
  if (!st)
    st = ct_st_writer_meta(wr, "prediction_type",
                           t->obj.prediction_type == CT_PRED_V ? "v_prediction" : "epsilon", err);
  char g[32];
  snprintf(g, sizeof g, "%g", t->obj.snr_gamma);
  if (!st) st = ct_st_writer_meta(wr, "snr_gamma", g, err);
  if (!st) st = ct_st_writer_write(wr, path, err);
  ct_st_writer_free(wr);
  return st;
}

/* is_regularisation_data under LoRA: the target is the base U-net's own
 * prediction on the same input, the adapters detached (SimpleTuner's
 * "Predicting parent model residual", as the FLUX.1 task does). */
static ct_status parent_target(trainer *tr, const ct_unet_inputs *in, float *pred, size_t tot,
                               ct_err *err) {
  sdxl_task *t = S(tr);
  ct_status st = ct_unet_set_lora(t->u, NULL, err);
  if (!st) st = ct_unet_forward(t->u, in, pred, NULL, err);
  ct_err ignored = {0};
  ct_status s2 = ct_unet_set_lora(t->u, t->l, st ? &ignored : err);
  if (st || s2) return st ? st : s2;
  if (t->d_pred)
    ct_trainer_be(tr)->copy_out(t->target, t->d_pred, tot * sizeof(float));
  else
    memcpy(t->target, t->pred, tot * sizeof(float));
  return CT_OK;
}

/* One micro-batch: forward, loss, backward (the gradients accumulate). */
static ct_status micro_batch(trainer *tr, ct_train_state *s, int accum, long step, double *parts,
                             ct_err *err) {
  sdxl_task *t = S(tr);
  ct_batch *bt = NULL;
  ct_status st = ct_dataset_next(tr->ds, &bt, err);
  if (st) return st;
  tr->data_wait += bt->wait_s;
  const float *txt, *pooled;
  st = prepare(tr, bt, step, &txt, &pooled, err);
  if (st) return st;
  const int B = bt->B;
  const size_t lat = (size_t)bt->C * (size_t)bt->h * (size_t)bt->w, tot = (size_t)B * lat;
  const ct_unet_inputs in = {
      .B = B,
      .H = bt->h,
      .W = bt->w,
      .sample = upload(tr, t->d_xt, t->xt, tot),
      .timesteps = upload(tr, t->d_ft, t->ft, (size_t)B),
      .Lk = t->T,
      .encoder_hidden_states = upload(tr, t->d_txt, txt, (size_t)B * t->T * t->D),
      .text_embeds = upload(tr, t->d_pooled, pooled, (size_t)B * t->P),
      .time_ids = upload(tr, t->d_tids, t->tids, (size_t)B * 6)};
  const ct_backend_ops *be = ct_trainer_be(tr);
  float *pred = t->d_pred ? t->d_pred : t->pred, *grad = t->d_grad ? t->d_grad : t->grad;
  if (t->l && bt->regularisation) {
    st = parent_target(tr, &in, pred, tot, err);
    if (st) return st;
  }
  ct_unet_tape *tape = NULL;
  st = ct_unet_forward(t->u, &in, pred, &tape, err);
  if (st) return st;
  if (t->d_pred) be->copy_out(t->pred, t->d_pred, tot * sizeof(float));
  /* SimpleTuner's loss: the mean over the batch; each micro-batch and rank a share */
  double l = ct_ddpm_loss(&t->obj, t->ac, t->ts, B, lat, t->pred, t->target, t->grad);
  const float share = 1.0f / ((float)accum * (float)tr->world);
  for (size_t i = 0; i < tot; i++) t->grad[i] *= share;
  st = dump(t, bt, txt, pooled, l, err);
  if (st) {
    ct_unet_tape_free(tape);
    return st;
  }
  if (ct_fault_nan(step)) t->grad[0] = NAN, l = NAN;
  if (t->d_grad) be->copy_in(t->d_grad, t->grad, tot * sizeof(float));
  st = ct_unet_backward(t->u, tape, grad, NULL, NULL, err);
  ct_unet_tape_free(tape);
  parts[0] += l / accum;
  s->samples_seen = (long)ct_dataset_samples_seen(tr->ds);
  s->epoch = ct_dataset_epoch(tr->ds);
  s->epoch_pos = 0;
  return st;
}

static double loss(const trainer *tr, const double *parts) {
  return parts[0] / tr->world;
}

static void metrics(const trainer *tr, const double *parts, char *buf, size_t n) {
  (void)tr, (void)parts;
  if (n) buf[0] = 0;
}

/* SimpleTuner's validation_negative_prompt default (helpers/configuration/cmd_args.py). */
#define SDXL_VALIDATION_NEGATIVE "blurry, cropped, ugly"

/* The validation images of n prompts (ct_vsample_fn): StableDiffusionXLPipeline
 * over the training U-net as it is now (LoRA: the adapters applied), image i
 * from validation_seed's noise of index i; the sampler opened at first use,
 * over the task's pipeline (its text encoders and VAE shared). */
static ct_status vsample(trainer *tr, const char *const *prompts, int n, ct_image *out,
                         ct_err *err) {
  const ct_config *c = tr->cfg;
  sdxl_task *t = S(tr);
  ct_status st = t->vs ? CT_OK : ct_sdxl_sampler_open_pipe(&t->pipe, t->u, &t->vs, err);
  if (st) return st;
  int f, C;
  ct_sdxl_sampler_geometry(t->vs, NULL, &f, &C, NULL);
  const size_t lat = (size_t)C * (size_t)(tr->vh / f) * (size_t)(tr->vw / f);
  float *x = malloc(lat * sizeof *x);
  if (!x) return ct_errf(err, CT_ERR_NOMEM, "out of memory for the validation latents");
  ct_sdxl_run r = {.negative = c->validation_negative_prompt ? c->validation_negative_prompt
                                                             : SDXL_VALIDATION_NEGATIVE,
                   .width = tr->vw,
                   .height = tr->vh,
                   .sched = &t->vsched,
                   .opts = {(int)c->validation_num_inference_steps, c->validation_guidance,
                            c->validation_guidance_rescale}};
  for (int i = 0; i < n && !st; i++) {
    r.prompt = prompts[i];
    ct_sdxl_sampler_noise((uint64_t)c->validation_seed, (uint64_t)i, lat, x);
    st = ct_sdxl_sampler_run(t->vs, &r, x, &out[i], err);
  }
  free(x);
  return st;
}

static ct_status validate(trainer *tr, long step, int *nimg, char *where, size_t wn, char *ev,
                          size_t evn, ct_err *err) {
  ct_status st = ct_validate_with(tr, step, vsample, nimg, err);
  snprintf(where, wn, "%s/validation_images", tr->cfg->output_dir);
  snprintf(ev, evn, "validation: %d images in %s/validation_images", *nimg, tr->cfg->output_dir);
  return st;
}

/* A file of the checkpoint into the final pipeline: a hard link, else a copy. */
static ct_status link_or_copy(const char *src, const char *dst, ct_err *err) {
  if (link(src, dst) == 0) return CT_OK;
  char *data = NULL;
  size_t n = 0;
  ct_status st = ct_read_file(src, (size_t)1 << 36, &data, &n, err);
  if (!st) st = ct_write_file_atomic(dst, data, n, err);
  free(data);
  return st;
}

/* The files of the checkpoint's unet/ into tmp/unet. */
static ct_status copy_unet(const char *ckpt, const char *tmp, ct_err *err) {
  char q[4300], p[4400];
  snprintf(p, sizeof p, "%s/unet", tmp);
  ct_status st = ct_mkdir_p(p, err);
  snprintf(q, sizeof q, "%s/unet", ckpt);
  DIR *d = st ? NULL : opendir(q);
  if (!st && !d) st = ct_errf(err, CT_ERR_IO, "%s: %s", q, strerror(errno));
  for (struct dirent *e; d && !st && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char a[4600], b[4600];
    snprintf(a, sizeof a, "%s/%s", q, e->d_name);
    snprintf(b, sizeof b, "%s/unet/%s", tmp, e->d_name);
    st = link_or_copy(a, b, err);
  }
  if (d) closedir(d);
  return st;
}

/* After the last checkpoint of a LoRA run (rank 0): its adapter as
 * output_dir/pytorch_lora_weights.safetensors, as FLUX.1 LoRA runs leave it
 * (what StableDiffusionXLPipeline.load_lora_weights reads). */
static ct_status lora_done(trainer *tr, const char *path, ct_err *err) {
  char src[4200], dst[4200];
  snprintf(src, sizeof src, "%s/pytorch_lora_weights.safetensors", path);
  snprintf(dst, sizeof dst, "%s/pytorch_lora_weights.safetensors", tr->cfg->output_dir);
  unlink(dst); /* a link over an older one */
  ct_status st = link_or_copy(src, dst, err);
  if (!st) CT_INFO("the trained SDXL LoRA is %s (from %s)", dst, path);
  return st;
}

/* After the last checkpoint (rank 0): output_dir/pipeline, the trained
 * pipeline as SimpleTuner's save_pretrained leaves it (what
 * StableDiffusionXLPipeline.from_pretrained loads): unet/ from that
 * checkpoint, model_index.json, and the frozen components as symbolic links
 * to the source pipeline's; written as pipeline.tmp, renamed over an older one. */
static ct_status checkpoint_done(trainer *tr, const char *path, int last, ct_err *err) {
  if (!last || tr->rank != 0) return CT_OK;
  const sdxl_task *t = S(tr);
  if (t->l) return lora_done(tr, path, err);
  char out[4200], tmp[4300], p[4600], q[4600], abs[PATH_MAX];
  snprintf(out, sizeof out, "%s/pipeline", tr->cfg->output_dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  ct_status st = ct_rm_rf(tmp, err);
  if (!st) st = copy_unet(path, tmp, err);
  snprintf(p, sizeof p, "%s/model_index.json", t->pipe.root);
  snprintf(q, sizeof q, "%s/model_index.json", tmp);
  if (!st) st = link_or_copy(p, q, err);
  static const char *const parts[] = {"text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2",
                                      "vae",          "scheduler"};
  for (size_t i = 0; i < sizeof parts / sizeof parts[0] && !st; i++) {
    snprintf(p, sizeof p, "%s/%s", t->pipe.root, parts[i]);
    snprintf(q, sizeof q, "%s/%s", tmp, parts[i]);
    if (!realpath(p, abs))
      st = ct_errf(err, CT_ERR_IO, "%s: %s", p, strerror(errno));
    else if (symlink(abs, q))
      st = ct_errf(err, CT_ERR_IO, "%s: %s", q, strerror(errno));
  }
  if (!st) st = ct_rm_rf(out, err);
  if (!st && rename(tmp, out)) st = ct_errf(err, CT_ERR_IO, "%s: %s", out, strerror(errno));
  if (!st) CT_INFO("the trained SDXL pipeline is %s (unet/ from %s)", out, path);
  return st;
}

static void task_free(trainer *tr) {
  sdxl_task *t = S(tr);
  if (!t) return;
  ct_codec_free(&tr->codec);
  ct_validation_free(tr);
  ct_sdxl_sampler_free(t->vs);
  if (t->pipe_open) ct_sdxl_pipe_close(&t->pipe);
  free(t->ts);
  float **h[] = {&t->ft,     &t->noise, &t->noise_in, &t->xt,     &t->pred,
                 &t->target, &t->grad,  &t->txt,      &t->pooled, &t->tids};
  for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) ct_free(*h[i]);
  float *d[] = {t->d_xt, t->d_ft, t->d_txt, t->d_pooled, t->d_tids, t->d_pred, t->d_grad};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
    if (d[i]) ct_trainer_be(tr)->free(d[i]);
  free(t);
  tr->tk = NULL;
}

const ct_task_ops ct_task_sdxl = {.name = "sdxl",
                                  .configure = configure,
                                  .open = open_task,
                                  .new_model = new_model,
                                  .build_optim = ct_trainer_optim_table,
                                  .alloc = alloc,
                                  .nparts = 1,
                                  .micro_batch = micro_batch,
                                  .loss = loss,
                                  .metrics = metrics,
                                  .validate = validate,
                                  .extra = NULL,
                                  .checkpoint_done = checkpoint_done,
                                  .free = task_free};
