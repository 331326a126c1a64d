/* The flow-matching training loop (MODEL.md "Objective and sampling").
 *
 * Per optimizer step: lr from the schedule; for each micro-batch draw samples
 * in epoch order, caption dropout, t ~ logit-normal (or uniform) with the flow
 * shift, eps ~ N(0, 1); x_t = (1 - t) x0 + t eps; loss = mean (v - (eps - x0))^2;
 * backward accumulates. Then NaN/Inf check, global-norm clipping, optimizer,
 * EMA, metrics, checkpoint and validation at their intervals.
 *
 * Every random number is indexed by the global sample id, so batch 8 x accum 1
 * and batch 4 x accum 2 see identical samples, and a resumed run continues
 * with exactly the numbers an uninterrupted one would have drawn. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/codec.h"
#include "ctuner/data.h"
#include "ctuner/hash.h"
#include "ctuner/health.h"
#include "ctuner/vae.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/optim.h"
#include "ctuner/rng.h"
#include "train/offload.h"
#include "train/onebit.h"
#include "train/zero.h"
#include "train/remote.h"
#include "train_int.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

ct_status ct_geometry_from_config(const ct_config *cfg, ct_geometry *g, ct_err *err) {
  const ct_mmdit_preset *p = ct_mmdit_preset_find(cfg->preset);
  if (!p || !p->batch)
    return ct_errf(err, CT_ERR_INVALID, "preset '%s' is not trainable; choose one of tiny, small, bench",
                   cfg->preset);
  g->mc = p->cfg;
  int s = (int)cfg->codec_scale;
  if (cfg->codec && !strcmp(cfg->codec, "vae")) { /* the VAE's factor and latent channels */
    char cp[4200];
    const char *d = cfg->pretrained_vae_model_name_or_path;
    const size_t l = strlen(d);
    if (l > 12 && !strcmp(d + l - 12, ".safetensors")) {
      const char *slash = strrchr(d, '/');
      snprintf(cp, sizeof cp, "%.*sconfig.json", slash ? (int)(slash - d + 1) : 0, d);
    } else {
      snprintf(cp, sizeof cp, "%s/config.json", d);
    }
    ct_vae_config vc;
    ct_status vs = ct_vae_config_load(cp, &vc, err);
    if (vs) return vs;
    s = ct_vae_factor(&vc);
    g->mc.in_channels = vc.latent_channels;
  } else {
    if (s == 0) { /* the preset's channels if they are 3 s^2, else s = 1 */
      s = 1;
      for (int k = 1; k <= 4; k *= 2)
        if (ct_pixel_channels(k) == p->cfg.in_channels) s = k;
    }
    g->mc.in_channels = ct_pixel_channels(s);
  }
  g->codec_scale = s;
  g->T = cfg->tokenizer_max_length ? (int)cfg->tokenizer_max_length : p->txt_len;
  if (g->T < 2) g->T = 2;
  int res = (int)cfg->resolution;
  if (res == 0) res = (p->lat_h > p->lat_w ? p->lat_h : p->lat_w) * s;
  g->resolution = res;
  if (res % (2 * s))
    return ct_errf(err, CT_ERR_INVALID, "resolution %d must be a multiple of %d (codec factor %d x patch 2)",
                   res, 2 * s, s);
  if (g->mc.context_in_dim != g->mc.vec_in_dim)
    return ct_errf(err, CT_ERR_INVALID, "preset '%s' has context_in_dim != vec_in_dim", cfg->preset);
  return ct_mmdit_config_validate(&g->mc, err);
}

ct_status ct_textenc_from_config(const ct_config *cfg, int hidden, const char *ckpt_dir, ct_textenc **te,
                                 ct_err *err) {
  char vocab[4200], merges[4200], weights[4200];
  const char *wpath = cfg->text_encoder_path;
  *te = NULL;
  if (ckpt_dir) {
    snprintf(vocab, sizeof vocab, "%s/" CT_CKPT_TOKENIZER_VOCAB, ckpt_dir);
    snprintf(merges, sizeof merges, "%s/" CT_CKPT_TOKENIZER_MERGES, ckpt_dir);
    snprintf(weights, sizeof weights, "%s/text_encoder.safetensors", ckpt_dir);
    wpath = weights;
  } else if (cfg->tokenizer_vocab && cfg->tokenizer_merges) {
    snprintf(vocab, sizeof vocab, "%s", cfg->tokenizer_vocab);
    snprintf(merges, sizeof merges, "%s", cfg->tokenizer_merges);
  }
  ct_textenc_config tc;
  ct_textenc_config_default(hidden, &tc);
  tc.layers = (int)cfg->text_encoder_layers;
  ct_bpe *bpe = NULL;
  ct_status st = CT_OK;
  if (cfg->text_encoder && !strcmp(cfg->text_encoder, "clip-bpe")) {
    st = ct_bpe_load(vocab, merges, &bpe, err);
    if (st) return st;
    tc.vocab = ct_bpe_vocab_size(bpe);
    tc.eos_id = ct_bpe_eos(bpe);
  }
  st = ct_textenc_config_validate(&tc, err);
  if (!st) st = ct_textenc_new(&tc, (uint64_t)cfg->text_encoder_seed, te, err);
  if (!st && bpe) {
    st = ct_textenc_set_bpe(*te, bpe, err);
    bpe = NULL;
  }
  if (!st && wpath) st = ct_textenc_load(*te, wpath, err);
  if (st) {
    ct_bpe_free(bpe);
    ct_textenc_free(*te);
    *te = NULL;
  }
  return st;
}

/* Optimizer tensor table over the model's flat buffer; alignment gaps become
 * vector "tensors". Muon orthogonalises hidden 2-D weights only: embeddings,
 * input layers and the final layer go to its AdamW part (cols = 0).
 * µP multipliers compare each tensor with the same tensor of a base-width model. */
static int muon_excluded(const char *name) {
  static const char *const ex[] = {"img_in.", "txt_in.", "time_in.in_layer.", "vector_in.in_layer.",
                                   "guidance_in.in_layer.", "final_layer.linear.", NULL};
  for (const char *const *e = ex; *e; e++)
    if (!strncmp(name, *e, strlen(*e))) return 1;
  return 0;
}

/* The optimizer over [lo, hi) of the flat buffer (everything without ZeRO).
 * Tensors cut by lo or hi become fragments; the tensor-wise kinds (Lamb's
 * trust ratio, Muon's orthogonalisation) need whole tensors and refuse. */
void ct_train_optim_hp(const ct_config *cfg, ct_optim_kind kind, ct_optim_hp *hp) {
  ct_optim_hp_default(kind, hp);
  hp->beta1 = (float)cfg->adam_beta1;
  hp->beta2 = (float)cfg->adam_beta2;
  hp->eps = (float)cfg->adam_epsilon;
  hp->weight_decay = (float)cfg->adam_weight_decay;
  hp->momentum = (float)cfg->optimizer_momentum;
  hp->nesterov = cfg->optimizer_nesterov;
  hp->muon_momentum = (float)cfg->muon_momentum;
  hp->muon_ns_steps = (int)cfg->muon_ns_steps;
  hp->muon_adamw_lr = (float)cfg->muon_adamw_lr;
  if (kind == CT_OPTIM_MUON) hp->nesterov = cfg->muon_nesterov;
}

