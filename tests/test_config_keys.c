/* The config table's per-key data: the model types a key applies to
 * (ct_config_key_applies, keys given explicitly and ct_config_first_inapplicable),
 * the listing behind --help-keys, and the messages of the declarative rules
 * (ranges, intervals, choices) that replaced the hand-written checks. */
#include <stdio.h>
#include <string.h>

#include "ctuner/config.h"
#include "harness.h"

CT_TEST(config_keys, applies_by_model_type) {
  CHECK(ct_config_key_applies("vae_loss", "vae") == 1);
  CHECK(ct_config_key_applies("vae_loss", "full") == 0);
  CHECK(ct_config_key_applies("--vae_kl_weight", "full") == 0);
  CHECK(ct_config_key_applies("text_encoder", "vae") == 0);
  CHECK(ct_config_key_applies("flow_shift", "vae") == 0);
  CHECK(ct_config_key_applies("validation_guidance", "vae") == 0);
  CHECK(ct_config_key_applies("text_encoder", "full") == 1);
  CHECK(ct_config_key_applies("learning_rate", "vae") == 1);
  CHECK(ct_config_key_applies("zero_stage", "vae") == 1);
  CHECK(ct_config_key_applies("checkpointing_steps", "vae") == 1); /* an alias */
  CHECK(ct_config_key_applies("no_such_key", "full") == -1);
  CHECK(ct_config_key_applies("learning_rate", "lora") == 1); /* lora takes every FULL key */
  CHECK(ct_config_key_applies("lora_rank", "lora") == 1);
  CHECK(ct_config_key_applies("lora_rank", "full") == 0);
  CHECK(ct_config_key_applies("lora_rank", "vae") == 0);
  CHECK(ct_config_key_applies("learning_rate", "dreambooth") == -1);
}

CT_TEST(config_keys, given_and_inapplicable) {
  ct_config c;
  ct_err err = {0};
  ct_config_defaults(&c);
  int any = 0;
  for (int i = 0; i < CT_CONFIG_NKEYS; i++) any |= c.given[i];
  CHECK(!any);                                     /* defaults are not "given" */
  CHECK(ct_config_first_inapplicable(&c) == NULL); /* full, nothing given */
  CHECK(ct_config_set(&c, "--text_encoder", "clip-byte", &err) == CT_OK);
  CHECK(c.given[CT_KEY_text_encoder] && !c.given[CT_KEY_learning_rate]);
  CHECK(ct_config_first_inapplicable(&c) == NULL); /* applies to full */
  CHECK(ct_config_set(&c, "model_type", "vae", &err) == CT_OK);
  const char *k = ct_config_first_inapplicable(&c);
  CHECKF(k && !strcmp(k, "text_encoder"), "%s", k ? k : "NULL");
  CHECK(ct_config_set(&c, "bogus_key", "1", &err) != CT_OK); /* a failed set marks nothing */
  ct_config_free(&c);

  char path[1024];
  snprintf(path, sizeof path, "%s/given.json", ct_test_tmpdir());
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs("{\"model_type\": \"full\", \"vae_loss\": \"l2\", \"learning_rate\": 0.5}\n", f);
  fclose(f);
  ct_config_defaults(&c);
  CHECKF(ct_config_load_file(&c, path, &err) == CT_OK, "%s", err.msg);
  CHECK(c.given[CT_KEY_vae_loss] && c.given[CT_KEY_learning_rate] && !c.given[CT_KEY_seed]);
  k = ct_config_first_inapplicable(&c);
  CHECKF(k && !strcmp(k, "vae_loss"), "%s", k ? k : "NULL");
  ct_config_free(&c);
}

