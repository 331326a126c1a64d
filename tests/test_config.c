/* Config parsing: defaults, "--" prefixes, aliases, types, errors with line and
 * column, did-you-mean, the optimizer's combinations from its registry flags,
 * {env:VAR}, command-line overrides, digest; SimpleTuner's defaults; the
 * DeepSpeed JSON fold (deepspeed_config: batch arithmetic, DeepSpeed's
 * defaults for absent fields, refused and no-effect sections, offload). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/config.h"
#include "ctuner/optim.h"
#include "harness.h"

CT_TEST(config, defaults_validate) {
  ct_config c;
  ct_config_defaults(&c);
  ct_err err = {0};
  CHECKF(ct_config_validate(&c, &err) == CT_OK, "%s", err.msg);
  CHECK(!strcmp(c.optimizer, "adamw"));
  CHECK(c.train_batch_size == 1);
  CHECK_NEAR(c.learning_rate, 1e-4, 0);
  CHECK_NEAR(c.ema_decay, 0.995, 0);
  CHECK(!strcmp(c.resume_from_checkpoint, "latest"));
  CHECK(c.validation_prompt == NULL);
  ct_config_free(&c);
}

CT_TEST(config, file_prefixes_aliases_types) {
  const char *p = ct_test_write_tmp(
      "c1.json",
      "{\"--learning_rate\": 3e-4, \"train_batch_size\": 8, \"use_ema\": true,\n"
      " \"--checkpointing_steps\": 50, \"validation_prompt\": \"a cat\",\n"
      " \"flow_schedule_shift\": 3, \"resolution\": \"64\", \"validation_resolution\": 64}");
  ct_config c;
  ct_config_defaults(&c);
  ct_err err = {0};
  REQUIRE(ct_config_load_file(&c, p, &err) == CT_OK);
  CHECK_NEAR(c.learning_rate, 3e-4, 0);
  CHECK(c.train_batch_size == 8);
  CHECK(c.use_ema == 1);
  CHECK(c.checkpoint_step_interval == 50);
  CHECK(!strcmp(c.validation_prompt, "a cat"));
  CHECK_NEAR(c.flow_shift, 3, 0);
  CHECK(c.resolution == 64);
  CHECK(!strcmp(c.validation_resolution, "64"));
  /* The command line overrides the file. */
  CHECK(ct_config_set(&c, "--learning_rate", "1e-5", &err) == CT_OK);
  CHECK_NEAR(c.learning_rate, 1e-5, 0);
  CHECK(ct_config_set(&c, "use_ema", "false", &err) == CT_OK);
  CHECK(c.use_ema == 0);
  CHECK(ct_config_set(&c, "validation_prompt", "none", &err) == CT_OK);
  CHECK(c.validation_prompt == NULL);
  ct_config_free(&c);
}

CT_TEST(config, simpletuner_keys_without_effect_accepted_and_named) {
  const char *p = ct_test_write_tmp(
      "noeff.json",
      "{\"--push_to_hub\": true, \"--tracker_image_layout\": \"table\", \"report_to\": "
      "\"wandb\",\n \"--ema_device\": \"accelerator\", \"--learning_rate\": 2e-4}");
  ct_config c;
  ct_config_defaults(&c);
  ct_err err = {0};
  REQUIRE(ct_config_load_file(&c, p, &err) == CT_OK);
  CHECK_NEAR(c.learning_rate, 2e-4, 0);
  CHECK(!strcmp(c.no_effect, "push_to_hub,tracker_image_layout,ema_device"));
  CHECK(ct_config_set(&c, "--push_to_hub", "false", &err) == CT_OK); /* noted once */
  CHECK(ct_config_set(&c, "--fuse_qkv_projections", "true", &err) == CT_OK);
  CHECK(!strcmp(c.no_effect, "push_to_hub,tracker_image_layout,ema_device,fuse_qkv_projections"));
  /* report_to and tracker_* are keys now (docs/tensorboard.md); unknown trackers refused */
  CHECK(!strcmp(c.report_to, "wandb") && ct_config_no_effect("report_to") == NULL);
  CHECK(ct_config_set(&c, "report_to", "none", &err) == CT_OK && c.report_to == NULL);
  CHECK(ct_config_set(&c, "report_to", "tensorbored", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) == CT_ERR_INVALID && strstr(err.msg, "report_to") &&
        strstr(err.msg, "tensorboard"));
  CHECK(ct_config_set(&c, "report_to", "all", &err) == CT_OK);
  CHECK(ct_config_no_effect("hub_model_id") != NULL);
  CHECK(ct_config_no_effect("learning_rate") == NULL);
  /* SimpleTuner keys not implemented here: refused with the reason, no misleading "did you mean" */
  CHECK(ct_config_set(&c, "--pretrained_model_name_or_path", "black-forest-labs/FLUX.1-dev",
                      &err) == CT_OK); /* a directory; the trainer says it is not one */
  CHECK(ct_config_set(&c, "--lycoris_config", "x.json", &err) == CT_OK); /* lora_type lycoris */
  CHECK(ct_config_set(&c, "--tread_config", "{}", &err) == CT_ERR_UNSUPPORTED);
  CHECK(!strstr(err.msg, "vae_config"));
  /* a key that is neither ours nor in the list is still an error */
  CHECK(ct_config_set(&c, "--push_to_hubb", "true", &err) == CT_ERR_INVALID);
  ct_config_free(&c);
}