static ct_status build_optim(const ct_config *cfg, const ct_geometry *g, ct_mmdit *m, size_t lo,
                             size_t hi, ct_optim **out, ct_err *err) {
  ct_optim_kind kind = CT_OPTIM_ADAM; /* onebitadam keeps Adam's two moments (onebit.c steps them) */
  ct_status st = ct_optim_onebit_of(cfg->optimizer) ? CT_OK : ct_optim_kind_parse(cfg->optimizer, &kind, err);
  if (st) return st;
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
      return ct_errf(err, CT_ERR_INVALID, "mup_base_hidden %ld must be a multiple of the head dim %d",
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
    if (t[i].offset > cur) ot[k++] = (ct_optim_tensor){"(padding)", cur, t[i].offset - cur, 0, 0, 1, 1};
    ct_optim_tensor x = {t[i].name, t[i].offset, t[i].numel, (int)t[i].shape[0],
                         t[i].ndim == 2 ? (int)t[i].shape[1] : 0, 1, 1};
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
  /* cut the table to [lo, hi), offsets relative to lo */
  size_t kk = 0;
  for (size_t i = 0; i < k; i++) {
    size_t a = ot[i].offset, b = a + ot[i].numel;
    if (b <= lo || a >= hi) continue;
    ct_optim_tensor x = ot[i];
    size_t a2 = a < lo ? lo : a, b2 = b > hi ? hi : b;
    if (a2 != a || b2 != b) {
      if (kind == CT_OPTIM_LAMB || (kind == CT_OPTIM_MUON && x.cols > 0)) {
        st = ct_errf(err, CT_ERR_UNSUPPORTED,
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
  if (!st) st = ct_optim_new(kind, &hp, ot, kk, hi - lo, out, err);
  free(ot);
  free(base);
  return st;
}

ct_status ct_train_build_sched(const ct_config *cfg, long total, ct_sched *s, ct_err *err) {
  memset(s, 0, sizeof *s);
  ct_status st = ct_sched_kind_parse(cfg->lr_scheduler, &s->kind, err);
  if (st) return st;
  s->lr = cfg->learning_rate;
  s->warmup_steps = cfg->lr_warmup_steps;
  s->total_steps = total;
  s->num_cycles = cfg->lr_num_cycles;
  s->lr_end = cfg->lr_end;
  s->power = cfg->lr_power;
  s->warmup_min_lr = cfg->warmup_min_lr;
  s->warmup_max_lr = cfg->learning_rate;
  s->warmup_num_steps = cfg->lr_warmup_steps;
  s->total_num_steps = total;
  s->warmup_log = !strcmp(cfg->warmup_type, "log");
  st = ct_sched_validate(s, err);
  if (st) ct_err_prefix(err, "lr_scheduler %s: ", cfg->lr_scheduler);
  return st;
}

/* Deterministic sum of squares: fixed chunks summed in double, in order. */
double ct_train_sumsq(const float *g, size_t n) {
  enum { CH = 1 << 16 };
  size_t nch = (n + CH - 1) / CH;
  double *part = malloc(nch * sizeof *part);
  CT_ASSERT(part);
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < nch; c++) {
    size_t a = c * CH, b = a + CH < n ? a + CH : n;
    double s = 0;
    for (size_t i = a; i < b; i++) s += (double)g[i] * g[i];
    part[c] = s;
  }
  double s = 0;
  for (size_t c = 0; c < nch; c++) s += part[c];
  free(part);
  return s;
}

/* Validation prompts: validation_prompt ("validation") + user_prompt_library. */
typedef struct vprompts {
  int n;
  char *short_[64];
  char *text[64];
} vprompts;

static void vprompts_free(vprompts *v) {
  for (int i = 0; i < v->n; i++) free(v->short_[i]), free(v->text[i]);
  v->n = 0;
}

static ct_status load_prompts(const ct_config *cfg, vprompts *v, ct_err *err) {
  memset(v, 0, sizeof *v);
  if (cfg->validation_prompt) {
    v->short_[v->n] = strdup("validation");
    v->text[v->n++] = strdup(cfg->validation_prompt);
  }
  if (!cfg->user_prompt_library) return CT_OK;
  char *text;
  size_t n;
  ct_status st = ct_read_file(cfg->user_prompt_library, 1 << 20, &text, &n, err);
  if (st) {
    ct_err_prefix(err, "user_prompt_library: ");
    return st;
  }
  ct_json *j = NULL;
  st = ct_json_parse(text, n, &j, err);
  free(text);
  if (st) {
    ct_err_prefix(err, "%s: ", cfg->user_prompt_library);
    return st;
  }
  if (j->type != CT_JSON_OBJECT)
    st = ct_errf(err, CT_ERR_FORMAT, "%s: expected a JSON object {shortname: prompt}", cfg->user_prompt_library);
  for (size_t i = 0; i < j->n && !st; i++) {
    const ct_json *x = &j->items[i];
    if (x->type != CT_JSON_STRING) {
      st = ct_errf(err, CT_ERR_FORMAT, "%s: prompt '%s' must be a string", cfg->user_prompt_library, j->keys[i]);
      break;
    }
    if (v->n == 64) {
      st = ct_errf(err, CT_ERR_RANGE, "%s: more than 64 prompts", cfg->user_prompt_library);
      break;
    }
    v->short_[v->n] = strdup(j->keys[i]);
    v->text[v->n++] = strdup(x->str);
  }
  ct_json_free(j);
  return st;
}

/* "WxH,WxH" or "N" -> first size (the grid is per size; we use the first). */
static ct_status parse_vres(const ct_config *cfg, int def, int *w, int *h, ct_err *err) {
  *w = *h = def;
  if (!cfg->validation_resolution) return CT_OK;
  int a = 0, b = 0;
  char x;
  if (sscanf(cfg->validation_resolution, "%d%c%d", &a, &x, &b) == 3 && x == 'x') {
    *w = a, *h = b;
  } else if (sscanf(cfg->validation_resolution, "%d", &a) == 1) {
    *w = *h = a;
  } else {
    return ct_errf(err, CT_ERR_INVALID, "validation_resolution '%s': expected WxH or a side in pixels",
                   cfg->validation_resolution);
  }
  if (*w <= 0 || *h <= 0 || *w > 4096 || *h > 4096)
    return ct_errf(err, CT_ERR_INVALID, "validation_resolution '%s' is out of range", cfg->validation_resolution);
  return CT_OK;
}

typedef struct trainer {
  const ct_config *cfg;
  ct_comm *comm;
  int rank, world; /* data parallel: rank r takes samples [r*B, (r+1)*B) of each global micro-batch */
  int zero;        /* ZeRO stage >= 1: this rank's optimizer covers [lo, hi) of the flat buffer */
  int stage;       /* zero_stage */
  size_t shard, lo, hi;
  int bf16;        /* mixed_precision bf16 */
  int own;         /* the trainer holds the float32 weights of [lo, hi) in wsh (stage 3 or bf16) */
  zero_ctx z;      /* stages 2-3 and bf16 (zero.h) */
  float *wsh;      /* float32 (master) weights of [lo, hi) when own */
  ct_offload *off; /* offload nvme: the optimizer state and/or (stage 3) the weights in a swap file */
  int opt_off;     /* the optimizer's state arrays are the file's first ones */
  int widx;        /* offload_param: the weights are the file's array widx (wsh is NULL); else -1 */
  ct_onebit *ob;   /* optimizer onebitadam (its moments are tr.opt's Adam state) */
  char swap_dir[4200];
  ct_geometry g;
  ct_mmdit *m;
  ct_textenc *te;
  ct_dataset *ds;
  ct_text_cb text_cb;
  ct_text_encoder_fn text_fn;
  double data_wait; /* seconds waited for batches */
  ct_health *h;     /* monitor, circuit breaker, webhooks (ct_train_run only) */
  ct_remote *remote; /* output_dir s3://...: checkpoints mirrored there (rank 0) */
  char remote_pending[1024]; /* a checkpoint whose upload failed, retried at the end */
  ct_codec codec;   /* pixel or VAE: the data's latents, validation's decoding */
  ct_optim *opt;
  ct_sched sched;
  float *ema;      /* every parameter; when own: [lo, hi) only */
  vprompts vp;
  int vw, vh;
  long total;
  FILE *metrics;
  /* batch buffers */
  float *eps, *xt, *v, *dv, *t, *txt, *y;
} trainer;

static ct_status write_sidecar(const char *png, const char *prompt, ct_err *err) {
  char p[4700];
  if (ct_pathf(p, sizeof p, "%s", png)) return ct_errf(err, CT_ERR_RANGE, "path too long: %s", png);
  char *dot = strrchr(p, '.');
  if (dot) strcpy(dot, ".txt");
  return ct_write_file_atomic(p, prompt, strlen(prompt), err);
}

/* Sample every validation prompt (live weights and/or EMA), write the images
 * with prompt sidecars, and one grid (rows: prompt x variant, columns: idx). */
static ct_status validate(trainer *tr, long step, int *nimages, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  *nimages = 0;
  if (tr->vp.n == 0 || cfg->disable_validation) return CT_OK;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/validation_images", cfg->output_dir);
  ct_status st = ct_mkdir_p(dir, err);
  if (st) return st;
  int variants[2], nv = 0; /* 0 live, 1 ema */
  if (!tr->ema || strcmp(cfg->ema_validation, "ema_only")) variants[nv++] = 0;
  if (tr->ema && strcmp(cfg->ema_validation, "none")) variants[nv++] = 1;
  const int per = (int)cfg->num_validation_images, n = tr->vp.n * per;
  ct_sample_opts so = {tr->vw, tr->vh, (int)cfg->validation_num_inference_steps,
                       (float)cfg->validation_guidance, (float)cfg->flow_shift,
                       (uint64_t)cfg->validation_seed};
  const char **prompts = malloc((size_t)n * sizeof *prompts);
  ct_image *imgs = calloc((size_t)n * nv, sizeof *imgs);
  float *live = NULL;
  if (!prompts || !imgs) {
    free(prompts);
    free(imgs);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  for (int p = 0; p < tr->vp.n; p++)
    for (int i = 0; i < per; i++) prompts[p * per + i] = tr->vp.text[p];
  size_t nw = ct_mmdit_numel(tr->m);
  for (int k = 0; k < nv && !st; k++) {
    if (variants[k] == 1) { /* swap the EMA weights in, and back afterwards */
      live = ct_alloc(CT_MEM_BUFFERS, nw * sizeof(float));
      if (!live) {
        st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
        break;
      }
      memcpy(live, ct_mmdit_params(tr->m), nw * sizeof(float));
      memcpy(ct_mmdit_params(tr->m), tr->ema, nw * sizeof(float));
    }
    /* Same noise for every prompt's idx-th image, so rows are comparable. */
    for (int q = 0; q < n && !st; q += per) {
      st = ct_sample_images(tr->m, tr->te, tr->g.T, &tr->codec, prompts + q, per, 0, &so,
                            imgs + (size_t)k * n + q, err);
    }
    if (live) {
      memcpy(ct_mmdit_params(tr->m), live, nw * sizeof(float));
      ct_free(live);
      live = NULL;
    }
  }
  for (int k = 0; k < nv && !st; k++)
    for (int q = 0; q < n && !st; q++) {
      char path[4600];
      int p = q / per, i = q % per;
      snprintf(path, sizeof path, "%s/step_%ld_%s%s_%d_%dx%d.png", dir, step, tr->vp.short_[p],
               variants[k] ? "-ema" : "", i, tr->vw, tr->vh);
      st = ct_image_save_png(path, &imgs[(size_t)k * n + q], err);
      if (!st) st = write_sidecar(path, tr->vp.text[p], err);
      if (!st) (*nimages)++;
    }
  if (!st) { /* grid */
    const int pad = 2, cols = per, rows = tr->vp.n * nv;
    ct_image grid = {0};
    st = ct_image_alloc(cols * (tr->vw + pad) + pad, rows * (tr->vh + pad) + pad, &grid, err);
    if (!st) {
      memset(grid.px, 255, (size_t)grid.w * grid.h * 3);
      for (int k = 0; k < nv; k++)
        for (int q = 0; q < n; q++) {
          const ct_image *im = &imgs[(size_t)k * n + q];
          int r = (q / per) * nv + k, c = q % per;
          for (int yy = 0; yy < im->h; yy++)
            memcpy(grid.px + (((size_t)(r * (tr->vh + pad) + pad + yy)) * grid.w + c * (tr->vw + pad) + pad) * 3,
                   im->px + (size_t)yy * im->w * 3, (size_t)im->w * 3);
        }
      char path[4600];
      snprintf(path, sizeof path, "%s/step_%ld_grid.png", dir, step);
      st = ct_image_save_png(path, &grid, err);
      ct_image_free(&grid);
    }
  }
  for (size_t i = 0; i < (size_t)n * nv; i++) ct_image_free(&imgs[i]);
  free(imgs);
  free(prompts);
  return st;
}

/* Keep metrics.jsonl lines of steps <= `upto` (a resume rewrites the tail). */
FILE *ct_train_open_metrics(const char *out, long upto) {
  char p[4200], tmp[4300];
  snprintf(p, sizeof p, "%s/metrics.jsonl", out);
  if (upto > 0) {
    FILE *in = fopen(p, "rb");
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    FILE *o = in ? fopen(tmp, "wb") : NULL;
    if (in && o) {
      char line[4096];
      while (fgets(line, sizeof line, in)) {
        long s;
        if (sscanf(line, "{\"step\": %ld", &s) == 1 && s <= upto) fputs(line, o);
      }
      fclose(o);
      rename(tmp, p);
    } else if (o) {
      fclose(o);
    }
    if (in) fclose(in);
    return fopen(p, "ab");
  }
  return fopen(p, "wb");
}

/* Test hook (docs/testing.md): CTUNER_FAULT_NAN_AT_STEP=a,b,... poisons the
 * loss gradient of those steps with NaN, to exercise the skip logic. */
static int fault_nan(long step) {
  const char *e = getenv("CTUNER_FAULT_NAN_AT_STEP");
  if (!e) return 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", e);
  char *save = NULL;
  for (char *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save))
    if (atol(p) == step) return 1;
  return 0;
}

static ct_status text_encode(void *ctx, const char *const *caps, int n, float *seq, float *pooled, ct_err *err) {
  const ct_text_cb *cb = ctx;
  return ct_encode_prompts(cb->te, cb->T, caps, n, seq, pooled, err);
}

ct_status ct_text_fn_init(ct_text_cb *cb, int d, int dp, ct_text_encoder_fn *fn, ct_err *err) {
  /* The tag is a digest of the encoder's output on probe captions: any change
   * of weights, tokenizer or length names different cache files. */
  static const char *const probe[3] = {"", "a small red circle at the top left", "ctuner text cache probe 0123"};
  const size_t Td = (size_t)cb->T * (size_t)d;
  float *seq = malloc(3 * Td * sizeof(float)), *pooled = malloc(3 * (size_t)dp * sizeof(float));
  ct_status st = seq && pooled ? ct_encode_prompts(cb->te, cb->T, probe, 3, seq, pooled, err)
                               : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  if (!st) {
    char h1[65], h2[65];
    ct_sha256_hex(seq, 3 * Td * sizeof(float), h1);
    ct_sha256_hex(pooled, 3 * (size_t)dp * sizeof(float), h2);
    *fn = (ct_text_encoder_fn){.ctx = cb, .T = cb->T, .d = d, .dp = dp, .encode = text_encode};
    snprintf(fn->tag, sizeof fn->tag, "T%d-%.8s%.8s", cb->T, h1, h2);
  }
  free(seq);
  free(pooled);
  return st;
}

/* Tokens of a caption without BOS/EOS. */
static size_t caption_tokens(const char *caption, void *te) {
  const ct_bpe *b = ct_textenc_bpe(te);
  return b ? (size_t)ct_bpe_tokens(b, caption, NULL, 0) : strlen(caption);
}

/* One micro-batch: forward, loss, backward (grads accumulate). The batch
 * (one aspect bucket, this rank's slice of the step's samples) comes from the
 * data loader; noise and timesteps are keyed by its global sample ids. */
static ct_status micro_batch(trainer *tr, ct_train_state *s, int accum, long step, double *loss,
                             ct_err *err) {
  const ct_config *cfg = tr->cfg;
  const int B = (int)cfg->train_batch_size, T = tr->g.T;
  ct_batch *bt = NULL;
  ct_status st = ct_dataset_next(tr->ds, &bt, err);
  if (st) return st;
  const size_t lat = (size_t)bt->C * (size_t)bt->h * (size_t)bt->w;
  tr->data_wait += bt->wait_s;
  const float *x0s = bt->x0; /* (B, C, h, w), valid until the next batch */
  const uint64_t seed = (uint64_t)cfg->seed;
  for (int b = 0; b < B; b++) {
    const uint64_t id = bt->ids[b];
    float t;
    if (!strcmp(cfg->timestep_sampling, "uniform")) {
      t = ct_rng_uniform(seed, CT_STREAM_TIMESTEP, id);
    } else {
      float z = (float)cfg->logit_mean + (float)cfg->logit_std * ct_rng_normal(seed, CT_STREAM_TIMESTEP, id);
      t = 1.0f / (1.0f + expf(-z));
    }
    tr->t[b] = ct_flow_shift_t(t, (float)cfg->flow_shift);
    ct_rng_fill_normal(tr->eps + b * lat, lat, seed, CT_STREAM_NOISE, id * lat, 0.0f, 1.0f);
  }
  const float *txt = bt->txt, *y = bt->pooled; /* from the text cache */
  if (!txt) {
    st = ct_encode_prompts(tr->te, T, bt->caps, B, tr->txt, tr->y, err);
    if (st) return st;
    txt = tr->txt, y = tr->y;
  }
  for (int b = 0; b < B; b++) {
    const float t = tr->t[b];
    const float *x0 = x0s + b * lat, *e = tr->eps + b * lat;
    float *xt = tr->xt + b * lat;
    for (size_t i = 0; i < lat; i++) xt[i] = (1.0f - t) * x0[i] + t * e[i];
  }
  ct_mmdit_batch in = {.B = B, .H = bt->h, .W = bt->w, .T = T, .x = tr->xt, .t = tr->t, .txt = txt, .y = y};
  st = ct_mmdit_forward(tr->m, &in, tr->v, err);
  if (st) return st;
  const size_t tot = (size_t)B * lat;
  const float scale = 2.0f / ((float)tot * (float)accum * (float)tr->world);
  double l = 0;
  for (size_t i = 0; i < tot; i++) {
    float diff = tr->v[i] - (tr->eps[i] - x0s[i]);
    l += (double)diff * diff;
    tr->dv[i] = scale * diff;
  }
  if (fault_nan(step)) tr->dv[0] = NAN, l = NAN;
  st = ct_mmdit_backward(tr->m, tr->dv, err);
  *loss = l / (double)tot;
  s->samples_seen = (long)ct_dataset_samples_seen(tr->ds);
  s->epoch = ct_dataset_epoch(tr->ds);
  s->epoch_pos = 0;
  return st;
}

/* A checkpoint. One rank, or an unsharded optimizer: rank 0 writes it all.
 * Sharded: every rank writes its optimizer fragments into the temporary
 * directory rank 0 prepared, rank 0 the rest, and rank 0 commits (.guard)
 * only after every rank reported its file durable; the others learn the
 * outcome, so all ranks fail together. */
static ct_status save_checkpoint(trainer *tr, const ct_ckpt_io *io, const ct_train_state *s,
                                 ct_train_summary *sum, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  const int lead = tr->rank == 0;
  if (!tr->zero || tr->world == 1)
    return lead ? ct_checkpoint_save(cfg->output_dir, io, s, cfg->checkpoints_total_limit, sum->last_checkpoint,
                                     sizeof sum->last_checkpoint, err)
                : CT_OK;
  char tmp[4096];
  double bad = 0;
  ct_status st = lead ? ct_checkpoint_prepare(cfg->output_dir, s->global_step, tmp, sizeof tmp, err) : CT_OK;
  bad = st ? 1 : 0;
  ct_status cs = ct_comm_broadcast(tr->comm, &bad, sizeof bad, 0, err); /* the directory exists */
  if (cs) return cs;
  if (bad) return st ? st : ct_errf(err, CT_ERR_IO, "rank 0 could not prepare the checkpoint directory");
  if (!lead && ct_pathf(tmp, sizeof tmp, "%s/checkpoint-%ld-tmp", cfg->output_dir, s->global_step))
    st = ct_errf(err, CT_ERR_RANGE, "output_dir path is too long: %s", cfg->output_dir);
  if (!st) st = ct_checkpoint_write_fragments(tmp, io, s, tr->rank, tr->world, err);
  if (!st && lead) st = ct_checkpoint_write_main(tmp, io, s, 1, err);
  double fails[2] = {st ? 1 : 0, st ? (double)tr->rank : 0};
  cs = ct_comm_allreduce_f64(tr->comm, fails, 2, err); /* every rank's files are durable (or not) */
  if (cs) return cs;
  if (st) return st;
  if (fails[0] > 0)
    return ct_errf(err, CT_ERR_IO, "checkpoint %s: %g rank(s) failed to write their part (see their messages)",
                   tmp, fails[0]);
  if (lead)
    st = ct_checkpoint_commit(cfg->output_dir, tmp, s->global_step, cfg->checkpoints_total_limit,
                              sum->last_checkpoint, sizeof sum->last_checkpoint, err);
  bad = st ? 1 : 0;
  cs = ct_comm_broadcast(tr->comm, &bad, sizeof bad, 0, err);
  if (cs) return cs;
  if (!st && bad) st = ct_errf(err, CT_ERR_IO, "rank 0 could not complete checkpoint %s", tmp);
  return st;
}

/* When the trainer holds the weights (stage 3, bf16): the full float32
 * weights and EMA on rank 0 — gathered from the ranks' ranges, or the
 * trainer's own when it holds all — with the model pointing at them without
 * hooks, for validation and checkpoints; every rank takes part. Otherwise
 * nothing: the model has its full weights. */
typedef struct full_view {
  float *w, *e;
  int owned;   /* gathered copies, freed by release */
  float *mine; /* offload_param: this rank's weights read back from the file */
} full_view;

static ct_status gather_full(trainer *tr, full_view *fv, ct_err *err) {
  memset(fv, 0, sizeof *fv);
  if (!tr->own) return CT_OK;
  const size_t nw = ct_mmdit_numel(tr->m);
  const int lead = tr->rank == 0;
  ct_status st = CT_OK;
  const float *wsrc = tr->wsh;
  if (tr->widx >= 0) { /* offload_param: this rank's weights from the swap file */
    fv->mine = ct_alloc(CT_MEM_BUFFERS, (tr->hi - tr->lo ? tr->hi - tr->lo : 1) * sizeof(float));
    float *arr[8] = {0};
    arr[tr->widx] = fv->mine;
    st = fv->mine ? ct_offload_load_all(tr->off, arr, err)
                  : ct_errf(err, CT_ERR_NOMEM, "out of memory reading the offloaded weights back");
    if (st) return st; /* the CLI aborts the job: nobody waits in a gather */
    wsrc = fv->mine;
  }
  if (tr->hi - tr->lo == nw) { /* one rank at stage 3, or bf16 stage 0: every rank holds all */
    fv->w = lead ? (float *)wsrc : NULL;
    fv->e = lead ? tr->ema : NULL;
  } else {
    fv->owned = 1;
    if (lead) {
      fv->w = ct_alloc(CT_MEM_BUFFERS, nw * sizeof(float));
      fv->e = tr->ema ? ct_alloc(CT_MEM_BUFFERS, nw * sizeof(float)) : NULL;
      if (!fv->w || (tr->ema && !fv->e)) st = ct_errf(err, CT_ERR_NOMEM, "out of memory gathering the weights");
    }
    /* every rank takes part even if rank 0 failed: the CLI then aborts the job */
    ct_status s2 = ct_comm_gather_f32(tr->comm, wsrc, fv->w, tr->shard, nw, 0, err);
    if (!st) st = s2;
    if (tr->ema) {
      s2 = ct_comm_gather_f32(tr->comm, tr->ema, fv->e, tr->shard, nw, 0, err);
      if (!st) st = s2;
    }
  }
  if (!st && lead) {
    zero_hooks(&tr->z, 0);
    ct_mmdit_use_params(tr->m, fv->w);
  }
  return st;
}

static void release_full(trainer *tr, full_view *fv) {
  if (!tr->own) return;
  if (tr->rank == 0 && fv->w) {
    ct_mmdit_use_params(tr->m, NULL);
    zero_hooks(&tr->z, 1);
  }
  if (fv->owned) {
    ct_free(fv->w);
    ct_free(fv->e);
  }
  ct_free(fv->mine);
  memset(fv, 0, sizeof *fv);
}

/* offload_optimizer nvme: the optimizer's state moves into a swap file under
 * offload_param_path/ctuner-swap-<hash of output_dir>/rank-R (a stale one of
 * an earlier run is removed first) and the optimizer steps it sub-group by
 * sub-group. */
static ct_status par_read(void *user, size_t a, size_t b, float *dst, ct_err *err) {
  trainer *tr = user;
  return ct_offload_read_range(tr->off, tr->widx, a, b, dst, err);
}

static ct_status start_offload(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  ct_optim_kind kind = ct_optim_get_kind(tr->opt);
  const int want_opt = cfg->offload_optimizer && !strcmp(cfg->offload_optimizer, "nvme");
  const int par = cfg->offload_param && !strcmp(cfg->offload_param, "nvme");
  if (kind == CT_OPTIM_LAMB || kind == CT_OPTIM_MUON)
    return ct_errf(err, CT_ERR_UNSUPPORTED,
                   "offload %s nvme: optimizer '%s' updates whole tensors and cannot step in pieces; use an "
                   "elementwise optimizer (adamw, adam, adagrad, lion, sgd, mu*) or offload none",
                   par ? "param" : "optimizer", ct_optim_kind_name(kind));
  const size_t nst = want_opt ? ct_optim_nstate(tr->opt) : 0;
  if (want_opt && !nst && tr->rank == 0)
    CT_INFO("offload_optimizer nvme: optimizer '%s' keeps no state here; nothing to offload",
            ct_optim_kind_name(kind));
  if (!nst && !par) return CT_OK;
  const uint64_t h = ct_hash_str(cfg->output_dir); /* one swap directory per run directory */
  if (ct_pathf(tr->swap_dir, sizeof tr->swap_dir, "%s/ctuner-swap-%016llx/rank-%d", cfg->offload_param_path,
               (unsigned long long)h, tr->rank))
    return ct_errf(err, CT_ERR_RANGE, "offload_param_path is too long: %s", cfg->offload_param_path);
  ct_status st = ct_rm_rf(tr->swap_dir, err); /* a stale swap of an earlier run */
  if (st) return st;
  /* One swap file: the optimizer's state arrays (offload_optimizer), then the
   * float32 weights of this rank's range (offload_param, stage 3). */
  const size_t n = tr->hi - tr->lo, narr = nst + (size_t)par;
  /* auto: an eighth of the range (so reading, stepping and writing overlap),
   * between 256 Ki and 4 Mi floats per array */
  size_t sub = n / 8;
  sub = sub < ((size_t)1 << 18) ? (size_t)1 << 18 : sub > ((size_t)1 << 22) ? (size_t)1 << 22 : sub;
  if (cfg->offload_buffer_size > 0) sub = (size_t)cfg->offload_buffer_size;
  sub = (sub + 1023) / 1024 * 1024; /* whole 4 KiB pages per array (O_DIRECT) */
  st = ct_offload_open(tr->swap_dir, n, narr, sub, cfg->offload_pin_memory, &tr->off, err);
  if (st) return st;
  float *arr[8] = {0};
  for (size_t i = 0; i < nst && i < 7; i++) arr[i] = ct_optim_state(tr->opt, i, NULL);
  if (par) arr[nst] = tr->wsh;
  st = ct_offload_store_all(tr->off, arr, err);
  if (st) return st;
  tr->opt_off = nst > 0;
  if (tr->opt_off) ct_optim_release_state(tr->opt);
  if (par) { /* the gathers read this rank's pieces from the file from now on */
    tr->widx = (int)nst;
    st = zero_set_reader(&tr->z, par_read, tr, err);
    if (st) return st;
    ct_free(tr->wsh);
    tr->wsh = NULL;
  }
  if (tr->rank == 0)
    CT_INFO("offload nvme: %s%s%s of %zu floats per rank in %s (%s I/O, sub-groups of %zu)",
            nst ? "the optimizer state" : "", nst && par ? " and " : "", par ? "the float32 weights" : "", n,
            tr->swap_dir, ct_offload_mode(tr->off), sub);
  return CT_OK;
}

typedef struct off_step {
  trainer *tr;
  float *w;       /* in memory, or NULL: in the file (offload_param) */
  const float *g;
  float lr;
  long step;
  float *ema;     /* offload_param: the EMA is updated here (NULL: not this step) */
  float dcy;
} off_step;

static ct_status off_step_fn(void *user, size_t a, size_t len, float *const *states, ct_err *err) {
  off_step *s = user;
  trainer *tr = s->tr;
  float *w = tr->widx >= 0 ? states[tr->widx] : s->w + a;
  float *st[2] = {NULL, NULL};
  for (size_t i = 0; i < ct_optim_nstate(tr->opt) && i < 2; i++)
    st[i] = tr->opt_off ? states[i] : ct_optim_state(tr->opt, i, NULL) + a;
  ct_status rc = ct_optim_step_slice(tr->opt, a, len, w, s->g + a, st, s->lr, s->step, err);
  if (!rc && s->ema) {
    float *e = s->ema + a;
    const float d = s->dcy;
    for (size_t i = 0; i < len; i++) e[i] = d * e[i] + (1.0f - d) * w[i];
  }
  return rc;
}

/* The offloaded optimizer state in memory for a checkpoint (arrays of the range). */
static ct_status offload_states(trainer *tr, float ***out, ct_err *err) {
  *out = NULL;
  if (!tr->opt_off) return CT_OK;
  const size_t nst = ct_optim_nstate(tr->opt), n = ct_optim_numel(tr->opt);
  float **a = calloc(nst ? nst : 1, sizeof *a);
  if (!a) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  *out = a;
  for (size_t i = 0; i < nst; i++) {
    a[i] = ct_alloc(CT_MEM_BUFFERS, (n ? n : 1) * sizeof(float));
    if (!a[i]) return ct_errf(err, CT_ERR_NOMEM, "out of memory reading the offloaded optimizer state back");
  }
  float *arr[8] = {0}; /* the weights' array (if any) is skipped */
  for (size_t i = 0; i < nst && i < 7; i++) arr[i] = a[i];
  return ct_offload_load_all(tr->off, arr, err);
}

static void free_states(trainer *tr, float **a) {
  if (!a) return;
  for (size_t i = 0; i < ct_optim_nstate(tr->opt); i++) ct_free(a[i]);
  free(a);
}

static void trainer_free(trainer *tr) {
  ct_health_close(tr->h); /* sends what is queued, within webhook_timeout */
  ct_codec_free(&tr->codec);
  ct_onebit_free(tr->ob);
  if (tr->off) {
    ct_offload_close(tr->off);
    ct_err e = {0};
    ct_rm_rf(tr->swap_dir, &e);
    char *slash = strrchr(tr->swap_dir, '/');
    if (slash) *slash = 0, rmdir(tr->swap_dir); /* the run's directory, once empty */
  }
  zero_free(&tr->z);
  ct_mmdit_free(tr->m);
  ct_free(tr->wsh);
  ct_textenc_free(tr->te);
  ct_dataset_free(tr->ds);
  ct_optim_free(tr->opt);
  ct_free(tr->ema);
  vprompts_free(&tr->vp);
  if (tr->metrics) fclose(tr->metrics);
  ct_free(tr->eps);
  ct_free(tr->xt);
  ct_free(tr->v);
  ct_free(tr->dv);
  ct_free(tr->t);
  ct_free(tr->txt);
  ct_free(tr->y);
}

/* Everything up to the data: config checks, threads per rank, output_dir,
 * the frozen text encoder, and the dataset with its caches built (every rank
 * together). Shared by training and `ctuner cache`. */
static ct_status open_data(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  ct_comm *comm = tr->comm;
  const int lead = tr->rank == 0;
  ct_status st = ct_config_validate(cfg, err);
  if (!st) st = ct_geometry_from_config(cfg, &tr->g, err);
  if (st) return st;
  if (!cfg->data_backend_config)
    return ct_errf(err, CT_ERR_INVALID, "data_backend_config is required: a multidatabackend.json "
                                        "listing the datasets (docs/training.md)");
  if (cfg->num_threads > 0) {
    omp_set_num_threads((int)cfg->num_threads);
  } else if (tr->world > 1 && !getenv("OMP_NUM_THREADS")) {
    /* cores of this process (its affinity mask) shared by the ranks on the node */
    int per = omp_get_num_procs() / ct_comm_local_size(comm);
    omp_set_num_threads(per < 1 ? 1 : per);
  }
  if (lead) {
    st = ct_mkdir_p(cfg->output_dir, err);
    if (st) return st;
    ct_checkpoint_clean_tmp(cfg->output_dir);
  }
  st = ct_comm_barrier(comm, err); /* output_dir exists (shared) before anyone reads it */
  if (st) return st;

  /* the frozen text encoder first: the data loader caches its embeddings */
  st = ct_textenc_from_config(cfg, tr->g.mc.context_in_dim, NULL, &tr->te, err);
  if (st) return st;
  tr->text_cb = (ct_text_cb){tr->te, tr->g.T};
  st = ct_text_fn_init(&tr->text_cb, tr->g.mc.context_in_dim, tr->g.mc.vec_in_dim, &tr->text_fn, err);
  if (st) return st;
  st = cfg->codec && !strcmp(cfg->codec, "vae")
           ? ct_codec_vae(cfg->pretrained_vae_model_name_or_path, (int)cfg->vae_tile, (uint64_t)cfg->seed, &tr->codec,
                          err)
           : ct_codec_pixel(tr->g.codec_scale, &tr->codec, err);
  if (st) return st;
  if (lead && tr->codec.ctx)
    CT_INFO("codec vae: %s, %d latent channels, factor %d (%s)", cfg->pretrained_vae_model_name_or_path,
            tr->codec.channels, tr->codec.factor, tr->codec.tag);
  ct_data_opts dopt = {.cfg = cfg, .comm = comm, .codec_scale = tr->g.codec_scale, .codec = &tr->codec,
                       .size_multiple = tr->g.codec_scale * 2,
                       .text = &tr->text_fn, .prefetch = cfg->dataloader_prefetch ? (int)cfg->dataloader_prefetch_qlen : 0};
  return ct_dataset_open(cfg->data_backend_config, &dopt, &tr->ds, err);
}

/* Before a checkpoint every rank agrees on two things, in rounds of one
 * all-reduce: rank 0's verdict on the free space of output_dir (enough, wait,
 * stop) and whether the breaker opened anywhere since the step began. A
 * fault stops every rank without the checkpoint; so does too little space
 * (disk_low_action stop or a script that freed too little); wait polls. */
static ct_status checkpoint_gate(trainer *tr, long step, ct_train_summary *sum, ct_err *err) {
  if (!tr->h) return CT_OK;
  for (int round = 0;; round++) {
    ct_err de = {0};
    double f[2] = {tr->rank == 0 ? (double)ct_health_disk_verdict(tr->h, tr->cfg->output_dir, round, &de) : 0,
                   (double)ct_health_is_open(tr->h)};
    if (tr->world > 1) {
      ct_status cs = ct_comm_allreduce_f64(tr->comm, f, 2, err);
      if (cs) return cs;
    }
    if (f[1] > 0) {
      sum->joint_stop = 1;
      return ct_health_is_open(tr->h)
                 ? ct_errf(err, CT_ERR_HEALTH, "circuit breaker open before checkpoint %ld: %s; stopped without it",
                           step, ct_health_reason(tr->h))
                 : ct_errf(err, CT_ERR_HEALTH,
                           "circuit breaker open on %.0f other rank(s) before checkpoint %ld; stopped without it",
                           f[1], step);
    }
    if (f[0] == 0) return CT_OK;
    if (f[0] >= 2) {
      sum->joint_stop = 1; /* every rank stops here together */
      if (tr->rank == 0) {
        if (err) *err = de;
        return CT_ERR_IO;
      }
      return ct_errf(err, CT_ERR_IO, "rank 0 found too little free space in %s for checkpoint %ld",
                     tr->cfg->output_dir, step);
    }
    usleep((useconds_t)(ct_health_poll_seconds(tr->h) * 1e6)); /* disk_low_action wait */
  }
}

static ct_status train_run(const ct_config *cfg, ct_remote *remote, ct_comm *comm, ct_step_cb cb, void *user,
                           ct_train_summary *sum, ct_err *err) {
  const double t_start = now_s();
  memset(sum, 0, sizeof *sum);
  trainer tr = {0};
  tr.widx = -1;
  tr.cfg = cfg;
  tr.remote = remote;
  tr.comm = comm;
  tr.rank = ct_comm_rank(comm);
  tr.world = ct_comm_size(comm);
  const int lead = tr.rank == 0; /* rank 0 writes metrics, validation images and checkpoints */
  ct_train_state s = {0};
  double last_status = 0;
  long first_step = 0;
  ct_status st = ct_health_open(cfg, comm, &tr.h, err); /* collective: GPUs are assigned to ranks */
  if (st) goto out;
  ct_health_stage(tr.h, "init_data_backend", "Loading data backends and caches", "running", 0);
  st = open_data(&tr, err);
  if (st) goto out;
  ct_health_stage(tr.h, "init_data_backend", "Loading data backends and caches", "completed", 100);
  const int B = (int)cfg->train_batch_size, accum = (int)cfg->gradient_accumulation_steps;
  {
    ct_data_stats ds_st;
    ct_dataset_stats(tr.ds, &ds_st);
    sum->images = ds_st.kept;
    sum->images_skipped = ds_st.unreadable + ds_st.no_caption + ds_st.not_found + ds_st.duplicate +
                          ds_st.outside_dir + ds_st.metadata_missing;
  }
  const size_t GB = (size_t)B * (size_t)tr.world;
  if (lead)
    CT_INFO("effective batch %zu = train_batch_size %d x %d rank(s) x gradient_accumulation_steps %d "
            "(%d OpenMP thread(s) per rank)",
            GB * (size_t)accum, B, tr.world, accum, omp_get_max_threads());
  long per_epoch = ct_dataset_steps_per_epoch(tr.ds);
  if (per_epoch < 1) per_epoch = 1;
  tr.total = cfg->max_train_steps ? cfg->max_train_steps : per_epoch * cfg->num_train_epochs;
  sum->total_steps = tr.total;

  /* Stages 2 and 3 keep no full gradient, stage 3 no full parameters: each
   * rank initialises and loads only its shard (zero.c). bf16 keeps bf16
   * parameters and gradients in zero.c and the float32 weights of the
   * optimizer's range here. */
  tr.zero = cfg->zero_stage >= 1;
  tr.stage = (int)cfg->zero_stage;
  tr.bf16 = !strcmp(cfg->mixed_precision, "bf16");
  tr.own = tr.stage >= 3 || tr.bf16;
  st = ct_mmdit_new(&tr.g.mc, (uint64_t)cfg->seed,
                    (tr.stage < 2 && !tr.bf16 ? CT_MMDIT_GRADS : 0) | (tr.own ? CT_MMDIT_NO_PARAMS : 0), &tr.m, err);
  if (st) goto out;
  const size_t nw = ct_mmdit_numel(tr.m);
  tr.shard = ct_comm_shard_len(nw, tr.world);
  tr.lo = tr.zero ? (size_t)tr.rank * tr.shard : 0;
  if (tr.lo > nw) tr.lo = nw;
  tr.hi = tr.zero ? (tr.lo + tr.shard < nw ? tr.lo + tr.shard : nw) : nw;
  if (tr.own) { /* bf16: master weights, counted with the optimizer state as in ZeRO's 12 bytes */
    tr.wsh = ct_calloc(tr.bf16 ? CT_MEM_OPTIMIZER : CT_MEM_PARAMS, tr.hi - tr.lo ? tr.hi - tr.lo : 1, sizeof(float));
    if (!tr.wsh) {
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory for the %zu float32 weights of this rank", tr.hi - tr.lo);
      goto out;
    }
    ct_mmdit_init_range(tr.m, (uint64_t)cfg->seed, tr.lo, tr.hi, tr.wsh);
    if (cfg->pretrained_model_path)
      st = ct_mmdit_load_range(tr.m, cfg->pretrained_model_path, "", tr.lo, tr.hi, tr.wsh, err);
  } else if (cfg->pretrained_model_path) {
    st = ct_mmdit_load(tr.m, cfg->pretrained_model_path, "", err);
  }
  if (!st) {
    /* BOS and EOS take two of the T tokens. */
    size_t over, longest = ct_dataset_longest_caption(tr.ds, caption_tokens, tr.te, (size_t)tr.g.T - 2, &over);
    if (over)
      CT_WARN("%zu captions are longer than tokenizer_max_length %d allows (%d %s) and are truncated; "
              "the longest has %zu: set --tokenizer_max_length=%zu to keep them whole",
              over, tr.g.T, tr.g.T - 2, ct_textenc_bpe(tr.te) ? "BPE tokens" : "bytes", longest, longest + 2);
  }
  if (!st) {
    size_t np;
    const ct_param *tab = ct_mmdit_table(tr.m, &np);
    for (size_t i = 0; i < np; i++) sum->params += tab[i].numel;
  }
  if (!st && tr.hi > tr.lo) st = build_optim(cfg, &tr.g, tr.m, tr.lo, tr.hi, &tr.opt, err);
  if (!st && tr.zero && tr.hi <= tr.lo)
    st = ct_errf(err, CT_ERR_INVALID, "the model's %zu parameters are too few to shard over %d ranks", nw,
                 tr.world);
  if (!st) st = ct_train_build_sched(cfg, tr.total, &tr.sched, err);
  if (!st) st = load_prompts(cfg, &tr.vp, err);
  if (!st) st = parse_vres(cfg, tr.g.resolution, &tr.vw, &tr.vh, err);
  if (st) goto out;
  if (cfg->use_ema) { /* own: this rank's range of it */
    const size_t ne = tr.own ? tr.hi - tr.lo : nw;
    tr.ema = ct_calloc(CT_MEM_OPTIMIZER, ne ? ne : 1, sizeof(float));
    if (!tr.ema) {
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory for the EMA weights");
      goto out;
    }
    memcpy(tr.ema, tr.own ? tr.wsh : ct_mmdit_params(tr.m), ne * sizeof(float));
  }
  ct_config_digest(cfg, s.digest);
  {
    ct_optim_kind kind;
    ct_err e2 = {0};
    snprintf(s.optimizer, sizeof s.optimizer, "%s",
             ct_optim_kind_parse(cfg->optimizer, &kind, &e2) ? cfg->optimizer : ct_optim_kind_name(kind));
  }
  ct_ckpt_io io = {tr.m, tr.ema, tr.ema, tr.opt, tr.te, cfg, tr.lo, NULL, tr.own ? tr.wsh : NULL, tr.lo, tr.hi, NULL, NULL};
  char *sampler_loaded = NULL;
  io.sampler_out = &sampler_loaded;

  /* Resume. */
  if (strcmp(cfg->resume_from_checkpoint, "none")) {
    char dir[4096] = "";
    long cs = 0;
    int have = 0;
    ct_status pulled = CT_OK; /* output_dir s3://: rank 0 fetches a newer remote checkpoint first */
    if (!strcmp(cfg->resume_from_checkpoint, "latest")) {
      long ps = 0;
      if (lead && tr.remote) pulled = ct_remote_pull_latest(tr.remote, cfg->output_dir, &ps, err);
      ct_err e2 = {0};
      have = !pulled && ct_checkpoint_latest(cfg->output_dir, dir, sizeof dir, &cs, &e2) == CT_OK;
    } else {
      snprintf(dir, sizeof dir, "%s", cfg->resume_from_checkpoint);
      have = 1;
    }
    if (tr.world > 1) { /* rank 0 decides, so no rank resumes from another step */
      char msg[4100];
      msg[0] = pulled ? 2 : (char)have;
      memcpy(msg + 1, dir, sizeof dir);
      st = ct_comm_broadcast(comm, msg, sizeof msg, 0, err);
      if (st) goto out;
      if (msg[0] == 2 && !pulled)
        pulled = ct_errf(err, CT_ERR_IO, "rank 0 could not download the newest checkpoint of the output bucket");
      have = msg[0] == 1;
      memcpy(dir, msg + 1, sizeof dir);
      dir[sizeof dir - 1] = 0;
    }
    if (pulled) {
      st = pulled;
      goto out;
    }
    if (have) {
      char digest[17];
      char optname[sizeof s.optimizer];
      memcpy(digest, s.digest, sizeof digest);
      memcpy(optname, s.optimizer, sizeof optname);
      ct_health_stage(tr.h, "init_resume_checkpoint", "Resuming from checkpoint", "running", 0);
      st = ct_checkpoint_load(dir, &io, &s, err);
      if (st) {
        ct_err_prefix(err, "resume_from_checkpoint: ");
        goto out;
      }
      ct_health_stage(tr.h, "init_resume_checkpoint", "Resuming from checkpoint", "completed", 100);
      if (strcmp(digest, s.digest))
        CT_WARN("resuming %s with a different configuration (digest %s, checkpoint %s)", dir,
                digest, s.digest);
      memcpy(s.digest, digest, sizeof digest);
      memcpy(s.optimizer, optname, sizeof optname); /* this run's optimizer, as the digest */
      CT_INFO("resumed from %s at step %ld (epoch %ld)", dir, s.global_step, s.epoch + 1);
      if (!sampler_loaded) { /* a checkpoint from before the bucketed loader: epoch and sample ids only */
        char buf[256];
        snprintf(buf, sizeof buf, "{\"epoch\": %ld, \"step_in_epoch\": 0, \"samples_seen\": %ld, \"datasets\": {}}",
                 s.epoch, s.samples_seen);
        sampler_loaded = strdup(buf);
      }
      if (sampler_loaded) st = ct_dataset_state_restore(tr.ds, sampler_loaded, err);
      free(sampler_loaded);
      sampler_loaded = NULL;
      if (st) {
        ct_err_prefix(err, "%s: ", dir);
        goto out;
      }
    }
    if (tr.world > 1) { /* every rank must have read the same state */
      long mine[2] = {s.global_step, s.samples_seen}, root[2] = {s.global_step, s.samples_seen};
      st = ct_comm_broadcast(comm, root, sizeof root, 0, err);
      if (!st && (root[0] != mine[0] || root[1] != mine[1]))
        st = ct_errf(err, CT_ERR_IO,
                     "rank %d resumed at step %ld but rank 0 at step %ld: %s is not the same on every "
                     "machine (output_dir must be a shared file system)",
                     tr.rank, mine[0], root[0], have ? dir : cfg->output_dir);
      if (st) goto out;
    }
  }
  io.sampler_out = NULL;
  sum->start_step = s.global_step;
  if (tr.opt && ct_optim_onebit_of(cfg->optimizer)) { /* loaded and resumed: the moments are tr.opt's */
    size_t np;
    const ct_param *tab = ct_mmdit_table(tr.m, &np);
    size_t *offs = malloc((np + 1) * sizeof *offs), *lens = malloc((np + 1) * sizeof *lens);
    if (!offs || !lens) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < np; i++) offs[i] = tab[i].offset, lens[i] = tab[i].numel;
    if (!st)
      st = ct_onebit_new(comm, nw, offs, lens, np, ct_optim_state(tr.opt, 0, NULL), ct_optim_state(tr.opt, 1, NULL),
                         (float)cfg->adam_beta1, (float)cfg->adam_beta2, (float)cfg->adam_epsilon,
                         (float)cfg->adam_weight_decay, cfg->freeze_step, &tr.ob, err);
    free(offs);
    free(lens);
    const int zo = ct_optim_onebit_of(cfg->optimizer) == CT_OPTIM_ONEBIT_ZEROONE_ADAM,
              lb = ct_optim_onebit_of(cfg->optimizer) == CT_OPTIM_ONEBIT_LAMB;
    if (!st && zo) {
      ct_zeroone_hp zh = {cfg->var_freeze_step, cfg->var_update_scaler, cfg->local_step_scaler,
                          cfg->local_step_clipper};
      st = ct_onebit_zeroone(tr.ob, &zh, err);
    }
    if (!st && lb) {
      ct_onebit_lamb_hp lh = {(float)cfg->lamb_max_coeff, (float)cfg->lamb_min_coeff, (float)cfg->lamb_coeff_beta,
                              (float)cfg->lamb_factor_max, (float)cfg->lamb_factor_min,
                              (float)cfg->lamb_factor_threshold};
      st = ct_onebit_lamb(tr.ob, &lh, err);
      if (!st && s.opt_steps >= cfg->freeze_step) {
        /* the frozen trust ratios are not checkpointed: warm up again from the loaded moments */
        ct_onebit_set_freeze(tr.ob, s.opt_steps + cfg->freeze_step);
        if (lead)
          CT_WARN("OneBitLamb resumed at step %ld, past freeze_step %ld: its trust-ratio state is not in the "
                  "checkpoint, so %ld more full-precision warm-up steps re-estimate it",
                  s.opt_steps, cfg->freeze_step, cfg->freeze_step);
      }
    }
    if (st) goto out;
    if (lead && lb)
      CT_INFO("OneBitLamb: Lamb warm-up for %ld steps (trust ratios averaged), then 1-bit compressed momentum with "
              "the frozen trust ratios scaled by the re-estimated variance",
              cfg->freeze_step);
    if (lead && !zo && !lb)
      CT_INFO("OneBitAdam: full-precision warm-up for %ld steps, then 1-bit compressed momentum (error "
              "feedback starts at zero%s)",
              cfg->freeze_step, s.opt_steps ? "; a resume resets it, as DeepSpeed" : "");
    if (lead && zo)
      CT_INFO("ZeroOneAdam: variance updated at doubling intervals (x2 every %ld updates) until step %ld, 1-bit "
              "gradients between; then local steps, synchronised every 1, 2, ... %ld steps (x2 every %ld)%s",
              cfg->var_update_scaler, cfg->var_freeze_step, cfg->local_step_clipper, cfg->local_step_scaler,
              s.opt_steps ? "; a resume restarts the schedules, as DeepSpeed" : "");
  }
  if (tr.stage >= 2 || tr.bf16) { /* loaded and resumed: now shard / round to bf16 */
    size_t bucket = (size_t)cfg->reduce_bucket_size;
    if (!bucket) bucket = (size_t)tr.g.mc.hidden * (size_t)tr.g.mc.hidden;
    st = zero_init(&tr.z, comm, tr.m, tr.stage, tr.bf16, bucket, tr.own ? tr.wsh : NULL, err);
    if (st) goto out;
    if (lead && tr.stage >= 2)
      CT_INFO("ZeRO-%d: %zu of %zu parameters per rank; gradients reduced in buckets of %zu elements during the "
              "backward%s",
              tr.stage, tr.hi - tr.lo, nw, tr.z.cap,
              tr.stage >= 3 ? "; each block's parameters gathered before it runs, the next one prefetched" : "");
    if (lead && tr.bf16)
      CT_INFO("mixed_precision bf16: bf16 parameters, gradients and communication; float32 master weights and "
              "optimizer state for %zu parameters per rank; float32 compute",
              tr.hi - tr.lo);
  }
  if (tr.opt && ((cfg->offload_optimizer && !strcmp(cfg->offload_optimizer, "nvme")) ||
                 (cfg->offload_param && !strcmp(cfg->offload_param, "nvme")))) { /* loaded, resumed, sharded: to the swap file */
    st = start_offload(&tr, err);
    if (st) goto out;
  }
  if (lead) tr.metrics = ct_train_open_metrics(cfg->output_dir, s.global_step);
  if (lead && !tr.metrics) {
    st = ct_errf(err, CT_ERR_IO, "%s/metrics.jsonl: cannot open: %s", cfg->output_dir, strerror(errno));
    goto out;
  }

  const int T = tr.g.T;
  const size_t lat = ct_dataset_max_latent(tr.ds);
  const int d = tr.g.mc.context_in_dim;
  tr.eps = ct_alloc(CT_MEM_BUFFERS, B * lat * sizeof(float));
  tr.xt = ct_alloc(CT_MEM_BUFFERS, B * lat * sizeof(float));
  tr.v = ct_alloc(CT_MEM_BUFFERS, B * lat * sizeof(float));
  tr.dv = ct_alloc(CT_MEM_BUFFERS, B * lat * sizeof(float));
  tr.t = ct_alloc(CT_MEM_BUFFERS, B * sizeof(float));
  tr.txt = ct_alloc(CT_MEM_BUFFERS, (size_t)B * T * d * sizeof(float));
  tr.y = ct_alloc(CT_MEM_BUFFERS, (size_t)B * d * sizeof(float));
  if (!tr.eps || !tr.xt || !tr.v || !tr.dv || !tr.t || !tr.txt || !tr.y) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory for the batch buffers");
    goto out;
  }

  float *w = ct_mmdit_params(tr.m), *g = ct_mmdit_grads(tr.m);
  first_step = s.global_step;
  ct_health_status(tr.h, "running", s.global_step, tr.total, -1, NAN);
  last_status = now_s();
  while (s.global_step < tr.total) {
    const double t0 = now_s();
    const long step = s.global_step + 1;
    const double lr = ct_sched_lr(&tr.sched, s.global_step);
    if (tr.stage >= 2 || tr.bf16)
      zero_begin_step(&tr.z);
    else
      memset(g, 0, nw * sizeof(float));
    double loss = 0;
    for (int a = 0; a < accum && !st; a++) {
      double l;
      st = micro_batch(&tr, &s, accum, step, &l, err);
      loss += l / accum;
    }
    if (st) goto out;
    /* Each rank's gradient is already divided by the world size: sums are means. */
    float *gstep = g; /* the gradient the optimizer sees: all of it, or this rank's shard */
    double gn;
    if (tr.bf16) { /* bf16 gradients reduced (zero.c), this rank's range in float32 */
      st = zero_bf16_grads(&tr.z, &gstep, err);
      /* stage 0: every rank holds the whole (identical) gradient */
      double red[2] = {loss, tr.stage == 0 && tr.rank > 0 ? 0 : ct_train_sumsq(gstep, tr.hi - tr.lo)};
      if (!st) st = ct_comm_allreduce_f64(comm, red, 2, err);
      if (st) goto out;
      loss = red[0] / tr.world;
      gn = sqrt(red[1]);
    } else if (tr.stage >= 2) { /* reduced during the backward, bucket by bucket (zero.c) */
      double red[2] = {loss, ct_train_sumsq(tr.z.gsh, tr.hi - tr.lo)};
      st = ct_comm_allreduce_f64(comm, red, 2, err);
      if (st) goto out;
      loss = red[0] / tr.world;
      gn = sqrt(red[1]);
      gstep = tr.z.gsh;
    } else if (tr.zero) {
      double red[2] = {loss, 0};
      /* in place: this rank's slot of the gradient buffer receives its reduced shard */
      st = ct_comm_reduce_scatter_f32(comm, g, nw, g + tr.lo, tr.shard, err);
      red[1] = ct_train_sumsq(g + tr.lo, tr.hi - tr.lo);
      if (!st) st = ct_comm_allreduce_f64(comm, red, 2, err);
      if (st) goto out;
      loss = red[0] / tr.world;
      gn = sqrt(red[1]);
      gstep = g + tr.lo;
    } else if (tr.ob && !ct_onebit_full_gradient(tr.ob, s.opt_steps + 1)) {
      /* 1-bit Adam after freeze_step, 0/1 Adam outside its variance steps: no
       * gradient all-reduce; each rank steps with its own mean gradient (world
       * x its share), the norm reported and clipped is the RMS over ranks */
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < nw; i++) g[i] *= (float)tr.world;
      double red[2] = {loss, ct_train_sumsq(g, nw)};
      st = ct_comm_allreduce_f64(comm, red, 2, err);
      if (st) goto out;
      loss = red[0] / tr.world;
      gn = sqrt(red[1] / tr.world);
    } else {
      if (tr.world > 1) {
        st = ct_comm_allreduce_f32(comm, g, nw, err);
        double lsum = loss;
        if (!st) st = ct_comm_allreduce_f64(comm, &lsum, 1, err);
        if (st) goto out;
        loss = lsum / tr.world;
      }
      gn = sqrt(ct_train_sumsq(g, nw));
    }
    /* The circuit breaker, agreed by every rank: a fault anywhere stops every
     * rank here, before this step changes the weights, without a checkpoint. */
    if (tr.h) {
      double open = ct_health_is_open(tr.h);
      if (tr.world > 1 && (st = ct_comm_allreduce_f64(comm, &open, 1, err))) goto out;
      if (open > 0) {
        sum->joint_stop = 1;
        st = ct_health_is_open(tr.h)
                 ? ct_errf(err, CT_ERR_HEALTH, "circuit breaker open before step %ld: %s; stopped without a checkpoint "
                           "(the newest one, if any, resumes)", step, ct_health_reason(tr.h))
                 : ct_errf(err, CT_ERR_HEALTH, "circuit breaker open on %.0f other rank(s) before step %ld; stopped "
                           "without a checkpoint (the newest one, if any, resumes)", open, step);
        goto out;
      }
    }
    ct_step_info info = {step, tr.total, s.epoch, loss, lr, gn, 0, 0, 0, NULL};
    if (!isfinite(loss) || !isfinite(gn)) {
      s.nonfinite_run++;
      s.nonfinite_total++;
      info.skipped = 1;
      CT_WARN("step %ld: %s is not finite; step skipped (%ld in a row, %ld in all)", step,
              isfinite(loss) ? "the gradient norm" : "the loss", s.nonfinite_run, s.nonfinite_total);
      if (s.nonfinite_run >= cfg->max_nonfinite_steps) {
        /* a runtime fault every rank sees at the same step (the loss is reduced) */
        st = ct_errf(err, CT_ERR_HEALTH,
                     "stopping: %ld consecutive steps had NaN/Inf loss or gradients (max_nonfinite_steps "
                     "= %ld); the newest checkpoint predates the trouble; lower learning_rate or set "
                     "max_grad_norm",
                     s.nonfinite_run, cfg->max_nonfinite_steps);
        ct_health_runtime_fault(tr.h, "nonfinite_loss", "FloatingPointError", err->msg, lead);
        sum->joint_stop = 1;
        goto out;
      }
    } else {
      s.nonfinite_run = 0;
      const size_t ns = tr.hi - tr.lo;
      if (cfg->max_grad_norm > 0 && gn > cfg->max_grad_norm) {
        const float c = (float)(cfg->max_grad_norm / (gn + 1e-6));
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < ns; i++) gstep[i] *= c;
      }
      s.opt_steps++;
      float *wstep = tr.own ? tr.wsh : w + tr.lo; /* this rank's (master) weights */
      const double dcy0 = (1.0 + s.opt_steps) / (10.0 + s.opt_steps);
      const float dcy = (float)(dcy0 < cfg->ema_decay ? dcy0 : cfg->ema_decay);
      const int ema_due = tr.ema && s.opt_steps % cfg->ema_update_interval == 0;
      if (tr.ob) {
        st = ct_onebit_step(tr.ob, wstep, gstep, (float)lr, s.opt_steps, err);
      } else if (tr.off) { /* offload_param: the EMA follows each sub-group of weights as it passes */
        off_step os = {&tr, wstep, gstep, (float)lr, s.opt_steps, tr.widx >= 0 && ema_due ? tr.ema : NULL, dcy};
        st = ct_offload_foreach(tr.off, off_step_fn, &os, err);
      } else if (tr.opt) {
        st = ct_optim_step(tr.opt, wstep, gstep, (float)lr, s.opt_steps, err);
      }
      if (!st && tr.zero && !tr.own && tr.world > 1) /* every rank gets every updated shard, in place */
        st = ct_comm_allgather_f32(comm, w + tr.lo, w, tr.shard, nw, err);
      if (!st && tr.own) st = zero_params_changed(&tr.z, err); /* bf16 rounding and sharing; stale slots */
      if (st) goto out;
      if (ema_due && tr.widx < 0) {
        float *e = tr.ema;
        const float *src = tr.own ? tr.wsh : w;
        const size_t ne = tr.own ? tr.hi - tr.lo : nw;
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < ne; i++) e[i] = dcy * e[i] + (1.0f - dcy) * src[i];
      }
      s.last_loss = loss;
      sum->last_loss = loss;
    }
    s.global_step = step;
    info.seconds = now_s() - t0;
    sum->loop_seconds += info.seconds; /* steps only: not validation or checkpoints */
    info.samples_per_s = (double)GB * accum / (info.seconds > 0 ? info.seconds : 1e-9);
    if (lead) {
    fprintf(tr.metrics,
            "{\"step\": %ld, \"epoch\": %ld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
            "\"seconds\": %.4f, \"samples_per_s\": %.3f, \"skipped\": %s}\n",
            step, s.epoch + 1, loss, lr, gn, info.seconds, info.samples_per_s,
            info.skipped ? "true" : "false");
    fflush(tr.metrics);
    }
    if (cb && lead) cb(&info, user);
    const int last = s.global_step == tr.total;
    if (tr.h && lead && (last || now_s() - last_status >= cfg->webhook_status_interval)) {
      const double per = sum->loop_seconds / (double)(step - first_step);
      ct_health_status(tr.h, "running", step, tr.total, per * (double)(tr.total - step), loss);
      last_status = now_s();
    }
    char ev[4300];
    if ((cfg->validation_step_interval && step % cfg->validation_step_interval == 0) || last) {
      int nimg = 0;
      full_view fv;
      float *ema_mine = tr.ema;
      st = gather_full(&tr, &fv, err); /* own: the full model on rank 0 */
      if (!st && lead) {
        if (tr.own) tr.ema = fv.e;
        st = validate(&tr, step, &nimg, err);
        tr.ema = ema_mine;
      }
      release_full(&tr, &fv);
      if (st) goto out;
      if (nimg) {
        char vdir[4200];
        snprintf(vdir, sizeof vdir, "%s/validation_images", cfg->output_dir);
        ct_health_validation(tr.h, step, nimg, vdir);
      }
      if (nimg && cb) {
        snprintf(ev, sizeof ev, "validation: %d images in %s/validation_images", nimg, cfg->output_dir);
        ct_step_info e = info;
        e.event = ev;
        cb(&e, user);
      }
    }
    const int due = (cfg->checkpoint_step_interval && step % cfg->checkpoint_step_interval == 0) || last;
    if (due && s.nonfinite_run > 0) {
      /* Never checkpoint in the middle of NaN/Inf trouble: the newest
       * checkpoint stays one from before it. */
      CT_WARN("step %ld: checkpoint skipped: the last %ld step(s) were not finite", step, s.nonfinite_run);
    } else if (due) {
      st = checkpoint_gate(&tr, step, sum, err); /* free space, and no fault since the step began */
      if (st) goto out;
      ct_health_stage(tr.h, "checkpoint_save", "Saving checkpoint", "running", 0);
      /* Every rank holds the same weights. ZeRO-1: the optimizer state is
       * gathered for rank 0, which writes a checkpoint any world size or stage
       * can resume (docs/distributed.md). */
      full_view fv;
      float **ost = NULL;
      st = gather_full(&tr, &fv, err);
      if (tr.own) io.ema = fv.e;
      if (!st) st = offload_states(&tr, &ost, err);
      io.opt_states = ost;
      char *sj = ct_dataset_state_json(tr.ds);
      io.sampler_json = sj;
      if (!st) st = sj ? save_checkpoint(&tr, &io, &s, sum, err) : ct_errf(err, CT_ERR_NOMEM, "out of memory");
      io.sampler_json = NULL;
      free(sj);
      io.opt_states = NULL;
      free_states(&tr, ost);
      release_full(&tr, &fv);
      io.ema = tr.own ? NULL : tr.ema;
      if (st) goto out;
      if (lead && tr.remote) { /* a failed upload warns; the end of the run tries once more */
        ct_err ue = {0};
        ct_status us = ct_remote_push_checkpoint(tr.remote, sum->last_checkpoint, cfg->checkpoints_total_limit, &ue);
        if (!us) us = ct_remote_push_outputs(tr.remote, cfg->output_dir, &ue);
        if (us) CT_WARN("%s (the local copy is intact; retried at the end of the run)", ue.msg);
        snprintf(tr.remote_pending, sizeof tr.remote_pending, "%s", us ? sum->last_checkpoint : "");
      }
      ct_health_stage(tr.h, "checkpoint_save", "Saving checkpoint", "completed", 100);
      ct_health_checkpoint(tr.h, sum->last_checkpoint, step, last);
      if (cb && lead) {
        snprintf(ev, sizeof ev, "checkpoint: %s", sum->last_checkpoint);
        ct_step_info e = info;
        e.event = ev;
        cb(&e, user);
      }
    }
  }
