/* Memory planning without allocating (`ctuner bench memory --plan`): the bytes
 * per rank of the trainable model's parameters, gradients and optimizer state
 * as the trainer allocates them — loop.c (ct_trainer_shard: the float32 range
 * or master weights), zero.c (the gradient shard, bf16 parameters and
 * gradients), optim.c (state arrays at a 16-float stride), offload.c (three
 * sub-group buffers) — and the model geometry a config trains. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctuner/comm.h"
#include "ctuner/family.h"
#include "ctuner/mmdit.h"
#include "ctuner/unet.h"
#include "ctuner/vae.h"
#include "trainer_int.h"

/* ct_train_model_config: the family row's geometry (family.c). */

/* FLUX.1's plan hook: the MMDiT a config trains (ct_train_model_config), its
 * parameter table and the activation arena of ct_mmdit_activation_plan, as
 * `bench memory --plan --preset` computes them. */
ct_status ct_plan_flux(const ct_config *cfg, int batch, long res, int tokens, int ckpt,
                       ct_plan_denoiser *o, ct_err *err) {
  ct_mmdit_config mc;
  int s = 1, T = 0;
  ct_status st = ct_train_model_config(cfg, &mc, &s, &T, err);
  if (st) return st;
  ct_param *tab = NULL;
  size_t ntab = 0;
  st = ct_mmdit_param_table(&mc, &tab, &ntab, &o->numel, err);
  if (st) return st;
  for (size_t i = 0; i < ntab; i++) o->psi += tab[i].numel;
  o->maxseg = ct_mmdit_max_segment(&mc, tab, ntab, o->numel);
  free(tab);
  o->kind = "mmdit";
  snprintf(o->geometry, sizeof o->geometry, "preset %s", cfg->preset);
  o->hidden = mc.hidden;
  o->codec_scale = s;
  o->tokens = tokens ? tokens : T;
  o->resolution = res ? res : 64; /* the measured mode's bucket */
  if (o->resolution % (2 * s))
    return ct_errf(err, CT_ERR_INVALID, "resolution %ld must be a multiple of %d", o->resolution,
                   2 * s);
  o->latent = (int)(o->resolution / s);
  o->activations =
      (double)ct_mmdit_activation_plan(&mc, ckpt, batch, o->latent, o->latent, o->tokens);
  return CT_OK;
}

static int file_exists(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0;
}

/* SDXL's U-net geometry: DIR/unet/config.json (or DIR/config.json, a unet/
 * directory) and the VAE's factor from DIR/vae/config.json; without a
 * directory SDXL 1.0 base's values (ct_unet_config_sdxl, factor 8). */
static ct_status sdxl_geometry(const ct_config *cfg, ct_unet_config *uc, int *s, char *where,
                               size_t wn, ct_err *err) {
  const char *dir = cfg->pretrained_model_name_or_path;
  *s = 8;
  if (!dir) {
    const char *fl = ct_family_flavour(ct_family_find("sdxl"), cfg->model_flavour);
    if (fl && strncmp(fl, "base-", 5))
      return ct_errf(err, CT_ERR_UNSUPPORTED,
                     "model_flavour %s: the built-in geometry is SDXL 1.0 base's U-net; give "
                     "the refiner's pipeline directory (--pretrained DIR) to plan it",
                     fl);
    ct_unet_config_sdxl(uc);
    snprintf(where, wn, "SDXL 1.0 base U-net (built in)");
    return CT_OK;
  }
  snprintf(where, wn, "%s/unet/config.json", dir);
  if (!file_exists(where)) snprintf(where, wn, "%s/config.json", dir);
  ct_status st = ct_unet_config_load(where, uc, err);
  if (st) return st;
  char vp[4200];
  snprintf(vp, sizeof vp, "%s/vae/config.json", dir);
  if (!file_exists(vp)) return CT_OK;
  ct_vae_config vc;
  st = ct_vae_config_load(vp, &vc, err);
  if (!st) *s = ct_vae_factor(&vc);
  return st;
}

/* SDXL's plan hook: the U-net's table (no padding: numel = Ψ) and one step's
 * activations and im2col scratch from ct_unet_plan_memory (the dry backend,
 * the bytes the CPU backend's run allocates). */
