/* The flow-matching task on the MMDiT (MODEL.md "Objective and sampling"):
 * the optimizer's tensor table over the model's flat buffer (Muon's
 * exclusions, µP multipliers, a ZeRO range cut into fragments), and one
 * micro-batch: t ~ logit-normal (or uniform) with the flow shift, eps ~
 * N(0, 1), x_t = (1 - t) x0 + t eps, loss = mean (v - (eps - x0))^2,
 * backward accumulating into the gradient.
 *
 * Every random number is indexed by the global sample id, so batch 8 x accum 1
 * and batch 4 x accum 2 see identical samples, and a resumed run continues
 * with exactly the numbers an uninterrupted one would have drawn. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/backend.h"
#include "ctuner/hash.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/lora.h"
#include "ctuner/rng.h"
#include "ctuner/vae.h"
#include "train/flux_pipe.h"
#include "train/textcond.h"
#include "trainer_int.h"

/* Optimizer tensor table over the model's flat buffer; alignment gaps become
 * vector "tensors". Muon orthogonalises hidden 2-D weights only: embeddings,
 * input layers and the final layer go to its AdamW part (cols = 0).
 * µP multipliers compare each tensor with the same tensor of a base-width model. */
static int muon_excluded(const char *name) {
  static const char *const ex[] = {"img_in.",
                                   "txt_in.",
                                   "time_in.in_layer.",
                                   "vector_in.in_layer.",
                                   "guidance_in.in_layer.",
                                   "final_layer.linear.",
                                   NULL};
  for (const char *const *e = ex; *e; e++)
    if (!strncmp(name, *e, strlen(*e))) return 1;
  return 0;
}

static ct_status cut_and_make(const ct_config *cfg, ct_optim_kind kind, const ct_optim_hp *hp,
                              ct_optim_tensor *ot, size_t k, size_t lo, size_t hi, ct_optim **out,
                              ct_err *err);