CT_TEST(config, errors_name_the_problem) {
  ct_config c;
  ct_config_defaults(&c);
  ct_err err = {0};
  const char *p = ct_test_write_tmp("c2.json", "{\"--learning_rat\": 1}");
  CHECK(ct_config_load_file(&c, p, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "did you mean 'learning_rate'") && strstr(err.msg, "c2.json"), "%s",
         err.msg);
  p = ct_test_write_tmp("c3.json", "{\"seed\": 1,\n  \"train_batch_size\": 2.5}");
  CHECK(ct_config_load_file(&c, p, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "c3.json:2:23: ") && strstr(err.msg, "expects an integer"), "%s", err.msg);
  p = ct_test_write_tmp("c4.json", "{\"seed\": 1\n  \"x\": 2}");
  CHECK(ct_config_load_file(&c, p, &err) != CT_OK);
  CHECKF(strstr(err.msg, "c4.json:2:3: "), "%s", err.msg);
  p = ct_test_write_tmp("c5.json", "[1, 2]");
  CHECK(ct_config_load_file(&c, p, &err) == CT_ERR_FORMAT);
  CHECK(ct_config_load_file(&c, "/nonexistent/config.json", &err) == CT_ERR_IO);
  CHECKF(strstr(err.msg, "/nonexistent/config.json"), "%s", err.msg);
  CHECK(ct_config_set(&c, "train_batch_size", "many", &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "train_batch_size") && strstr(err.msg, "many"), "%s", err.msg);
  CHECK(ct_config_set(&c, "zzzzzzzzzzzz", "1", &err) == CT_ERR_INVALID);
  CHECK(strstr(err.msg, "did you mean") == NULL);
  /* Validation names the key. */
  ct_config_free(&c);
  ct_config_defaults(&c);
  c.train_batch_size = 0;
  CHECK(ct_config_validate(&c, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "train_batch_size"), "%s", err.msg);
  c.train_batch_size = 1;
  CHECK(ct_config_set(&c, "optimizer", "adamq", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) != CT_OK);
  CHECKF(strstr(err.msg, "adamq"), "%s", err.msg);
  CHECK(ct_config_set(&c, "optimizer", "adamw", &err) == CT_OK);
  CHECK(ct_config_set(&c, "lr_scheduler", "cosin", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) != CT_OK);
  CHECKF(strstr(err.msg, "cosin"), "%s", err.msg);
  ct_config_free(&c);
}

/* The optimizer's combinations are decided by its registry row's flags. */
CT_TEST(config, optimizer_capabilities) {
  ct_config c;
  ct_config_defaults(&c);
  ct_err err = {0};
  /* 1-bit: the MMDiT trainer only, with a true message (no "not implemented") */
  CHECK(ct_config_set(&c, "model_type", "vae", &err) == CT_OK);
  CHECK(ct_config_set(&c, "vae_config", "/tmp/vae.json", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) == CT_OK);
  CHECK(ct_config_set(&c, "optimizer", "onebitadam", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "optimizer onebitadam is data-parallel 1-bit") &&
             strstr(err.msg, "model_type vae does not support it yet") &&
             !strstr(err.msg, "not implemented"),
         "%s", err.msg);
  CHECK(ct_config_set(&c, "optimizer", "1BitLamb", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "model_type vae does not support it yet") && strstr(err.msg, "OneBitLamb"),
         "%s", err.msg);
  CHECK(ct_config_set(&c, "model_type", "full", &err) == CT_OK);
  CHECK(ct_config_set(&c, "optimizer", "onebitadam", &err) == CT_OK);
  CHECKF(ct_config_validate(&c, &err) == CT_OK, "%s", err.msg);
  CHECK(ct_config_set(&c, "zero_stage", "1", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "works with zero_stage 0 only"), "%s", err.msg);
  CHECK(ct_config_set(&c, "zero_stage", "0", &err) == CT_OK);
  CHECK(ct_config_set(&c, "mixed_precision", "bf16", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "keeps float32 storage"), "%s", err.msg);
  CHECK(ct_config_set(&c, "mixed_precision", "no", &err) == CT_OK);
  CHECK(ct_config_set(&c, "freeze_step", "0", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "optimizer onebitadam needs freeze_step >= 1"), "%s", err.msg);
  CHECK(ct_config_set(&c, "optimizer", "zerooneadam", &err) == CT_OK); /* 0/1 Adam has no warm-up */
  CHECKF(ct_config_validate(&c, &err) == CT_OK, "%s", err.msg);
  /* offload needs an optimizer that steps in pieces */
  CHECK(ct_config_set(&c, "offload_optimizer", "nvme", &err) == CT_OK);
  CHECK(ct_config_set(&c, "offload_param_path", "/tmp/swap", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg,
                "optimizer 'zerooneadam' communicates the momentum itself, so it cannot offload"),
         "%s", err.msg);
  CHECK(ct_config_set(&c, "optimizer", "lamb", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "offload_optimizer nvme: optimizer 'lamb' updates whole tensors") &&
             strstr(err.msg, "(adamw, adam, adagrad, lion, sgd, muadam, muadamw, musgd)"),
         "%s", err.msg);
  CHECK(ct_config_set(&c, "optimizer", "optimi-lion", &err) == CT_OK);
  CHECKF(ct_config_validate(&c, &err) == CT_OK, "%s", err.msg);
  /* tensor-wise kinds train bf16 storage */
  CHECK(ct_config_set(&c, "offload_optimizer", "none", &err) == CT_OK);
  CHECK(ct_config_set(&c, "optimizer", "muon", &err) == CT_OK);
  CHECK(ct_config_set(&c, "mixed_precision", "bf16", &err) == CT_OK);
  CHECKF(ct_config_validate(&c, &err) == CT_OK, "%s", err.msg);
  /* a refused name keeps its reason */
  CHECK(ct_config_set(&c, "optimizer", "prodigy", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) == CT_ERR_UNSUPPORTED);
  CHECKF(strstr(err.msg, "optimizer: ") && strstr(err.msg, "Prodigy"), "%s", err.msg);
  ct_config_free(&c);
}

