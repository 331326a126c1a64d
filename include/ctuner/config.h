/* The training configuration: SimpleTuner-style keys parsed once into a typed
 * struct with defaults and validation.
 *
 * Sources, later ones overriding earlier ones: defaults, a config file
 * (SimpleTuner's config.json, config.env or config.toml, picked by the
 * extension; keys may carry the "--" prefix), then "--key=value" arguments.
 * Loading and validation collect every problem at once into a
 * ct_config_problems list (each with the file, line and column or the
 * "--key" it came from, the key, and for unknown keys the nearest known one,
 * "did you mean"); the library never prints them. String values may hold
 * {env:VAR}, replaced by the environment variable (unset -> error).
 * Every key, its type, default and meaning: CT_CONFIG_KEYS below and
 * docs/config.md.
 */
#ifndef CTUNER_CONFIG_H
#define CTUNER_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/json.h"  /* ct_config_toml_parse's result (core) */
#include "ctuner/parse.h" /* {env:VAR} and byte sizes in values (core) */
#include "ctuner/status.h"

/* X(key, type, default, models, check, help)
 *   type: INT (long), NUM (double), BOOL (int) or STR (char *, NULL when the
 *     default is NULL).
 *   models: the model types the key applies to: FULL (model_type full, the
 *     MMDiT; model_type lora takes them too), LORA (model_type lora only),
 *     VAE (model_type vae) or ALL (CT_MODEL_* below;
 *     ct_config_key_applies).
 *   check: the key's own rule, run by ct_config_validate in table order:
 *     ANY; INT_GE(lo), INT_GE_UNIT(lo, note), INT_IN(lo, hi) (lo..hi),
 *     INT_ONE_OF("8|16"); NUM_GE(lo), NUM_GE_UNIT(lo, note), NUM_GT(lo),
 *     NUM_IN("[)", lo, hi) (the interval's brackets), NUM_BETWEEN("(]", lo,
 *     hi, unit); ONE_OF("a|b"), ONE_OF_QUOTED("a|b"), NONE_OR("a|b") (unset
 *     or one of), USE("a|b") ("... is not supported; use"); FN(f): the
 *     function f in src/config/config.c. Rules that relate several keys
 *     (offload_param nvme needs zero_stage 3, ...) run after the table. */