static ct_status build_optim_range(const ct_config *cfg, const ct_geometry *g, ct_mmdit *m,
                                   size_t lo, size_t hi, ct_optim **out, ct_err *err) {
  /* the 1-bit family keeps Adam's two moments in an Adam (onebit.c steps them) */
  const ct_optim_info *oi = ct_optim_lookup(cfg->optimizer, err);
  if (!oi) return err ? err->status : CT_ERR_INVALID;
  const ct_optim_kind kind = oi->kind;
  ct_status st = CT_OK;
  ct_optim_hp hp;
  ct_train_optim_hp(cfg, kind, &hp);
  size_t np, n = ct_mmdit_numel(m);
  const ct_param *t = ct_mmdit_table(m, &np);
  ct_param *base = NULL;
  size_t nb = 0, bnumel = 0;
  if (cfg->mup_base_hidden > 0) {
    ct_mmdit_config bc = g->mc;
    int hd = bc.hidden / bc.heads;
    bc.hidden = (int)cfg->mup_base_hidden;
    bc.heads = bc.hidden / hd;
    if (bc.heads < 1 || bc.heads * hd != bc.hidden)
      return ct_errf(err, CT_ERR_INVALID,
                     "mup_base_hidden %ld must be a multiple of the head dim %d",
                     cfg->mup_base_hidden, hd);
    st = ct_mmdit_param_table(&bc, &base, &nb, &bnumel, err);
    if (st) return st;
    CT_ASSERT(nb == np);
  }
  ct_optim_tensor *ot = calloc(2 * np + 1, sizeof *ot);
  if (!ot) {
    free(base);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  size_t k = 0, cur = 0;
  for (size_t i = 0; i < np; i++) {
    if (t[i].offset > cur)
      ot[k++] = (ct_optim_tensor){"(padding)", cur, t[i].offset - cur, 0, 0, 1, 1};
    ct_optim_tensor x = {t[i].name,
                         t[i].offset,
                         t[i].numel,
                         (int)t[i].shape[0],
                         t[i].ndim == 2 ? (int)t[i].shape[1] : 0,
                         1,
                         1};
    if (kind == CT_OPTIM_MUON && muon_excluded(t[i].name)) x.cols = 0;
    if (base) {
      if (t[i].ndim == 2) {
        x.out_mult = (float)t[i].shape[0] / (float)base[i].shape[0];
        x.in_mult = (float)t[i].shape[1] / (float)base[i].shape[1];
      } else {
        x.out_mult = (float)t[i].shape[0] / (float)base[i].shape[0];
      }
    }
    ot[k++] = x;
    cur = t[i].offset + t[i].numel;
  }
  if (cur < n) ot[k++] = (ct_optim_tensor){"(padding)", cur, n - cur, 0, 0, 1, 1};
  st = cut_and_make(cfg, kind, &hp, ot, k, lo, hi, out, err);
  free(ot);
  free(base);
  return st;
}

/* The optimizer over [lo, hi) of a tensor table ot (k rows, offsets of the
 * whole buffer): rows cut to the range (refused for whole-tensor optimizers). */
static ct_status cut_and_make(const ct_config *cfg, ct_optim_kind kind, const ct_optim_hp *hp,
                              ct_optim_tensor *ot, size_t k, size_t lo, size_t hi, ct_optim **out,
                              ct_err *err) {
  ct_status st = CT_OK;
  /* cut the table to [lo, hi), offsets relative to lo */
  size_t kk = 0;
  for (size_t i = 0; i < k; i++) {
    size_t a = ot[i].offset, b = a + ot[i].numel;
    if (b <= lo || a >= hi) continue;
    ct_optim_tensor x = ot[i];
    size_t a2 = a < lo ? lo : a, b2 = b > hi ? hi : b;
    if (a2 != a || b2 != b) {
      if (!ct_optim_can_cut(kind, &x)) {
        st = ct_errf(
            err, CT_ERR_UNSUPPORTED,
            "optimizer '%s' updates whole tensors, and the ZeRO shard boundary at float %zu "
            "cuts '%s'; use zero_stage 0 with this optimizer",
            cfg->optimizer, a2 != a ? lo : hi, x.name);
        break;
      }
      /* a fragment keeps rows/cols: the elementwise rules only read them for
       * the µP width multipliers, which apply to every element of the tensor */
    }
    x.offset = a2 - lo;
    x.numel = b2 - a2;
    ot[kk++] = x;
  }
  if (!st) st = ct_optim_new(kind, hp, ot, kk, hi - lo, out, err);
  return st;
}

/* Tokens of a caption without the special ones (BOS/EOS, T5's </s>). */
static size_t caption_tokens(const char *caption, void *tc) {
  return ct_textcond_tokens(tc, caption);
}

/* The guidance input of a guidance_embeds model (SimpleTuner's flux_guidance_mode):
 * the constant, or U(min, max) keyed by the sample id. NULL without guidance_embeds. */
static const float *guidance(trainer *tr, const uint64_t *ids, int B) {
  const ct_config *cfg = tr->cfg;
  if (!tr->g.mc.guidance_embed) return NULL;
  const int range = !strcmp(cfg->flux_guidance_mode, "random-range");
  for (int b = 0; b < B; b++)
    tr->guid[b] = range ? (float)cfg->flux_guidance_min +
                              (float)(cfg->flux_guidance_max - cfg->flux_guidance_min) *
                                  ct_rng_uniform((uint64_t)cfg->seed, CT_STREAM_GUIDANCE, ids[b])
                        : (float)cfg->flux_guidance_value;
  return tr->guid;
}

/* n floats of host data where the model reads them: the host buffer itself on
 * a backend with host memory, else copied into its twin dev. */
static const float *upload(const trainer *tr, float *dev, const float *host, size_t n) {
  const ct_backend_ops *be = ct_trainer_be(tr);
  if (be->host_memory || !host) return host;
  be->copy_in(dev, host, n * sizeof(float));
  return dev;
}

/* One micro-batch: forward, loss, backward (grads accumulate). The batch
 * (one aspect bucket, this rank's slice of the step's samples) comes from the
 * data loader; noise and timesteps are keyed by its global sample ids. On a
 * backend without host memory x_t, t, the text embeddings and the guidance
 * are copied in, v out and dv in; the loss is the host loop either way, so
 * its bits do not depend on the backend. */
static ct_status micro_batch_loss(trainer *tr, ct_train_state *s, int accum, long step,
                                  double *loss, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  const int B = (int)cfg->train_batch_size, T = tr->g.T;
  ct_batch *bt = NULL;
  ct_status st = ct_dataset_next(tr->ds, &bt, err);
  if (st) return st;
  const size_t lat = (size_t)bt->C * (size_t)bt->h * (size_t)bt->w;
  tr->data_wait += bt->wait_s;
  const float *x0s = bt->x0; /* (B, C, h, w), valid until the next batch */
  const uint64_t seed = (uint64_t)cfg->seed;
  const float shift = cfg->flow_schedule_auto_shift /* per bucket: its image token count */
                          ? ct_flow_auto_shift((long)(bt->h / 2) * (bt->w / 2))
                          : (float)cfg->flow_shift;
  for (int b = 0; b < B; b++) {
    const uint64_t id = bt->ids[b];
    float t;
    if (!strcmp(cfg->timestep_sampling, "uniform")) {
      t = ct_rng_uniform(seed, CT_STREAM_TIMESTEP, id);
    } else {
      float z = (float)cfg->logit_mean +
                (float)cfg->logit_std * ct_rng_normal(seed, CT_STREAM_TIMESTEP, id);
      t = 1.0f / (1.0f + expf(-z));
    }
    tr->t[b] = ct_flow_shift_t(t, shift);
    ct_rng_fill_normal(tr->eps + b * lat, lat, seed, CT_STREAM_NOISE, id * lat, 0.0f, 1.0f);
  }
  const float *txt = bt->txt, *y = bt->pooled; /* from the text cache */
  if (!txt) {
    st = ct_textcond_encode(tr->tc, bt->caps, B, tr->txt, tr->y, err);
    if (st) return st;
    txt = tr->txt, y = tr->y;
  }
  for (int b = 0; b < B; b++) {
    const float t = tr->t[b];
    const float *x0 = x0s + b * lat, *e = tr->eps + b * lat;
    float *xt = tr->xt + b * lat;
    for (size_t i = 0; i < lat; i++) xt[i] = (1.0f - t) * x0[i] + t * e[i];
  }
  const size_t tot = (size_t)B * lat;
  const ct_backend_ops *be = ct_trainer_be(tr);
  const size_t dtxt = (size_t)T * (size_t)tr->g.mc.context_in_dim;
  ct_mmdit_batch in = {.B = B,
                       .H = bt->h,
                       .W = bt->w,
                       .T = T,
                       .x = upload(tr, tr->d_xt, tr->xt, tot),
                       .t = upload(tr, tr->d_t, tr->t, (size_t)B),
                       .txt = upload(tr, tr->d_txt, txt, (size_t)B * dtxt),
                       .y = upload(tr, tr->d_y, y, (size_t)B * (size_t)tr->g.mc.vec_in_dim),
                       .guidance = upload(tr, tr->d_guid, guidance(tr, bt->ids, B), (size_t)B)};
  if (tr->lora) ct_lora_set_batch(tr->lora, B, bt->ids); /* dropout masks by sample id */
  float *v = be->host_memory ? tr->v : tr->d_v, *dv = be->host_memory ? tr->dv : tr->d_dv;
  /* is_regularisation_data under LoRA: the target is the base model's own
   * prediction on the same input, the adapters left out (SimpleTuner's
   * trainer.py: "Predicting parent model residual" with disable_lora() /
   * set_multiplier(0.0), then prepared_batch["target"]; models/common.py
   * get_prediction_target). It waits in tr->dv, which the loss overwrites. */
  const int parent = tr->lora && bt->regularisation;
  /* Kontext: the references' tokens beside the targets' (the loss and dL/dv
   * cover the target tokens only, ct_mmdit_forward_ref) */
  if (tr->kontext && !bt->ref)
    return ct_errf(err, CT_ERR_INTERNAL, "model_flavour kontext: a batch without references");
  const float *ref =
      bt->ref ? upload(tr, tr->d_ref, bt->ref, (size_t)B * bt->C * bt->rh * bt->rw) : NULL;
  if (parent) {
    ct_lora_set_bypass(tr->lora, 1);
    st = ct_mmdit_forward_ref(tr->m, &in, ref, bt->rh, bt->rw, v, err);
    ct_lora_set_bypass(tr->lora, 0);
    if (st) return st;
    if (v != tr->v)
      be->copy_out(tr->dv, v, tot * sizeof(float));
    else
      memcpy(tr->dv, tr->v, tot * sizeof(float));
  }
  st = ct_mmdit_forward_ref(tr->m, &in, ref, bt->rh, bt->rw, v, err);
  if (st) return st;
  if (v != tr->v) be->copy_out(tr->v, v, tot * sizeof(float));
  const float scale = 2.0f / ((float)tot * (float)accum * (float)tr->world);
  double l = 0;
  for (size_t i = 0; i < tot; i++) {
    float diff = tr->v[i] - (parent ? tr->dv[i] : tr->eps[i] - x0s[i]);
    l += (double)diff * diff;
    tr->dv[i] = scale * diff;
  }
  if (ct_fault_nan(step)) tr->dv[0] = NAN, l = NAN;
  if (dv != tr->dv) be->copy_in(dv, tr->dv, tot * sizeof(float));
  st = ct_mmdit_backward(tr->m, dv, err);
  if (tr->lora) ct_lora_set_batch(tr->lora, 0, NULL); /* validation samples without dropout */
  *loss = l / (double)tot;
  s->samples_seen = (long)ct_dataset_samples_seen(tr->ds);
  s->epoch = ct_dataset_epoch(tr->ds);
  s->epoch_pos = 0;
  return st;
}

/* A file copied into the checkpoint (tokenizer, VAE), written atomically. */
static ct_status copy_file(const char *src, const char *dst, ct_err *err) {
  char *data = NULL;
  size_t n = 0;
  ct_status st = ct_read_file(src, (size_t)1 << 34, &data, &n, err);
  if (!st) st = ct_write_file_atomic(dst, data, n, err);
  free(data);
  return st;
}

/* The MMDiT task's files in a checkpoint beside the model: the frozen text
 * encoder, its tokenizer and the codec's VAE (so sampling from the
 * checkpoint needs nothing else). */
/* A FLUX.1 pipeline run in bf16: the transformer in diffusers' layout
 * (transformer/, what FluxTransformer2DModel.from_pretrained reads, as
 * SimpleTuner's checkpoints hold it) in bf16 beside the float32 master
 * weights (model.safetensors). In float32 transformer/ is the model's own
 * checkpoint file (model_mmdit.c). */
static ct_status extra_flux(trainer *tr, const char *tmp, ct_err *err) {
  char p[4200];
  snprintf(p, sizeof p, "%s/transformer", tmp);
  return ct_mmdit_save_diffusers(tr->m, p, (size_t)10 << 30,
                                 tr->bf16 ? CT_DTYPE_BF16 : CT_DTYPE_F32, err);
}

static ct_status extra(void *user, const char *tmp, ct_err *err) {
  trainer *tr = user;
  /* LoRA: a frozen base; float32: the model's own files are transformer/ */
  if (tr->fp) return tr->lora || !tr->bf16 ? CT_OK : extra_flux(tr, tmp, err);
  char p[4200];
  ct_status st = CT_OK;
  if (!st) {
    snprintf(p, sizeof p, "%s/text_encoder.safetensors", tmp);
    st = ct_textenc_save(tr->tc->te, p, err);
  }
  if (!st && ct_textenc_bpe(tr->tc->te)) { /* the tokenizer travels with the checkpoint */
    const char *src[2] = {tr->cfg->tokenizer_vocab, tr->cfg->tokenizer_merges};
    const char *name[2] = {CT_CKPT_TOKENIZER_VOCAB, CT_CKPT_TOKENIZER_MERGES};
    for (int k = 0; k < 2 && !st; k++) {
      snprintf(p, sizeof p, "%s/%s", tmp, name[k]);
      st = copy_file(src[k], p, err);
    }
  }
  if (!st && tr->cfg->codec && !strcmp(tr->cfg->codec, "vae")) {
    /* the VAE travels with the checkpoint too (vae/), so sampling from it
     * does not depend on the directory the config names */
    const char *d = tr->cfg->pretrained_vae_model_name_or_path;
    const size_t dl = strlen(d);
    const int file = dl > 12 && !strcmp(d + dl - 12, ".safetensors");
    const char *slash = strrchr(d, '/');
    char src[2][4200];
    if (file) {
      snprintf(src[0], sizeof src[0], "%.*sconfig.json", slash ? (int)(slash - d + 1) : 0, d);
      snprintf(src[1], sizeof src[1], "%s", d);
    } else {
      snprintf(src[0], sizeof src[0], "%s/config.json", d);
      snprintf(src[1], sizeof src[1], "%s/diffusion_pytorch_model.safetensors", d);
    }
    const char *name[2] = {"config.json", "diffusion_pytorch_model.safetensors"};
    snprintf(p, sizeof p, "%s/vae", tmp);
    st = ct_mkdir_p(p, err);
    for (int k = 0; k < 2 && !st; k++) {
      snprintf(p, sizeof p, "%s/vae/%s", tmp, name[k]);
      st = copy_file(src[k], p, err);
    }
  }
  return st;
}

/* ---- the task table ---- */

/* A FLUX.1 pipeline's geometry: the transformer's config, the VAE's factor,
 * max_sequence_length T5 tokens; resolution 0 is SimpleTuner's 1024. */
static ct_status flux_geometry(trainer *tr, ct_err *err) {
  const ct_flux_pipe *fp = tr->fp;
  ct_geometry *g = &tr->g;
  g->mc = fp->tcfg;
  g->codec_scale = fp->vae_factor;
  g->T = fp->max_sequence_length;
  g->resolution = tr->cfg->resolution ? (int)tr->cfg->resolution : 1024;
  if (g->resolution % (2 * g->codec_scale))
    return ct_errf(err, CT_ERR_INVALID,
                   "resolution %d must be a multiple of %d (VAE factor %d x 2x2 packing)",
                   g->resolution, 2 * g->codec_scale, g->codec_scale);
  return ct_mmdit_config_validate(&g->mc, err);
}

typedef struct named_key {
  int key;
  const char *name;
} named_key;

/* The keys of K the config sets, as "a, b, c" in list ("" if none). */
static void given_keys(const ct_config *cfg, const named_key *K, size_t n, char *list,
                       size_t size) {
  list[0] = 0;
  for (size_t i = 0; i < n; i++)
    if (cfg->given[K[i].key]) {
      const size_t l = strlen(list);
      snprintf(list + l, size - l, "%s%s", l ? ", " : "", K[i].name);
    }
}

/* FLUX.1 keys set without a pipeline: one warning naming them. */
static void warn_flux_keys(const ct_config *cfg) {
  static const named_key K[] = {
      {CT_KEY_model_flavour, "model_flavour"},
      {CT_KEY_flux_guidance_mode, "flux_guidance_mode"},
      {CT_KEY_flux_guidance_value, "flux_guidance_value"},
      {CT_KEY_flux_guidance_min, "flux_guidance_min"},
      {CT_KEY_flux_guidance_max, "flux_guidance_max"},
      {CT_KEY_t5_padding, "t5_padding"},
      {CT_KEY_pretrained_transformer_subfolder, "pretrained_transformer_subfolder"}};
  char list[256];
  given_keys(cfg, K, sizeof K / sizeof K[0], list, sizeof list);
  if (list[0])
    CT_WARN(
        "%s: no effect without a FLUX.1 pipeline (pretrained_model_name_or_path); the "
        "presets have no guidance input and no T5",
        list);
}

/* The DDPM objective's keys (the sdxl task's) set for FLUX.1: one warning
 * naming them, as SimpleTuner applies none of them to flow matching
 * (models/common.py loss(): "Flow matching always uses L2 loss"; the offset
 * noise only `if not self.config.flow_matching`). */
static void warn_ddpm_keys(const ct_config *cfg) {
  static const named_key K[] = {{CT_KEY_snr_gamma, "snr_gamma"},
                                {CT_KEY_snr_weight, "snr_weight"},
                                {CT_KEY_offset_noise, "offset_noise"},
                                {CT_KEY_noise_offset, "noise_offset"},
                                {CT_KEY_noise_offset_probability, "noise_offset_probability"},
                                {CT_KEY_input_perturbation, "input_perturbation"},
                                {CT_KEY_input_perturbation_steps, "input_perturbation_steps"}};
  char list[256];
  given_keys(cfg, K, sizeof K / sizeof K[0], list, sizeof list);
  if (list[0])
    CT_WARN(
        "%s: no effect on FLUX.1 (flow matching); SimpleTuner applies them to DDPM models "
        "(model_family sdxl) only",
        list);
}

/* model_flavour kontext (docs/kontext.md): training on image pairs, a FLUX.1
 * pipeline's transformer with each batch's reference tokens. What is not
 * done with it yet is refused by name. */
static ct_status kontext_check(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  tr->kontext = cfg->model_flavour && !strcmp(cfg->model_flavour, "kontext");
  if (!tr->kontext) return CT_OK;
  if (!ct_flux_pipe_wanted(cfg))
    return ct_errf(err, CT_ERR_INVALID,
                   "model_flavour kontext needs a FLUX.1 pipeline (pretrained_model_name_or_path): "
                   "the presets are not FLUX.1 Kontext");
  if (cfg->zero_stage >= 2)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_flavour kontext with zero_stage %ld is not implemented yet (reference "
                   "tokens under ZeRO-2/3); use zero_stage 0 or 1",
                   cfg->zero_stage);
  if (!strcmp(cfg->model_type, "lora") && cfg->lora_type && strcmp(cfg->lora_type, "standard"))
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_flavour kontext with lora_type %s is not implemented yet; use "
                   "lora_type standard or model_type full",
                   cfg->lora_type);
  return CT_OK;
}

