/* rules.c: the rules between configuration keys (each key has its own rule
 * in the CT_CONFIG_KEYS table, checked by config.c): the optimizer's
 * capabilities against the rest (from its registry row, not its name),
 * offload against the ZeRO stage and precision, the files some choices need.
 * Each rule is its own function filed under one key, so that
 * ct_config_check runs them all and reports each failure at the place the
 * key came from. A rule never assumes another key passed its own check. */
#include <stdio.h>
#include <string.h>

#include "config_int.h"
#include "ctuner/family.h"
#include "ctuner/optim.h"

#define BAD(...) return ct_errf(err, CT_ERR_INVALID, __VA_ARGS__)

/* The optimizer against the rest of the configuration, decided by its
 * registry row (ctuner/optim.h): what it can do (offload, bf16 storage,
 * 1-bit communication), not its name. Whether a ZeRO shard cuts a tensor of
 * a tensor-wise optimizer depends on the world size: the trainer checks that
 * (ct_optim_can_cut). The name itself was checked by its row (check_optimizer). */
static ct_status check_optimizer_with(const ct_config *c, ct_err *err) {
  const ct_optim_info *oi = c->optimizer ? ct_optim_lookup(c->optimizer, NULL) : NULL;
  if (!oi) return CT_OK; /* its own rule (check_optimizer) says why */
  const int bf16 = c->mixed_precision && !strcmp(c->mixed_precision, "bf16");
  const int onv = c->offload_optimizer && !strcmp(c->offload_optimizer, "nvme");
  const int pnv = c->offload_param && !strcmp(c->offload_param, "nvme");
  if (oi->flags &
      CT_OPTIM_ONEBIT) { /* 1-bit Adam, 0/1 Adam, 1-bit Lamb: data parallel over float32 */
    if (c->model_type && !strcmp(c->model_type, "vae"))
      BAD("optimizer %s is data-parallel 1-bit communication (DeepSpeed's %s) for the MMDiT "
          "trainer; "
          "model_type vae does not support it yet: use a local optimizer such as %s",
          c->optimizer, ct_optim_onebit_name(oi->onebit),
          oi->onebit == CT_OPTIM_ONEBIT_LAMB ? "lamb" : "adam");
    if (!(c->lamb_min_coeff > 0 && c->lamb_max_coeff >= c->lamb_min_coeff))
      BAD("lamb_min_coeff (%g) must be > 0 and <= lamb_max_coeff (%g)", c->lamb_min_coeff,
          c->lamb_max_coeff);
    if (!(c->lamb_coeff_beta >= 0 && c->lamb_coeff_beta < 1))
      BAD("lamb_coeff_beta must be in [0, 1), got %g", c->lamb_coeff_beta);
    if (!(c->lamb_factor_min > 0 && c->lamb_factor_max >= c->lamb_factor_min &&
          c->lamb_factor_threshold >= 0))
      BAD("lamb_factor_min (%g) must be > 0 and <= lamb_factor_max (%g), lamb_factor_threshold >= "
          "0 (%g)",
          c->lamb_factor_min, c->lamb_factor_max, c->lamb_factor_threshold);
    if (oi->onebit != CT_OPTIM_ONEBIT_ZEROONE_ADAM && c->freeze_step < 1)
      BAD("optimizer %s needs freeze_step >= 1: the frozen variance comes from the warm-up steps",
          c->optimizer);
    if (c->zero_stage != 0)
      BAD("optimizer %s communicates the momentum itself and works with zero_stage 0 only (as in "
          "DeepSpeed), got %ld",
          c->optimizer, c->zero_stage);
  }
  if (bf16 && !(oi->flags & CT_OPTIM_CAN_BF16))
    BAD("optimizer %s keeps float32 storage; set mixed_precision no", c->optimizer);
  if ((onv || pnv) && !(oi->flags & CT_OPTIM_CAN_OFFLOAD)) {
    char list[256] = "";
    size_t nr, len = 0;
    const ct_optim_info *r = ct_optim_registry(&nr);
    for (size_t i = 0; i < nr; i++) {
      if (strcmp(r[i].name, r[i].canonical) || !(r[i].flags & CT_OPTIM_CAN_OFFLOAD)) continue;
      int w = snprintf(list + len, sizeof list - len, "%s%s", len ? ", " : "", r[i].name);
      if (w > 0 && (size_t)w < sizeof list - len) len += (size_t)w;
    }
    BAD("offload_%s nvme: optimizer '%s' %s, so it cannot offload its state; use an optimizer that "
        "can (%s) "
        "or offload none",
        onv ? "optimizer" : "param", c->optimizer,
        oi->flags & CT_OPTIM_ONEBIT ? "communicates the momentum itself"
                                    : "updates whole tensors and cannot step in pieces",
        list);
  }
  return CT_OK;
}

/* 1 if s is set and equals v. */
static int is(const char *s, const char *v) {
  return s && !strcmp(s, v);
}

/* ---- rules that relate several keys: each one its own function, all run ---- */