#define CT_CONFIG_KEYS(X)                                                                          \
  X(model_family, STR, "flux", ALL, FN(check_model_family),                                        \
    "model family, a row of the family registry (ctuner/family.h, docs/models.md): \"flux\" "      \
    "(FLUX.1); \"sdxl\" (the U-net: full or LoRA); SimpleTuner's other "                           \
    "families are refused by name")                                                                \
  X(model_type, STR, "full", ALL, FN(check_model_type),                                            \
    "\"full\": the MMDiT (SDXL: the U-net); \"lora\": LoRA adapters on it, frozen "                \
    "(docs/lora.md); \"vae\": "                                                                    \
    "train an AutoencoderKL (docs/vae.md)")                                                        \
  X(lora_type, STR, "standard", LORA, FN(check_lora_type),                                         \
    "model_type lora: standard (peft LoRA) or lycoris (LyCORIS's lora/locon, loha, lokr from "     \
    "lycoris_config; docs/lora.md)")                                                               \
  X(lycoris_config, STR, NULL, LORA, ANY,                                                          \
    "lora_type lycoris: the LyCORIS config JSON (algo, multiplier, linear_dim, linear_alpha, "     \
    "factor, full_matrix, decompose_both, apply_preset; docs/lora.md)")                            \
  X(validation_lycoris_strength, NUM, "1", LORA, NUM_GE(0),                                        \
    "lora_type lycoris: the LyCORIS multiplier while sampling validation images (SimpleTuner's "   \
    "set_multiplier); training keeps lycoris_config's multiplier")                                 \
  X(lora_rank, INT, "16", LORA, INT_GE(1), "model_type lora: the adapters' rank r")                \
  X(lora_alpha, NUM, "0", LORA, NUM_GE(0),                                                         \
    "model_type lora: alpha, the adapters scale by alpha / rank (0: lora_rank, SimpleTuner's "     \
    "None)")                                                                                       \
  X(lora_dropout, NUM, "0.1", LORA, NUM_IN("[)", 0, 1),                                            \
    "model_type lora: dropout on each adapter's input (peft's lora_dropout)")                      \
  X(lora_init_type, STR, "default", LORA, ONE_OF("default|gaussian"),                              \
    "model_type lora: peft's init_lora_weights: default (A kaiming-uniform) or gaussian (A "       \
    "N(0, 1/r)); B starts at zero")                                                                \
  X(init_lora, STR, NULL, LORA, ANY,                                                               \
    "model_type lora: a pytorch_lora_weights.safetensors to start the adapters from")              \
  X(use_dora, BOOL, "false", LORA, FN(check_use_dora),                                             \
    "model_type lora, lora_type standard: peft's DoRA (a trained magnitude per output row; "       \
    "needs lora_dropout 0)")                                                                       \
  X(flux_lora_target, STR, "all", LORA,                                                            \
    ONE_OF("mmdit|context|context+ffs|all|all+ffs|ai-toolkit|tiny|nano|all+ffs+embedder"),         \
    "model_type lora: SimpleTuner's preset of the diffusers modules adapted (docs/lora.md)")       \
  X(base_model_precision, STR, "no_change", LORA, FN(check_base_model_precision),                  \
    "model_type lora: the frozen base's storage: no_change (float32), bf16, int8-quanto or "       \
    "int8-torchao (weight-only int8, per-output-channel scales, dequantised in float32 GEMM "      \
    "tiles; docs/lora.md); fp8, int4, int2 and nf4 variants are not implemented")                  \
  X(base_model_default_dtype, STR, "fp32", LORA, ONE_OF("bf16|fp32"),                              \
    "model_type lora with an int8 base: the linear weight left unquantised (final_layer.linear) "  \
    "stored as fp32 (ctuner's default) or bf16 (SimpleTuner's); biases and norms stay float32")    \
  X(text_encoder_1_precision, STR, "no_change", FULL, FN(check_te1_precision),                     \
    "a pipeline's CLIP-L: no_change (its stored weights, float32), bf16 (linear weights rounded, " \
    "bf16 weight views), int8-quanto or int8-torchao (weight-only int8 per output row, "           \
    "docs/flux.md); fp8/int4/nf4 are not implemented")                                             \
  X(text_encoder_2_precision, STR, "no_change", FULL, FN(check_te2_precision),                     \
    "a pipeline's T5: no_change (as stored, float32 compute), bf16 (bf16 weight views), "          \
    "int8-quanto or int8-torchao (weight-only int8 per output row, quantised at load; "            \
    "docs/flux.md); fp8/int4/nf4 are not implemented")                                             \
  X(quantize_via, STR, "cpu", LORA, USE("cpu"),                                                    \
    "model_type lora: where the base is quantised: cpu (ctuner has no accelerator)")               \
  X(vae_config, STR, NULL, VAE, ANY,                                                               \
    "model_type vae: diffusers config.json of a VAE trained from scratch")                         \
  X(pretrained_vae_model_name_or_path, STR, NULL, ALL, ANY,                                        \
    "a VAE directory (config.json + diffusion_pytorch_model.safetensors) or a hub id "             \
    "(docs/hub.md)")                                                                               \
  X(vae_loss, STR, "l1", VAE, ONE_OF("l1|l2"), "model_type vae: reconstruction loss, l1 or l2")    \
  X(vae_kl_weight, NUM, "1e-6", VAE, NUM_GE(0), "model_type vae: weight of the KL term")           \
  X(vae_stats_images, INT, "64", VAE, INT_GE(1),                                                   \
    "model_type vae: images encoded at the end for scaling_factor/shift_factor")                   \
  X(preset, STR, "small", FULL, FN(check_preset), "model size preset: tiny, small, demo, bench")   \
  X(pretrained_model_path, STR, NULL, FULL, ANY,                                                   \
    "Flux-layout safetensors to start from (else seeded init)")                                    \
  X(pretrained_model_name_or_path, STR, NULL, FULL, ANY,                                           \
    "a diffusers FluxPipeline to fine-tune (transformer, CLIP + T5 text encoders, VAE: "           \
    "docs/flux.md): a directory, or a hub id from the Hugging Face cache or the hub "              \
    "(docs/hub.md)")                                                                               \
  X(revision, STR, NULL, ALL, ANY,                                                                 \
    "hub ids: the branch, tag or commit sha to load (unset: main; docs/hub.md)")                   \
  X(variant, STR, NULL, ALL, ANY,                                                                  \
    "diffusers' weight variant, e.g. fp16: diffusion_pytorch_model.fp16.safetensors "              \
    "(docs/hub.md)")                                                                               \
  X(pretrained_transformer_model_name_or_path, STR, NULL, FULL, ANY,                               \
    "the transformer from elsewhere: a diffusers directory or hub id (+ "                          \
    "pretrained_transformer_subfolder) or a BFL .safetensors file")                                \
  X(pretrained_transformer_subfolder, STR, "transformer", FULL, ANY,                               \
    "subfolder of pretrained_transformer_model_name_or_path holding the transformer; \"none\": "   \
    "the path itself")                                                                             \
  X(model_flavour, STR, NULL, FULL, FN(check_model_flavour),                                       \
    "the model_family's flavour (its registry row): FLUX.1 dev, krea (as dev: 512 T5 tokens) or "  \
    "schnell (256 T5 tokens); SDXL base-1.0, refiner-1.0, base-0.9 or refiner-0.9")                \
  X(flux_guidance_mode, STR, "constant", FULL, ONE_OF("constant|random-range"),                    \
    "guidance-embedding value per sample (guidance_embeds models): constant or random-range")      \
  X(flux_guidance_value, NUM, "1.0", FULL, NUM_GE(0),                                              \
    "flux_guidance_mode constant: the guidance every sample gets (1.0 keeps dev's distillation)")  \
  X(flux_guidance_min, NUM, "0", FULL, NUM_GE(0),                                                  \
    "flux_guidance_mode random-range: lower end of the uniform draw")                              \
  X(flux_guidance_max, NUM, "4", FULL, NUM_GE(0),                                                  \
    "flux_guidance_mode random-range: upper end of the uniform draw")                              \
  X(t5_padding, STR, "unmodified", FULL, ONE_OF("unmodified|zero"),                                \
    "T5 sequence past the caption: unmodified, or zero (padding rows set to 0)")                   \
  X(output_dir, STR, "output", ALL, FN(check_output_dir),                                          \
    "where checkpoints, validation images and metrics go")                                         \
  X(output_dir_local, STR, NULL, FULL, ANY,                                                        \
    "with output_dir s3://bucket/prefix: the local working directory (default "                    \
    "s3-output/<bucket>/<prefix>)")                                                                \
  X(output_aws_endpoint_url, STR, NULL, FULL, ANY,                                                 \
    "with output_dir s3://...: the S3 endpoint (else AWS_ENDPOINT_URL, else AWS)")                 \
  X(output_aws_region_name, STR, NULL, FULL, ANY,                                                  \
    "with output_dir s3://...: the region (else AWS_REGION, else \"auto\")")                       \
  X(output_aws_addressing_style, STR, "auto", FULL, ONE_OF("auto|path|virtual"),                   \
    "with output_dir s3://...: auto, path or virtual")                                             \
  X(seed, INT, "0", ALL, INT_GE(0),                                                                \
    "seed of every random draw (init, data order, noise, timesteps)")                              \
  X(resolution, INT, "0", ALL, INT_IN(0, 4096),                                                    \
    "training image side in pixels (0: the preset's latent size x codec scale)")                   \
  X(data_backend_config, STR, NULL, ALL, ANY, "multidatabackend.json: the datasets to train on")   \
  X(aspect_bucket_alignment, INT, "64", ALL, INT_ONE_OF("8|16|24|32|64"),                          \
    "bucket sizes are multiples of this: 8, 16, 24, 32 or 64 (docs/data.md)")                      \
  X(aspect_bucket_rounding, INT, "2", ALL, INT_IN(0, 6),                                           \
    "decimals of a bucket's aspect key (\"1.33\")")                                                \
  X(allow_dataset_oversubscription, BOOL, "false", ALL, ANY,                                       \
    "raise repeats of datasets whose buckets cannot fill the effective batch (not where repeats "  \
    "is set)")                                                                                     \
  X(disable_bucket_pruning, BOOL, "false", ALL, ANY,                                               \
    "fail instead of dropping buckets smaller than the effective batch")                           \
  X(compress_disk_cache, BOOL, "false", ALL, ANY,                                                  \
    "compress latent cache entries (disk_cache_compression)")                                      \
  X(disk_cache_compression, STR, "gzip", ALL, ONE_OF("gzip|zstd"),                                 \
    "gzip or zstd, with compress_disk_cache")                                                      \
  X(dataloader_prefetch, BOOL, "true", ALL, ANY, "prepare batches on a background thread")         \
  X(dataloader_prefetch_qlen, INT, "4", ALL, INT_IN(1, 256),                                       \
    "micro-batches prepared ahead with dataloader_prefetch")                                       \
  X(train_batch_size, INT, "1", ALL, INT_IN(1, 4096), "samples per micro-batch")                   \
  X(gradient_accumulation_steps, INT, "1", ALL, INT_GE(1), "micro-batches per optimizer step")     \
  X(max_train_steps, INT, "0", ALL, INT_GE(0),                                                     \
    "optimizer steps to train (0: from num_train_epochs)")                                         \
  X(num_train_epochs, INT, "1", ALL, INT_GE(0), "epochs, used when max_train_steps is 0")          \
  X(learning_rate, NUM, "1e-4", ALL, FN(check_learning_rate), "peak learning rate")                \
  X(lr_scheduler, STR, "constant_with_warmup", ALL, FN(check_lr_scheduler),                        \
    "constant, constant_with_warmup, linear, cosine, sine (SimpleTuner's), polynomial, "           \
    "diffusers_cosine, WarmupLR, WarmupDecayLR")                                                   \
  X(lr_warmup_steps, INT, "0", ALL, INT_GE(0),                                                     \
    "warmup steps of the schedule (cosine, sine: the half-period of the wave)")                    \
  X(lr_num_cycles, NUM, "0.5", ALL, NUM_GE(0),                                                     \
    "diffusers_cosine: number of cosine cycles (0.5 = half a cosine)")                             \
  X(lr_power, NUM, "0.8", ALL, NUM_GT(0), "polynomial: power (SimpleTuner's default 0.8)")         \
  X(lr_end, NUM, "4e-7", ALL, NUM_GE(0),                                                           \
    "polynomial: final learning rate; cosine, sine: the floor")                                    \
  X(warmup_min_lr, NUM, "0", ALL, NUM_GE(0), "WarmupLR/WarmupDecayLR: learning rate at step 0")    \
  X(warmup_type, STR, "log", ALL, ONE_OF_QUOTED("log|linear"),                                     \
    "WarmupLR/WarmupDecayLR: log or linear warmup")                                                \
  X(optimizer, STR, "adamw", ALL, FN(check_optimizer),                                             \
    "adamw, adam, adagrad, lamb, lion, sgd, muon, muadam, muadamw, musgd, onebitadam, "            \
    "zerooneadam, onebitlamb; SimpleTuner's names (adamw_bf16, optimi-*, bnb-*, torch-*) run "     \
    "with SimpleTuner's fixed settings, not the adam_* keys (docs/optimizers.md)")                 \
  X(optimizer_config, STR, NULL, ALL, FN(check_optimizer_config),                                  \
    "SimpleTuner's optimizer names: \"key=value,...\" over the name's fixed settings (eps, "       \
    "weight_decay, momentum, dampening, nesterov, lr_decay, initial_accumulator_value)")           \
  X(optimizer_beta1, NUM, NULL, ALL, NUM_IN("[)", 0, 1),                                           \
    "SimpleTuner's optimizer names: beta1, used when optimizer_beta2 is set too and "              \
    "optimizer_config is not")                                                                     \
  X(optimizer_beta2, NUM, NULL, ALL, NUM_IN("[)", 0, 1),                                           \
    "SimpleTuner's optimizer names: beta2, used with optimizer_beta1")                             \
  X(freeze_step, INT, "100", ALL, INT_GE(0),                                                       \
    "onebitadam: full-precision warm-up steps before 1-bit compressed momentum")                   \
  X(var_freeze_step, INT, "1000", ALL, INT_GE(0),                                                  \
    "zerooneadam: the last step whose variance may update")                                        \
  X(lamb_max_coeff, NUM, "10", ALL, NUM_GT(0),                                                     \
    "onebitlamb, and lamb where set: largest trust ratio (DeepSpeed max_coeff)")                   \
  X(lamb_min_coeff, NUM, "0.01", ALL, NUM_GE(0),                                                   \
    "onebitlamb, and lamb where set: smallest trust ratio (min_coeff)")                            \
  X(lamb_coeff_beta, NUM, "0.9", ALL, NUM_IN("[)", 0, 1),                                          \
    "onebitlamb: running-average rate of the warm-up trust ratios (coeff_beta)")                   \
  X(lamb_factor_max, NUM, "4", ALL, NUM_GT(0),                                                     \
    "onebitlamb: largest factor on the frozen trust ratio (factor_max)")                           \
  X(lamb_factor_min, NUM, "0.5", ALL, NUM_GT(0), "onebitlamb: smallest factor (factor_min)")       \
  X(lamb_factor_threshold, NUM, "0.1", ALL, NUM_GE(0),                                             \
    "onebitlamb: largest relative change of the factor per step (factor_threshold)")               \
  X(var_update_scaler, INT, "16", ALL, INT_GE(1),                                                  \
    "zerooneadam: the variance-update interval doubles after this many updates")                   \
  X(local_step_scaler, INT, "32678", ALL, INT_GE(1),                                               \
    "zerooneadam: after var_freeze_step the local-step interval doubles after this many steps")    \
  X(local_step_clipper, INT, "16", ALL, INT_GE(1), "zerooneadam: the largest local-step interval") \
  X(adam_beta1, NUM, "0.9", ALL, NUM_IN("[)", 0, 1),                                               \
    "first-moment decay (Adam family, Lamb; Lion's beta1); not read by SimpleTuner's optimizer "   \
    "names")                                                                                       \
  X(adam_beta2, NUM, "0.999", ALL, NUM_IN("[)", 0, 1),                                             \
    "second-moment decay (Adam family, Lamb; Lion's beta2); not read by SimpleTuner's names")      \
  X(adam_epsilon, NUM, "1e-8", ALL, NUM_GE(0),                                                     \
    "denominator epsilon; not read by SimpleTuner's optimizer names")                              \
  X(adam_weight_decay, NUM, "1e-2", ALL, NUM_GE(0),                                                \
    "weight decay; not read by SimpleTuner's optimizer names")                                     \
  X(optimizer_momentum, NUM, "0.9", ALL, NUM_IN("[)", 0, 1), "SGD/MuSGD momentum")                 \
  X(optimizer_nesterov, BOOL, "false", ALL, ANY, "SGD/MuSGD: Nesterov momentum")                   \
  X(optimizer_bias_correction, BOOL, "true", ALL, ANY,                                             \
    "Adam family and Lamb: bias-correct the moments (DeepSpeed optimizer.params.bias_correction)") \
  X(muon_ns_steps, INT, "5", ALL, INT_IN(1, 20), "Muon: Newton-Schulz iterations")                 \
  X(muon_momentum, NUM, "0.95", ALL, NUM_IN("[)", 0, 1), "Muon: momentum of the 2-D weights")      \
  X(muon_nesterov, BOOL, "true", ALL, ANY, "Muon: Nesterov momentum for the 2-D weights")          \
  X(muon_adamw_lr, NUM, "1", ALL, NUM_IN("[]", 0, 1000),                                           \
    "Muon: lr of its AdamW part (other tensors) as a multiple of lr")                              \
  X(mup_base_hidden, INT, "0", FULL, INT_GE(0),                                                    \
    "Mu* optimizers: width of the base model (0: the preset's)")                                   \
  X(max_grad_norm, NUM, "2.0", ALL, NUM_GE_UNIT(0, " (0 disables)"),                               \
    "the gradient clipping threshold (grad_clip_method; 0: no clipping)")                          \
  X(grad_clip_method, STR, "value", ALL, ONE_OF("value|norm"),                                     \
    "value: clamp each gradient element to +-max_grad_norm (SimpleTuner's default); norm: scale "  \
    "the whole gradient to global L2 norm max_grad_norm (a DeepSpeed config always clips by "      \
    "norm)")                                                                                       \
  X(max_nonfinite_steps, INT, "5", ALL, INT_GE(1),                                                 \
    "stop after this many consecutive steps with NaN/Inf")                                         \
  X(gradient_checkpointing, BOOL, "false", FULL, ANY,                                              \
    "keep only each block's input in the forward, recompute its activations in the backward "      \
    "(less memory, one more forward of the blocks; same numbers)")                                 \
  X(gradient_checkpointing_interval, INT, "0", FULL, INT_GE_UNIT(0, " (0: every block)"),          \
    "with gradient_checkpointing: only every Nth double and single block (0 or 1: every block)")   \
  X(zero_stage, INT, "0", ALL, INT_ONE_OF("0|1|2|3"),                                              \
    "ZeRO stage under mpirun: 0 data parallel, 1 optimizer state, 2 also gradients, 3 also "       \
    "parameters sharded")                                                                          \
  X(offload_optimizer, STR, "none", ALL, NONE_OR("cpu|nvme"),                                      \
    "none, cpu (host memory: where the state already is) or nvme (a swap file under "              \
    "offload_param_path)")                                                                         \
  X(offload_param, STR, "none", ALL, NONE_OR("cpu|nvme"),                                          \
    "none, cpu (host memory) or nvme (stage 3: the weights in the swap file)")                     \
  X(offload_param_path, STR, NULL, ALL, ANY,                                                       \
    "directory for NVMe offload swap files (DeepSpeed nvme_path)")                                 \
  X(offload_buffer_size, INT, "0", ALL, INT_GE_UNIT(0, " (0: auto)"),                              \
    "offload: floats per state moved at a time (0: auto, 4Mi)")                                    \
  X(offload_pin_memory, BOOL, "false", ALL, ANY, "offload: mlock the two I/O buffers")             \
  X(reduce_bucket_size, INT, "0", ALL, INT_GE_UNIT(0, " (0: auto)"),                               \
    "ZeRO-2/3: floats per gradient reduce-scatter bucket (0: auto, hidden x hidden; at least one " \
    "block)")                                                                                      \
  X(deepspeed_config, STR, NULL, ALL, ANY,                                                         \
    "DeepSpeed JSON (a file path or an inline object): zero stage, batch, clipping, optimizer, "   \
    "scheduler")                                                                                   \
  X(use_ema, BOOL, "false", ALL, ANY, "keep an exponential moving average of the weights")         \
  X(ema_decay, NUM, "0.995", ALL, NUM_IN("[)", 0, 1),                                              \
    "EMA decay cap: decay = min((1+s)/(10+s), ema_decay)")                                         \
  X(ema_update_interval, INT, "1", ALL, INT_GE(1), "update the EMA every N optimizer steps")       \
  X(ema_validation, STR, "comparison", ALL, ONE_OF("none|ema_only|comparison"),                    \
    "validate with: none (live weights), ema_only, comparison (both)")                             \
  X(checkpoint_step_interval, INT, "0", ALL, INT_GE(0),                                            \
    "checkpoint every N steps (0: only at the end)")                                               \
  X(checkpoints_total_limit, INT, "5", ALL, INT_GE(0), "keep at most N checkpoints (0: keep all)") \
  X(resume_from_checkpoint, STR, "latest", ALL, FN(check_resume),                                  \
    "latest, none, or a checkpoint directory")                                                     \
  X(validation_prompt, STR, NULL, FULL, ANY, "prompt sampled at each validation")                  \
  X(user_prompt_library, STR, NULL, FULL, ANY,                                                     \
    "JSON object {shortname: prompt} of more validation prompts")                                  \
  X(validation_step_interval, INT, "0", ALL, INT_GE(0),                                            \
    "validate every N steps (0: only at the end)")                                                 \
  X(validation_num_inference_steps, INT, "30", FULL, INT_IN(1, 1000),                              \
    "Euler steps of validation sampling")                                                          \
  X(validation_guidance, NUM, "7.5", FULL, NUM_GE(0), "classifier-free guidance scale")            \
  X(validation_resolution, STR, NULL, FULL, ANY, "WxH[,WxH...] or a side (default: resolution)")   \
  X(num_validation_images, INT, "1", FULL, INT_IN(1, 64), "images per validation prompt")          \
  X(validation_seed, INT, "0", FULL, ANY, "seed of validation noise")                              \
  X(resolution_type, STR, "pixel_area", ALL, FN(check_resolution_type),                            \
    "the resolution_type of datasets that leave it out (SimpleTuner's default pixel_area; pixel)") \
  X(minimum_image_size, NUM, "0", ALL, NUM_GE(0),                                                  \
    "the minimum_image_size of datasets that leave it out (their resolution_type's units; 0: "     \
    "none)")                                                                                       \
  X(validation_negative_prompt, STR, NULL, FULL, ANY,                                              \
    "the unconditional prompt of validation's CFG pass (unset: the empty caption; SDXL: "          \
    "SimpleTuner's \"blurry, cropped, ugly\"); FLUX.1 pipelines make no CFG pass")                 \
  X(validation_noise_scheduler, STR, NULL, FULL, ANY,                                              \
    "SimpleTuner's validation sampler: SDXL takes euler, ddim or dpm++ (DPM++ 2M; unset: the "     \
    "pipeline's scheduler); FLUX.1 samples flow-matching Euler steps (another value: a warning)")  \
  X(validation_guidance_rescale, NUM, "0", FULL, NUM_IN("[]", 0, 1),                               \
    "SimpleTuner's CFG rescale (SD 1.x/2.x/XL only): SDXL validation applies it; on FLUX.1 "       \
    "nonzero draws a warning")                                                                     \
  X(validation_disable_unconditional, BOOL, "false", FULL, ANY,                                    \
    "SimpleTuner's switch for its extra empty-prompt validation images, which ctuner never "       \
    "samples (false given: one warning)")                                                          \
  X(validation_prompt_library, BOOL, "false", FULL, FN(check_prompt_library),                      \
    "SimpleTuner's built-in validation prompts: not shipped (true is refused; use "                \
    "user_prompt_library)")                                                                        \
  X(evaluation_type, STR, NULL, FULL, NONE_OR("clip"),                                             \
    "SimpleTuner's validation scoring: clip draws a warning (no CLIP image model here)")           \
  X(controlnet, BOOL, "false", ALL, FN(check_controlnet),                                          \
    "ControlNet training: not implemented (true is refused)")                                      \
  X(disable_validation, BOOL, "false", ALL, ANY, "never sample validation images")                 \
  X(caption_dropout_probability, NUM, "0.1", FULL, NUM_IN("[]", 0, 1),                             \
    "replace captions with the empty caption")                                                     \
  X(timestep_sampling, STR, "logit_normal", FULL, ONE_OF("logit_normal|uniform"),                  \
    "logit_normal or uniform")                                                                     \
  X(logit_mean, NUM, "0", FULL, NUM_IN("[]", -100, 100), "logit-normal mean")                      \
  X(logit_std, NUM, "1", FULL, NUM_GT(0), "logit-normal standard deviation")                       \
  X(flow_shift, NUM, "3", FULL, NUM_IN("[)", 0, 1000),                                             \
    "timestep shift s: t <- s t / (1 + (s - 1) t), training and sampling; 0: none (alias "         \
    "flow_schedule_shift)")                                                                        \
  X(flow_schedule_auto_shift, BOOL, "false", FULL, ANY,                                            \
    "shift from each image's token count n as FluxPipeline: s = exp(0.5 + 0.65 (n - 256) / 3840)"  \
    "; needs flow_shift 0")                                                                        \
  X(prediction_type, STR, NULL, FULL, NONE_OR("epsilon|v_prediction|flow_matching|flow-matching"), \
    "what the model predicts; unset: the family's (sdxl: scheduler_config.json's, FLUX.1: "        \
    "flow_matching); sdxl takes epsilon or v_prediction")                                          \
  X(snr_gamma, NUM, "0", FULL, NUM_GE(0),                                                          \
    "sdxl: min-SNR weighting, each sample's loss x min(snr, gamma) / snr (v_prediction: / "        \
    "(snr + 1)); 0: none (SimpleTuner's None)")                                                    \
  X(snr_weight, NUM, "1", FULL, NUM_GT(0),                                                         \
    "sdxl: the loss weight without snr_gamma (SimpleTuner's snr_weight)")                          \
  X(offset_noise, BOOL, "false", FULL, ANY,                                                        \
    "sdxl: add noise_offset x N(0, 1) per sample and channel to the noise")                        \
  X(noise_offset, NUM, "0.1", FULL, NUM_GE(0), "sdxl, offset_noise: its strength")                 \
  X(noise_offset_probability, NUM, "0.25", FULL, NUM_IN("[]", 0, 1),                               \
    "sdxl, offset_noise: the share of samples that get it")                                        \
  X(input_perturbation, NUM, "0", FULL, NUM_GE(0),                                                 \
    "sdxl: the noise added to the latents is noise + s x N(0, 1) (the target keeps the noise)")    \
  X(input_perturbation_steps, INT, "0", FULL, INT_GE_UNIT(0, " (0: no decay)"),                    \
    "sdxl: input_perturbation decays linearly to 0 over this many steps")                          \
  X(text_encoder, STR, "clip-byte", FULL, USE("clip-byte|clip-bpe"),                               \
    "clip-byte or clip-bpe: CLIP text transformer with the byte or BPE tokenizer")                 \
  X(text_encoder_path, STR, NULL, FULL, ANY, "CLIPTextModel safetensors (else seeded weights)")    \
  X(text_encoder_layers, INT, "2", FULL, INT_IN(1, 48), "layers of the seeded text encoder")       \
  X(text_encoder_seed, INT, "1234", FULL, ANY, "seed of the seeded text encoder weights")          \
  X(tokenizer_max_length, INT, "0", FULL, FN(check_tokenizer_max_length),                          \
    "text tokens per caption (0: the preset's; a FLUX.1 pipeline ignores it: 512, schnell 256)")   \
  X(tokenizer_vocab, STR, NULL, FULL, ANY, "clip-bpe: the tokenizer's vocab.json")                 \
  X(tokenizer_merges, STR, NULL, FULL, ANY, "clip-bpe: the tokenizer's merges.txt")                \
  X(codec, STR, "pixel", FULL, USE("pixel|vae"),                                                   \
    "latent codec: pixel (space-to-depth) or vae (pretrained_vae_model_name_or_path)")             \
  X(vae_tile, INT, "512", FULL, INT_IN(0, 16384),                                                  \
    "codec vae: pixels per tile for encode/decode (0: untiled)")                                   \
  X(codec_scale, INT, "0", FULL, FN(check_codec_scale),                                            \
    "pixel codec factor s in {1,2,4} (0: from the preset's channels)")                             \
  X(mixed_precision, STR, "no", ALL, FN(check_mixed_precision),                                    \
    "no (float32) or bf16 (bf16 parameters, gradients and communication, linear products with "    \
    "bf16 operands and float32 sums; float32 master weights, norms, softmax, loss, optimizer)")    \
  X(compute_backend, STR, "auto", ALL, ANY,                                                        \
    "where the trainer computes: auto (cuda when built in and usable, else cpu), cpu, cuda, or "   \
    "a registered backend (sealed: the test backend the host cannot touch); mixed_precision bf16 " \
    "takes its bf16 sibling (docs/training.md, \"Compute backends and residency\")")               \
  X(num_threads, INT, "0", ALL, INT_IN(0, 1024), "OpenMP threads (0: all cores)")                  \
  X(disable_progress_bar, BOOL, "false", ALL, ANY, "plain log lines even on a terminal")           \
  X(report_to, STR, NULL, ALL, NONE_OR("tensorboard|wandb|comet_ml|all"),                          \
    "experiment tracker: tensorboard (event files under logging_dir), all (= tensorboard here), "  \
    "none; wandb and comet_ml are not built (one warning) (docs/tensorboard.md)")                  \
  X(logging_dir, STR, "logs", ALL, ANY,                                                            \
    "report_to tensorboard: the event files' directory, relative to output_dir unless absolute")   \
  X(tracker_project_name, STR, "simpletuner", ALL, ANY,                                            \
    "report_to tensorboard: the run's subdirectory of logging_dir (accelerate's layout)")          \
  X(tracker_run_name, STR, "simpletuner-testing", ALL, ANY,                                        \
    "report_to tensorboard: the run's name, shown with its config text (not a directory)")         \
  X(distributed_timeout, NUM, "600", ALL, NUM_BETWEEN("(]", 0, 86400, " seconds"),                 \
    "seconds a rank waits in one collective before the watchdog stops the job (alias "             \
    "nccl_timeout; docs/distributed.md)")                                                          \
  X(webhook_config, STR, NULL, ALL, ANY,                                                           \
    "webhooks (docs/health.md): a JSON file path, or an inline object or list")                    \
  X(webhook_timeout, NUM, "5", ALL, NUM_BETWEEN("(]", 0, 600, " seconds"),                         \
    "seconds per webhook request")                                                                 \
  X(webhook_retries, INT, "3", ALL, INT_IN(0, 20),                                                 \
    "retries of a failed webhook request (exponential backoff)")                                   \
  X(webhook_status_interval, NUM, "10", ALL, NUM_GE_UNIT(0, " seconds"),                           \
    "seconds between training.status webhook events (0: every step)")                              \
  X(health_poll_interval, NUM, "5", ALL, NUM_BETWEEN("[]", 0.01, 3600, " seconds"),                \
    "seconds between GPU health polls")                                                            \
  X(health_ecc_threshold, INT, "10", ALL, INT_GE(1),                                               \
    "new uncorrected (volatile) ECC errors since start that open the circuit")                     \
  X(health_temp_margin, NUM, "5", ALL, NUM_BETWEEN("[]", 0, 100, " degrees"),                      \
    "degrees C below the NVML shutdown temperature that open the circuit")                         \
  X(health_nvml_library, STR, "libnvidia-ml.so.1", ALL, ANY,                                       \
    "the NVML library loaded with dlopen")                                                         \
  X(health_memory_low_percent, NUM, "5", ALL, NUM_BETWEEN("[)", 0, 100, ""),                       \
    "warn when available host memory falls below this percentage")                                 \
  X(disk_low_threshold, STR, NULL, ALL, FN(check_bytes),                                           \
    "free space on output_dir needed before a checkpoint (e.g. 10G, 500M, bytes)")                 \
  X(disk_low_action, STR, "stop", ALL, ONE_OF("stop|wait|script"),                                 \
    "below disk_low_threshold: stop, wait or script")                                              \
  X(disk_low_script, STR, NULL, ALL, ANY,                                                          \
    "disk_low_action=script: the command run (sh -c) to free space")

