/* names.c: SimpleTuner's names for things ctuner does differently, and the
 * "did you mean" for keys nobody knows.
 *
 * Two tables: ST, SimpleTuner's options ctuner has no key for, each with
 * what ctuner does (accepted with one warning when it changes nothing here,
 * refused with what is missing when it would; never pointed at a look-alike
 * key), and HINTS: spellings and
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
#include <strings.h>

#include "config_int.h"

/* SimpleTuner's options that have no row in CT_CONFIG_KEYS, and what ctuner
 * does with each (issue 32: none is a bare "unknown key"). The key list is
 * SimpleTuner's (documentation/OPTIONS.md, its `train.py --help` dump, read
 * at commit 0077465; the field registry
 * simpletuner/simpletuner_sdk/server/services/field_registry/sections/ (one file per tab);
 * older names met in real configs: allow_tf32,
 * enable_xformers_memory_efficient_attention). A key ending in '*' is a
 * prefix (sdnq_*). Kinds:
 *   NOEF  accepted with one warning, as it changes no number of the run here
 *         (speed, memory, logging, uploads, other model families);
 *   REF   refused: it changes the run and ctuner does not do it;
 *   SET   does something only when set: at one of its off values ("off",
 *         '|'-separated; NULL: false, 0, none, null, "" and empty lists) it
 *         is no-effect, at any other value refused.
 * `why` says what ctuner does; for SET it reads true either way. */