ct_status ct_plan_sdxl(const ct_config *cfg, int batch, long res, int tokens, int ckpt,
                       ct_plan_denoiser *o, ct_err *err) {
  if (ckpt)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "model_family sdxl: the U-net has no gradient checkpointing yet (its backward "
                   "keeps every activation), so there is nothing to plan for "
                   "gradient_checkpointing");
  ct_unet_config uc;
  int s = 8;
  ct_status st = sdxl_geometry(cfg, &uc, &s, o->geometry, sizeof o->geometry, err);
  if (!st) st = ct_unet_config_validate(&uc, err);
  if (st) return st;
  const int mult = s << (uc.nblocks - 1);
  o->kind = "unet";
  o->codec_scale = s;
  o->tokens = tokens ? tokens : 77; /* both CLIP encoders' context */
  o->resolution = res ? res : (long)uc.sample_size * s;
  if (o->resolution % mult)
    return ct_errf(err, CT_ERR_INVALID,
                   "resolution %ld must be a multiple of %d (the VAE's factor %d x the U-net's "
                   "down-sampling)",
                   o->resolution, mult, s);
  o->latent = (int)(o->resolution / s);
  ct_unet_plan up;
  st = ct_unet_plan_memory(&uc, batch, o->latent, o->latent, o->tokens, &up, err);
  if (st) return st;
  o->numel = o->psi = up.numel;
  o->maxseg = up.max_tensor;
  o->hidden = uc.block_out_channels[uc.nblocks - 1];
  o->activations = (double)up.activations_peak;
  o->scratch = (double)up.buffers_peak;
  return CT_OK;
}

static size_t round16(size_t n) {
  return (n + 15) & ~(size_t)15;
}

/* offload.c's sub-group length for a range of n floats (update.c's default). */
static size_t offload_sub(size_t n, size_t asked) {
  size_t sub = n / 8;
  sub = sub < ((size_t)1 << 18) ? (size_t)1 << 18 : sub > ((size_t)1 << 22) ? (size_t)1 << 22 : sub;
  if (asked > 0) sub = asked;
  sub = (sub + 1023) / 1024 * 1024;
  if (sub < 1024) sub = 1024;
  return sub;
}

/* zero.c's buffers (zero_start, zero_set_reader) and dp_zero.c's gather for a
 * checkpoint or validation on rank 0 (ct_dp_gather_full). */
static void zero_buffers(const ct_memplan_opts *o, ct_memplan *p, size_t shard, size_t range) {
  const size_t n = o->numel, e = o->bf16 ? 2 : 4, ms = o->maxseg;
  const int own = o->stage >= 3 || o->bf16;
  double z = 0;
  if (o->stage >= 2 || o->bf16) {
    size_t bucket = o->bucket ? o->bucket : (size_t)o->hidden * (size_t)o->hidden;
    if (o->stage >= 2) z += 2.0 * (double)(bucket > ms ? bucket : ms) * (double)e;
    if (o->stage >= 3) z += 2.0 * (double)ms * (double)e;
    if (o->bf16) z += 2.0 * (double)ms * 4.0 + 4.0 * (double)(o->stage >= 1 ? range : n);
    if (o->offload_param) z += 2.0 * (double)(ms < shard ? ms : shard) * 4.0;
  }
  p->zero_buffers = z;
  if (own && range < n) p->gather_rank0 = 4.0 * (double)n * (o->ema ? 2 : 1);
  if (o->offload_param) p->gather_rank0 += 4.0 * (double)range;
}

/* model_type lora's frozen base (task_mmdit.c, zero.c): whole on every rank,
 * or at stage 3 this rank's byte range (zero_frozen_range) plus two slots of
 * its largest segment, gathered whole to rank 0 for validation. */
