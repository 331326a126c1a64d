/* SimpleTuner's keys as ctuner reads them (issue 32): the polynomial
 * schedule's lr_power default (SimpleTuner's 0.8), the keys that only tune
 * speed (one warning, no effect, never a refusal), every SimpleTuner option
 * without a ctuner key named as SimpleTuner's with what ctuner does (never a
 * bare "unknown key"), options that act only when set (no effect at their
 * off value, refused when on), a directory given as the config file, and
 * integers too large for a key. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config_int.h"
#include "ctuner/config.h"
#include "ctuner/fs.h"
#include "ctuner/optim.h"
#include "harness.h"
#include "train/train_int.h"

/* SimpleTuner's lr_power default is 0.8 (field_registry/sections/training.py,
 * "LR Power": default_value=0.8); the start-up note and the schedule say so. */
CT_TEST(config_st, lr_power_default) {
  ct_config c;
  ct_config_defaults(&c);
  ct_err err = {0};
  CHECK(c.lr_power == 0.8);
  char note[1024];
  ct_config_defaults_note(&c, note, sizeof note);
  CHECKF(strstr(note, "lr_power 0.8"), "%s", note);
  REQUIRE(ct_config_set(&c, "lr_scheduler", "polynomial", &err) == CT_OK);
  ct_sched s;
  REQUIRE(ct_train_build_sched(&c, 100, &s, &err) == CT_OK);
  CHECK(s.kind == CT_SCHED_POLYNOMIAL && s.power == 0.8);
  /* halfway: (lr - lr_end) (1/2)^0.8 + lr_end */
  const double want = (c.learning_rate - c.lr_end) * pow(0.5, 0.8) + c.lr_end;
  CHECKF(fabs(ct_sched_lr(&s, 50) - want) < 1e-15, "%g vs %g", ct_sched_lr(&s, 50), want);
  REQUIRE(ct_config_set(&c, "lr_power", "1", &err) == CT_OK);
  ct_config_defaults_note(&c, note, sizeof note);
  CHECKF(!strstr(note, "lr_power"), "%s", note);
  ct_config_free(&c);
}

/* Keys that only tune speed in SimpleTuner: accepted, one warning each naming
 * the key, noted for the trainer's one line, no error; a config.json of them
 * passes the check. */
CT_TEST(config_st, speed_keys_warn) {
  static const char *const K[][2] = {
      {"allow_tf32", "true"},
      {"disable_tf32", "true"},
      {"torch_num_threads", "8"},
      {"read_batch_size", "25"},
      {"write_batch_size", "64"},
      {"image_processing_batch_size", "32"},
      {"aws_max_pool_connections", "128"},
      {"metadata_update_interval", "65"},
      {"max_workers", "32"},
      {"enable_multiprocessing", "true"},
      {"aspect_bucket_worker_count", "12"},
      {"dataloader_num_workers", NULL}, /* not SimpleTuner's: still unknown */
      {"vae_cache_ondemand", "true"},
      {"accelerator_cache_clear_interval", "100"},
      {"set_grads_to_none", "true"},
      {"keep_vae_loaded", "true"},
      {"offload_during_startup", "true"},
      {"dynamo_backend", "inductor"},
      {"enable_xformers_memory_efficient_attention", "true"},
  };
  ct_config c;
  ct_config_defaults(&c);
  for (size_t i = 0; i < sizeof K / sizeof K[0]; i++) {
    ct_config_problems probs = {0};
    const ct_status st = ct_config_set_arg(&c, K[i][0], K[i][1] ? K[i][1] : "1", &probs);
    if (!K[i][1]) {
      CHECKF(st == CT_ERR_INVALID && probs.errors == 1, "%s: %d", K[i][0], st);
    } else {
      CHECKF(st == CT_OK && probs.n == 1 && probs.v[0].warning && probs.errors == 0 &&
                 strstr(probs.v[0].msg, "has no effect here") &&
                 strstr(probs.v[0].msg, "SimpleTuner's option"),
             "%s: st %d, %zu problems: %s", K[i][0], st, probs.n, probs.n ? probs.v[0].msg : "");
      CHECKF(strstr(c.no_effect, K[i][0]) && ct_config_no_effect(K[i][0]), "%s not noted: %s",
             K[i][0], c.no_effect);
    }
    ct_config_problems_free(&probs);
  }
  ct_config_free(&c);
  /* the same in a config.json: warnings only, and the check passes */
  const char *p =
      ct_test_write_tmp("speed.json",
                        "{\"allow_tf32\": true, \"torch_num_threads\": 8, \"read_batch_size\": "
                        "25, \"write_batch_size\": 64, \"image_processing_batch_size\": 32, "
                        "\"aws_max_pool_connections\": 128, \"metadata_update_interval\": 65}");
  ct_config_defaults(&c);
  ct_config_problems probs = {0};
  CHECK(ct_config_load(&c, p, &probs) == CT_OK);
  CHECK(ct_config_check(&c, &probs) == CT_OK);
  CHECKF(probs.errors == 0 && probs.n == 7, "%zu problems, %zu errors", probs.n, probs.errors);
  ct_config_problems_free(&probs);
  ct_config_free(&c);
}