static ct_status configure(trainer *tr, ct_err *err) {
  if (tr->rank == 0) warn_ddpm_keys(tr->cfg);
  ct_status kst = kontext_check(tr, err);
  if (kst) return kst;
  if (!ct_flux_pipe_wanted(tr->cfg)) {
    if (tr->rank == 0) warn_flux_keys(tr->cfg);
    return ct_geometry_from_config(tr->cfg, &tr->g, err);
  }
  tr->fp = malloc(sizeof *tr->fp);
  if (!tr->fp) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = ct_flux_pipe_open(tr->cfg, tr->rank == 0, tr->fp, err);
  return st ? st : flux_geometry(tr, err);
}

/* After the text cache: the validation prompts and "" encoded once, then the
 * FLUX.1 encoders freed (as SimpleTuner frees them after caching). */
static ct_status flux_release(trainer *tr, ct_err *err) {
  ct_status st = ct_validation_init(tr, err);
  if (st) return st;
  const char *keep[65];
  int n = 0;
  if (tr->rank == 0) { /* rank 0 alone validates */
    keep[n++] = "";
    for (int i = 0; i < tr->vp.n; i++) keep[n++] = tr->vp.text[i];
  }
  st = ct_textcond_release(tr->tc, keep, n, err);
  if (!st && tr->rank == 0)
    CT_INFO("FLUX.1 text encoders freed after caching (%d prompt(s) kept for validation)", n);
  return st;
}