typedef enum { NOEF, REF, SET } st_kind;
static const struct st_opt {
  const char *key;
  st_kind kind;
  const char *off;
  const char *why;
} ST[] = {
    /* uploads, trackers, model cards */
    {"push_to_hub", NOEF, NULL, "ctuner does not upload to the Hugging Face Hub"},
    {"push_checkpoints_to_hub", NOEF, NULL, "ctuner does not upload to the Hugging Face Hub"},
    {"push_to_hub_background", NOEF, NULL, "ctuner does not upload to the Hugging Face Hub"},
    {"hub_model_id", NOEF, NULL, "ctuner does not upload to the Hugging Face Hub"},
    {"model_card_note", NOEF, NULL, "ctuner writes no Hugging Face model card"},
    {"model_card_private", NOEF, NULL, "ctuner writes no Hugging Face model card"},
    {"model_card_safe_for_work", NOEF, NULL, "ctuner writes no Hugging Face model card"},
    {"publishing_config", NOEF, NULL,
     "ctuner publishes nowhere (output_dir s3://bucket/prefix uploads its checkpoints)"},
    {"tracker_image_layout", NOEF, NULL,
     "wandb's gallery/table choice; TensorBoard shows each validation image under its own tag"},
    {"enable_watermark", NOEF, NULL, "ctuner's validation images carry no watermark"},
    {"webhook_reporting_interval", NOEF, NULL,
     "ctuner sends its training.status events every webhook_status_interval seconds (SimpleTuner's "
     "interval counts steps)"},
    /* torch.compile, kernels, TF32: speed only */
    {"validation_torch_compile", NOEF, NULL, "no torch.compile: ctuner's kernels are compiled C"},
    {"validation_torch_compile_mode", NOEF, NULL,
     "no torch.compile: ctuner's kernels are compiled C"},
    {"dynamo_*", NOEF, NULL, "no torch.compile: ctuner's kernels are compiled C"},
    {"fuse_qkv_projections", NOEF, NULL, "the MMDiT's q, k and v projections are already one GEMM"},
    {"allow_tf32", NOEF, NULL,
     "TF32 is a speed setting of PyTorch's GEMMs; ctuner's float32 GEMMs are IEEE float32 on every "
     "backend"},
    {"disable_tf32", NOEF, NULL,
     "TF32 is a speed setting of PyTorch's GEMMs; ctuner's float32 GEMMs are IEEE float32 on every "
     "backend"},
    {"enable_xformers_memory_efficient_attention", NOEF, NULL,
     "an attention kernel choice; ctuner's attention is its own kernel, the same math"},
    {"sageattention_usage", NOEF, NULL,
     "SageAttention is not used here (attention_mechanism sageattention is refused)"},
    {"sla_config", NOEF, NULL,
     "SLA attention is not used here (attention_mechanism sla is refused)"},
    {"attention_mechanism", SET,
     "diffusers|xformers|flash-attn|flash-attn-2|flash-attn-3|flash-attn-3-varlen|flex|cudnn|"
     "native-efficient|native-flash|native-math|native-npu|native-xla",
     "ctuner's attention is its own exact kernel (the SDPA, xformers and flash backends compute "
     "the "
     "same); the quantised or sparse SageAttention and SLA are not implemented"},
    /* threads, workers, I/O batching: speed only */
    {"torch_num_threads", NOEF, NULL,
     "PyTorch's CPU threads; ctuner's are OpenMP threads (num_threads, 0: every core)"},
    {"max_workers", NOEF, NULL, "ctuner's caches are built on every core (OpenMP)"},
    {"enable_multiprocessing", NOEF, NULL, "ctuner's caches are built on every core (OpenMP)"},
    {"aspect_bucket_worker_count", NOEF, NULL, "ctuner buckets on every core (OpenMP)"},
    {"image_processing_batch_size", NOEF, NULL,
     "a read-ahead size of SimpleTuner's image workers; ctuner's latent cache streams its images"},
    {"read_batch_size", NOEF, NULL,
     "a read-ahead size of SimpleTuner's VAE cache; ctuner's latent cache streams its images"},
    {"write_batch_size", NOEF, NULL,
     "a write batching size of SimpleTuner's VAE cache (a dataset's own write_batch_size is read)"},
    {"aws_max_pool_connections", NOEF, NULL,
     "the S3 connection pool is set per dataset (aws_max_pool_connections in the data backend "
     "config)"},
    {"metadata_update_interval", NOEF, NULL,
     "how often SimpleTuner saves its bucket metadata while scanning; ctuner writes its own once"},
    {"preserve_data_backend_cache", NOEF, NULL,
     "ctuner validates its discovery and latent caches itself on every start"},
    {"override_dataset_config", NOEF, NULL,
     "ctuner validates its discovery and latent caches itself on every start"},
    {"vae_cache_scan_behaviour", NOEF, NULL,
     "ctuner validates its discovery and latent caches itself on every start"},
    {"aspect_bucket_disable_rebuild", NOEF, NULL,
     "ctuner builds its aspect buckets once per run, never per epoch"},
    {"skip_file_discovery", NOEF, NULL,
     "ctuner's discovery cache makes a restart cheap by itself (a dataset's own "
     "skip_file_discovery is accepted too)"},
    {"vae_cache_ondemand", NOEF, NULL,
     "ctuner encodes each image once, before training, into its latent cache (the same latents an "
     "on-demand encode gives, without encoding again every epoch)"},
    {"vae_cache_disable", NOEF, NULL,
     "ctuner always keeps its latent cache (the training numbers do not depend on it)"},
    {"vae_batch_size", NOEF, NULL,
     "the latent cache encodes on every core in chunks; there is no VAE batch size"},
    {"vae_dtype", NOEF, NULL, "ctuner's VAE encodes in float32"},
    {"vae_enable_slicing", NOEF, NULL, "a memory setting of diffusers' VAE; ctuner's is tiled"},
    {"vae_enable_tiling", NOEF, NULL, "ctuner's VAE tiles by vae_tile"},
    {"vae_enable_patch_conv", NOEF, NULL, "a HunyuanVideo VAE memory setting"},
    {"keep_vae_loaded", NOEF, NULL, "ctuner holds the VAE only while it builds the latent cache"},
    /* memory placement and offload of PyTorch models: memory only */
    {"offload_during_startup", NOEF, NULL, "ctuner places its models itself (memory only)"},
    {"offload_during_save", NOEF, NULL, "ctuner places its models itself (memory only)"},
    {"fully_unload_text_encoder", NOEF, NULL, "ctuner places its models itself (memory only)"},
    {"enable_model_cpu_offload", NOEF, NULL,
     "ctuner's offload is offload_optimizer and offload_param (memory only)"},
    {"enable_group_offload", NOEF, NULL,
     "ctuner's offload is offload_optimizer and offload_param (memory only)"},
    {"group_offload_*", NOEF, NULL,
     "ctuner's offload is offload_optimizer and offload_param (memory only)"},
    {"ramtorch*", NOEF, NULL,
     "ctuner's offload is offload_optimizer and offload_param (memory only)"},
    {"accelerator_cache_clear_interval", NOEF, NULL,
     "PyTorch's CUDA cache; ctuner allocates its own memory once"},
    {"set_grads_to_none", NOEF, NULL, "ctuner's gradients are one buffer, zeroed every step"},
    {"optimizer_offload_gradients", NOEF, NULL,
     "ctuner's offload is offload_optimizer and offload_param (memory only)"},
    {"optimizer_release_gradients", NOEF, NULL, "ctuner's gradients are one buffer (memory only)"},
    {"optimizer_cpu_offload_method", NOEF, NULL,
     "ctuner's offload is offload_optimizer and offload_param (memory only)"},
    {"fuse_optimizer", NOEF, NULL, "ctuner's optimizer steps are fused loops already"},
    {"unet_attention_slice", NOEF, NULL, "an SDXL UNet memory setting"},
    {"checkpointing_use_tempdir", NOEF, NULL,
     "ctuner always writes a checkpoint to a temporary directory and renames it"},
    /* logging, debugging, processes */
    {"debug_aspect_buckets", NOEF, NULL, "SimpleTuner's debug log; ctuner --log-level debug"},
    {"debug_dataset_loader", NOEF, NULL, "SimpleTuner's debug log; ctuner --log-level debug"},
    {"print_filenames", NOEF, NULL, "SimpleTuner's debug log; ctuner --log-level debug"},
    {"print_sampler_statistics", NOEF, NULL, "SimpleTuner's debug log; ctuner --log-level debug"},
    {"local_rank", NOEF, NULL, "the rank comes from mpirun ('ctuner launch')"},
    {"num_processes", NOEF, NULL,
     "processes are mpirun's -n here ('ctuner launch' reads an Accelerate config's "
     "num_processes)"},
    {"i_know_what_i_am_doing", NOEF, NULL, "ctuner's limits have no override"},
    {"disable_benchmark", NOEF, NULL,
     "SimpleTuner's start-up validation benchmark does not exist here"},
    {"ema_device", NOEF, NULL, "the EMA lives beside the weights it follows (host memory)"},
    {"ema_cpu_only", NOEF, NULL, "the EMA lives beside the weights it follows (host memory)"},
    {"ema_foreach_disable", NOEF, NULL, "no torch foreach kernels: the EMA is one fused loop"},
    /* evaluation (SimpleTuner's eval datasets, CLIP scores) */
    {"eval_steps_interval", NOEF, NULL,
     "SimpleTuner's evaluation loss runs over `dataset_type: eval` backends, which ctuner does not "
     "read"},
    {"eval_epoch_interval", NOEF, NULL,
     "SimpleTuner's evaluation loss runs over `dataset_type: eval` backends, which ctuner does not "
     "read"},
    {"eval_timesteps", NOEF, NULL, "SimpleTuner's evaluation loss is not run here"},
    {"eval_dataset_pooling", NOEF, NULL, "SimpleTuner's evaluation loss is not run here"},
    {"eval_dataset_id", NOEF, NULL, "SimpleTuner's evaluation loss is not run here"},
    {"num_eval_images", NOEF, NULL,
     "SimpleTuner's CLIP evaluation (evaluation_type clip) is not run here"},
    {"pretrained_evaluation_model_name_or_path", NOEF, NULL,
     "SimpleTuner's CLIP evaluation (evaluation_type clip) is not run here"},
    /* other model families and their parts: nothing for a FLUX.1 model */
    {"sd3_clip_uncond_behaviour", NOEF, NULL, "an SD3 setting; ctuner trains FLUX.1"},
    {"sd3_t5_uncond_behaviour", NOEF, NULL, "an SD3 setting; ctuner trains FLUX.1"},
    {"text_encoder_3_precision", NOEF, NULL, "FLUX.1 has two text encoders"},
    {"text_encoder_4_precision", NOEF, NULL, "FLUX.1 has two text encoders"},
    {"pretrained_unet_model_name_or_path", NOEF, NULL, "a UNet model's; FLUX.1 has a transformer"},
    {"pretrained_unet_subfolder", NOEF, NULL, "a UNet model's; FLUX.1 has a transformer"},
    {"hidream_*", NOEF, NULL, "a HiDream setting; ctuner trains FLUX.1"},
    {"ltx_*", NOEF, NULL, "an LTX-Video setting; ctuner trains FLUX.1"},
    {"framerate", NOEF, NULL, "a video setting; ctuner trains images"},
    {"validation_num_video_frames", NOEF, NULL, "a video setting; ctuner trains images"},
    {"sana_complex_human_instruction", NOEF, NULL, "a Sana setting; ctuner trains FLUX.1"},
    {"sdxl_refiner_uses_full_range", NOEF, NULL, "an SDXL refiner setting"},
    {"refiner_training_invert_schedule", NOEF, NULL, "an SDXL refiner setting"},
    {"refiner_training_strength", NOEF, NULL, "an SDXL refiner setting"},
    {"data_aesthetic_score", NOEF, NULL, "an SDXL refiner conditioning"},
    {"validation_stitch_input_location", NOEF, NULL,
     "an image-to-image validation setting; ctuner validates text-to-image"},
    /* DDPM-only settings: SimpleTuner applies none of them to flow matching
     * (models/common.py loss(): "Flow matching always uses L2 loss"; noise
     * offset only `if not self.config.flow_matching`; SNR weights and the
     * timestep spacing belong to the DDPM schedule) */
    {"use_soft_min_snr", NOEF, NULL, "SNR weighting is for DDPM models; FLUX.1 is flow matching"},
    {"soft_min_snr_sigma_data", NOEF, NULL,
     "SNR weighting is for DDPM models; FLUX.1 is flow matching"},
    {"rescale_betas_zero_snr", NOEF, NULL, "a DDPM schedule setting; FLUX.1 is flow matching"},
    {"training_scheduler_timestep_spacing", NOEF, NULL,
     "a DDPM schedule setting; FLUX.1 is flow matching"},
    {"inference_scheduler_timestep_spacing", NOEF, NULL,
     "a DDPM schedule setting; FLUX.1 is flow matching"},
    {"disable_segmented_timestep_sampling", NOEF, NULL,
     "SimpleTuner segments DDPM timesteps only; FLUX.1 is flow matching"},
    {"loss_type", NOEF, NULL,
     "SimpleTuner's flow-matching loss is always L2 (huber and smooth_l1 apply to DDPM models)"},
    {"huber_schedule", NOEF, NULL, "SimpleTuner's flow-matching loss is always L2"},
    {"huber_c", NOEF, NULL, "SimpleTuner's flow-matching loss is always L2"},
    /* text encoder training: not implemented; its settings then mean nothing */
    {"train_text_encoder", SET, NULL, "ctuner does not train the text encoders"},
    {"text_encoder_lr", NOEF, NULL, "ctuner does not train the text encoders"},
    {"text_encoder_limit", NOEF, NULL, "ctuner does not train the text encoders"},
    {"save_text_encoder", NOEF, NULL, "ctuner does not train the text encoders"},
    {"freeze_encoder_before", NOEF, NULL, "ctuner does not train the text encoders"},
    {"freeze_encoder_after", NOEF, NULL, "ctuner does not train the text encoders"},
    {"freeze_encoder_strategy", NOEF, NULL, "ctuner does not train the text encoders"},
    /* the rest of what changes a run: refused when on */
    {"tread_config", REF, NULL, "TREAD token routing is not implemented"},
    {"init_lokr_norm", SET, NULL,
     "SimpleTuner's perturbed-normal LoKr initialisation is not implemented (ctuner starts "
     "LyCORIS adapters as LyCORIS does)"},
    {"sdnq_*", NOEF, NULL,
     "SDNQ quantisation settings; ctuner's base_model_precision is no_change, bf16, int8-quanto or "
     "int8-torchao (an *-sdnq precision is refused)"},
    {"control", SET, NULL, "channel-wise control training is not implemented"},
    {"controlnet_custom_config", NOEF, NULL, "ControlNet training is not implemented"},
    {"controlnet_model_name_or_path", NOEF, NULL, "ControlNet training is not implemented"},
    {"distillation_method", SET, NULL, "distillation (LCM, DCM, DMD, PeRFlow) is not implemented"},
    {"distillation_config", SET, NULL, "distillation (LCM, DCM, DMD, PeRFlow) is not implemented"},
    {"refiner_training", SET, NULL, "mixture-of-experts refiner training is not implemented"},
    {"quantize_activations", SET, NULL, "activation quantisation is not implemented"},
    {"layer_freeze_strategy", SET, "none", "BitFit (training biases only) is not implemented"},
    {"peft_lora_mode", SET, "standard", "SingLoRA is not implemented"},
    {"singlora_ramp_up_steps", NOEF, NULL, "SingLoRA is not implemented"},
    {"slider_lora_target", SET, NULL, "slider LoRA targets are not implemented"},
    {"lora_format", SET, "diffusers",
     "ctuner saves diffusers/peft adapters ('ctuner lora export' writes kohya/ComfyUI keys)"},
    {"prodigy_steps", NOEF, NULL, "the Prodigy optimizer is not implemented (it is refused)"},
    {"gradient_precision", SET, "unmodified",
     "ctuner's gradients follow mixed_precision (float32, or bf16 with float32 sums)"},
    {"seed_for_each_device", SET, NULL,
     "per-device seeds are not implemented (every rank draws from seed)"},
    {"lr_scale", SET, NULL,
     "scaling learning_rate by the batch and process count is not implemented: scale it yourself"},
    {"lr_scale_sqrt", SET, NULL,
     "scaling learning_rate by the batch and process count is not implemented: scale it yourself"},
    {"ignore_final_epochs", NOEF, NULL,
     "max_train_steps, where set, ends the run here whatever the epochs"},
    {"ignore_missing_files", NOEF, NULL, "ctuner skips a missing image and counts it"},
    {"delete_unwanted_images", NOEF, NULL, "ctuner skips such images and never deletes a file"},
    {"delete_problematic_images", NOEF, NULL, "ctuner skips such images and never deletes a file"},
    {"max_upscale_threshold", SET, NULL, "dropping buckets that need upscaling is not implemented"},
    {"timestep_bias_strategy", SET, "none", "timestep bias is not implemented"},
    {"timestep_bias_begin", NOEF, NULL, "timestep bias is not implemented"},
    {"timestep_bias_end", NOEF, NULL, "timestep bias is not implemented"},
    {"timestep_bias_multiplier", NOEF, NULL, "timestep bias is not implemented"},
    {"timestep_bias_portion", NOEF, NULL, "timestep bias is not implemented"},
    {"flow_sigmoid_scale", SET, "1|1.0",
     "SimpleTuner's sigmoid(scale * N(0, 1)) timesteps are ctuner's timestep_sampling logit_normal "
     "with logit_std = the scale: set logit_std instead"},
    {"flow_use_uniform_schedule", SET, NULL,
     "uniform timesteps are ctuner's timestep_sampling uniform: set that instead"},
    {"flow_use_beta_schedule", SET, NULL, "beta-distributed timesteps are not implemented"},
    {"flow_beta_schedule_alpha", NOEF, NULL, "beta-distributed timesteps are not implemented"},
    {"flow_beta_schedule_beta", NOEF, NULL, "beta-distributed timesteps are not implemented"},
    {"flux_fast_schedule", SET, NULL, "SimpleTuner's fast schnell schedule is not implemented"},
    {"flux_attention_masked_training", SET, NULL,
     "attention masking of the T5 padding is not implemented"},
    {"masked_loss_probability", NOEF, NULL,
     "masked loss needs mask conditioning datasets, which are refused"},
    {"conditioning_multidataset_sampling", NOEF, NULL,
     "conditioning datasets are not implemented (the data backend config refuses them)"},
    {"data_backend_sampling", REF, NULL,
     "ctuner draws each step's dataset by its probability (docs/data.md, \"Sampling\"); "
     "SimpleTuner's uniform and auto-weighting modes are not implemented"},
    {"checkpoint_epoch_interval", SET, NULL,
     "checkpoints by epoch are not implemented (checkpoint_step_interval)"},
    {"checkpointing_rolling_steps", SET, NULL, "rolling checkpoints are not implemented"},
    {"checkpoints_rolling_total_limit", NOEF, NULL, "rolling checkpoints are not implemented"},
    {"validation_epoch_interval", SET, NULL,
     "validation by epoch is not implemented (validation_step_interval)"},
    {"validation_on_startup", SET, NULL, "ctuner does not validate before the first step"},
    {"validation_using_datasets", SET, NULL,
     "validation from dataset images is not implemented (validation_prompt)"},
    {"validation_randomize", SET, NULL, "ctuner validates with validation_seed every time"},
    {"validation_seed_source", NOEF, NULL, "ctuner draws validation noise from validation_seed"},
    {"validation_guidance_real", SET, "1|1.0",
     "FLUX.1's true CFG at validation is not implemented"},
    {"validation_no_cfg_until_timestep", NOEF, NULL,
     "FLUX.1's true CFG at validation is not implemented (validation_guidance_real)"},
    {"validation_guidance_skip_layers", SET, NULL,
     "skip-layer guidance at validation is not implemented"},
    {"validation_guidance_skip_layers_start", NOEF, NULL,
     "skip-layer guidance at validation is not implemented"},
    {"validation_guidance_skip_layers_stop", NOEF, NULL,
     "skip-layer guidance at validation is not implemented"},
    {"validation_guidance_skip_scale", NOEF, NULL,
     "skip-layer guidance at validation is not implemented"},
    /* dataset defaults: ctuner reads these on each dataset of the data backend config */
    {"caption_strategy", SET, NULL,
     "set caption_strategy on each dataset of the data backend config, where ctuner reads it"},
    {"instance_prompt", SET, NULL,
     "set instance_prompt on each dataset of the data backend config, where ctuner reads it"},
    {"prepend_instance_prompt", SET, NULL,
     "prepending instance_prompt to every caption is not implemented"},
    {"only_instance_prompt", SET, NULL,
     "set caption_strategy instanceprompt on the datasets of the data backend config"},
    {"parquet_caption_column", SET, NULL,
     "set parquet.caption_column on each dataset of the data backend config"},
    {"parquet_filename_column", SET, NULL,
     "set parquet.filename_column on each dataset of the data backend config"},
    {"cache_dir", NOEF, NULL,
     "the Hugging Face download cache; ctuner reads local directories and does not download"},
    {"cache_dir_text", SET, NULL,
     "ctuner keeps its text cache beside each dataset's latent cache (cache_dir_vae)"},
    {"cache_dir_vae", SET, NULL,
     "set cache_dir_vae on each dataset of the data backend config, where ctuner reads it"},
    {"maximum_image_size", SET, NULL,
     "set maximum_image_size on each dataset of the data backend config, where ctuner reads it"},
    {"target_downsample_size", SET, NULL,
     "set target_downsample_size on each dataset of the data backend config, where ctuner reads "
     "it"},
    {"pretrained_t5_model_name_or_path", SET, NULL,
     "a T5 from elsewhere is not implemented: the pipeline's text_encoder_2 is used"},
    /* DeepSpeed fields (deepspeed.c notes them under these names) */
    {"deepspeed_config.prescale_gradients", NOEF, NULL,
     "gradients are summed in float32 in rank order and divided once; prescaling keeps fp16 sums "
     "in range, which float32 and bf16 (communication) do not need"},
    {"deepspeed_config.gradient_predivide_factor", NOEF, NULL,
     "gradients are summed in float32 in rank order and divided once by the world size; a "
     "predivide only splits that division to keep fp16 in range"},
    {"deepspeed_config.offload_optimizer.buffer_count", NOEF, NULL,
     "the swap file always moves through three buffers (read, step, write)"},
    {"deepspeed_config.offload_param.buffer_count", NOEF, NULL,
     "the swap file always moves through three buffers (read, step, write)"},
    {"deepspeed_config.offload_param.max_in_cpu", NOEF, NULL,
     "ZeRO-3 keeps no weights in host memory beyond the block being gathered; the rest stay in "
     "the swap file"},
    {"deepspeed_config.optimizer.params.bias_correction", NOEF, NULL,
     "the 1-bit optimizers never bias-correct (DeepSpeed's accept the field and ignore it too)"},
};
#define NST (sizeof ST / sizeof ST[0])