out:
  if (tr.ob && lead) {
    double sent, full, sa, fa;
    long ns, na;
    ct_onebit_bytes(tr.ob, &sent, &full, &ns);
    ct_onebit_bytes_all(tr.ob, &sa, &fa, &na);
    const char *nm = ct_optim_onebit_name(ct_optim_onebit_of(cfg->optimizer));
    if (ns)
      CT_INFO("%s: %ld compressed round(s): %.3f MB sent per rank instead of %.3f MB of float32 "
              "all-reduce (%.1fx less)",
              nm, ns, sent / 1e6, full / 1e6, sent > 0 ? full / sent : 0.0);
    if (na)
      CT_INFO("%s: all %ld step(s): %.3f MB sent per rank for gradients and momentum instead of %.3f MB with a "
              "float32 all-reduce every step (%.1fx less)",
              nm, na, sa / 1e6, fa / 1e6, sa > 0 ? fa / sa : 0.0);
  }
  if (tr.off && lead)
    CT_INFO("offload: %.1f MB moved, %.3f s waiting for reads (%s)", ct_offload_bytes(tr.off) / 1e6,
            ct_offload_wait_s(tr.off), ct_offload_mode(tr.off));
  if ((tr.stage >= 2 || tr.bf16) && tr.z.comm && lead)
    CT_INFO("ZeRO-%d: %ld bucket reductions, %ld parameter gathers not prefetched, %.3f s waiting for "
            "communication",
            tr.stage, tr.z.buckets, tr.z.misses, tr.z.wait_s);
  if (st == CT_OK && tr.h) { /* a fault during the last step's validation or checkpoint */
    double open = ct_health_is_open(tr.h);
    if (tr.world > 1) st = ct_comm_allreduce_f64(comm, &open, 1, err);
    if (!st && open > 0) {
      sum->joint_stop = 1;
      st = ct_errf(err, CT_ERR_HEALTH, "circuit breaker open at the end of training%s%s",
                   ct_health_is_open(tr.h) ? ": " : " (on another rank)", ct_health_reason(tr.h));
    }
  }
  /* A rank alone short of memory or cut off from the others is a runtime
   * fault too: the breaker opens and the CLI ends the job with its code. */
  if (tr.h && (st == CT_ERR_NOMEM || st == CT_ERR_COMM)) {
    ct_health_runtime_fault(tr.h, "runtime_error", st == CT_ERR_NOMEM ? "MemoryError" : "CollectiveError", err->msg, 1);
    st = CT_ERR_HEALTH;
  }
  if (st == CT_OK && lead && tr.remote && tr.remote_pending[0]) { /* after every collective */
    st = ct_remote_push_checkpoint(tr.remote, tr.remote_pending, cfg->checkpoints_total_limit, err);
    if (!st) st = ct_remote_push_outputs(tr.remote, cfg->output_dir, err);
    if (st) ct_err_prefix(err, "the last checkpoint is only local (%s): ", tr.remote_pending);
  }
  if (st == CT_OK) {
    ct_health_stage(tr.h, "training_complete", "Training complete", "completed", 100);
  } else if (tr.h) {
    ct_health_stage(tr.h, "training_abort", "Training stopped", "failed", 100 * (double)s.global_step / (double)(tr.total ? tr.total : 1));
    if (!sum->joint_stop || lead) { /* one error event for a stop every rank made */
      char title[96];
      snprintf(title, sizeof title, "Training failed: %s", ct_status_name(st));
      ct_health_error(tr.h, title, err->msg);
    }
  }
  sum->end_step = s.global_step;
  sum->skipped_nonfinite = s.nonfinite_total;
  sum->seconds = now_s() - t_start;
  sum->data_wait_seconds = tr.data_wait;
  if (sum->loop_seconds > 0 && lead)
    CT_INFO("data: waited %.2f s for batches in %.2f s of training steps (%.1f%%)", tr.data_wait, sum->loop_seconds,
            100.0 * tr.data_wait / sum->loop_seconds);
  trainer_free(&tr);
  return st;
}