/* The frozen text encoder first (the data loader caches its embeddings),
 * the codec, then the dataset. */
static ct_status open_task(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  ct_comm *comm = tr->comm;
  const int lead = tr->rank == 0;
  ct_status st = CT_OK;
  st = tr->fp ? ct_textcond_flux(tr->fp, !strcmp(cfg->t5_padding, "zero"), &tr->tc, err)
              : ct_textcond_builtin(cfg, tr->g.mc.context_in_dim, NULL, tr->g.T, &tr->tc, err);
  if (st) return st;
  if (lead && tr->fp &&
      (strcmp(cfg->text_encoder_1_precision, "no_change") ||
       strcmp(cfg->text_encoder_2_precision, "no_change")))
    CT_INFO("text encoders stored: CLIP-L %s (%.2f MB of weights), T5 %s (%.2f MB)",
            cfg->text_encoder_1_precision, (double)ct_textenc_weight_bytes(tr->tc->te) / 1e6,
            cfg->text_encoder_2_precision, (double)ct_textcond_t5_bytes(tr->tc) / 1e6);
  tr->text_cb = (ct_text_cb){tr->tc, tr->g.T};
  st = ct_text_fn_init(&tr->text_cb, tr->g.mc.context_in_dim, tr->g.mc.vec_in_dim, &tr->text_fn,
                       err);
  if (st) return st;
  const char *vae = tr->fp ? tr->fp->vae
                    : cfg->codec && !strcmp(cfg->codec, "vae")
                        ? cfg->pretrained_vae_model_name_or_path
                        : NULL;
  st = vae ? ct_codec_vae(vae, (int)cfg->vae_tile, (uint64_t)cfg->seed, &tr->codec, err)
           : ct_codec_pixel(tr->g.codec_scale, &tr->codec, err);
  if (st) return st;
  if (lead && tr->codec.ctx)
    CT_INFO("codec vae: %s, %d latent channels, factor %d (%s)", vae, tr->codec.channels,
            tr->codec.factor, tr->codec.tag);
  char why[160];
  snprintf(why, sizeof why, "model_family %s (model_flavour %s)", cfg->model_family,
           cfg->model_flavour ? cfg->model_flavour : "none");
  ct_data_opts dopt = {
      .cfg = cfg,
      .comm = comm,
      .codec_scale = tr->g.codec_scale,
      .codec = &tr->codec,
      .size_multiple = tr->g.codec_scale * 2,
      .text = &tr->text_fn,
      .prefetch = cfg->dataloader_prefetch ? (int)cfg->dataloader_prefetch_qlen : 0,
      .reference = tr->kontext,
      .reference_why = why};
  st = ct_dataset_open(cfg->data_backend_config, &dopt, &tr->ds, err);
  if (!st && tr->fp) st = flux_release(tr, err);
  return st;
}

