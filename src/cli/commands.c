/* The command table: every `ctuner` command declared once, as data (Redis's
 * command table). A row names the command, its one-line summary, its help and
 * its handler; main.c dispatches from this table and generates `ctuner --help`,
 * `ctuner help NAME [SUB]` and each group's help (`ctuner bench --help`) from
 * it. A new command is a handler and a help function in a cmd_*.c file plus a
 * row here; tests/cli_help.sh checks that every handler has one. Rows of one
 * NAME stay adjacent (they form a group), and so do rows of one section. */
#include "cli/cli.h"

#define TRAINING "training"
#define MODELS "models and checkpoints"
#define DATA "data"
#define EVAL "evaluation"
#define BENCH "benchmarks"
#define STORAGE "storage (S3 bucket or directory)"

const ct_cli_cmd ct_cli_commands[] = {
    {TRAINING, "train", NULL,
     "train the MMDiT (flow matching) or a VAE from a SimpleTuner-style config", ct_cmd_train_help,
     ct_cmd_train},
    {TRAINING, "cache", NULL,
     "discover the data and build its latent and text caches (docs/data.md)", ct_cmd_cache_help,
     ct_cmd_cache},
    {TRAINING, "launch", NULL, "run train under mpirun (or srun) as an Accelerate config describes",
     ct_cmd_launch_help, ct_cmd_launch},
    {TRAINING, "config", "check",
     "print a config's resolved keys and every problem at once (exit 2 if any)",
     ct_cmd_config_check_help, ct_cmd_config_check},
    {TRAINING, "serve", NULL, "web UI: dashboard of runs, config builder, launch (docs/webui.md)",
     ct_cmd_serve_help, ct_cmd_serve},
    {TRAINING, "sample", NULL, "generate images from a checkpoint", ct_cmd_sample_help,
     ct_cmd_sample},
    {MODELS, "model", "check", "run forward and backward on a PyTorch golden file and compare",
     ct_cmd_model_check_help, ct_cmd_model_check},
    {MODELS, "model", "info", "print a preset's configuration and parameter count",
     ct_cmd_model_info_help, ct_cmd_model_info},
    {MODELS, "model", "convert",
     "a Flux transformer between diffusers' layout (directory) and BFL's single file",
     ct_cmd_model_convert_help, ct_cmd_model_convert},
    {MODELS, "model", "text",
     "tokenize and encode captions with a FLUX pipeline's T5 (text_encoder_2, tokenizer_2)",
     ct_cmd_model_text_help, ct_cmd_model_text},
    {MODELS, "hub", "download",
     "a Hugging Face Hub pipeline into the Hugging Face cache, as train fetches it (docs/hub.md)",
     ct_cmd_hub_help, ct_cmd_hub},
    {MODELS, "hub", "path", "the cached snapshot directory of a hub id, nothing downloaded",
     ct_cmd_hub_help, ct_cmd_hub},
    {MODELS, "checkpoint", "export",
     "one Flux-layout safetensors file (f32 or bf16) from a checkpoint",
     ct_cmd_checkpoint_export_help, ct_cmd_checkpoint_export},
    {MODELS, "lora", "merge",
     "the base with a LoRA folded in, as a diffusers FluxTransformer2DModel directory",
     ct_cmd_lora_merge_help, ct_cmd_lora_merge},
    {MODELS, "lora", "export", "a LoRA in kohya's Flux keys (--format comfyui: ComfyUI, Forge)",
     ct_cmd_lora_export_help, ct_cmd_lora_export},
    {DATA, "dataset", "synth", "write the synthetic coloured-shapes dataset (images + captions)",
     ct_cmd_dataset_synth_help, ct_cmd_dataset_synth},
    {DATA, "dataset", "prompts",
     "print captions of the synthetic dataset (--held-out: unseen ones)",
     ct_cmd_dataset_prompts_help, ct_cmd_dataset_prompts},
    {DATA, "dataset", "parquet", "print a Parquet file's rows as JSON lines, or its schema",
     ct_cmd_dataset_parquet_help, ct_cmd_dataset_parquet},
    {EVAL, "eval", "synth", "judge colour, shape, size, position, background of images",
     ct_cmd_eval_synth_help, ct_cmd_eval_synth},
    {EVAL, "eval", "vae", "PSNR of a VAE's reconstructions of a directory of images",
     ct_cmd_eval_vae_help, ct_cmd_eval_vae},
    {BENCH, "bench", "step", "time forward + backward + AdamW of a preset on random data",
     ct_cmd_bench_step_help, ct_cmd_bench_step},
    {BENCH, "bench", "peak",
     "the cores' FMA peak (register-only loop) and each SGEMM path against it",
     ct_cmd_bench_peak_help, ct_cmd_bench_peak},
    {BENCH, "bench", "memory", "bytes per rank by category beside the ZeRO formula",
     ct_cmd_bench_memory_help, ct_cmd_bench_memory},
    {BENCH, "bench", "discovery",
     "images per second of the data loader's discovery against decoding",
     ct_cmd_bench_discovery_help, ct_cmd_bench_discovery},
    {BENCH, "bench", "vae", "time and memory of a VAE encode and decode of one image",
     ct_cmd_bench_vae_help, ct_cmd_bench_vae},
    {STORAGE, "storage", "ls", "every object under a URL, recursive: size, key",
     ct_cmd_storage_help, ct_cmd_storage},
    {STORAGE, "storage", "get", "one object to a file or stdout", ct_cmd_storage_help,
     ct_cmd_storage},
    {STORAGE, "storage", "put", "one file as an object", ct_cmd_storage_help, ct_cmd_storage},
    {STORAGE, "storage", "rm", "delete one object (missing is not an error)", ct_cmd_storage_help,
     ct_cmd_storage},
    {STORAGE, "storage", "sync", "upload a directory tree, N puts at once", ct_cmd_storage_help,
     ct_cmd_storage},
    {STORAGE, "storage", "bench", "upload N objects, then time fetching them with each pool size",
     ct_cmd_storage_help, ct_cmd_storage},
};

const size_t ct_cli_ncommands = sizeof ct_cli_commands / sizeof ct_cli_commands[0];
