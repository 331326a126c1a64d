/* The training configuration: SimpleTuner-style keys parsed once into a typed
 * struct with defaults and validation.
 *
 * Sources, later ones overriding earlier ones: defaults, config.json (a flat
 * object; keys may carry the "--" prefix), then "--key=value" arguments.
 * Errors name the file, line and column, the key, the expected type, and for
 * unknown keys the nearest known one ("did you mean"). String values may hold
 * {env:VAR}, replaced by the environment variable (unset -> error).
 * Every key, its type, default and meaning: CT_CONFIG_KEYS below and
 * docs/config.md.
 */
#ifndef CTUNER_CONFIG_H
#define CTUNER_CONFIG_H

#include <stdint.h>

#include "ctuner/parse.h" /* {env:VAR} and byte sizes in values (core) */
#include "ctuner/status.h"

/* X(key, type, default, help); type is INT (long), NUM (double), BOOL (int) or
 * STR (char *, NULL when the default is NULL). */
#define CT_CONFIG_KEYS(X)                                                                      \
  X(model_family, STR, "flux", "model family; only \"flux\" (the MMDiT of MODEL.md)")          \
  X(model_type, STR, "full", "\"full\": the MMDiT; \"vae\": train an AutoencoderKL (docs/vae.md)") \
  X(vae_config, STR, NULL, "model_type vae: diffusers config.json of a VAE trained from scratch") \
  X(pretrained_vae_model_name_or_path, STR, NULL, "a VAE directory (config.json + diffusion_pytorch_model.safetensors)") \
  X(vae_loss, STR, "l1", "model_type vae: reconstruction loss, l1 or l2")                     \
  X(vae_kl_weight, NUM, "1e-6", "model_type vae: weight of the KL term")                      \
  X(vae_stats_images, INT, "64", "model_type vae: images encoded at the end for scaling_factor/shift_factor") \
  X(preset, STR, "small", "model size preset: tiny, small, bench")                             \
  X(pretrained_model_path, STR, NULL, "Flux-layout safetensors to start from (else seeded init)") \
  X(output_dir, STR, "output", "where checkpoints, validation images and metrics go")          \
  X(output_dir_local, STR, NULL, "with output_dir s3://bucket/prefix: the local working directory (default s3-output/<bucket>/<prefix>)") \
  X(output_aws_endpoint_url, STR, NULL, "with output_dir s3://...: the S3 endpoint (else AWS_ENDPOINT_URL, else AWS)") \
  X(output_aws_region_name, STR, NULL, "with output_dir s3://...: the region (else AWS_REGION, else \"auto\")") \
  X(output_aws_addressing_style, STR, "auto", "with output_dir s3://...: auto, path or virtual") \
  X(seed, INT, "0", "seed of every random draw (init, data order, noise, timesteps)")           \
  X(resolution, INT, "0", "training image side in pixels (0: the preset's latent size x codec scale)") \
  X(data_backend_config, STR, NULL, "multidatabackend.json: the datasets to train on")         \
  X(aspect_bucket_alignment, INT, "64", "bucket sizes are multiples of this: 8, 16, 24, 32 or 64 (docs/data.md)") \
  X(aspect_bucket_rounding, INT, "2", "decimals of a bucket's aspect key (\"1.33\")")            \
  X(allow_dataset_oversubscription, BOOL, "false", "raise repeats of datasets whose buckets cannot fill the effective batch (not where repeats is set)") \
  X(disable_bucket_pruning, BOOL, "false", "fail instead of dropping buckets smaller than the effective batch") \
  X(compress_disk_cache, BOOL, "false", "compress latent cache entries (disk_cache_compression)") \
  X(disk_cache_compression, STR, "gzip", "gzip or zstd, with compress_disk_cache")           \
  X(dataloader_prefetch, BOOL, "true", "prepare batches on a background thread")              \
  X(dataloader_prefetch_qlen, INT, "4", "micro-batches prepared ahead with dataloader_prefetch") \
  X(train_batch_size, INT, "1", "samples per micro-batch")                                     \
  X(gradient_accumulation_steps, INT, "1", "micro-batches per optimizer step")                 \
  X(max_train_steps, INT, "0", "optimizer steps to train (0: from num_train_epochs)")          \
  X(num_train_epochs, INT, "1", "epochs, used when max_train_steps is 0")                      \
  X(learning_rate, NUM, "1e-4", "peak learning rate")                                          \
  X(lr_scheduler, STR, "constant", "constant, constant_with_warmup, linear, cosine, polynomial, WarmupLR, WarmupDecayLR") \
  X(lr_warmup_steps, INT, "0", "warmup steps of the schedule")                                 \
  X(lr_num_cycles, NUM, "0.5", "cosine: number of cosine cycles (0.5 = half a cosine)")        \
  X(lr_power, NUM, "1.0", "polynomial: power")                                                 \
  X(lr_end, NUM, "1e-7", "polynomial: final learning rate")                                    \
  X(warmup_min_lr, NUM, "0", "WarmupLR/WarmupDecayLR: learning rate at step 0")                \
  X(warmup_type, STR, "log", "WarmupLR/WarmupDecayLR: log or linear warmup")                   \
  X(optimizer, STR, "adamw", "adamw, adam, adagrad, lamb, lion, sgd, muon, muadam, muadamw, musgd, onebitadam, zerooneadam, onebitlamb") \
  X(freeze_step, INT, "100", "onebitadam: full-precision warm-up steps before 1-bit compressed momentum") \
  X(var_freeze_step, INT, "1000", "zerooneadam: the last step whose variance may update") \
  X(lamb_max_coeff, NUM, "10", "onebitlamb: largest trust ratio (DeepSpeed max_coeff)") \
  X(lamb_min_coeff, NUM, "0.01", "onebitlamb: smallest trust ratio (min_coeff)") \
  X(lamb_coeff_beta, NUM, "0.9", "onebitlamb: running-average rate of the warm-up trust ratios (coeff_beta)") \
  X(lamb_factor_max, NUM, "4", "onebitlamb: largest factor on the frozen trust ratio (factor_max)") \
  X(lamb_factor_min, NUM, "0.5", "onebitlamb: smallest factor (factor_min)") \
  X(lamb_factor_threshold, NUM, "0.1", "onebitlamb: largest relative change of the factor per step (factor_threshold)") \
  X(var_update_scaler, INT, "16", "zerooneadam: the variance-update interval doubles after this many updates") \
  X(local_step_scaler, INT, "32678", "zerooneadam: after var_freeze_step the local-step interval doubles after this many steps") \
  X(local_step_clipper, INT, "16", "zerooneadam: the largest local-step interval") \
  X(adam_beta1, NUM, "0.9", "first-moment decay (Adam family, Lamb; Lion's beta1)")           \
  X(adam_beta2, NUM, "0.999", "second-moment decay (Adam family, Lamb; Lion's beta2)")        \
  X(adam_epsilon, NUM, "1e-8", "denominator epsilon")                                          \
  X(adam_weight_decay, NUM, "1e-2", "weight decay")                                            \
  X(optimizer_momentum, NUM, "0.9", "SGD/MuSGD momentum")                     \
  X(optimizer_nesterov, BOOL, "false", "SGD/MuSGD: Nesterov momentum")                    \
  X(muon_ns_steps, INT, "5", "Muon: Newton-Schulz iterations")                                 \
  X(muon_momentum, NUM, "0.95", "Muon: momentum of the 2-D weights")                          \
  X(muon_nesterov, BOOL, "true", "Muon: Nesterov momentum for the 2-D weights")                 \
  X(muon_adamw_lr, NUM, "1", "Muon: lr of its AdamW part (other tensors) as a multiple of lr") \
  X(mup_base_hidden, INT, "0", "Mu* optimizers: width of the base model (0: the preset's)")    \
  X(max_grad_norm, NUM, "2.0", "clip gradients to this global L2 norm (0: no clipping)")       \
  X(max_nonfinite_steps, INT, "5", "stop after this many consecutive steps with NaN/Inf")      \
  X(zero_stage, INT, "0", "ZeRO stage under mpirun: 0 data parallel, 1 optimizer state, 2 also gradients, 3 also parameters sharded") \
  X(offload_optimizer, STR, "none", "none, cpu (host memory: where the state already is) or nvme (a swap file under offload_param_path)") \
  X(offload_param, STR, "none", "none, cpu (host memory) or nvme (stage 3: the weights in the swap file)") \
  X(offload_param_path, STR, NULL, "directory for NVMe offload swap files (DeepSpeed nvme_path)") \
  X(offload_buffer_size, INT, "0", "offload: floats per state moved at a time (0: auto, 4Mi)") \
  X(offload_pin_memory, BOOL, "false", "offload: mlock the two I/O buffers") \
  X(reduce_bucket_size, INT, "0", "ZeRO-2/3: floats per gradient reduce-scatter bucket (0: auto, hidden x hidden; at least one block)") \
  X(deepspeed_config, STR, NULL, "DeepSpeed JSON (a file path or an inline object): zero stage, batch, clipping, optimizer, scheduler") \
  X(use_ema, BOOL, "false", "keep an exponential moving average of the weights")               \
  X(ema_decay, NUM, "0.995", "EMA decay cap: decay = min((1+s)/(10+s), ema_decay)")           \
  X(ema_update_interval, INT, "1", "update the EMA every N optimizer steps")                   \
  X(ema_validation, STR, "comparison", "validate with: none (live weights), ema_only, comparison (both)") \
  X(checkpoint_step_interval, INT, "0", "checkpoint every N steps (0: only at the end)")      \
  X(checkpoints_total_limit, INT, "5", "keep at most N checkpoints (0: keep all)")             \
  X(resume_from_checkpoint, STR, "latest", "latest, none, or a checkpoint directory")          \
  X(validation_prompt, STR, NULL, "prompt sampled at each validation")                         \
  X(user_prompt_library, STR, NULL, "JSON object {shortname: prompt} of more validation prompts") \
  X(validation_step_interval, INT, "0", "validate every N steps (0: only at the end)")        \
  X(validation_num_inference_steps, INT, "30", "Euler steps of validation sampling")           \
  X(validation_guidance, NUM, "7.5", "classifier-free guidance scale")                         \
  X(validation_resolution, STR, NULL, "WxH[,WxH...] or a side (default: resolution)")         \
  X(num_validation_images, INT, "1", "images per validation prompt")                           \
  X(validation_seed, INT, "0", "seed of validation noise")                                     \
  X(disable_validation, BOOL, "false", "never sample validation images")                       \
  X(caption_dropout_probability, NUM, "0.1", "replace captions with the empty caption")       \
  X(timestep_sampling, STR, "logit_normal", "logit_normal or uniform")                        \
  X(logit_mean, NUM, "0", "logit-normal mean")                                                 \
  X(logit_std, NUM, "1", "logit-normal standard deviation")                                    \
  X(flow_shift, NUM, "1", "timestep shift s: t <- s t / (1 + (s - 1) t), training and sampling") \
  X(text_encoder, STR, "clip-byte", "clip-byte or clip-bpe: CLIP text transformer with the byte or BPE tokenizer") \
  X(text_encoder_path, STR, NULL, "CLIPTextModel safetensors (else seeded weights)")           \
  X(text_encoder_layers, INT, "2", "layers of the seeded text encoder")                        \
  X(text_encoder_seed, INT, "1234", "seed of the seeded text encoder weights")                 \
  X(tokenizer_max_length, INT, "0", "text tokens per caption (0: the preset's)")               \
  X(tokenizer_vocab, STR, NULL, "clip-bpe: the tokenizer's vocab.json")                        \
  X(tokenizer_merges, STR, NULL, "clip-bpe: the tokenizer's merges.txt")                       \
  X(codec, STR, "pixel", "latent codec: pixel (space-to-depth) or vae (pretrained_vae_model_name_or_path)") \
  X(vae_tile, INT, "512", "codec vae: pixels per tile for encode/decode (0: untiled)")       \
  X(codec_scale, INT, "0", "pixel codec factor s in {1,2,4} (0: from the preset's channels)")  \
  X(mixed_precision, STR, "no", "no (float32) or bf16 (bf16 parameters, gradients and communication; float32 master weights)") \
  X(num_threads, INT, "0", "OpenMP threads (0: all cores)")                                    \
  X(disable_progress_bar, BOOL, "false", "plain log lines even on a terminal")                 \
  X(webhook_config, STR, NULL, "webhooks (docs/health.md): a JSON file path, or an inline object or list") \
  X(webhook_timeout, NUM, "5", "seconds per webhook request")                                  \
  X(webhook_retries, INT, "3", "retries of a failed webhook request (exponential backoff)")     \
  X(webhook_status_interval, NUM, "10", "seconds between training.status webhook events (0: every step)") \
  X(health_poll_interval, NUM, "5", "seconds between GPU health polls")                         \
  X(health_ecc_threshold, INT, "10", "new uncorrected (volatile) ECC errors since start that open the circuit") \
  X(health_temp_margin, NUM, "5", "degrees C below the NVML shutdown temperature that open the circuit") \
  X(health_nvml_library, STR, "libnvidia-ml.so.1", "the NVML library loaded with dlopen")      \
  X(health_memory_low_percent, NUM, "5", "warn when available host memory falls below this percentage") \
  X(disk_low_threshold, STR, NULL, "free space on output_dir needed before a checkpoint (e.g. 10G, 500M, bytes)") \
  X(disk_low_action, STR, "stop", "below disk_low_threshold: stop, wait or script")            \
  X(disk_low_script, STR, NULL, "disk_low_action=script: the command run (sh -c) to free space")