/* The model types of the models column, as bits. */
typedef enum ct_model_types {
  CT_MODEL_FULL = 1, /* model_type full: the MMDiT */
  CT_MODEL_VAE = 2,  /* model_type vae: an AutoencoderKL */
  CT_MODEL_LORA = 4, /* model_type lora only (lora also takes every FULL key) */
  CT_MODEL_ALL = 7
} ct_model_types;

/* CT_KEY_<key>: a key's row in the table; CT_CONFIG_NKEYS rows. */
enum {
#define CT_X(k, type, def, models, check, help) CT_KEY_##k,
  CT_CONFIG_KEYS(CT_X)
#undef CT_X
      CT_CONFIG_NKEYS
};

typedef struct ct_config {
#define CT_X_INT(k) long k;
#define CT_X_NUM(k) double k;
#define CT_X_BOOL(k) int k;
#define CT_X_STR(k) char *k;
#define CT_X(k, type, def, models, check, help) CT_X_##type(k)
  CT_CONFIG_KEYS(CT_X)
#undef CT_X
#undef CT_X_INT
#undef CT_X_NUM
#undef CT_X_BOOL
#undef CT_X_STR
  /* given[CT_KEY_k] != 0: k was set by a config file, the command line or
   * deepspeed_config rather than left at its default; the value is the
   * ct_config_origin, and line/col say where in `file` (CT_ORIGIN_FILE). */
  unsigned char given[CT_CONFIG_NKEYS];
  int line[CT_CONFIG_NKEYS], col[CT_CONFIG_NKEYS];
  char file[512]; /* the config file loaded last ("" if none) */
  /* SimpleTuner keys given that have no meaning here (ct_config_no_effect),
   * comma-separated: accepted, and the trainer warns once naming each. */
  char no_effect[512];
} ct_config;

