/* Config parsing: defaults, "--" prefixes, aliases, types, errors with line and
 * column, did-you-mean, the optimizer's combinations from its registry flags,
 * {env:VAR}, command-line overrides, digest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/config.h"
#include "harness.h"

static const char *write_tmp(const char *name, const char *text) {
  static char path[4][1024];
  static int k;
  char *p = path[k++ % 4];
  snprintf(p, 1024, "%s/%s", ct_test_tmpdir(), name);
  FILE *f = fopen(p, "w");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
  return p;
}

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
  const char *p = write_tmp(
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
  const char *p =
      write_tmp("noeff.json",
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
                      &err) == CT_ERR_UNSUPPORTED);
  CHECK(strstr(err.msg, "FLUX.1 pipeline is not implemented yet") &&
        !strstr(err.msg, "did you mean"));
  CHECK(ct_config_set(&c, "--lora_rank", "16", &err) == CT_ERR_UNSUPPORTED);
  CHECK(strstr(err.msg, "LoRA training is not implemented yet"));
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
  const char *p = write_tmp("c2.json", "{\"--learning_rat\": 1}");
  CHECK(ct_config_load_file(&c, p, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "did you mean 'learning_rate'") && strstr(err.msg, "c2.json"), "%s",
         err.msg);
  p = write_tmp("c3.json", "{\"seed\": 1,\n  \"train_batch_size\": 2.5}");
  CHECK(ct_config_load_file(&c, p, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "line 2, column 23") && strstr(err.msg, "expects an integer"), "%s",
         err.msg);
  p = write_tmp("c4.json", "{\"seed\": 1\n  \"x\": 2}");
  CHECK(ct_config_load_file(&c, p, &err) != CT_OK);
  CHECKF(strstr(err.msg, "line 2, column 3"), "%s", err.msg);
  p = write_tmp("c5.json", "[1, 2]");
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
  const char *p = write_tmp("c6.json", "{\"output_dir\": \"{env:CT_TEST_CFG_DIR}/run1\"}");
  REQUIRE(ct_config_load_file(&c, p, &err) == CT_OK);
  CHECK(!strcmp(c.output_dir, "/tmp/ctuner-x/run1"));
  p = write_tmp("c7.json", "{\"output_dir\": \"{env:CT_TEST_CFG_UNSET}\"}");
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