static ct_status rule_vae_source(const ct_config *c, ct_err *err) {
  if (is(c->model_type, "vae") && !c->vae_config && !c->pretrained_vae_model_name_or_path)
    BAD("model_type vae needs vae_config (a diffusers config.json to train from scratch) or "
        "pretrained_vae_model_name_or_path (a VAE directory to fine-tune)");
  return CT_OK;
}

static ct_status rule_s3_output(const ct_config *c, ct_err *err) {
  if (c->output_dir && !strncmp(c->output_dir, "s3://", 5) && is(c->model_type, "vae"))
    BAD("output_dir s3://... is supported for the MMDiT trainer only; for model_type vae use a "
        "local output_dir");
  return CT_OK;
}

static ct_status rule_disk_script(const ct_config *c, ct_err *err) {
  if (is(c->disk_low_action, "script") && (!c->disk_low_script || !c->disk_low_script[0]))
    BAD("disk_low_action=script needs disk_low_script (the command to run)");
  return CT_OK;
}

static ct_status rule_length(const ct_config *c, ct_err *err) {
  if (c->max_train_steps == 0 && c->num_train_epochs < 1)
    BAD("set max_train_steps or num_train_epochs (>= 1)");
  return CT_OK;
}

static ct_status rule_offload_stage(const ct_config *c, ct_err *err) {
  if (is(c->offload_param, "nvme") && c->zero_stage != 3)
    BAD("offload_param nvme needs zero_stage 3 (parameters are sharded there; below it every rank "
        "holds all "
        "of them), got zero_stage %ld",
        c->zero_stage);
  return CT_OK;
}

static ct_status rule_offload_bf16(const ct_config *c, ct_err *err) {
  if (is(c->offload_param, "nvme") && is(c->mixed_precision, "bf16"))
    BAD("offload_param nvme works with float32 storage; set mixed_precision no");
  return CT_OK;
}

static ct_status rule_offload_path(const ct_config *c, ct_err *err) {
  const int onv = is(c->offload_optimizer, "nvme"), pnv = is(c->offload_param, "nvme");
  if ((onv || pnv) && (!c->offload_param_path || !*c->offload_param_path))
    BAD("offload_%s nvme needs offload_param_path: a directory on the device for the swap files",
        onv ? "optimizer" : "param");
  return CT_OK;
}

static ct_status rule_bpe_files(const ct_config *c, ct_err *err) {
  if (is(c->text_encoder, "clip-bpe") && (!c->tokenizer_vocab || !c->tokenizer_merges))
    BAD("text_encoder \"clip-bpe\" needs tokenizer_vocab (vocab.json) and tokenizer_merges "
        "(merges.txt)");
  return CT_OK;
}

static ct_status rule_codec_vae(const ct_config *c, ct_err *err) {
  if (is(c->codec, "vae") && !c->pretrained_vae_model_name_or_path)
    BAD("codec vae needs pretrained_vae_model_name_or_path (a VAE directory: config.json + "
        "diffusion_pytorch_model.safetensors, e.g. the output_dir/vae of a model_type vae run)");
  return CT_OK;
}

static ct_status rule_auto_shift(const ct_config *c, ct_err *err) {
  if (c->flow_schedule_auto_shift && c->flow_shift > 0)
    BAD("flow_schedule_auto_shift cannot be combined with flow_shift %g (whose default is 3, as "
        "SimpleTuner's): set flow_shift (flow_schedule_shift) to 0 to train with the automatic "
        "shift",
        c->flow_shift);
  return CT_OK;
}

/* prediction_type against the family's (ctuner/family.h): FLUX.1 predicts
 * flow matching's velocity, SDXL epsilon or v_prediction. */
static ct_status rule_prediction_type(const ct_config *c, ct_err *err) {
  const ct_family *f = ct_family_find(c->model_family);
  if (!c->prediction_type || !f) return CT_OK;
  char want[64];
  snprintf(want, sizeof want, "%s", c->prediction_type);
  if (!strcmp(want, "flow-matching")) snprintf(want, sizeof want, "flow_matching");
  if (!ct_family_in_list(f->prediction_types, want))
    BAD("prediction_type %s does not go with model_family %s (%s predicts %s)", c->prediction_type,
        f->name, f->title, f->prediction_types);
  return CT_OK;
}

/* Each rule with the key its problem is filed under. */
static const struct rule {
  const char *key;
  ct_status (*fn)(const ct_config *c, ct_err *err);
} TOGETHER[] = {
    {"model_type", rule_vae_source},
    {"output_dir", rule_s3_output},
    {"disk_low_action", rule_disk_script},
    {"max_train_steps", rule_length},
    {"optimizer", check_optimizer_with},
    {"offload_param", rule_offload_stage},
    {"offload_param", rule_offload_bf16},
    {"offload_param_path", rule_offload_path},
    {"text_encoder", rule_bpe_files},
    {"codec", rule_codec_vae},
    {"flow_schedule_auto_shift", rule_auto_shift},
    {"prediction_type", rule_prediction_type},
};

ct_status ct_cfg_rule_at(size_t i, const ct_config *c, const char **key, ct_err *err) {
  if (i >= sizeof TOGETHER / sizeof TOGETHER[0]) return CT_ERR_RANGE;
  *key = TOGETHER[i].key;
  return err ? TOGETHER[i].fn(c, err) : CT_OK;
}