/* The keys whose defaults are SimpleTuner's and that cfg leaves at them
 * (flow_shift, lr_scheduler, lr_warmup_steps, lr_end, lr_power, max_grad_norm,
 * ...), with their values, for the one line the trainer logs at start:
 * "flow_shift 3, lr_scheduler constant_with_warmup, ...". Keys of another
 * model type are left out; "" when every such key was set. */
void ct_config_defaults_note(const ct_config *cfg, char *out, size_t cap);

/* Where a key's value came from (ct_config.given). */
typedef enum ct_config_origin {
  CT_ORIGIN_DEFAULT = 0,
  CT_ORIGIN_FILE = 1,     /* config.json / config.env / config.toml */
  CT_ORIGIN_CLI = 2,      /* --KEY=VALUE */
  CT_ORIGIN_DEEPSPEED = 3 /* folded from deepspeed_config */
} ct_config_origin;
/* "default", "file", "cli" or "deepspeed". */
const char *ct_config_origin_name(ct_config_origin o);

/* One problem of a configuration: what is wrong and where it came from.
 * Plain data for any front end (the CLI prints them, a web form may attach
 * them to its fields): file + line/col for a config file (line 0: the whole
 * file), file "" and key for the command line ("--key") or for a rule about
 * keys left at their defaults. */
