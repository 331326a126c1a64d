/* names.c: SimpleTuner's names for things ctuner does differently, and the
 * "did you mean" for keys nobody knows.
 *
 * Three tables: SimpleTuner keys with no effect here (accepted, one warning
 * each), SimpleTuner keys ctuner does not implement (refused with what is
 * missing, never pointed at a look-alike key), and HINTS: spellings and
 * renames seen in real configs that are not accepted as they are but whose
 * meaning is known (weight_decay -> adam_weight_decay). Everything else gets
 * a hint only when it is close to exactly one key: a Damerau-Levenshtein
 * distance over the '_'-separated words (a typo inside a word costs its share
 * of that word, a different word costs 1, two words swapped 0.5; the total
 * must stay below one word), or one edit apart once the underscores are
 * taken out ("train_batchsize"). Ties between different keys give no hint.
 */
#include <stdio.h>
#include <string.h>

#include "config_int.h"

/* SimpleTuner keys that mean nothing here: accepted with one warning (the
 * trainer's) naming each and why, never silently and never fatal. */
static const struct {
  const char *key, *why;
} NO_EFFECT[] = {
    {"push_to_hub", "ctuner does not upload to the Hugging Face Hub"},
    {"push_checkpoints_to_hub", "ctuner does not upload to the Hugging Face Hub"},
    {"hub_model_id", "ctuner does not upload to the Hugging Face Hub"},
    {"tracker_image_layout",
     "wandb's gallery/table choice; TensorBoard shows each validation image under its own tag"},
    {"validation_torch_compile", "no torch.compile: ctuner's kernels are compiled C"},
    {"disable_benchmark", "SimpleTuner's start-up validation benchmark does not exist here"},
    {"fuse_qkv_projections", "the MMDiT's q, k and v projections are already one GEMM"},
    {"ema_device", "the EMA lives beside the weights it follows (host memory)"},
    {"ema_cpu_only", "the EMA lives beside the weights it follows (host memory)"},
    {"ema_foreach_disable", "no torch foreach kernels: the EMA is one fused loop"},
    {"eval_steps_interval",
     "SimpleTuner's evaluation loss runs over `dataset_type: eval` backends, which ctuner does not "
     "read"},
    {"num_eval_images", "SimpleTuner's CLIP evaluation (evaluation_type clip) is not run here"},
    {"vae_batch_size",
     "the latent cache encodes on every core in chunks; there is no VAE batch size"},
    /* DeepSpeed fields (deepspeed.c notes them under these names) */
    {"deepspeed_config.prescale_gradients",
     "gradients are summed in float32 in rank order and divided once; prescaling keeps fp16 sums "
     "in range, which float32 and bf16 (communication) do not need"},
    {"deepspeed_config.gradient_predivide_factor",
     "gradients are summed in float32 in rank order and divided once by the world size; a "
     "predivide only splits that division to keep fp16 in range"},
    {"deepspeed_config.offload_optimizer.buffer_count",
     "the swap file always moves through three buffers (read, step, write)"},
    {"deepspeed_config.offload_param.buffer_count",
     "the swap file always moves through three buffers (read, step, write)"},
    {"deepspeed_config.offload_param.max_in_cpu",
     "ZeRO-3 keeps no weights in host memory beyond the block being gathered; the rest stay in "
     "the swap file"},
    {"deepspeed_config.optimizer.params.bias_correction",
     "the 1-bit optimizers never bias-correct (DeepSpeed's accept the field and ignore it too)"},
};

const char *ct_config_no_effect(const char *key) {
  for (size_t i = 0; i < sizeof NO_EFFECT / sizeof NO_EFFECT[0]; i++)
    if (!strcmp(NO_EFFECT[i].key, key)) return NO_EFFECT[i].why;
  return NULL;
}

/* SimpleTuner keys ctuner does not implement: refused with what is missing,
 * not with a "did you mean" that points elsewhere. */