CT_TEST(config, env_substitution) {
  setenv("CT_TEST_CFG_DIR", "/tmp/ctuner-x", 1);
  unsetenv("CT_TEST_CFG_UNSET");
  ct_config c;
  ct_config_defaults(&c);
  ct_err err = {0};
  const char *p = ct_test_write_tmp("c6.json", "{\"output_dir\": \"{env:CT_TEST_CFG_DIR}/run1\"}");
  REQUIRE(ct_config_load_file(&c, p, &err) == CT_OK);
  CHECK(!strcmp(c.output_dir, "/tmp/ctuner-x/run1"));
  p = ct_test_write_tmp("c7.json", "{\"output_dir\": \"{env:CT_TEST_CFG_UNSET}\"}");
  CHECK(ct_config_load_file(&c, p, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "CT_TEST_CFG_UNSET"), "%s", err.msg);
  ct_config_free(&c);
}

CT_TEST(config, digest_ignores_cosmetic_keys) {
  ct_config a, b;
  ct_config_defaults(&a);
  ct_config_defaults(&b);
  ct_err err = {0};
  char da[17], db[17];
  ct_config_set(&b, "output_dir", "elsewhere", &err);
  ct_config_set(&b, "validation_prompt", "x", &err);
  ct_config_digest(&a, da);
  ct_config_digest(&b, db);
  CHECK(!strcmp(da, db));
  ct_config_set(&b, "learning_rate", "0.5", &err);
  ct_config_digest(&b, db);
  CHECK(strcmp(da, db) != 0);
  char *j = ct_config_to_json(&b);
  CHECK(j && strstr(j, "\"output_dir\": \"elsewhere\""));
  free(j);
  ct_config_free(&a);
  ct_config_free(&b);
}

/* ---- deepspeed_config (src/config/deepspeed.c; issue 21) ---- */

/* Defaults + an inline DeepSpeed JSON folded for `world` ranks. */
static ct_status ds(ct_config *c, const char *json, int world, ct_err *err) {
  ct_config_defaults(c);
  ct_status st = ct_config_set(c, "deepspeed_config", json, err);
  return st ? st : ct_deepspeed_apply(c, world, err);
}

/* train_batch_size alone: DeepSpeed's gradient accumulation 1 and micro
 * batch train_batch_size / world; a remainder is refused as DeepSpeed does.
 * (The old code refused every such file unless train_batch_size == world.) */
CT_TEST(config, deepspeed_train_batch_size_alone) {
  ct_config c;
  ct_err err = {0};
  REQUIRE(ds(&c, "{\"train_batch_size\": 8}", 2, &err) == CT_OK);
  CHECK(c.train_batch_size == 4 && c.gradient_accumulation_steps == 1);
  ct_config_free(&c);
  CHECK(ds(&c, "{\"train_batch_size\": 8}", 3, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "train_batch_size 8") && strstr(err.msg, "3 rank(s)"), "%s", err.msg);
  ct_config_free(&c);
  /* with the trainer's accumulation set explicitly, it stays and divides the batch */
  ct_config_defaults(&c);
  REQUIRE(ct_config_set(&c, "gradient_accumulation_steps", "2", &err) == CT_OK);
  REQUIRE(ct_config_set(&c, "deepspeed_config", "{\"train_batch_size\": 16}", &err) == CT_OK);
  REQUIRE(ct_deepspeed_apply(&c, 2, &err) == CT_OK);
  CHECK(c.train_batch_size == 4 && c.gradient_accumulation_steps == 2);
  ct_config_free(&c);
  /* the other combinations keep DeepSpeed's arithmetic */
  REQUIRE(ds(&c, "{\"train_batch_size\": 12, \"train_micro_batch_size_per_gpu\": 2}", 2, &err) ==
          CT_OK);
  CHECK(c.train_batch_size == 2 && c.gradient_accumulation_steps == 3);
  ct_config_free(&c);
}