CT_TEST(config_keys, listing) {
  ct_config_key_info k;
  size_t n = 0;
  int vae_only = 0, full_only = 0;
  for (; ct_config_key_info_at(n, &k); n++) {
    CHECK(k.models != 0 && k.help && ct_config_help(k.name) == k.help);
    vae_only += k.models == CT_MODEL_VAE;
    full_only += k.models == CT_MODEL_FULL;
  }
  CHECK(n == CT_CONFIG_NKEYS);
  CHECK(vae_only >= 4 && full_only >= 10);
  CHECK(ct_config_key_info_at(CT_KEY_vae_loss, &k) && !strcmp(k.name, "vae_loss") &&
        !strcmp(ct_config_models_name(k.models), "vae"));
  CHECK(!strcmp(ct_config_models_name(CT_MODEL_ALL), "all"));
}

/* One key set to a bad value: the message the table's rule gives. */
static void expect(int *ct_failed_, const char *key, const char *value, const char *msg) {
  ct_config c;
  ct_err err = {0};
  ct_config_defaults(&c);
  CHECK(ct_config_set(&c, key, value, &err) == CT_OK);
  /* the place ("--key: ") first, then the rule's message */
  char want[1200];
  snprintf(want, sizeof want, "--%s: %s", key, msg);
  CHECKF(ct_config_validate(&c, &err) == CT_ERR_INVALID && !strcmp(err.msg, want), "%s=%s: %s", key,
         value, err.msg);
  ct_config_free(&c);
}

CT_TEST(config_keys, rule_messages) {
  expect(ct_failed_, "seed", "-1", "seed must be >= 0, got -1");
  expect(ct_failed_, "offload_buffer_size", "-2",
         "offload_buffer_size must be >= 0 (0: auto), got -2");
  expect(ct_failed_, "resolution", "5000", "resolution must be between 0 and 4096, got 5000");
  expect(ct_failed_, "aspect_bucket_alignment", "12",
         "aspect_bucket_alignment must be 8, 16, 24, 32 or 64, got 12");
  expect(ct_failed_, "zero_stage", "4", "zero_stage must be 0, 1, 2 or 3, got 4");
  expect(ct_failed_, "max_grad_norm", "-1", "max_grad_norm must be >= 0 (0 disables), got -1");
  expect(ct_failed_, "logit_std", "0", "logit_std must be > 0, got 0");
  expect(ct_failed_, "adam_beta1", "1", "adam_beta1 must be in [0, 1), got 1");
  expect(ct_failed_, "flow_shift", "nan", "flow_shift must be in [0, 1000), got nan");
  expect(ct_failed_, "caption_dropout_probability", "1.5",
         "caption_dropout_probability must be in [0, 1], got 1.5");
  expect(ct_failed_, "webhook_timeout", "0",
         "webhook_timeout must be more than 0 and at most 600 seconds, got 0");
  expect(ct_failed_, "health_poll_interval", "0.001",
         "health_poll_interval must be between 0.01 and 3600 seconds, got 0.001");
  expect(ct_failed_, "vae_loss", "l3", "vae_loss must be l1 or l2, got 'l3'");
  expect(ct_failed_, "warmup_type", "cubic",
         "warmup_type must be \"log\" or \"linear\", got 'cubic'");
  expect(ct_failed_, "ema_validation", "x",
         "ema_validation must be none, ema_only or comparison, got 'x'");
  expect(ct_failed_, "offload_optimizer", "disk",
         "offload_optimizer must be none, cpu or nvme, got 'disk'");
  expect(ct_failed_, "model_family", "sdxl2",
         "model_family 'sdxl2' is not supported; use \"flux\" or \"sdxl\"");
  expect(ct_failed_, "model_family", "sd3",
         "model_family 'sd3' is one of SimpleTuner's families, not yet in ctuner; ctuner has "
         "\"flux\" or \"sdxl\" (docs/models.md)");
  expect(ct_failed_, "codec", "jpeg", "codec 'jpeg' is not supported; use \"pixel\" or \"vae\"");
  expect(ct_failed_, "text_encoder", "t5",
         "text_encoder 't5' is not supported; use \"clip-byte\" or \"clip-bpe\"");
}