typedef struct ct_config_problem {
  ct_status status; /* CT_ERR_INVALID, CT_ERR_UNSUPPORTED, CT_ERR_FORMAT, CT_ERR_IO, ... */
  int warning;      /* 1: accepted but has no effect here (training still runs) */
  ct_config_origin origin;
  char file[512];
  int line, col;
  char key[128];  /* the key concerned, "" for the whole file */
  char hint[128]; /* unknown key: the key it probably means ("did you mean"), or "" */
  char msg[768];  /* what is wrong and what to do, without the place */
} ct_config_problem;
typedef struct ct_config_problems {
  ct_config_problem *v;
  size_t n, cap;
  size_t errors; /* problems with warning == 0 */
} ct_config_problems;
/* Zero-initialise a list ({0}); free it with this. */
void ct_config_problems_free(ct_config_problems *p);
/* Appends a problem (dropped silently past 10000 or out of memory; errors is
 * still counted). file may be NULL. */
void ct_config_problems_add(ct_config_problems *p, int warning, ct_status st,
                            ct_config_origin origin, const char *file, int line, int col,
                            const char *key, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 10, 11)));
/* "config.json:3:5", "config.env:7", "--learning_rate" or "default value of
 * preset" into buf. */
const char *ct_config_problem_where(const ct_config_problem *pr, char *buf, size_t n);
/* The first error as one ct_err message ("where: msg", plus "(and N more
 * problems; 'ctuner config check' lists them all)"); CT_OK if no errors. */