/* The row of key ("--" allowed), or NULL. */
static const struct st_opt *st_find(const char *key) {
  while (*key == '-') key++;
  for (size_t i = 0; i < NST; i++) {
    const size_t l = strlen(ST[i].key);
    if (ST[i].key[l - 1] == '*' ? !strncmp(key, ST[i].key, l - 1) : !strcmp(key, ST[i].key))
      return &ST[i];
  }
  return NULL;
}

/* 1 if value is one of the row's off values. */
static int is_off(const struct st_opt *e, const char *v) {
  if (!v) return 0;
  if (!e->off)
    return !*v || !strcasecmp(v, "false") || !strcasecmp(v, "none") || !strcasecmp(v, "null") ||
           !strcmp(v, "0") || !strcmp(v, "0.0") || !strcmp(v, "[]") || !strcmp(v, "{}");
  const size_t n = strlen(v);
  for (const char *p = e->off; *p;) {
    const size_t l = strcspn(p, "|");
    if (l == n && !strncasecmp(p, v, n)) return 1;
    p += l + (p[l] == '|');
  }
  return 0;
}

ct_st_action ct_cfg_st_option(const char *key, const char *value, const char **why) {
  const struct st_opt *e = st_find(key);
  if (!e) return CT_ST_NONE;
  *why = e->why;
  if (e->kind == NOEF || (e->kind == SET && is_off(e, value))) return CT_ST_NO_EFFECT;
  return CT_ST_REFUSED;
}

const char *ct_config_no_effect(const char *key) {
  const struct st_opt *e = st_find(key);
  return e && e->kind != REF ? e->why : NULL;
}

const char *ct_cfg_not_here(const char *key) {
  const struct st_opt *e = st_find(key);
  return e && e->kind != NOEF ? e->why : NULL;
}

size_t ct_cfg_st_option_at(size_t i, const char **key) {
  if (i >= NST) return 0;
  *key = ST[i].key;
  return 1;
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