/* Every SimpleTuner option is a ctuner key (or alias), or named as
 * SimpleTuner's with what ctuner does: never a bare "unknown key". The list
 * is SimpleTuner's `train.py --help` (documentation/OPTIONS.md, commit
 * 0077465) with its other documented options and older names met in real
 * configs; revision and variant are left to the hub-id work (issue 32,
 * "Files users bring"). */
CT_TEST(config_st, every_simpletuner_option_is_named) {
  static const char *const ST =
      "model_family model_flavour controlnet pretrained_model_name_or_path output_dir logging_dir "
      "model_type seed resolution resume_from_checkpoint prediction_type "
      "pretrained_vae_model_name_or_path vae_dtype vae_cache_ondemand vae_cache_disable "
      "accelerator_cache_clear_interval aspect_bucket_rounding base_model_precision "
      "text_encoder_1_precision text_encoder_2_precision text_encoder_3_precision "
      "text_encoder_4_precision gradient_checkpointing_interval offload_during_startup "
      "quantize_via "
      "fuse_qkv_projections control controlnet_custom_config controlnet_model_name_or_path "
      "tread_config pretrained_transformer_model_name_or_path pretrained_transformer_subfolder "
      "pretrained_unet_model_name_or_path pretrained_unet_subfolder "
      "pretrained_t5_model_name_or_path base_model_default_dtype unet_attention_slice "
      "num_train_epochs max_train_steps train_batch_size learning_rate optimizer optimizer_config "
      "lr_scheduler gradient_accumulation_steps lr_warmup_steps checkpoints_total_limit "
      "gradient_checkpointing train_text_encoder text_encoder_lr lr_num_cycles lr_power "
      "use_soft_min_snr use_ema ema_device ema_cpu_only ema_update_interval ema_foreach_disable "
      "ema_decay lora_rank lora_alpha lora_type lora_dropout lora_init_type peft_lora_mode "
      "singlora_ramp_up_steps slider_lora_target init_lora lycoris_config init_lokr_norm "
      "flux_lora_target use_dora resolution_type data_backend_config caption_strategy "
      "conditioning_multidataset_sampling instance_prompt parquet_caption_column "
      "parquet_filename_column ignore_missing_files vae_cache_scan_behaviour vae_enable_slicing "
      "vae_enable_tiling vae_enable_patch_conv vae_batch_size caption_dropout_probability "
      "tokenizer_max_length validation_step_interval validation_epoch_interval disable_benchmark "
      "validation_prompt num_validation_images num_eval_images eval_steps_interval "
      "eval_epoch_interval eval_timesteps eval_dataset_pooling evaluation_type "
      "pretrained_evaluation_model_name_or_path validation_guidance validation_num_inference_steps "
      "validation_on_startup validation_using_datasets validation_torch_compile "
      "validation_guidance_real validation_no_cfg_until_timestep validation_negative_prompt "
      "validation_randomize validation_seed validation_disable validation_prompt_library "
      "user_prompt_library eval_dataset_id validation_stitch_input_location "
      "validation_guidance_rescale validation_disable_unconditional "
      "validation_guidance_skip_layers "
      "validation_guidance_skip_layers_start validation_guidance_skip_layers_stop "
      "validation_guidance_skip_scale validation_lycoris_strength validation_noise_scheduler "
      "validation_num_video_frames validation_resolution validation_seed_source "
      "validation_torch_compile_mode i_know_what_i_am_doing flow_sigmoid_scale flux_fast_schedule "
      "flow_use_uniform_schedule flow_use_beta_schedule flow_beta_schedule_alpha "
      "flow_beta_schedule_beta flow_schedule_shift flow_schedule_auto_shift flux_guidance_mode "
      "flux_attention_masked_training flux_guidance_value flux_guidance_min flux_guidance_max "
      "t5_padding sd3_clip_uncond_behaviour sd3_t5_uncond_behaviour soft_min_snr_sigma_data "
      "mixed_precision attention_mechanism sageattention_usage disable_tf32 set_grads_to_none "
      "noise_offset noise_offset_probability input_perturbation input_perturbation_steps lr_end "
      "lr_scale lr_scale_sqrt ignore_final_epochs freeze_encoder_before freeze_encoder_after "
      "freeze_encoder_strategy layer_freeze_strategy fully_unload_text_encoder save_text_encoder "
      "text_encoder_limit prepend_instance_prompt only_instance_prompt data_aesthetic_score "
      "delete_unwanted_images delete_problematic_images disable_bucket_pruning "
      "disable_segmented_timestep_sampling preserve_data_backend_cache override_dataset_config "
      "cache_dir cache_dir_text cache_dir_vae compress_disk_cache aspect_bucket_disable_rebuild "
      "keep_vae_loaded skip_file_discovery data_backend_sampling image_processing_batch_size "
      "write_batch_size read_batch_size enable_multiprocessing max_workers "
      "aws_max_pool_connections "
      "torch_num_threads dataloader_prefetch dataloader_prefetch_qlen aspect_bucket_worker_count "
      "aspect_bucket_alignment minimum_image_size maximum_image_size target_downsample_size "
      "max_upscale_threshold metadata_update_interval debug_aspect_buckets debug_dataset_loader "
      "print_filenames print_sampler_statistics timestep_bias_strategy timestep_bias_begin "
      "timestep_bias_end timestep_bias_multiplier timestep_bias_portion "
      "training_scheduler_timestep_spacing inference_scheduler_timestep_spacing loss_type "
      "huber_schedule huber_c snr_gamma masked_loss_probability hidream_use_load_balancing_loss "
      "hidream_load_balancing_loss_weight adam_beta1 adam_beta2 optimizer_beta1 optimizer_beta2 "
      "optimizer_cpu_offload_method gradient_precision adam_weight_decay adam_epsilon "
      "prodigy_steps "
      "max_grad_norm grad_clip_method optimizer_offload_gradients fuse_optimizer "
      "optimizer_release_gradients push_to_hub push_to_hub_background push_checkpoints_to_hub "
      "publishing_config hub_model_id model_card_private model_card_safe_for_work model_card_note "
      "report_to checkpoint_step_interval checkpoint_epoch_interval checkpointing_rolling_steps "
      "checkpointing_use_tempdir checkpoints_rolling_total_limit tracker_run_name "
      "tracker_project_name tracker_image_layout enable_watermark framerate seed_for_each_device "
      "snr_weight rescale_betas_zero_snr webhook_config webhook_reporting_interval "
      "distillation_method distillation_config ema_validation local_rank ltx_train_mode "
      "ltx_i2v_prob ltx_partial_noise_fraction ltx_protect_first_frame offload_param_path "
      "offset_noise quantize_activations refiner_training refiner_training_invert_schedule "
      "refiner_training_strength sdxl_refiner_uses_full_range sana_complex_human_instruction "
      "lora_format offload_during_save enable_group_offload group_offload_type "
      "group_offload_blocks_per_group group_offload_use_stream group_offload_to_disk_path ramtorch "
      "ramtorch_target_modules ramtorch_text_encoder ramtorch_vae ramtorch_controlnet "
      "enable_model_cpu_offload sla_config dynamo_backend dynamo_mode dynamo_fullgraph "
      "dynamo_dynamic dynamo_use_regional_compilation allow_dataset_oversubscription num_processes "
      "allow_tf32 enable_xformers_memory_efficient_attention sdnq_use_hadamard "
      "sdnq_hadamard_group_size sdnq_group_size sdnq_use_quantized_matmul sdnq_compile_mode "
      "checkpointing_steps validation_steps";
  int n = 0;
  for (const char *p = ST; *p;) {
    const size_t l = strcspn(p, " ");
    char k[96];
    snprintf(k, sizeof k, "%.*s", (int)l, p);
    p += l + (p[l] == ' ');
    n++;
    ct_config c;
    ct_config_defaults(&c);
    ct_config_problems probs = {0};
    ct_config_set_arg(&c, k, "1", &probs);
    for (size_t i = 0; i < probs.n; i++)
      CHECKF(!strstr(probs.v[i].msg, "unknown key"), "%s: %s", k, probs.v[i].msg);
    const int known = ct_config_help(k) != NULL;
    CHECKF(known || (probs.n == 1 && strstr(probs.v[0].msg, "SimpleTuner")),
           "%s: neither a key nor named as SimpleTuner's (%zu problems)", k, probs.n);
    ct_config_problems_free(&probs);
    ct_config_free(&c);
  }
  CHECK(n > 290);
}