static const struct {
  const char *key, *why;
} NOT_HERE[] = {
    {"tread_config", "TREAD token routing is not implemented"},
    {"init_lokr_norm",
     "SimpleTuner's perturbed-normal LoKr initialisation is not implemented "
     "(ctuner starts LyCORIS adapters as LyCORIS does)"},
};

/* Other SimpleTuner options met in real configs (tests/data/realcfg) that
 * ctuner does not implement: refused by name as SimpleTuner's, never
 * answered with a look-alike key. */
static const char *const ST_OPTIONS[] = {
    "allow_tf32",
    "attention_mechanism",
    "aws_max_pool_connections",
    "conditioning_multidataset_sampling",
    "delete_problematic_images",
    "delete_unwanted_images",
    "enable_xformers_memory_efficient_attention",
    "eval_dataset_id",
    "freeze_encoder_strategy",
    "image_processing_batch_size",
    "inference_scheduler_timestep_spacing",
    "instance_prompt",
    "loss_type",
    "metadata_update_interval",
    "read_batch_size",
    "snr_gamma",
    "timestep_bias_strategy",
    "torch_num_threads",
    "training_scheduler_timestep_spacing",
    "validation_guidance_real",
    "validation_guidance_skip_layers",
    "validation_no_cfg_until_timestep",
    "write_batch_size",
};

const char *ct_cfg_not_here(const char *key) {
  for (size_t i = 0; i < sizeof NOT_HERE / sizeof NOT_HERE[0]; i++)
    if (!strcmp(NOT_HERE[i].key, key)) return NOT_HERE[i].why;
  for (size_t i = 0; i < sizeof ST_OPTIONS / sizeof ST_OPTIONS[0]; i++)
    if (!strcmp(ST_OPTIONS[i], key))
      return "a SimpleTuner option ctuner does not implement; remove it (docs/config.md lists "
             "the keys ctuner reads)";
  return NULL;
}

/* Spellings of real configs (other trainers, DeepSpeed, older SimpleTuner)
 * whose meaning is known: a hint, not an alias (the user should write the
 * key). */
static const struct {
  const char *spelling, *key;
} HINTS[] = {
    {"num_epochs", "num_train_epochs"},
    {"epochs", "num_train_epochs"},
    {"max_steps", "max_train_steps"},
    {"train_steps", "max_train_steps"},
    {"batch_size", "train_batch_size"},
    {"lr", "learning_rate"},
    {"weight_decay", "adam_weight_decay"},
    {"adam_eps", "adam_epsilon"},
    {"epsilon", "adam_epsilon"},
    {"gradient_clipping", "max_grad_norm"},
    {"grad_clip", "max_grad_norm"},
    {"validation_guidance_scale", "validation_guidance"},
    {"guidance_scale", "validation_guidance"},
    {"validation_num_steps", "validation_num_inference_steps"},
    {"save_steps", "checkpoint_step_interval"},
    {"checkpoint_steps", "checkpoint_step_interval"},
    {"save_total_limit", "checkpoints_total_limit"},
    {"checkpoints_limit", "checkpoints_total_limit"},
    {"dataloader_config", "data_backend_config"},
    {"data_backend", "data_backend_config"},
    {"multidatabackend", "data_backend_config"},
    {"lr_schedule", "lr_scheduler"},
    {"resume_checkpoint", "resume_from_checkpoint"},
    {"output_directory", "output_dir"},
    {"vae_path", "pretrained_vae_model_name_or_path"},
    {"training_seed", "seed"},
};

/* Optimal-string-alignment (restricted Damerau-Levenshtein) distance of two
 * short strings; a large number past 63 characters. */
static int osa(const char *a, size_t la, const char *b, size_t lb) {
  if (la > 63 || lb > 63) return 99;
  int d[64][64];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
        c = d[i - 2][j - 2] + 1;
      d[i][j] = c;
    }
  return d[la][lb];
}