/* ---- inference pipeline from a checkpoint ---- */
ct_status ct_pipeline_from_checkpoint(const char *dir, int use_ema, ct_pipeline *p, ct_err *err) {
  memset(p, 0, sizeof *p);
  ct_config_defaults(&p->cfg);
  char path[4200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  ct_status st = ct_config_load_file(&p->cfg, path, err);
  if (!st && p->cfg.codec && !strcmp(p->cfg.codec, "vae")) {
    /* the checkpoint's own copy of the VAE (vae/), else the directory its config names */
    char vdir[4200];
    struct stat sb;
    snprintf(vdir, sizeof vdir, "%s/vae/config.json", dir);
    if (stat(vdir, &sb) == 0) {
      snprintf(vdir, sizeof vdir, "%s/vae", dir);
      char *c = strdup(vdir);
      if (!c) st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
      else {
        free(p->cfg.pretrained_vae_model_name_or_path);
        p->cfg.pretrained_vae_model_name_or_path = c;
      }
    }
  }
  ct_geometry g;
  if (!st) st = ct_geometry_from_config(&p->cfg, &g, err);
  if (st) goto fail;
  p->T = g.T;
  p->codec_scale = g.codec_scale;
  if (p->cfg.codec && !strcmp(p->cfg.codec, "vae")) {
    st = ct_codec_vae(p->cfg.pretrained_vae_model_name_or_path, (int)p->cfg.vae_tile, (uint64_t)p->cfg.seed,
                      &p->codec, err);
  } else {
    st = ct_codec_pixel(g.codec_scale, &p->codec, err);
  }
  if (st) goto fail;
  st = ct_mmdit_new(&g.mc, 0, 0, &p->model, err);
  if (st) goto fail;
  snprintf(path, sizeof path, "%s/%s.safetensors", dir, use_ema ? "ema" : "model");
  if (use_ema && access(path, R_OK) != 0) {
    st = ct_errf(err, CT_ERR_NOT_FOUND, "%s: no EMA weights in this checkpoint (trained without use_ema)", path);
    goto fail;
  }
  st = ct_mmdit_load(p->model, path, "", err);
  if (st) goto fail;
  st = ct_textenc_from_config(&p->cfg, g.mc.context_in_dim, dir, &p->te, err);
  if (st) goto fail;
  return CT_OK;
fail:
  ct_pipeline_free(p);
  return st;
}

void ct_pipeline_free(ct_pipeline *p) {
  ct_codec_free(&p->codec);
  ct_mmdit_free(p->model);
  ct_textenc_free(p->te);
  ct_config_free(&p->cfg);
  memset(p, 0, sizeof *p);
}

/* output_dir s3://bucket/prefix: the run works in the local directory and
 * mirrors its checkpoints (src/train/remote.c). */
static ct_status with_output(const ct_config *cfg, int lead, ct_config *local_cfg, ct_remote **remote,
                             char **local, ct_err *err) {
  *local_cfg = *cfg;
  *remote = NULL;
  *local = NULL;
  if (!ct_remote_wanted(cfg)) return CT_OK;
  ct_status st = ct_remote_open(cfg, lead, remote, local, err);
  if (st) return st;
  local_cfg->output_dir = *local;
  if (lead) CT_INFO("output_dir %s: working in %s; checkpoints are mirrored to the bucket", cfg->output_dir, *local);
  return CT_OK;
}

ct_status ct_train_run(const ct_config *cfg, ct_comm *comm, ct_step_cb cb, void *user, ct_train_summary *sum,
                       ct_err *err) {
  if (cfg->model_type && !strcmp(cfg->model_type, "vae")) return ct_vae_train_run(cfg, comm, cb, user, sum, err);
  ct_config c2;
  ct_remote *r;
  char *local;
  memset(sum, 0, sizeof *sum);
  ct_status st = with_output(cfg, ct_comm_rank(comm) == 0, &c2, &r, &local, err);
  if (!st) st = train_run(&c2, r, comm, cb, user, sum, err);
  ct_remote_free(r);
  free(local);
  return st;
}

ct_status ct_cache_run(const ct_config *cfg_in, ct_comm *comm, ct_data_stats *stats, ct_err *err) {
  ct_config c2;
  ct_remote *r;
  char *local;
  ct_status st0 = with_output(cfg_in, 0, &c2, &r, &local, err);
  ct_remote_free(r);
  if (st0) return st0;
  const ct_config *cfg = &c2;
  trainer tr = {0};
  tr.widx = -1;
  tr.cfg = cfg;
  tr.comm = comm;
  tr.rank = ct_comm_rank(comm);
  tr.world = ct_comm_size(comm);
  ct_status st = open_data(&tr, err);
  if (!st) ct_dataset_stats(tr.ds, stats);
  trainer_free(&tr);
  free(local);
  return st;
}
