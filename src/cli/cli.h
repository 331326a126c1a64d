/* Shared declarations of the ctuner commands. The commands themselves are
 * declared once, as data, in the table of commands.c; main.c dispatches from
 * it and generates `ctuner --help` and each group's help from it. */
#ifndef CT_CLI_H
#define CT_CLI_H

#include <stddef.h>
#include <stdio.h>

/* One row of the command table: `ctuner NAME [SUB] [options]`. */
typedef struct ct_cli_cmd {
  const char *section;   /* heading it is listed under in `ctuner --help` */
  const char *name;      /* first word: "train", "bench" */
  const char *sub;       /* second word ("step"), NULL for a command without subcommands */
  const char *summary;   /* one line for `ctuner --help` */
  void (*help)(FILE *f); /* usage line(s) and description (`ctuner NAME [SUB] --help`) */
  int (*run)(int argc, char **argv); /* argv[0] = NAME, argv[1] = SUB if any, then the options;
                                        returns the exit code (0 done, 1 failed, 2 bad usage) */
} ct_cli_cmd;

/* The table (commands.c): rows of one NAME adjacent, rows of one section adjacent. */
extern const ct_cli_cmd ct_cli_commands[];
extern const size_t ct_cli_ncommands;

/* Command handlers and their help, by file. */
int ct_cmd_train(int argc, char **argv); /* cmd_train.c */
void ct_cmd_train_help(FILE *f);
int ct_cmd_cache(int argc, char **argv);
void ct_cmd_cache_help(FILE *f);
int ct_cmd_sample(int argc, char **argv);
void ct_cmd_sample_help(FILE *f);
int ct_cmd_launch(int argc, char **argv); /* cmd_launch.c */
void ct_cmd_launch_help(FILE *f);
int ct_cmd_serve(int argc, char **argv); /* cmd_serve.c */
void ct_cmd_serve_help(FILE *f);
int ct_cmd_model_check(int argc, char **argv); /* cmd_model.c */
void ct_cmd_model_check_help(FILE *f);
int ct_cmd_config_check(int argc, char **argv);
void ct_cmd_config_check_help(FILE *f);
int ct_cmd_model_info(int argc, char **argv);
void ct_cmd_model_info_help(FILE *f);
int ct_cmd_model_convert(int argc, char **argv);
void ct_cmd_model_convert_help(FILE *f);
int ct_cmd_model_text(int argc, char **argv); /* cmd_t5.c */
void ct_cmd_model_text_help(FILE *f);
int ct_cmd_lora_merge(int argc, char **argv); /* cmd_lora.c */
void ct_cmd_lora_merge_help(FILE *f);
int ct_cmd_lora_export(int argc, char **argv);
void ct_cmd_lora_export_help(FILE *f);
int ct_cmd_checkpoint_export(int argc, char **argv); /* cmd_checkpoint.c */
void ct_cmd_checkpoint_export_help(FILE *f);
int ct_cmd_dataset_synth(int argc, char **argv); /* cmd_dataset.c */
void ct_cmd_dataset_synth_help(FILE *f);
int ct_cmd_dataset_prompts(int argc, char **argv);
void ct_cmd_dataset_prompts_help(FILE *f);
int ct_cmd_dataset_parquet(int argc, char **argv); /* cmd_parquet.c */
void ct_cmd_dataset_parquet_help(FILE *f);
int ct_cmd_eval_synth(int argc, char **argv); /* cmd_eval.c */
void ct_cmd_eval_synth_help(FILE *f);
int ct_cmd_eval_vae(int argc, char **argv); /* cmd_eval_vae.c */
void ct_cmd_eval_vae_help(FILE *f);
int ct_cmd_bench_step(int argc, char **argv); /* cmd_bench.c */
void ct_cmd_bench_step_help(FILE *f);
int ct_cmd_bench_peak(int argc, char **argv); /* cmd_bench_peak.c */
void ct_cmd_bench_peak_help(FILE *f);
int ct_cmd_bench_memory(int argc, char **argv);  /* cmd_bench_memory.c */
int ct_bench_memory_plan(int argc, char **argv); /* cmd_bench_plan.c: --plan */
void ct_cmd_bench_memory_help(FILE *f);
int ct_cmd_bench_discovery(int argc, char **argv); /* cmd_bench_data.c */
void ct_cmd_bench_discovery_help(FILE *f);
int ct_cmd_bench_vae(int argc, char **argv); /* cmd_bench_vae.c */
void ct_cmd_bench_vae_help(FILE *f);
int ct_cmd_storage(int argc, char **argv); /* cmd_storage.c: every storage subcommand */
int ct_cmd_hub(int argc, char **argv);     /* cmd_hub.c: hub download, hub path */
void ct_cmd_hub_help(FILE *f);
struct ct_config;
/* config check's "hub:" lines: each model key that is a hub id, from the cache. */
void ct_cli_hub_check(const struct ct_config *cfg);
void ct_cmd_storage_help(FILE *f);