/* Fields a DeepSpeed JSON leaves out take DeepSpeed's defaults: no
 * gradient_clipping is no clipping; an optimizer's missing params are its
 * class defaults (FusedAdam: weight_decay 0, betas (0.9, 0.999), eps 1e-8,
 * lr 1e-3, bias_correction true). "auto" keeps the trainer's value. */
CT_TEST(config, deepspeed_absent_fields_take_deepspeeds_defaults) {
  ct_config c;
  ct_err err = {0};
  REQUIRE(ds(&c, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4}}}", 1, &err) ==
          CT_OK);
  CHECK_NEAR(c.max_grad_norm, 0, 0); /* ctuner's own default is 2.0 */
  CHECK_NEAR(c.adam_weight_decay, 0, 0);
  CHECK_NEAR(c.learning_rate, 3e-4, 0);
  CHECK_NEAR(c.adam_beta1, 0.9, 0);
  CHECK_NEAR(c.adam_beta2, 0.999, 0);
  CHECK_NEAR(c.adam_epsilon, 1e-8, 0);
  CHECK(c.optimizer_bias_correction == 1);
  ct_config_free(&c);
  /* "auto" is the trainer's */
  ct_config_defaults(&c);
  REQUIRE(ct_config_set(&c, "adam_weight_decay", "0.05", &err) == CT_OK);
  REQUIRE(ct_config_set(&c, "deepspeed_config",
                        "{\"gradient_clipping\": \"auto\", \"optimizer\": {\"type\": \"AdamW\", "
                        "\"params\": {\"weight_decay\": \"auto\", \"lr\": \"auto\"}}}",
                        &err) == CT_OK);
  REQUIRE(ct_deepspeed_apply(&c, 1, &err) == CT_OK);
  CHECK_NEAR(c.max_grad_norm, 2.0, 0);
  CHECK_NEAR(c.adam_weight_decay, 0.05, 0);
  CHECK_NEAR(c.learning_rate, 1e-4, 0);
  ct_config_free(&c);
  /* per class: Adagrad's eps and lr, SGD's momentum 0, OneBitAdam's freeze_step */
  REQUIRE(ds(&c, "{\"optimizer\": {\"type\": \"Adagrad\"}}", 1, &err) == CT_OK);
  CHECK_NEAR(c.adam_epsilon, 1e-10, 0);
  CHECK_NEAR(c.learning_rate, 1e-2, 0);
  ct_config_free(&c);
  REQUIRE(ds(&c, "{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}}", 1, &err) ==
          CT_OK);
  CHECK_NEAR(c.optimizer_momentum, 0, 0);
  ct_config_free(&c);
  REQUIRE(ds(&c, "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1e-3}}}", 1,
             &err) == CT_OK);
  CHECK(c.freeze_step == 100000);
  ct_config_free(&c);
  /* no optimizer section: the trainer's optimizer and values stay */
  REQUIRE(ds(&c, "{\"zero_optimization\": {\"stage\": 1}}", 1, &err) == CT_OK);
  CHECK_NEAR(c.adam_weight_decay, 1e-2, 0);
  CHECK_NEAR(c.max_grad_norm, 0, 0); /* but DeepSpeed still does not clip */
  ct_config_free(&c);
}

/* bias_correction false reaches the optimizer key; Lamb always gets
 * FusedLamb's trust-ratio bounds; 1-bit optimizers never bias-correct. */
CT_TEST(config, deepspeed_bias_correction_and_lamb_bounds) {
  ct_config c;
  ct_err err = {0};
  REQUIRE(ds(&c,
             "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"bias_correction\": false, "
             "\"adam_w_mode\": false}}}",
             1, &err) == CT_OK);
  CHECK(c.optimizer_bias_correction == 0 && !strcmp(c.optimizer, "adam"));
  ct_config_free(&c);
  REQUIRE(ds(&c, "{\"optimizer\": {\"type\": \"Lamb\", \"params\": {\"max_coeff\": 5}}}", 1,
             &err) == CT_OK);
  CHECK(c.given[CT_KEY_lamb_max_coeff] && c.given[CT_KEY_lamb_min_coeff]);
  CHECK_NEAR(c.lamb_max_coeff, 5, 0);
  CHECK_NEAR(c.lamb_min_coeff, 0.01, 0);
  ct_config_free(&c);
  REQUIRE(ds(&c,
             "{\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"bias_correction\": true}}}",
             1, &err) == CT_OK);
  CHECKF(strstr(c.no_effect, "deepspeed_config.optimizer.params.bias_correction"), "%s",
         c.no_effect);
  ct_config_free(&c);
  CHECK(ds(&c, "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"bias_correction\": 0}}}", 1,
           &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "bias_correction"), "%s", err.msg);
  ct_config_free(&c);
}