typedef struct ct_config {
#define CT_X_INT(k) long k;
#define CT_X_NUM(k) double k;
#define CT_X_BOOL(k) int k;
#define CT_X_STR(k) char *k;
#define CT_X(k, type, def, help) CT_X_##type(k)
  CT_CONFIG_KEYS(CT_X)
#undef CT_X
#undef CT_X_INT
#undef CT_X_NUM
#undef CT_X_BOOL
#undef CT_X_STR
} ct_config;

/* Defaults into cfg (frees nothing: call on a zeroed or freed struct). */
void ct_config_defaults(ct_config *cfg);
void ct_config_free(ct_config *cfg);
/* Merge a config.json into cfg. Errors: "config.json: line 3, column 5: ...",
 * "config.json: unknown key 'learning_rat'; did you mean 'learning_rate'?",
 * "config.json: key 'train_batch_size' expects an integer, got a string". */
ct_status ct_config_load_file(ct_config *cfg, const char *path, ct_err *err);
/* Set one key from text (command line). The key may start with "--". */
ct_status ct_config_set(ct_config *cfg, const char *key, const char *value, ct_err *err);
/* Check ranges and choices after all sources are merged; names the key. */
ct_status ct_config_validate(const ct_config *cfg, ct_err *err);
/* Folds cfg->deepspeed_config (a file path or inline JSON text) into the
 * trainer's keys for `world` ranks (src/config/deepspeed.c; docs/distributed.md).
 * A no-op without one. */
ct_status ct_deepspeed_apply(ct_config *cfg, int world, ct_err *err);
/* Canonical JSON of every key (sorted as declared); caller frees. */
char *ct_config_to_json(const ct_config *cfg);
/* FNV-1a 64 of the canonical JSON of the keys that change the training math
 * (not output paths, intervals or resume settings), as 16 hex digits. */
void ct_config_digest(const ct_config *cfg, char out[17]);
/* Help text for one key (NULL if unknown). */
const char *ct_config_help(const char *key);
/* Nearest known key by edit distance (for "did you mean"); NULL if none close. */
const char *ct_config_suggest(const char *key);

#endif