/* gradient_checkpointing [_interval] (SimpleTuner's): every Nth block of each
 * list is recomputed in the backward (ct_mmdit_set_checkpointing); the interval
 * alone has no effect, as in SimpleTuner. */
static void set_checkpointing(trainer *tr) {
  const ct_config *cfg = tr->cfg;
  const long iv = cfg->gradient_checkpointing_interval;
  const int every = !cfg->gradient_checkpointing ? 0 : iv > 1 ? (int)iv : 1;
  ct_mmdit_set_checkpointing(tr->m, every);
  if (tr->rank != 0) return;
  if (!every && iv > 0)
    CT_WARN("gradient_checkpointing_interval %ld has no effect: gradient_checkpointing is off", iv);
  if (every) {
    int nd, ns;
    ct_mmdit_checkpointing(tr->m, &nd, &ns);
    CT_INFO(
        "gradient checkpointing every %d block(s): %d of %d double and %d of %d single blocks "
        "recomputed in the backward",
        every, nd, tr->g.mc.depth_double, ns, tr->g.mc.depth_single);
  }
}

/* Pretrained weights: the pipeline's transformer (diffusers directory or BFL
 * file) or pretrained_model_path; under ZeRO-3 / bf16 only this rank's range
 * [lo, hi) is read (range loaders, no full copy). */
static ct_status load_weights(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  const ct_flux_pipe *fp = tr->fp;
  const char *file =
      fp ? (fp->transformer_bfl ? fp->transformer : NULL) : cfg->pretrained_model_path;
  const char *prefix = fp ? fp->bfl_prefix : "";
  if (fp && !fp->transformer_bfl)
    return tr->own
               ? ct_mmdit_load_diffusers_range(tr->m, fp->transformer, tr->lo, tr->hi, tr->wsh, err)
               : ct_mmdit_load_diffusers(tr->m, fp->transformer, err);
  if (!file) return CT_OK;
  return tr->own ? ct_mmdit_load_range(tr->m, file, prefix, tr->lo, tr->hi, tr->wsh, err)
                 : ct_mmdit_load(tr->m, file, prefix, err);
}

/* The MMDiT: stages 2 and 3 keep no full gradient, stage 3 no full
 * parameters (zero.c supplies them); bf16 keeps bf16 copies in zero.c and
 * the float32 weights of this rank's range in the trainer. */
static ct_status new_lora_model(trainer *tr, ct_err *err);
static ct_status finish_model(trainer *tr, ct_err *err);

static ct_status new_model(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  if (!strcmp(cfg->model_type, "lora")) return new_lora_model(tr, err);
  const int flags =
      (tr->stage < 2 && !tr->bf16 ? CT_MMDIT_GRADS : 0) | (tr->own ? CT_MMDIT_NO_PARAMS : 0);
  ct_status st = ct_mmdit_new(&tr->g.mc, (uint64_t)cfg->seed, flags, &tr->m, err);
  /* a pipeline's transformer in float32: checkpoints hold it once, as transformer/ */
  if (!st) st = ct_model_mmdit_as(tr->m, tr->fp && !tr->bf16, &tr->model, err); /* owns it now */
  if (st) tr->m = NULL;
  if (!st) st = ct_trainer_shard(tr, err);
  if (st) return st;
  set_checkpointing(tr);
  st = load_weights(tr, err);
  if (st) return st;
  return finish_model(tr, err);
}

/* The base's floats [lo, hi) from where load_base reads them (a segment at a
 * time, for a base stored quantised: ct_mmdit_quantize_from). */
static ct_status read_base(void *user, size_t lo, size_t hi, float *out, ct_err *err) {
  trainer *tr = user;
  const ct_flux_pipe *fp = tr->fp;
  if (fp && !fp->transformer_bfl)
    return ct_mmdit_load_diffusers_range(tr->m, fp->transformer, lo, hi, out, err);
  if (fp) return ct_mmdit_load_range(tr->m, fp->transformer, fp->bfl_prefix, lo, hi, out, err);
  if (tr->cfg->pretrained_model_path)
    return ct_mmdit_load_range(tr->m, tr->cfg->pretrained_model_path, "", lo, hi, out, err);
  ct_mmdit_init_range(tr->m, (uint64_t)tr->cfg->seed, lo, hi, out);
  return CT_OK;
}

/* LoRA's frozen base, whole on every rank. */
static ct_status load_base(trainer *tr, ct_err *err) {
  const ct_flux_pipe *fp = tr->fp;
  if (fp && !fp->transformer_bfl) return ct_mmdit_load_diffusers(tr->m, fp->transformer, err);
  if (fp) return ct_mmdit_load(tr->m, fp->transformer, fp->bfl_prefix, err);
  if (tr->cfg->pretrained_model_path)
    return ct_mmdit_load(tr->m, tr->cfg->pretrained_model_path, "", err);
  return CT_OK;
}

/* ZeRO-3: only this rank's byte range of the base's storage (the MMDiT's
 * float32 flat buffer: whole floats, as the shards are 64-byte aligned), read
 * by the range loaders or drawn as the seeded init; zero.c gathers each
 * segment before it runs (zero_set_frozen). */