typedef struct words {
  const char *w[16];
  size_t len[16];
  int n;
} words;

/* The '_'-separated words of s (at most 16; more: n = -1). */
static void split(const char *s, words *out) {
  out->n = 0;
  for (const char *p = s; *p;) {
    const size_t l = strcspn(p, "_");
    if (l) {
      if (out->n == 16) {
        out->n = -1;
        return;
      }
      out->w[out->n] = p, out->len[out->n++] = l;
    }
    p += l;
    if (*p) p++;
  }
}

/* What changing word a into word b costs: its share of typos, 1 if it is
 * another word (more than a third of it changed). */
static double word_cost(const char *a, size_t la, const char *b, size_t lb) {
  const int d = osa(a, la, b, lb);
  const size_t m = la > lb ? la : lb;
  if (!d) return 0;
  if ((size_t)d * 3 > m) return 1;
  return (double)d / (double)m;
}

/* Damerau-Levenshtein over words with word_cost substitutions. */
static double word_distance(const words *a, const words *b) {
  double d[17][17];
  for (int i = 0; i <= a->n; i++) d[i][0] = i;
  for (int j = 0; j <= b->n; j++) d[0][j] = j;
  for (int i = 1; i <= a->n; i++)
    for (int j = 1; j <= b->n; j++) {
      double c =
          d[i - 1][j - 1] + word_cost(a->w[i - 1], a->len[i - 1], b->w[j - 1], b->len[j - 1]);
      if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a->len[i - 1] == b->len[j - 2] && a->len[i - 2] == b->len[j - 1] &&
          !strncmp(a->w[i - 1], b->w[j - 2], a->len[i - 1]) &&
          !strncmp(a->w[i - 2], b->w[j - 1], a->len[i - 2]) && d[i - 2][j - 2] + 0.5 < c)
        c = d[i - 2][j - 2] + 0.5;
      d[i][j] = c;
    }
  return d[a->n][b->n];
}

/* s without its underscores, into buf (n >= 64). */
static size_t squeeze(const char *s, char *buf) {
  size_t k = 0;
  for (; *s && k < 63; s++)
    if (*s != '_') buf[k++] = *s;
  buf[k] = 0;
  return k;
}

/* How far key is from cand; negative if too far for a hint. */
static double score(const char *key, const words *kw, const char *cand) {
  words cw;
  split(cand, &cw);
  double best = -1;
  if (kw->n > 0 && cw.n > 0) {
    const double d = word_distance(kw, &cw);
    if (d < 1) best = d;
  }
  char a[64], b[64];
  const size_t la = squeeze(key, a), lb = squeeze(cand, b);
  const int d = osa(a, la, b, lb);
  if (d <= 1 && la >= 6 && (best < 0 || d * 0.25 < best)) best = d * 0.25;
  return best;
}

const char *ct_config_suggest(const char *key) {
  while (*key == '-') key++;
  for (size_t i = 0; i < sizeof HINTS / sizeof HINTS[0]; i++)
    if (!strcmp(key, HINTS[i].spelling)) return HINTS[i].key;
  words kw;
  split(key, &kw);
  const char *best = NULL, *best_target = NULL;
  double bd = 1e9;
  int tie = 0;
  ct_config_key_info ki;
  for (size_t i = 0;; i++) {
    const char *cand = NULL, *target = NULL;
    if (ct_config_key_info_at(i, &ki))
      cand = target = ki.name;
    else if (!(cand = ct_cfg_alias_at(i - CT_CONFIG_NKEYS, &target)))
      break;
    const double d = score(key, &kw, cand);
    if (d < 0) continue;
    if (d < bd - 1e-9)
      bd = d, best = cand, best_target = target, tie = 0;
    else if (d < bd + 1e-9 && best && strcmp(best_target, target))
      tie = 1; /* two keys equally close: no hint rather than a guess */
  }
  return tie ? NULL : best;
}