/* Never silent: what cannot run here is refused by name, what cannot change
 * the numbers is noted for the one warning at start. */
CT_TEST(config, deepspeed_sections_refused_or_noted) {
  static const struct {
    const char *json, *want;
  } refused[] = {
      {"{\"zero_optimization\": {\"stage\": 2, \"zenflow\": {\"topk_ratio\": 0.1}}}", "zenflow"},
      {"{\"progressive_layer_drop\": {\"enabled\": true, \"theta\": 0.5}}",
       "progressive_layer_drop"},
      {"{\"data_efficiency\": {\"enabled\": true}}", "data_efficiency"},
      {"{\"bf16\": {\"enabled\": true, \"bf16_master_weights_and_grads\": true}}",
       "bf16_master_weights_and_grads"},
      {"{\"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true}}", "bf16_optimizer_states"},
      {"{\"gradient_predivide_factor\": -2}", "gradient_predivide_factor"},
  };
  ct_config c;
  ct_err err = {0};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    CHECKF(ds(&c, refused[i].json, 1, &err) != CT_OK, "%s accepted", refused[i].json);
    CHECKF(strstr(err.msg, refused[i].want), "%s: %s", refused[i].json, err.msg);
    ct_config_free(&c);
  }
  /* disabled sections and false flags are fine and silent */
  REQUIRE(ds(&c,
             "{\"progressive_layer_drop\": {\"enabled\": false}, \"data_efficiency\": "
             "{\"enabled\": false}, \"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": "
             "false}, \"prescale_gradients\": false, \"gradient_predivide_factor\": 1.0}",
             1, &err) == CT_OK);
  CHECK(c.no_effect[0] == 0);
  ct_config_free(&c);
  REQUIRE(ds(&c, "{\"prescale_gradients\": true, \"gradient_predivide_factor\": 2.0}", 1, &err) ==
          CT_OK);
  CHECKF(strstr(c.no_effect, "deepspeed_config.prescale_gradients") &&
             strstr(c.no_effect, "deepspeed_config.gradient_predivide_factor"),
         "%s", c.no_effect);
  CHECK(ct_config_no_effect("deepspeed_config.prescale_gradients") != NULL);
  ct_config_free(&c);
}

/* Offload: device "auto" is the trainer's (Accelerate fills it from its own
 * offload_*_device); offload_param's buffer_size and pin_memory drive the one
 * NVMe swap file; buffer_count and max_in_cpu are noted. */
CT_TEST(config, deepspeed_offload_auto_and_param_knobs) {
  ct_config c;
  ct_err err = {0};
  ct_config_defaults(&c);
  REQUIRE(ct_config_set(&c, "offload_param", "nvme", &err) == CT_OK);
  REQUIRE(ct_config_set(&c, "deepspeed_config",
                        "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": "
                        "\"auto\", \"nvme_path\": \"/tmp/x\", \"buffer_size\": 100000000, "
                        "\"buffer_count\": 5, \"pin_memory\": true, \"max_in_cpu\": 1e9}}}",
                        &err) == CT_OK);
  REQUIRE(ct_deepspeed_apply(&c, 1, &err) == CT_OK);
  CHECK(!strcmp(c.offload_param, "nvme") && !strcmp(c.offload_param_path, "/tmp/x"));
  CHECK(c.offload_buffer_size == 100000000 && c.offload_pin_memory == 1);
  CHECKF(strstr(c.no_effect, "deepspeed_config.offload_param.buffer_count") &&
             strstr(c.no_effect, "deepspeed_config.offload_param.max_in_cpu"),
         "%s", c.no_effect);
  ct_config_free(&c);
  /* "auto" with nothing set is none; the NVMe knobs of a cpu offload change nothing */
  REQUIRE(ds(&c,
             "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": "
             "\"auto\"}, \"offload_param\": {\"device\": \"cpu\", \"buffer_size\": 4096}}}",
             1, &err) == CT_OK);
  CHECK(!c.offload_optimizer || !strcmp(c.offload_optimizer, "none"));
  CHECK(c.offload_buffer_size == 0);
  ct_config_free(&c);
  /* the one swap file has one buffer size */
  CHECK(ds(&c,
           "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"nvme\", "
           "\"buffer_size\": 4096}, \"offload_param\": {\"device\": \"nvme\", \"buffer_size\": "
           "8192}}}",
           1, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "one buffer size"), "%s", err.msg);
  ct_config_free(&c);
  CHECK(ds(&c, "{\"zero_optimization\": {\"offload_param\": {\"device\": \"gpu\"}}}", 1, &err) ==
        CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "none, cpu, nvme or auto"), "%s", err.msg);
  ct_config_free(&c);
}