/* Options that act only when set: no effect at the off value, refused (naming
 * the value and why) when on; the same from a config.json's JSON values. */
CT_TEST(config_st, options_act_only_when_set) {
  static const struct {
    const char *key, *value;
    int refused;
  } C[] = {
      {"validation_on_startup", "false", 0},
      {"validation_on_startup", "true", 1},
      {"attention_mechanism", "diffusers", 0},
      {"attention_mechanism", "flash-attn-3", 0},
      {"attention_mechanism", "sageattention", 1},
      {"train_text_encoder", "false", 0},
      {"train_text_encoder", "true", 1},
      {"flow_sigmoid_scale", "1.0", 0},
      {"flow_sigmoid_scale", "2.0", 1},
      {"lora_format", "diffusers", 0},
      {"lora_format", "comfyui", 1},
      {"tread_config", "{}", 1},
      {"init_lokr_norm", "none", 0},
      {"init_lokr_norm", "1e-3", 1},
      {"caption_strategy", "textfile", 1},
      {"data_backend_sampling", "auto-weighting", 1},
      {"loss_type", "huber", 0},
  };
  for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
    ct_config c;
    ct_config_defaults(&c);
    ct_config_problems probs = {0};
    const ct_status st = ct_config_set_arg(&c, C[i].key, C[i].value, &probs);
    CHECKF((st != CT_OK) == C[i].refused && probs.n == 1 && probs.v[0].warning == !C[i].refused &&
               strstr(probs.v[0].msg, "SimpleTuner"),
           "%s=%s: st %d: %s", C[i].key, C[i].value, st, probs.n ? probs.v[0].msg : "");
    if (C[i].refused && probs.n) CHECKF(strstr(probs.v[0].msg, C[i].value), "%s", probs.v[0].msg);
    ct_config_problems_free(&probs);
    ct_config_free(&c);
  }
  const char *p =
      ct_test_write_tmp("when.json",
                        "{\"validation_on_startup\": false, \"train_text_encoder\": true, "
                        "\"validation_guidance_skip_layers\": [], \"flow_sigmoid_scale\": 1.0}");
  ct_config c;
  ct_config_defaults(&c);
  ct_config_problems probs = {0};
  ct_config_load(&c, p, &probs);
  CHECKF(probs.errors == 1 && probs.n == 4 && !strcmp(probs.v[1].key, "train_text_encoder") &&
             !probs.v[1].warning,
         "%zu problems, %zu errors", probs.n, probs.errors);
  ct_config_problems_free(&probs);
  ct_config_free(&c);
}