static void frozen_base(const ct_memplan_opts *o, ct_memplan *p) {
  const size_t b = o->frozen_bytes;
  const int sharded = o->stage >= 3;
  size_t shard, lo, hi;
  zero_frozen_range(b, o->ranks, 0, &shard, &lo, &hi);
  p->base = (double)(sharded ? shard : b);
  p->params += p->base;
  p->startup_params += p->base;
  p->formula_base = 4.0 * (double)o->frozen_psi / (sharded ? o->ranks : 1);
  p->formula_params += p->formula_base;
  if (sharded) p->zero_buffers += 2.0 * (double)o->frozen_maxseg;
  if (sharded && shard < b) p->gather_base_rank0 = 4.0 * (double)((b + 3) / 4);
  if (!sharded || !o->offload_param) return;
  /* offload_param (update.c): the shard into a swap file of its own, opened
   * after the optimizer state left memory; two pieces for the gathers */
  const size_t ms = o->frozen_maxseg < shard ? o->frozen_maxseg : shard;
  p->zero_buffers += 2.0 * (double)(ms + 8);
  p->swap += p->base;
  p->params -= p->base;
  const double fb = 3.0 * ((double)p->offload_sub * 4.0 + 4096.0); /* NBUF, ALIGN */
  p->optimizer += fb;
  p->offload_buffers += fb;
  if (p->optimizer > p->startup_optimizer) p->startup_optimizer = p->optimizer;
}

ct_status ct_memplan_trainable(const ct_memplan_opts *o, ct_memplan *p, ct_err *err) {
  memset(p, 0, sizeof *p);
  if (o->ranks < 1 || o->stage < 0 || o->stage > 3 || o->numel == 0)
    return ct_errf(err, CT_ERR_INVALID, "memory plan: ranks %d, stage %d, %zu floats", o->ranks,
                   o->stage, o->numel);
  if (o->offload_param && (o->stage != 3 || o->bf16))
    return ct_errf(err, CT_ERR_INVALID,
                   "offload_param nvme needs zero_stage 3 with float32 storage (as ctuner train)");
  const size_t n = o->numel, N = (size_t)o->ranks;
  const size_t shard = ct_comm_shard_len(n, o->ranks);
  /* rank 0 holds the largest range: [0, min(shard, n)) when sharded */
  const size_t range = o->stage >= 1 ? (shard < n ? shard : n) : n;
  const int own = o->stage >= 3 || o->bf16;
  double w = 0, g = 0, opt = 0;
  if (o->bf16) {
    w = 2.0 * (double)(o->stage >= 3 ? shard : n);
    g = 2.0 * (double)(o->stage >= 2 ? shard : n);
    opt = 4.0 * (double)range; /* float32 master weights */
  } else {
    w = 4.0 * (double)(own ? range : n);
    g = 4.0 * (double)(o->stage >= 2 ? shard : n);
  }
  const double state = 4.0 * (double)o->nstate * (double)round16(range);
  p->range = range;
  p->shard = shard;
  if (o->ema) opt += 4.0 * (double)(own ? range : n);
  opt += state;
  /* update.c: the swap file is opened (its three buffers allocated) while the
   * state and the float32 shard are still in memory; then they are written to
   * it and freed. The start-up peaks hold both. */
  const int offst = o->offload_optimizer && o->nstate > 0;
  const size_t narr = (offst ? (size_t)o->nstate : 0) + (size_t) !!o->offload_param;
  if (narr) {
    const size_t sub = offload_sub(range, o->offload_buffer);
    p->offload_sub = sub;
    p->offload_buffers = 3.0 * ((double)narr * (double)sub * 4.0 + 4096.0); /* NBUF, ALIGN */
    opt += p->offload_buffers;
  }
  p->startup_params = w;
  p->startup_optimizer = opt;
  if (offst) {
    p->swap += state;
    opt -= state;
  }
  if (o->offload_param) {
    p->swap += w; /* the float32 shard leaves memory */
    w = 0;
  }
  p->params = w;
  p->grads = g;
  p->optimizer = opt;
  zero_buffers(o, p, shard, range);
  /* the ZeRO paper's formula over Ψ (no alignment), as `bench memory` prints it */
  const double psi = (double)o->psi;
  double fp = (o->bf16 ? 2 : 4) * psi, fg = (o->bf16 ? 2 : 4) * psi,
         fo = (o->bf16 ? 4 + 4.0 * o->nstate : 4.0 * o->nstate) * psi;
  if (o->stage >= 1) fo /= (double)N;
  if (o->stage >= 2) fg /= (double)N;
  if (o->stage >= 3) fp /= (double)N;
  p->formula_params = fp;
  p->formula_grads = fg;
  p->formula_optimizer = fo;
  if (o->frozen_bytes) frozen_base(o, p);
  return CT_OK;
}