/* Old vs new on one file of the DeepSpeedExamples kind (ZeRO-2, AdamW with
 * lr only, train_batch_size only), 2 ranks. The old fold gave: an error
 * (train_batch_size 16 != 1 x 1 x 2); with a micro batch added, clipping at
 * ctuner's 2.0 and weight decay 0.01. DeepSpeed runs it with micro batch 8,
 * no clipping and weight decay 0, which is what it resolves to now. */
CT_TEST(config, deepspeed_old_vs_new) {
  ct_config c;
  ct_err err = {0};
  const char *j =
      "{\"train_batch_size\": 16, \"zero_optimization\": {\"stage\": 2}, "
      "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}}";
  REQUIRE(ds(&c, j, 2, &err) == CT_OK);
  CHECK(c.train_batch_size == 8 && c.gradient_accumulation_steps == 1);
  CHECK_NEAR(c.max_grad_norm, 0, 0);     /* old: 2.0 */
  CHECK_NEAR(c.adam_weight_decay, 0, 0); /* old: 0.01 */
  CHECK(c.zero_stage == 2 && !strcmp(c.optimizer, "adamw"));
  CHECKF(ct_config_validate(&c, &err) == CT_OK, "%s", err.msg);
  ct_config_free(&c);
}

/* SimpleTuner's defaults for keys real configs leave out (issue 21), listed
 * for the one line the trainer logs; constant_with_warmup with 0 warm-up
 * steps is the old "constant" exactly. */
CT_TEST(config, simpletuner_defaults) {
  ct_config c;
  ct_config_defaults(&c);
  ct_err err = {0};
  CHECK_NEAR(c.flow_shift, 3, 0);
  CHECK_NEAR(c.lr_end, 4e-7, 0);
  CHECK(!strcmp(c.lr_scheduler, "constant_with_warmup") && c.lr_warmup_steps == 0);
  CHECK_NEAR(c.max_grad_norm, 2.0, 0);
  char note[512];
  ct_config_defaults_note(&c, note, sizeof note);
  CHECKF(strstr(note, "flow_shift 3") && strstr(note, "lr_scheduler constant_with_warmup") &&
             strstr(note, "lr_end 4e-7"),
         "%s", note);
  REQUIRE(ct_config_set(&c, "flow_shift", "1", &err) == CT_OK);
  ct_config_defaults_note(&c, note, sizeof note);
  CHECKF(!strstr(note, "flow_shift"), "%s", note); /* set keys are not defaults */
  ct_config_free(&c);
  /* sine's period is lr_warmup_steps: 0 is refused at the config check */
  ct_config_defaults(&c);
  REQUIRE(ct_config_set(&c, "lr_scheduler", "sine", &err) == CT_OK);
  CHECK(ct_config_validate(&c, &err) == CT_ERR_INVALID && strstr(err.msg, "lr_warmup_steps"));
  REQUIRE(ct_config_set(&c, "lr_warmup_steps", "100", &err) == CT_OK);
  CHECKF(ct_config_validate(&c, &err) == CT_OK, "%s", err.msg);
  ct_config_free(&c);
  ct_sched a, b;
  ct_sched_default(CT_SCHED_CONSTANT, 1e-4, &a);
  ct_sched_default(CT_SCHED_CONSTANT_WITH_WARMUP, 1e-4, &b);
  b.warmup_steps = 0;
  for (long k = 0; k < 50; k++) CHECK(ct_sched_lr(&a, k) == ct_sched_lr(&b, k));
}

/* Every problem of a file, the command line and the rules at once, each with
 * its place; before, loading stopped at the first (one problem per run). */
CT_TEST(config, all_problems_at_once) {
  const char *p = ct_test_write_tmp("all.json",
                                    "{\"learning_rat\": 1e-4,\n"
                                    " \"train_batch_size\": \"many\",\n"
                                    " \"lora_rank\": 16,\n"
                                    " \"push_to_hub\": true,\n"
                                    " \"optimizer\": \"adamq\",\n"
                                    " \"seed\": 3}");
  ct_config c;
  ct_config_defaults(&c);
  ct_config_problems probs = {0};
  CHECK(ct_config_load(&c, p, &probs) != CT_OK);
  CHECK(c.seed == 3); /* the good keys are set */
  CHECK(ct_config_set_arg(&c, "--zero_stage", "7", &probs) == CT_OK);
  CHECK(ct_config_set_arg(&c, "--lerning_rate", "1", &probs) == CT_ERR_INVALID);
  CHECK(ct_config_check(&c, &probs) == CT_ERR_INVALID);
  char w[700];
  const char *want[][3] = {
      {"all.json:1:18", "learning_rat", "did you mean 'learning_rate'"},
      {"all.json:2:22", "train_batch_size", "expects an integer"},
      {"all.json:4:17", "push_to_hub", "no effect"},
      {"--lerning_rate", "lerning_rate", "did you mean 'learning_rate'"},
      {"all.json:3:15", "lora_rank", "applies to model_type lora only"}, /* at check time */
      {"all.json:5:15", "optimizer", "adamq"},
      {"--zero_stage", "zero_stage", "zero_stage must be 0, 1, 2 or 3"},
  };
  CHECKF(probs.n == 7 && probs.errors == 5, "%zu problems, %zu errors", probs.n, probs.errors);
  for (size_t i = 0; i < probs.n && i < 7; i++) {
    const ct_config_problem *pr = &probs.v[i];
    const char *where = ct_config_problem_where(pr, w, sizeof w);
    CHECKF(strstr(where, want[i][0]) && !strcmp(pr->key, want[i][1]) && strstr(pr->msg, want[i][2]),
           "%zu: %s: [%s] %s", i, where, pr->key, pr->msg);
  }
  CHECK(probs.v[2].warning == 1 && probs.v[4].warning == 1 && probs.v[0].warning == 0);
  CHECK(!strcmp(probs.v[0].hint, "learning_rate"));
  /* The old single-error API gives the first one and counts the rest. */
  ct_err err = {0};
  CHECK(ct_config_problems_to_err(&probs, &err) == CT_ERR_INVALID);
  CHECKF(
      strstr(err.msg, "all.json:1:18: unknown key 'learning_rat'") && strstr(err.msg, "and 4 more"),
      "%s", err.msg);
  ct_config_problems_free(&probs);
  ct_config_free(&c);
}