ct_status ct_config_problems_to_err(const ct_config_problems *p, ct_err *err);

/* Reads a config file by its extension: .json (SimpleTuner's config.json,
 * a flat object), .env (config.env: KEY=value shell lines with SimpleTuner's
 * variable names, TRAINER_EXTRA_ARGS), .toml (config.toml, top-level keys).
 * Every problem goes into probs; returns CT_OK, or the status of the first
 * error. Values that are fine are set even when others are not. */
ct_status ct_config_load(ct_config *cfg, const char *path, ct_config_problems *probs);
/* The TOML of SimpleTuner's config.toml as a JSON object (src/config/toml.c):
 * top-level `key = value` lines with basic and literal strings (escapes
 * included), integers (decimal, 0x, 0o, 0b, '_'), floats (inf, nan),
 * booleans, arrays of these, and comments. Tables, arrays of tables, dotted
 * keys, inline tables, multi-line strings and dates are refused by name;
 * errors read "line L, column C: ...". Checked against Python's tomllib
 * (tests/data/toml, scripts/toml_expect.py). */
ct_status ct_config_toml_parse(const char *text, size_t len, ct_json **out, ct_err *err);
/* One --KEY=VALUE argument (the key may start with "--"), problems to probs. */
ct_status ct_config_set_arg(ct_config *cfg, const char *key, const char *value,
                            ct_config_problems *probs);