static ct_status load_base_shard(trainer *tr, ct_err *err) {
  const ct_flux_pipe *fp = tr->fp;
  const size_t bytes = ct_mmdit_numel(tr->m) * sizeof(float);
  size_t shard, lo, hi;
  zero_frozen_range(bytes, tr->world, tr->rank, &shard, &lo, &hi);
  tr->fsh = ct_calloc(CT_MEM_PARAMS, shard ? shard : 1, 1);
  if (!tr->fsh)
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for this rank's %zu bytes of the base", shard);
  float *out = tr->fsh;
  const size_t a = lo / sizeof(float), b = hi / sizeof(float);
  if (fp && !fp->transformer_bfl)
    return ct_mmdit_load_diffusers_range(tr->m, fp->transformer, a, b, out, err);
  if (fp) return ct_mmdit_load_range(tr->m, fp->transformer, fp->bfl_prefix, a, b, out, err);
  if (tr->cfg->pretrained_model_path)
    return ct_mmdit_load_range(tr->m, tr->cfg->pretrained_model_path, "", a, b, out, err);
  ct_mmdit_init_range(tr->m, (uint64_t)tr->cfg->seed, a, b, out);
  return CT_OK;
}

/* lora_type lycoris: the standard-LoRA keys given have no effect (SimpleTuner
 * ignores them for LyCORIS), one warning each. */
static void lycoris_notes(const ct_config *cfg) {
  static const named_key K[] = {{CT_KEY_lora_rank, "lora_rank"},
                                {CT_KEY_lora_alpha, "lora_alpha"},
                                {CT_KEY_lora_dropout, "lora_dropout"},
                                {CT_KEY_flux_lora_target, "flux_lora_target"},
                                {CT_KEY_lora_init_type, "lora_init_type"}};
  for (size_t i = 0; i < sizeof K / sizeof K[0]; i++)
    if (cfg->given[K[i].key])
      CT_WARN(
          "%s has no effect with lora_type lycoris (lycoris_config decides; SimpleTuner "
          "ignores it too)",
          K[i].name);
}

/* model_type lora (docs/lora.md): the MMDiT frozen, whole on every rank or
 * (ZeRO-3) sharded (pretrained_model_path, else the seeded init), the adapters of
 * flux_lora_target as the trained model: their range [lo, hi), their init
 * (lora_init_type) or init_lora's file. */
static ct_status new_lora_model(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  const uint64_t seed = (uint64_t)cfg->seed;
  ct_lora *l = NULL;
  /* base_model_precision bf16 / int8: stored narrow segment by segment as it
   * is read (never whole in float32), the GEMM dequantising while packing;
   * whole on every rank (ZeRO-3 shards only a float32 base) */
  const int narrow = strcmp(cfg->base_model_precision, "no_change") != 0;
  const int sharded = tr->stage >= 3 && !narrow; /* the base too (zero.c gathers it per segment) */
  ct_status st =
      ct_mmdit_new(&tr->g.mc, seed, sharded || narrow ? CT_MMDIT_NO_PARAMS : 0, &tr->m, err);
  if (!st && narrow)
    st = ct_mmdit_quantize_from(tr->m, cfg->base_model_precision,
                                !strcmp(cfg->base_model_default_dtype, "bf16"), read_base, tr, err);
  else if (!st) /* the pipeline's transformer, or pretrained_model_path */
    st = sharded ? load_base_shard(tr, err) : load_base(tr, err);
  const ct_lora_opts o = {(int)cfg->lora_rank,
                          cfg->lora_alpha > 0 ? cfg->lora_alpha : (double)cfg->lora_rank,
                          cfg->lora_dropout, seed, cfg->use_dora};
  const int flags =
      (tr->stage < 2 && !tr->bf16 ? CT_LORA_GRADS : 0) | (tr->own ? CT_LORA_NO_PARAMS : 0);
  const int lyco = !strcmp(cfg->lora_type, "lycoris");
  if (!st && lyco) {
    st = ct_lycoris_new(&tr->g.mc, cfg->lycoris_config, flags, &l, err);
    if (st) ct_err_prefix(err, "lycoris_config: ");
  } else if (!st) {
    st = ct_lora_new(&tr->g.mc, ct_lora_preset(cfg->flux_lora_target), &o, flags, &l, err);
    if (st) ct_err_prefix(err, "flux_lora_target %s: ", cfg->flux_lora_target);
  }
  if (st) {
    ct_mmdit_free(tr->m);
    tr->m = NULL;
    return st;
  }
  ct_mmdit_set_lora(tr->m, l);
  ct_mmdit_set_frozen(tr->m, 1);
  tr->lora = l;
  st = ct_model_lora(tr->m, l, cfg->lora_init_type, seed, &tr->model, err); /* owns both */
  if (st) {
    tr->m = NULL;
    tr->lora = NULL;
    return st;
  }
  st = ct_trainer_shard(tr, err);
  if (!st && cfg->init_lora) {
    st = tr->own ? ct_lora_load(l, cfg->init_lora, tr->lo, tr->hi, tr->wsh, err)
                 : ct_lora_load(l, cfg->init_lora, 0, ct_lora_numel(l), ct_lora_params(l), err);
    if (st) ct_err_prefix(err, "init_lora: ");
  }
  if (st) return st;
  size_t nad;
  ct_lora_adapters(l, &nad);
  if (lyco) ct_lora_set_validation_multiplier(l, cfg->validation_lycoris_strength);
  if (tr->rank == 0 && lyco) {
    lycoris_notes(cfg);
    CT_INFO("LyCORIS: %zu modules, %zu parameters; the base's %zu frozen", nad, ct_lora_numel(l),
            ct_mmdit_numel(tr->m));
  } else if (tr->rank == 0) {
    if (cfg->given[CT_KEY_validation_lycoris_strength])
      CT_WARN("validation_lycoris_strength has no effect with lora_type standard");
    CT_INFO(
        "LoRA %s: %zu adapters, rank %d, alpha %g (scale %g), dropout %g, %zu parameters; "
        "the base's %zu frozen",
        cfg->flux_lora_target, nad, o.rank, o.alpha, (double)ct_lora_scale(l), o.dropout,
        ct_lora_numel(l), ct_mmdit_numel(tr->m));
    if (!cfg->pretrained_model_path && !tr->fp)
      CT_WARN(
          "model_type lora without pretrained_model_path: the base is the seeded init, whose "
          "final layer and gates are zero, so little or no gradient reaches the adapters");
    if (strcmp(cfg->base_model_precision, "no_change"))
      CT_INFO("base_model_precision %s: the frozen base takes %.1f MiB (float32: %.1f MiB)",
              cfg->base_model_precision, (double)ct_mmdit_param_bytes(tr->m) / 1048576.0,
              (double)ct_mmdit_numel(tr->m) * 4.0 / 1048576.0);
    if (strcmp(cfg->base_model_precision, "no_change") && tr->bf16)
      CT_INFO(
          "mixed_precision bf16 on a %s base: the base's products are float32 over its "
          "dequantised tiles, the adapters' bf16",
          cfg->base_model_precision);
  }
  set_checkpointing(tr);
  return finish_model(tr, err);
}