/* No row of the SimpleTuner table is also a key or an alias (it would never
 * be reached), and SimpleTuner's current names validation_disable is an alias. */
CT_TEST(config_st, table_rows_are_not_keys) {
  const char *k;
  for (size_t i = 0; ct_cfg_st_option_at(i, &k); i++) {
    char name[128];
    snprintf(name, sizeof name, "%s", k);
    const size_t l = strlen(name);
    if (name[l - 1] == '*') name[l - 1] = 0;
    CHECKF(ct_config_help(name) == NULL, "'%s' is a key and a SimpleTuner table row", name);
  }
  ct_config c;
  ct_config_defaults(&c);
  ct_err err = {0};
  CHECK(ct_config_set(&c, "validation_disable", "true", &err) == CT_OK && c.disable_validation);
  /* "none" is a value of ema_validation, not "unset" (SimpleTuner's hidream example says
   * "ema_validation": "none"; it read as '' and was refused) */
  CHECK(ct_config_set(&c, "ema_validation", "none", &err) == CT_OK && c.ema_validation &&
        !strcmp(c.ema_validation, "none"));
  CHECKF(ct_config_validate(&c, &err) == CT_OK, "%s", err.msg);
  CHECK(ct_config_set(&c, "report_to", "none", &err) == CT_OK && c.report_to == NULL);
  ct_config_free(&c);
}