/* Every key's rule and every rule between keys, each failure to probs
 * (not stopping at the first); the SimpleTuner keys with no effect here as
 * warnings. Returns CT_OK if no errors were added. */
ct_status ct_config_check(const ct_config *cfg, ct_config_problems *probs);

/* The SimpleTuner optimizer preset cfg's optimizer runs with
 * (ct_optim_preset_of in ctuner/optim.h), or NULL when the optimizer reads
 * the adam_* keys (ctuner's and DeepSpeed's names). As in SimpleTuner,
 * adamw_bf16 gives way to optimi-adamw on a quantised LoRA base (int8-*)
 * without mixed_precision bf16; *switched (may be NULL) is then 1. */
struct ct_optim_preset;
const struct ct_optim_preset *ct_config_optimizer_preset(const ct_config *cfg, int *switched);

/* Why a SimpleTuner key has no effect in ctuner (push_to_hub, tracker_image_layout,
 * ...), or NULL if it is not such a key. */
const char *ct_config_no_effect(const char *key);

/* Defaults into cfg (frees nothing: call on a zeroed or freed struct). */
void ct_config_defaults(ct_config *cfg);
void ct_config_free(ct_config *cfg);
/* ct_config_load with the first error in err: "config.json:3:5: key
 * 'train_batch_size' expects an integer, got a string (and 2 more problems;
 * ...)", "config.json:2:3: unknown key 'learning_rat'; did you mean
 * 'learning_rate'?". */