/* After the model: mixed_precision bf16 puts it on the bf16-compute sibling of
 * its backend (the matrix products of its forward, backward, LoRA adapters
 * and validation sampling with bf16 operands and float32 sums; docs/gemm.md)
 * — unless the environment sets CT_BF16_COMPUTE=0 (bf16 storage with float32
 * products, the numbers of before; tests/cli_losses.sh pins a run so);
 * caption lengths, validation inputs. */
static ct_status finish_model(trainer *tr, ct_err *err) {
  const char *env = getenv("CT_BF16_COMPUTE");
  if (tr->bf16 && env && !strcmp(env, "0")) {
    if (tr->rank == 0) CT_WARN("CT_BF16_COMPUTE=0: mixed_precision bf16 with float32 products");
  } else if (tr->bf16) {
    const ct_backend_ops *be = NULL;
    ct_status st = ct_backend_with_compute(ct_mmdit_backend(tr->m), CT_COMPUTE_BF16, &be, err);
    if (!st) st = ct_mmdit_set_backend(tr->m, be, err);
    if (st) return st;
  }
  /* BOS and EOS take two of the T tokens. */
  size_t over = 0, longest = 0; /* no dataset: tests/test_strategy.c builds the model alone */
  if (tr->ds)
    longest = ct_dataset_longest_caption(tr->ds, caption_tokens, tr->tc,
                                         (size_t)(tr->g.T - ct_textcond_specials(tr->tc)), &over);
  const int sp = tr->tc ? ct_textcond_specials(tr->tc) : 2;
  if (over && tr->fp)
    CT_WARN(
        "%zu captions are longer than the %d T5 tokens FLUX.1 reads (%d %s) and are truncated; "
        "the longest has %zu",
        over, tr->g.T, tr->g.T - sp, ct_textcond_unit(tr->tc), longest);
  else if (over)
    CT_WARN(
        "%zu captions are longer than tokenizer_max_length %d allows (%d %s) and are truncated; "
        "the longest has %zu: set --tokenizer_max_length=%zu to keep them whole",
        over, tr->g.T, tr->g.T - sp, ct_textcond_unit(tr->tc), longest, longest + (size_t)sp);
  return ct_validation_init(tr, err);
}

/* A file of the checkpoint into the final pipeline: a hard link, else a copy. */
static ct_status link_or_copy(const char *src, const char *dst, ct_err *err) {
  return link(src, dst) == 0 ? CT_OK : copy_file(src, dst, err);
}

/* After the last checkpoint (rank 0): output_dir/pipeline, the trained
 * pipeline as SimpleTuner's save_pretrained leaves it — transformer/ from
 * that checkpoint, model_index.json, and the frozen components as symbolic
 * links to the source pipeline's (they did not train) — written as
 * pipeline.tmp and renamed over any older one. */
