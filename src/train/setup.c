/* What a training run builds from its config before the first step: the
 * model geometry, the frozen text encoder and its view for the text cache,
 * the LR schedule, the optimizer hyperparameters, metrics.jsonl, and the
 * dataset with its caches (ct_trainer_open_data, shared with `ctuner cache`).
 * Also the deterministic gradient sum of squares every strategy uses. */
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
#include "ctuner/hash.h"
#include "ctuner/json.h"
#include "ctuner/kernels.h"
#include "ctuner/log.h"
#include "ctuner/rng.h"
#include "ctuner/vae.h"
#include "train/textcond.h"
#include "trainer_int.h"

ct_status ct_geometry_from_config(const ct_config *cfg, ct_geometry *g, ct_err *err) {
  const ct_mmdit_preset *p = ct_mmdit_preset_find(cfg->preset);
  if (!p || !p->batch)
    return ct_errf(err, CT_ERR_INVALID,
                   "preset '%s' is not trainable; choose one of tiny, small, demo, bench",
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
    return ct_errf(err, CT_ERR_INVALID,
                   "resolution %d must be a multiple of %d (codec factor %d x patch 2)", res, 2 * s,
                   s);
  if (g->mc.context_in_dim != g->mc.vec_in_dim)
    return ct_errf(err, CT_ERR_INVALID, "preset '%s' has context_in_dim != vec_in_dim",
                   cfg->preset);
  return ct_mmdit_config_validate(&g->mc, err);
}

ct_status ct_textenc_from_config(const ct_config *cfg, int hidden, const char *ckpt_dir,
                                 ct_textenc **te, ct_err *err) {
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

/* The optimizer over [lo, hi) of the flat buffer (everything without ZeRO).
 * Tensors cut by lo or hi become fragments; the tensor-wise kinds (Lamb's
 * trust ratio, Muon's orthogonalisation) need whole tensors and refuse. */
void ct_train_optim_hp(const ct_config *cfg, ct_optim_kind kind, ct_optim_hp *hp) {
  /* SimpleTuner's names: its fixed settings, optimizer_config or
   * optimizer_beta1/2 over them, never the adam_* keys (ctuner/optim.h;
   * the config check refused what ctuner cannot honour and warned about the
   * rest) */
  const ct_optim_preset *p = ct_config_optimizer_preset(cfg, NULL);
  if (p) {
    const int oc = cfg->optimizer_config && *cfg->optimizer_config;
    const float betas[2] = {(float)cfg->optimizer_beta1, (float)cfg->optimizer_beta2};
    const int both = cfg->given[CT_KEY_optimizer_beta1] && cfg->given[CT_KEY_optimizer_beta2];
    ct_status st = ct_optim_preset_hp(p, kind, oc ? cfg->optimizer_config : NULL,
                                      both && !oc ? betas : NULL, hp, NULL, 0, NULL);
    if (st) /* ct_config_validate refuses such a config first; not reached by a run */
      ct_optim_preset_hp(p, kind, NULL, NULL, hp, NULL, 0, NULL);
    return;
  }
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
  hp->bias_correction_off = !cfg->optimizer_bias_correction;
  /* plain Lamb clamps its trust ratio where the bounds were set (a DeepSpeed
   * Lamb always sets them, as FusedLamb always clamps); else the plain ratio */
  if (kind == CT_OPTIM_LAMB &&
      (cfg->given[CT_KEY_lamb_max_coeff] || cfg->given[CT_KEY_lamb_min_coeff])) {
    hp->lamb_max_coeff = (float)cfg->lamb_max_coeff;
    hp->lamb_min_coeff = (float)cfg->lamb_min_coeff;
  }
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

/* Deterministic sum of squares: fixed chunks summed in double, in order (the kernel layer's). */
double ct_train_sumsq(const float *g, size_t n) {
  return ct_sumsq(n, g);
}

/* Keep metrics.jsonl lines of steps <= `upto` (a resume rewrites the tail). */
FILE *ct_train_open_metrics(const char *out, long upto) {
  char p[4200], tmp[4300];
  snprintf(p, sizeof p, "%s/metrics.jsonl", out);
  if (upto > 0) {
    FILE *in = fopen(p, "rb");
    if (!in) return fopen(p, "ab"); /* no metrics yet */
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    FILE *o = fopen(tmp, "wb");
    int bad = !o;
    char line[4096];
    while (o && fgets(line, sizeof line, in)) {
      long s;
      if (sscanf(line, "{\"step\": %ld", &s) == 1 && s <= upto) fputs(line, o);
    }
    fclose(in);
    /* the tail past upto must go, or the resumed steps would appear twice:
     * a failed write or rename is a failure (errno kept for the caller) */
    if (o && fclose(o) != 0) bad = 1;
    if (!bad && rename(tmp, p) != 0) bad = 1;
    if (bad) {
      const int e = errno;
      if (o) remove(tmp);
      errno = e;
      return NULL;
    }
    return fopen(p, "ab");
  }
  return fopen(p, "wb");
}

static ct_status text_encode(void *ctx, const char *const *caps, int n, float *seq, float *pooled,
                             ct_err *err) {
  const ct_text_cb *cb = ctx;
  return ct_textcond_encode(cb->tc, caps, n, seq, pooled, err);
}

ct_status ct_text_fn_init(ct_text_cb *cb, int d, int dp, ct_text_encoder_fn *fn, ct_err *err) {
  /* The tag is a digest of the encoder's output on probe captions: any change
   * of weights, tokenizer or length names different cache files. */
  static const char *const probe[3] = {"", "a small red circle at the top left",
                                       "ctuner text cache probe 0123"};
  const size_t Td = (size_t)cb->T * (size_t)d;
  float *seq = malloc(3 * Td * sizeof(float)), *pooled = malloc(3 * (size_t)dp * sizeof(float));
  ct_status st = seq && pooled ? ct_textcond_encode(cb->tc, probe, 3, seq, pooled, err)
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

/* Keys set in the config that the model type does not use draw one warning
 * naming them all (a SimpleTuner config carries keys of every model). */
static void warn_inapplicable(const ct_config *cfg) {
  const char *mt = cfg->model_type ? cfg->model_type : "full";
  char list[1024] = "";
  int n = 0;
  ct_config_key_info ki;
  for (size_t i = 0; ct_config_key_info_at(i, &ki); i++) {
    if (!cfg->given[i] || ct_config_key_applies(ki.name, mt) != 0) continue;
    const size_t l = strlen(list);
    if (n++ < 12) snprintf(list + l, sizeof list - l, "%s%s", l ? ", " : "", ki.name);
  }
  if (cfg->no_effect[0]) { /* SimpleTuner keys without a meaning here: one warning naming each */
    char why[2048] = "", keys[sizeof cfg->no_effect];
    snprintf(keys, sizeof keys, "%s", cfg->no_effect);
    char *save = NULL;
    for (char *k = strtok_r(keys, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
      const size_t l = strlen(why);
      snprintf(why + l, sizeof why - l, "%s%s (%s)", l ? "; " : "", k, ct_config_no_effect(k));
    }
    CT_WARN("key(s) accepted with no effect here: %s", why);
  }
  if (n)
    CT_WARN(
        "model_type %s: %d key(s) set in the config apply to another model type and have no effect "
        "here: %s%s "
        "(ctuner train --help-keys lists each key's model types)",
        mt, n, list, n > 12 ? ", ..." : "");
}

/* Everything up to the data: config checks, threads per rank, output_dir,
 * then the task's frozen parts and the dataset with its caches built (every
 * rank together). Shared by training and `ctuner cache`. */
ct_status ct_trainer_open_data(trainer *tr, ct_err *err) {
  const ct_config *cfg = tr->cfg;
  ct_comm *comm = tr->comm;
  ct_status st = ct_config_validate(cfg, err);
  if (!st) { /* the files the config names, as `ctuner config check` checks them: before the caches
              */
    ct_config_problems probs = {0};
    if (ct_train_check_files(cfg, &probs)) st = ct_config_problems_to_err(&probs, err);
    ct_config_problems_free(&probs);
  }
  if (!st) st = tr->task->configure(tr, err);
  if (st) return st;
  if (tr->rank == 0) {
    warn_inapplicable(cfg);
    char dn[512];
    ct_config_defaults_note(cfg, dn, sizeof dn);
    if (dn[0]) CT_INFO("SimpleTuner's defaults in effect for keys not set: %s", dn);
  }
  if (!cfg->data_backend_config)
    return ct_errf(err, CT_ERR_INVALID,
                   "data_backend_config is required: a multidatabackend.json "
                   "listing the datasets (docs/training.md)");
  if (cfg->num_threads > 0) {
    omp_set_num_threads((int)cfg->num_threads);
  } else if (tr->world > 1 && !getenv("OMP_NUM_THREADS")) {
    /* cores of this process (its affinity mask) shared by the ranks on the node */
    int per = omp_get_num_procs() / ct_comm_local_size(comm);
    omp_set_num_threads(per < 1 ? 1 : per);
  }
  if (tr->rank == 0) {
    st = ct_mkdir_p(cfg->output_dir, err);
    if (st) return st;
    ct_checkpoint_clean_tmp(cfg->output_dir);
  }
  st = ct_comm_barrier(comm, err); /* output_dir exists (shared) before anyone reads it */
  return st ? st : tr->task->open(tr, err);
}

double ct_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Test hook (docs/training.md): CTUNER_FAULT_STEP_DELAY_MS=N sleeps N ms
 * before every step, so a test that must act before a run ends (stop it from
 * a web page) does not race a fast machine. */
void ct_fault_step_delay(void) {
  const char *e = getenv("CTUNER_FAULT_STEP_DELAY_MS");
  const long ms = e ? atol(e) : 0;
  if (ms > 0 && ms <= 10000) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* Test hook (docs/testing.md): CTUNER_FAULT_NAN_AT_STEP=a,b,... poisons the
 * loss gradient of those steps with NaN, to exercise the skip logic. */
int ct_fault_nan(long step) {
  const char *e = getenv("CTUNER_FAULT_NAN_AT_STEP");
  if (!e) return 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", e);
  char *save = NULL;
  for (char *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save))
    if (atol(p) == step) return 1;
  return 0;
}