ct_status ct_config_load_file(ct_config *cfg, const char *path, ct_err *err);
/* Set one key from text (command line). The key may start with "--". */
ct_status ct_config_set(ct_config *cfg, const char *key, const char *value, ct_err *err);
/* ct_config_check with the first error in err; names the key. */
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
/* Row i of the table (0 <= i < CT_CONFIG_NKEYS) for listings such as
 * `ctuner train --help-keys`; 0 past the end. def is NULL for "unset";
 * models is a mask of ct_model_types. */
typedef struct ct_config_key_info {
  const char *name, *type, *def, *help;
  unsigned models;
  const char *choices; /* '|'-separated allowed values when the key's rule is a fixed list
                          ("adamw|adam|..."), else NULL */
} ct_config_key_info;
int ct_config_key_info_at(size_t i, ct_config_key_info *out);
/* "all", "full" or "vae" for a models mask (as --help-keys prints it). */
const char *ct_config_models_name(unsigned models);
/* 1 if key (or an alias of it) applies to model_type ("full", "vae"), 0 if
 * it does not, -1 if the key or the model type is unknown. */
int ct_config_key_applies(const char *key, const char *model_type);
/* The first key given explicitly (cfg->given) that does not apply to
 * cfg->model_type, or NULL: for a trainer that refuses such keys. */
const char *ct_config_first_inapplicable(const ct_config *cfg);
/* The key an unknown one probably means (for "did you mean"): a SimpleTuner
 * spelling or known rename from a table, else the nearest key by
 * Damerau-Levenshtein distance over its '_'-separated words, within a bound
 * relative to its length; NULL if none is close or two are equally close. */
const char *ct_config_suggest(const char *key);

#endif