static ct_status flux_pipeline_done(trainer *tr, const char *path, ct_err *err) {
  const ct_flux_pipe *fp = tr->fp;
  char out[4200], tmp[4300], p[4600], q[4600], abs[4200];
  snprintf(out, sizeof out, "%s/pipeline", tr->cfg->output_dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  ct_status st = ct_rm_rf(tmp, err);
  if (!st) snprintf(p, sizeof p, "%s/transformer", tmp);
  if (!st) st = ct_mkdir_p(p, err);
  snprintf(q, sizeof q, "%s/transformer", path);
  DIR *d = st ? NULL : opendir(q);
  if (!st && !d) st = ct_errf(err, CT_ERR_IO, "%s: %s", q, strerror(errno));
  for (struct dirent *e; d && !st && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char a[4900], b[4900];
    snprintf(a, sizeof a, "%s/%s", q, e->d_name);
    snprintf(b, sizeof b, "%s/transformer/%s", tmp, e->d_name);
    st = link_or_copy(a, b, err);
  }
  if (d) closedir(d);
  snprintf(p, sizeof p, "%s/model_index.json", fp->root);
  snprintf(q, sizeof q, "%s/model_index.json", tmp);
  if (!st) st = copy_file(p, q, err);
  static const char *const parts[] = {"text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2",
                                      "vae",          "scheduler"};
  for (size_t i = 0; i < sizeof parts / sizeof parts[0] && !st; i++) {
    const char *src = i == 4 ? fp->vae : NULL;
    if (!src) {
      snprintf(p, sizeof p, "%s/%s", fp->root, parts[i]);
      src = p;
    }
    if (!realpath(src, abs)) {
      st = ct_errf(err, CT_ERR_IO, "%s: %s", src, strerror(errno));
      break;
    }
    snprintf(q, sizeof q, "%s/%s", tmp, parts[i]);
    if (symlink(abs, q)) st = ct_errf(err, CT_ERR_IO, "%s: %s", q, strerror(errno));
  }
  if (!st) st = ct_rm_rf(out, err);
  if (!st && rename(tmp, out)) st = ct_errf(err, CT_ERR_IO, "%s: %s", out, strerror(errno));
  if (!st) CT_INFO("the trained FLUX.1 pipeline is %s (transformer/ from %s)", out, path);
  return st;
}

/* LoRA: the adapters' table (A and B of each, padding between) */
static ct_status build_optim_lora(trainer *tr, ct_optim **out, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  const ct_optim_info *oi = ct_optim_lookup(cfg->optimizer, err);
  if (!oi) return err ? err->status : CT_ERR_INVALID;
  if (cfg->mup_base_hidden > 0)
    return ct_errf(err, CT_ERR_UNSUPPORTED, "mup_base_hidden does not apply to LoRA adapters");
  ct_optim_hp hp;
  ct_train_optim_hp(cfg, oi->kind, &hp);
  const ct_model *m = tr->model;
  ct_optim_tensor *ot = calloc(2 * m->ntab + 2, sizeof *ot);
  if (!ot) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  size_t k = 0, cur = 0;
  for (size_t i = 0; i < m->ntab; i++) {
    const ct_model_param *t = &m->tab[i];
    if (t->offset > cur) ot[k++] = (ct_optim_tensor){"(padding)", cur, t->offset - cur, 0, 0, 1, 1};
    ot[k++] =
        (ct_optim_tensor){t->name, t->offset, t->numel, (int)t->shape[0], (int)t->shape[1], 1, 1};
    cur = t->offset + t->numel;
  }
  if (cur < m->numel) ot[k++] = (ct_optim_tensor){"(padding)", cur, m->numel - cur, 0, 0, 1, 1};
  ct_status st = cut_and_make(cfg, oi->kind, &hp, ot, k, tr->lo, tr->hi, out, err);
  free(ot);
  return st;
}

static ct_status build_optim(trainer *tr, ct_optim **out, ct_err *err) {
  if (!strcmp(tr->cfg->model_type, "lora")) return build_optim_lora(tr, out, err);
  return build_optim_range(tr->cfg, &tr->g, tr->m, tr->lo, tr->hi, out, err);
}

/* After the last checkpoint (rank 0): a FLUX.1 pipeline run's output_dir/pipeline;
 * LoRA: the adapter also as output_dir/pytorch_lora_weights.safetensors. */
static ct_status checkpoint_done(trainer *tr, const char *path, int last, ct_err *err) {
  if (!last || tr->rank != 0) return CT_OK;
  if (tr->fp && strcmp(tr->cfg->model_type, "lora")) return flux_pipeline_done(tr, path, err);
  if (strcmp(tr->cfg->model_type, "lora")) return CT_OK;
  char src[4200], dst[4200];
  snprintf(src, sizeof src, "%s/pytorch_lora_weights.safetensors", path);
  snprintf(dst, sizeof dst, "%s/pytorch_lora_weights.safetensors", tr->cfg->output_dir);
  return copy_file(src, dst, err);
}

static ct_status alloc(trainer *tr, ct_err *err) {
  const size_t B = (size_t)tr->cfg->train_batch_size, lat = ct_dataset_max_latent(tr->ds);
  const size_t T = (size_t)tr->g.T, d = (size_t)tr->g.mc.context_in_dim,
               dp = (size_t)tr->g.mc.vec_in_dim;
  tr->eps = ct_alloc(CT_MEM_BUFFERS, B * lat * sizeof(float));
  tr->xt = ct_alloc(CT_MEM_BUFFERS, B * lat * sizeof(float));
  tr->v = ct_alloc(CT_MEM_BUFFERS, B * lat * sizeof(float));
  tr->dv = ct_alloc(CT_MEM_BUFFERS, B * lat * sizeof(float));
  tr->t = ct_alloc(CT_MEM_BUFFERS, B * sizeof(float));
  tr->txt = ct_alloc(CT_MEM_BUFFERS, B * T * d * sizeof(float));
  tr->y = ct_alloc(CT_MEM_BUFFERS, B * dp * sizeof(float));
  tr->guid = ct_alloc(CT_MEM_BUFFERS, B * sizeof(float));
  if (!tr->eps || !tr->xt || !tr->v || !tr->dv || !tr->t || !tr->txt || !tr->y || !tr->guid)
    return ct_errf(err, CT_ERR_NOMEM, "out of memory for the batch buffers");
  const ct_backend_ops *be = ct_trainer_be(tr);
  if (be->host_memory) return CT_OK; /* the model reads the host buffers */
  struct {
    float **p;
    size_t n;
  } dev[] = {{&tr->d_xt, B * lat},    {&tr->d_v, B * lat},
             {&tr->d_dv, B * lat},    {&tr->d_t, B},
             {&tr->d_txt, B * T * d}, {&tr->d_y, B * dp},
             {&tr->d_guid, B},        {&tr->d_ref, B * ct_dataset_max_reference(tr->ds)}};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
    *dev[i].p = be->alloc(CT_MEM_BUFFERS, (dev[i].n ? dev[i].n : 1) * sizeof(float));
    if (!*dev[i].p)
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for the batch buffers on compute backend %s",
                     be->name);
  }
  return CT_OK;
}

/* parts[0]: this rank's loss, the mean over its micro-batches */
static ct_status micro_batch(trainer *tr, ct_train_state *s, int accum, long step, double *parts,
                             ct_err *err) {
  double l = 0;
  ct_status st = micro_batch_loss(tr, s, accum, step, &l, err);
  parts[0] += l / accum;
  return st;
}

static double loss(const trainer *tr, const double *parts) {
  return parts[0] / tr->world;
}

static void metrics(const trainer *tr, const double *parts, char *buf, size_t n) {
  buf[0] = 0;
}

static ct_status validate(trainer *tr, long step, int *nimg, char *where, size_t wn, char *ev,
                          size_t evn, ct_err *err) {
  ct_status st = ct_validate(tr, step, nimg, err);
  if (tr->kontext && *nimg > 0 && !tr->kontext_warned++)
    CT_WARN(
        "model_flavour kontext: validation images are sampled without a reference image "
        "(validation with a reference is not implemented yet); `ctuner sample --image REF "
        "--checkpoint ...` samples with one");
  snprintf(where, wn, "%s/validation_images", tr->cfg->output_dir);
  snprintf(ev, evn, "validation: %d images in %s/validation_images", *nimg, tr->cfg->output_dir);
  return st;
}

static void task_free(trainer *tr) {
  ct_textcond_free(tr->tc);
  tr->tc = NULL;
  free(tr->fp);
  tr->fp = NULL;
  ct_codec_free(&tr->codec);
  ct_validation_free(tr);
  float **bufs[] = {&tr->eps, &tr->xt, &tr->v, &tr->dv, &tr->t, &tr->txt, &tr->y, &tr->guid};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ct_free(*bufs[i]), *bufs[i] = NULL;
  float **dev[] = {&tr->d_xt,  &tr->d_v, &tr->d_dv,   &tr->d_t,
                   &tr->d_txt, &tr->d_y, &tr->d_guid, &tr->d_ref};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
    ct_trainer_be(tr)->free(*dev[i]), *dev[i] = NULL;
}

const ct_task_ops ct_task_mmdit = {.name = "mmdit",
                                   .configure = configure,
                                   .open = open_task,
                                   .new_model = new_model,
                                   .build_optim = build_optim,
                                   .alloc = alloc,
                                   .nparts = 1,
                                   .micro_batch = micro_batch,
                                   .loss = loss,
                                   .metrics = metrics,
                                   .validate = validate,
                                   .extra = extra,
                                   .checkpoint_done = checkpoint_done,
                                   .free = task_free};