/* "latest:OUTPUT_DIR" (the newest complete checkpoint there) or a directory
 * into dir; prints the error and returns -1 if there is none. */
int ct_cli_checkpoint_dir(const char *cmd, const char *arg, char *dir, size_t n);

/* "--key=value" or "--key value": if argv[*i] is option `key`, store its value,
 * advance *i and return 1; 0 if it is another option; -1 (message printed) if
 * the value is missing. */
int ct_cli_opt(int argc, char **argv, int *i, const char *key, const char **val);
/* Parse an integer/float option value; prints an error naming the option. */
int ct_cli_int(const char *key, const char *val, long lo, long hi, long *out);
int ct_cli_float(const char *key, const char *val, double *out);
/* Write s as a JSON string literal (quoted, escaped). */
void ct_cli_json_str(FILE *f, const char *s);

/* `ctuner sample --pretrained DIR` (cmd_sample_flux.c): a FLUX.1 pipeline. */
typedef struct ct_flux_sample_args {
  const char *pretrained, *ckpt_dir, *flavour;
  int max_sequence_length, steps; /* 0 / -1: defaults */
  double guidance;                /* < 0: 3.5 */
  long seed;                      /* < 0: 0 */
  int width, height, per;         /* <= 0: 128 x the VAE factor */
  const char *out, *out_dir;
  const char *lora;  /* an adapter file, or NULL */
  double lora_scale; /* its multiplier */
  const char *image; /* Kontext: the reference image, or NULL (docs/kontext.md) */
  long max_area;     /* Kontext: FluxKontextPipeline's max_area */
  int auto_resize;   /* Kontext: its _auto_resize */
} ct_flux_sample_args;
int ct_cmd_sample_flux(const ct_flux_sample_args *a, const char *const *prompts, int n);

/* `ctuner sample --pretrained DIR` of a StableDiffusionXLPipeline
 * (cmd_sample_sdxl.c). */
typedef struct ct_sdxl_sample_args {
  const char *pretrained;
  const char *negative;  /* NULL: none (zeros with force_zeros_for_empty_prompt) */
  const char *scheduler; /* NULL: the pipeline's; euler | ddim | dpm++2m */
  int steps;             /* <= 0: 50 */
  double guidance;       /* < 0: 5 */
  double guidance_rescale;
  long seed;              /* < 0: 0 */
  int width, height, per; /* <= 0: the pipeline's (unet sample_size x the VAE factor) */
  const char *out, *out_dir;
} ct_sdxl_sample_args;
int ct_cmd_sample_sdxl(const ct_sdxl_sample_args *a, const char *const *prompts, int n);
/* A sampled image k to --out (PNG), or to --out-dir as NNNN.png with its
 * prompt in NNNN.txt; 1 (message printed) if the PNG cannot be written. */
struct ct_image;
int ct_cli_write_sample(const char *out, const char *out_dir, int k, const char *prompt,
                        const struct ct_image *im);
/* 1: dir's model_index.json names StableDiffusionXLPipeline. */
int ct_cli_is_sdxl_pipeline(const char *dir);

#endif