/* Did you mean: real misspellings get the key they mean, look-alikes that
 * mean something else get no hint (they misled before: tread_config ->
 * vae_config, pretrained_model_name_or_path -> pretrained_vae_...). */
CT_TEST(config, did_you_mean) {
  const char *good[][2] = {
      {"learning_rat", "learning_rate"},
      {"lerning_rate", "learning_rate"},
      {"learnig_rate", "learning_rate"},
      {"train_batchsize", "train_batch_size"},
      {"trainbatch_size", "train_batch_size"},
      {"max_train_step", "max_train_steps"},
      {"num_train_epoch", "num_train_epochs"},
      {"gradient_accumulation_step", "gradient_accumulation_steps"},
      {"gradient_acumulation_steps", "gradient_accumulation_steps"},
      {"lr_schedular", "lr_scheduler"},
      {"lr_warmup_step", "lr_warmup_steps"},
      {"checkpointing_step", "checkpointing_steps"},
      {"validation_promt", "validation_prompt"},
      {"mixed_percision", "mixed_precision"},
      {"adam_weight_decy", "adam_weight_decay"},
      {"weight_decay", "adam_weight_decay"},
      {"num_epochs", "num_train_epochs"},
      {"max_steps", "max_train_steps"},
      {"--data_backend", "data_backend_config"},
      {"resolution_validation", "validation_resolution"},
      {"caption_dropout_probabilty", "caption_dropout_probability"},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    const char *s = ct_config_suggest(good[i][0]);
    CHECKF(s && !strcmp(s, good[i][1]), "%s -> %s (want %s)", good[i][0], s ? s : "(none)",
           good[i][1]);
  }
  const char *none[] = {"tread_config",
                        "foo_config",
                        "vae_batch_sizes_x",
                        "controlnet_model_name_or_path",
                        "pretrained_unet_model_name_or_path",
                        "zzzzzzzzzzzz",
                        "lora"};
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
    const char *s = ct_config_suggest(none[i]);
    CHECKF(!s, "%s -> %s (want no hint)", none[i], s);
  }
}

/* SimpleTuner's config.env: variables mapped as its loader maps them,
 * quotes, export, +=, TRAINER_EXTRA_ARGS split on blanks, false dropped;
 * lines SimpleTuner and a shell would read differently are problems. */