/* A directory as the config file says so (and names the configs in it); an
 * integer too large says "too large" from the command line, JSON and TOML. */
CT_TEST(config_st, directory_and_too_large) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/cfgdir", ct_test_tmpdir());
  mkdir(dir, 0755);
  ct_test_write_tmp("cfgdir/config.json", "{}");
  ct_config c;
  ct_config_defaults(&c);
  ct_config_problems probs = {0};
  CHECK(ct_config_load(&c, dir, &probs) != CT_OK);
  CHECKF(probs.n == 1 && strstr(probs.v[0].msg, "is a directory, not a config file") &&
             strstr(probs.v[0].msg, "cfgdir/config.json"),
         "%s", probs.n ? probs.v[0].msg : "");
  ct_config_problems_free(&probs);
  ct_err err = {0};
  CHECK(ct_config_set(&c, "seed", "99999999999999999999", &err) != CT_OK);
  CHECKF(strstr(err.msg, "too large") && strstr(err.msg, "seed"), "%s", err.msg);
  CHECK(ct_config_set(&c, "seed", "-99999999999999999999", &err) != CT_OK);
  CHECKF(strstr(err.msg, "too large"), "%s", err.msg);
  CHECK(ct_config_set(&c, "seed", "12x", &err) != CT_OK && !strstr(err.msg, "too large"));
  const char *pj = ct_test_write_tmp("big.json", "{\"max_train_steps\": 123456789012345678901234}");
  CHECK(ct_config_load(&c, pj, &probs) != CT_OK);
  CHECKF(probs.n == 1 && strstr(probs.v[0].msg, "too large") &&
             strstr(probs.v[0].msg, "max_train_steps"),
         "%s", probs.n ? probs.v[0].msg : "");
  ct_config_problems_free(&probs);
  const char *pt = ct_test_write_tmp("big.toml", "max_train_steps = 123456789012345678901234\n");
  CHECK(ct_config_load(&c, pt, &probs) != CT_OK);
  CHECKF(probs.n == 1 && strstr(probs.v[0].msg, "too large"), "%s", probs.n ? probs.v[0].msg : "");
  ct_config_problems_free(&probs);
  /* a directory where a data file is read (ct_read_file) */
  char *data = NULL;
  size_t n = 0;
  CHECK(ct_read_file(dir, 1 << 20, &data, &n, &err) == CT_ERR_INVALID &&
        strstr(err.msg, "is a directory"));
  ct_config_free(&c);
}