CT_TEST(config, env_file) {
  const char *p = ct_test_write_tmp(
      "config.env",
      "# a comment\n"
      "export MODEL_FAMILY=\"flux\"\n"
      "export LEARNING_RATE=3e-5\n"
      "TRAIN_BATCH_SIZE='4'\n"
      "export OUTPUT_DIR=\"/tmp/out  dir\"\n"
      "USE_EMA=true\n"
      "PUSH_TO_HUB=false\n"
      "VALIDATION_PROMPT=\"a  photo of   a cat\"\n"
      "export TRAINER_EXTRA_ARGS=\"--lr_warmup_steps=10 --checkpointing_steps 50\"\n"
      "TRAINER_EXTRA_ARGS+=\" --use_ema --seed=7 ${EXTRA}\"\n"
      "TRAINING_NUM_PROCESSES=2\n"
      "DISABLE_UPDATES=true\n");
  ct_config c;
  ct_config_defaults(&c);
  ct_config_problems probs = {0};
  CHECK(ct_config_load(&c, p, &probs) == CT_OK);
  CHECKF(probs.errors == 0, "%s", probs.n ? probs.v[0].msg : "");
  CHECK_NEAR(c.learning_rate, 3e-5, 0);
  CHECK(c.train_batch_size == 4);
  CHECK(!strcmp(c.output_dir, "/tmp/out dir")); /* SimpleTuner joins words with one space */
  CHECK(c.use_ema == 1);
  CHECK(!strcmp(c.validation_prompt, "a photo of a cat"));
  CHECK(c.lr_warmup_steps == 10 && c.checkpoint_step_interval == 50 && c.seed == 7);
  CHECK(c.line[CT_KEY_learning_rate] == 3 && c.given[CT_KEY_learning_rate] == CT_ORIGIN_FILE);
  CHECK(!c.given[CT_KEY_seed] == 0);
  /* warnings: ${EXTRA} skipped, the launcher's variable, an unknown variable */
  CHECKF(probs.n == 3, "%zu", probs.n);
  ct_config_problems_free(&probs);
  ct_config_free(&c);
  p = ct_test_write_tmp("bad.env",
                        "MODEL_NAME=black-forest-labs/FLUX.1-dev\n"
                        "LEARNING_RATE=\"1e-4\" # peak\n"
                        "OPTIMIZER=adamw # the default\n"
                        "OUTPUT_DIR=${HOME}/out\n"
                        "VALIDATION_PROMPT=\"unclosed\n"
                        "2BAD=1\n");
  ct_config_defaults(&c);
  CHECK(ct_config_load(&c, p, &probs) != CT_OK);
  char w[700];
  /* names while reading; then each variable in file order */
  /* MODEL_NAME (line 1) is pretrained_model_name_or_path, a key ctuner reads */
  const char *want[][2] = {{"bad.env:6:1", "not a variable name"},
                           {"bad.env:2:22", "text after the closing quote"},
                           {"bad.env:3:17", "comment after an unquoted value"},
                           {"bad.env:4:12", "does not expand"},
                           {"bad.env:5:19", "not closed"}};
  CHECKF(probs.errors == 5, "%zu", probs.errors);
  CHECK(c.pretrained_model_name_or_path &&
        !strcmp(c.pretrained_model_name_or_path, "black-forest-labs/FLUX.1-dev"));
  for (size_t i = 0; i < probs.n && i < 5; i++)
    CHECKF(strstr(ct_config_problem_where(&probs.v[i], w, sizeof w), want[i][0]) &&
               strstr(probs.v[i].msg, want[i][1]),
           "%zu: %s: %s", i, w, probs.v[i].msg);
  ct_config_problems_free(&probs);
  ct_config_free(&c);
}

/* A config.env that selects another backend is the launcher's file: one
 * error saying which file holds the options, no variable read. */
CT_TEST(config, env_file_for_another_backend) {
  const char *p = ct_test_write_tmp("launcher.env",
                                    "export TRAINING_NUM_PROCESSES=8\n"
                                    "export CONFIG_BACKEND='json'\n"
                                    "export LEARNING_RATE=1\n");
  ct_config c;
  ct_config_defaults(&c);
  ct_config_problems probs = {0};
  CHECK(ct_config_load(&c, p, &probs) != CT_OK);
  CHECKF(probs.n == 1 && strstr(probs.v[0].msg, "config/config.json") && probs.v[0].line == 2, "%s",
         probs.n ? probs.v[0].msg : "");
  CHECK(c.given[CT_KEY_learning_rate] == 0);
  ct_config_problems_free(&probs);
  ct_config_free(&c);
}

/* config.toml: typed values as config.json; tables refused by name. */
CT_TEST(config, toml_file) {
  const char *p = ct_test_write_tmp("config.toml",
                                    "# SimpleTuner config.toml\n"
                                    "model_family = \"flux\"\n"
                                    "learning_rate = 1e-4\n"
                                    "train_batch_size = 2\n"
                                    "\"use_ema\" = true\n"
                                    "validation_prompt = 'C:\\no escapes'\n"
                                    "output_dir = \"out\\u00e9\" # trailing comment\n");
  ct_config c;
  ct_config_defaults(&c);
  ct_config_problems probs = {0};
  CHECKF(ct_config_load(&c, p, &probs) == CT_OK, "%s", probs.n ? probs.v[0].msg : "");
  CHECK(c.train_batch_size == 2 && c.use_ema == 1);
  CHECK(!strcmp(c.validation_prompt, "C:\\no escapes"));
  CHECK(!strcmp(c.output_dir, "out\xc3\xa9"));
  CHECK(c.line[CT_KEY_train_batch_size] == 4 && c.col[CT_KEY_train_batch_size] == 20);
  ct_config_problems_free(&probs);
  p = ct_test_write_tmp("t.toml", "seed = 1\n[model]\nx = 1\n");
  CHECK(ct_config_load(&c, p, &probs) == CT_ERR_FORMAT);
  char w[700];
  CHECKF(probs.n == 1 && strstr(ct_config_problem_where(&probs.v[0], w, sizeof w), "t.toml:2:1") &&
             strstr(probs.v[0].msg, "tables"),
         "%s", probs.n ? probs.v[0].msg : "");
  ct_config_problems_free(&probs);
  ct_config_free(&c);
}
