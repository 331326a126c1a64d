/* `ctuner train`, `ctuner cache` and `ctuner sample`: thin wrappers over
 * ct_train_run, ct_cache_run and ct_sample_images; progress drawing lives here, not in the library.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ctuner/config.h"
#include "ctuner/data.h"
#include "ctuner/family.h"
#include "ctuner/health.h"
#include "ctuner/image.h"
#include "ctuner/log.h"
#include "ctuner/lora_tools.h"
#include "ctuner/train.h"

void ct_cmd_cache_help(FILE *f) {
  fprintf(f,
          "usage: ctuner cache [--config config.json] [--KEY=VALUE ...]\n"
          "\n"
          "Builds the data caches of a training configuration and stops: discovery\n"
          "(image headers, spread over every rank), the bucket index files, the latent\n"
          "cache (cache_dir_vae) and the text-embedding cache, each rank encoding its\n"
          "share. Run it under mpirun (or 'ctuner launch') to use several processes or\n"
          "machines. Entries already valid are kept, so an interrupted run continues\n"
          "where it stopped. 'ctuner train' does the same at start. Prints one JSON\n"
          "line: images, processed, buckets, samples and the skipped counts\n"
          "(docs/data.md).\n");
}

void ct_cmd_train_help(FILE *f) {
  fprintf(f,
          "usage: ctuner train [--config config.json] [--KEY=VALUE ...]\n"
          "\n"
          "Trains the model_family's denoiser: FLUX.1's MMDiT with the flow-matching\n"
          "objective (flux), or SDXL's U-net with the DDPM objective (sdxl, from a\n"
          "StableDiffusionXLPipeline directory: docs/sdxl.md). The config is one of\n"
          "SimpleTuner's formats, by its extension: config.json (a flat object, keys may\n"
          "carry the \"--\" prefix), config.env (KEY=value lines with SimpleTuner's\n"
          "variable names) or config.toml; --KEY=VALUE arguments override it. Every\n"
          "problem is reported at once and nothing runs if there is one ('ctuner config\n"
          "check' prints them with the resolved keys). Main keys (all: docs/config.md,\n"
          "or 'ctuner train --help-keys'):\n"
          "  preset (or pretrained_model_name_or_path: a FLUX.1 pipeline directory,\n"
          "  docs/flux.md, or a hub id such as black-forest-labs/FLUX.1-dev, read from\n"
          "  the Hugging Face cache and downloaded into it when missing: docs/hub.md,\n"
          "  with revision and variant), output_dir, data_backend_config, train_batch_size,\n"
          "  gradient_accumulation_steps, max_train_steps, num_train_epochs,\n"
          "  learning_rate, lr_scheduler, optimizer, use_ema, checkpoint_step_interval,\n"
          "  resume_from_checkpoint, validation_prompt, validation_step_interval.\n"
          "\n"
          "Writes output_dir/checkpoint-<step>/, output_dir/validation_images/ and\n"
          "output_dir/metrics.jsonl; with report_to tensorboard, TensorBoard event\n"
          "files in output_dir/logs/<tracker_project_name>/ (docs/tensorboard.md).\n"
          "A progress bar is drawn when stdout is a terminal,\n"
          "plain lines otherwise. Exit status 1 on any error, 2 on bad arguments,\n"
          "3 circuit breaker (docs/health.md), 4 collective watchdog: a rank did not\n"
          "reach a collective within distributed_timeout seconds (docs/distributed.md),\n"
          "5 stopped on request: SIGTERM, SIGINT or SIGUSR1 end the run after the\n"
          "current step with a checkpoint to resume from (a second signal kills).\n");
}

typedef struct progress {
  int tty, every;
  double t_sum;
  long n;
} progress;

static void fmt_eta(double s, char *buf, size_t n) {
  if (!isfinite(s) || s < 0) s = 0;
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else
    snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

static void on_step(const ct_step_info *in, void *user) {
  progress *p = user;
  if (in->event) {
    if (p->tty) fputs("\r\033[K", stdout);
    printf("step %ld: %s\n", in->step, in->event);
    fflush(stdout);
    return;
  }
  p->t_sum += in->seconds;
  p->n++;
  double spi = p->t_sum / (double)p->n;
  char eta[32];
  fmt_eta(spi * (double)(in->total - in->step), eta, sizeof eta);
  if (p->tty) {
    int width = 30, fill = (int)(width * (double)in->step / (double)in->total);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '-';
    bar[width] = 0;
    printf("\r\033[K[%s] %ld/%ld loss %.4f lr %.2e %.3f s/it ETA %s%s", bar, in->step, in->total,
           in->loss, in->lr, spi, eta, in->skipped ? " (skipped: NaN/Inf)" : "");
    if (in->step == in->total) putchar('\n');
    fflush(stdout);
  } else if (in->step % p->every == 0 || in->step == in->total || in->skipped) {
    printf("step %ld/%ld epoch %ld loss %.6f lr %.3e grad_norm %.4f %.3f s/it ETA %s%s\n", in->step,
           in->total, in->epoch + 1, in->loss, in->lr, in->grad_norm, spi, eta,
           in->skipped ? " skipped (NaN/Inf)" : "");
    fflush(stdout);
  }
}

static void print_keys(void) {
  ct_config_key_info k;
  for (size_t i = 0; ct_config_key_info_at(i, &k); i++)
    printf("  %-32s %s (default: %s; model_type: %s)\n", k.name, k.help, k.def ? k.def : "unset",
           ct_config_models_name(k.models));
}

/* `ctuner train` and `ctuner cache` share options, launch and failure handling. */
/* SIGTERM (a scheduler's preemption, the web UI's Stop, mpirun passing one
 * on), SIGINT (Ctrl-C) and SIGUSR1 (which mpirun forwards to every rank):
 * the loop ends after the step it is in, with a checkpoint. A second signal,
 * or one before the loop runs, acts as it would by default. */
static void on_stop_signal(int sig) {
  if (ct_train_request_stop(sig)) return;
  signal(sig, SIG_DFL);
  raise(sig);
}

static void catch_stop_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
}

/* Hub ids in the model keys (docs/hub.md): rank 0 resolves them, downloading
 * what is missing, while the other ranks wait in an allreduce that carries its
 * status; then they resolve from the cache rank 0 filled. */
static ct_status resolve_hub(ct_config *cfg, ct_comm *comm, ct_err *err) {
  const int rank = ct_comm_rank(comm), world = ct_comm_size(comm);
  ct_status st = rank == 0 ? ct_train_resolve_hub(cfg, 1, err) : CT_OK;
  if (world == 1) return st;
  double failed = st ? 1.0 : 0.0;
  ct_err ce = {0};
  ct_comm_set_timeout(comm, 0); /* a download may take hours; the trainer sets the watchdog */
  if (ct_comm_allreduce_f64(comm, &failed, 1, &ce)) return ct_errf(err, ce.status, "%s", ce.msg);
  if (st) return st;
  if (failed > 0)
    return ct_errf(err, CT_ERR_NOT_FOUND, "rank 0 could not resolve the model (see its error)");
  return rank == 0 ? CT_OK : ct_train_resolve_hub(cfg, 0, err);
}

static int train_or_cache(int argc, char **argv, int cache) {
  const char *who = cache ? "ctuner cache" : "ctuner train";
  ct_config cfg;
  ct_config_defaults(&cfg);
  ct_err err = {0};
  ct_config_problems probs = {0};
  ct_comm *comm = NULL;
  int rc = 2;
  /* --config first, so that the other arguments override it wherever they are. */
  for (int i = 1; i < argc; i++) {
    const char *v;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      if (cache)
        ct_cmd_cache_help(stdout);
      else
        ct_cmd_train_help(stdout);
      rc = 0;
      goto out;
    }
    if (!strcmp(argv[i], "--help-keys")) {
      print_keys();
      rc = 0;
      goto out;
    }
    int r = ct_cli_opt(argc, argv, &i, "config", &v);
    if (r < 0) goto out;
    if (r) ct_config_load(&cfg, v, &probs);
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (ct_cli_opt(argc, argv, &i, "config", &v)) continue;
    if (strncmp(a, "--", 2)) {
      fprintf(stderr, "%s: unexpected argument '%s' (options are --KEY=VALUE)\n", who, a);
      goto out;
    }
    char key[256];
    const char *eq = strchr(a, '=');
    if (eq) {
      snprintf(key, sizeof key, "%.*s", (int)(eq - a), a);
      v = eq + 1;
    } else {
      snprintf(key, sizeof key, "%s", a);
      if (i + 1 >= argc) {
        fprintf(stderr, "%s: option %s needs a value\n", who, a);
        goto out;
      }
      v = argv[++i];
    }
    ct_config_set_arg(&cfg, key, v, &probs);
  }
  /* every problem of the file, the arguments and the rules at once; any error refuses.
   * Warnings are printed too, but not the no-effect keys: the trainer names those once. */
  int refuse = ct_config_check(&cfg, &probs) != CT_OK;
  /* the files it names, opened as config check opens them (pipeline, lycoris_config, webhooks) */
  refuse = ct_train_check_files(&cfg, &probs) != CT_OK || refuse || probs.errors;
  char where[700];
  for (size_t k = 0; k < probs.n; k++) {
    const ct_config_problem *pr = &probs.v[k];
    if (pr->warning && (refuse || ct_config_no_effect(pr->key))) continue;
    fprintf(stderr, "%s: %s: %s%s\n", who, ct_config_problem_where(pr, where, sizeof where),
            pr->warning ? "warning: " : "", pr->msg);
  }
  if (refuse) {
    fprintf(stderr, "%s: %zu problem%s in the configuration; nothing was run\n", who, probs.errors,
            probs.errors == 1 ? "" : "s");
    goto out;
  }
  progress p = {isatty(1) && !cfg.disable_progress_bar, 1, 0, 0};
  long planned = cfg.max_train_steps;
  p.every = planned >= 50 ? (int)(planned / 50) : 1;
  if (ct_comm_init(0, &comm, &err)) {
    fprintf(stderr, "%s: %s\n", who, err.msg);
    goto out;
  }
  const int rank = ct_comm_rank(comm), world = ct_comm_size(comm);
  if (rank > 0) ct_log_set_level(CT_LOG_WARN); /* rank 0 reports progress for the job */
  if (ct_deepspeed_apply(&cfg, world, &err) || ct_config_validate(&cfg, &err)) {
    fprintf(stderr, "%s: %s\n", who, err.msg);
    fflush(stderr);
    ct_comm_abort(comm, 2); /* one rank's bad file must not leave the others waiting */
    goto out;
  }
  if (resolve_hub(&cfg, comm, &err)) { /* hub ids: rank 0 downloads, the others wait */
    fprintf(stderr, "%s: %s\n", who, err.msg);
    fflush(stderr);
    ct_comm_abort(comm, 1);
    rc = 1;
    goto out;
  }
  if (world > 1) p.tty = 0; /* mpirun forwards output through a pty: plain lines, not a bar */
  if (!cache) catch_stop_signals();
  ct_train_summary sum;
  memset(&sum, 0, sizeof sum);
  ct_data_stats ds;
  ct_status st = cache ? ct_cache_run(&cfg, comm, &ds, &err)
                       : ct_train_run(&cfg, comm, on_step, &p, &sum, &err);
  if (p.tty) putchar('\n');
  if (st) {
    /* The circuit breaker's stop has its own exit code (docs/health.md).
     * When every rank stopped at the same point (breaker, low disk) they all
     * exit cleanly; otherwise this rank ends the job. */
    const int code = st == CT_ERR_HEALTH    ? CT_EXIT_HEALTH
                     : st == CT_ERR_TIMEOUT ? CT_EXIT_WATCHDOG /* docs/distributed.md */
                     : st == CT_ERR_STOPPED ? CT_EXIT_STOPPED  /* docs/training.md */
                                            : 1;
    const int joint = !cache && sum.joint_stop;
    if (world > 1) {
      fprintf(stderr, "%s: rank %d of %d: %s\n", who, rank, world, err.msg);
      fflush(stderr);
      if (!joint) ct_comm_abort(comm, code); /* the other ranks must not wait for this one */
    } else {
      fprintf(stderr, "%s: %s\n", who, err.msg);
    }
    rc = code;
    goto out;
  }
  rc = 0;
  if (rank > 0) goto out;
  if (cache) {
    printf(
        "{\"images\": %zu, \"processed\": %zu, \"buckets\": %zu, \"buckets_pruned\": %zu, "
        "\"samples\": %zu, "
        "\"skipped\": {\"unreadable\": %zu, \"no_caption\": %zu, \"too_small\": %zu, "
        "\"aspect_ratio\": %zu, "
        "\"outside_dir\": %zu, \"duplicate\": %zu, \"not_found\": %zu, \"metadata_missing\": %zu, "
        "\"max_num_samples\": %zu, \"unpaired\": %zu}}\n",
        ds.kept, ds.total_processed, ds.buckets, ds.buckets_pruned, ds.samples, ds.unreadable,
        ds.no_caption, ds.too_small, ds.aspect_ratio, ds.outside_dir, ds.duplicate, ds.not_found,
        ds.metadata_missing, ds.max_num_samples, ds.unpaired);
    goto out;
  }
  printf(
      "{\"steps\": %ld, \"from_step\": %ld, \"last_loss\": %.6g, \"seconds\": %.1f, \"images\": "
      "%zu, "
      "\"images_skipped\": %zu, \"nonfinite_steps_skipped\": %ld, \"checkpoint\": \"%s\"}\n",
      sum.end_step, sum.start_step, sum.last_loss, sum.seconds, sum.images, sum.images_skipped,
      sum.skipped_nonfinite, sum.last_checkpoint);
out:
  ct_comm_free(comm);
  ct_config_free(&cfg);
  ct_config_problems_free(&probs);
  return rc;
}

int ct_cmd_train(int argc, char **argv) {
  return train_or_cache(argc, argv, 0);
}
int ct_cmd_cache(int argc, char **argv) {
  return train_or_cache(argc, argv, 1);
}

void ct_cmd_sample_help(FILE *f) {
  fprintf(f,
          "usage: ctuner sample --checkpoint DIR (--prompt TEXT --out FILE.png |\n"
          "                     --prompts-file FILE --out-dir DIR [--per-prompt N])\n"
          "                     [--steps N] [--guidance G] [--seed S] [--width W] [--height H] "
          "[--ema]\n"
          "                     [--lora FILE [--lora_scale S]]\n"
          "\n"
          "Samples images from a checkpoint (Euler steps of the rectified flow with\n"
          "classifier-free guidance, decoded by the pixel codec). DIR may be 'latest:OUTPUT_DIR'\n"
          "for the newest complete checkpoint there. With --prompts-file (one prompt per\n"
          "line) images go to --out-dir as NNNN.png with the prompt in NNNN.txt.\n"
          "Defaults: the checkpoint's validation settings (steps, guidance, resolution, seed).\n"
          "\n"
          "A FLUX.1 pipeline (docs/flux.md): --pretrained DIR (a diffusers FluxPipeline\n"
          "directory, or a hub id from the Hugging Face cache, downloaded when missing:\n"
          "docs/hub.md) samples as FluxPipeline does (its scheduler's shift, guidance as the\n"
          "transformer's guidance input, no CFG pass); --checkpoint C (or latest:OUTPUT_DIR)\n"
          "then takes the transformer from C/transformer (a ctuner training run's). Also\n"
          "[--flavour dev|krea|schnell] [--max_sequence_length N] (T5 tokens: 512, schnell\n"
          "256). Defaults: 28 steps, guidance 3.5, 128 x the VAE factor pixels, seed 0.\n"
          "FLUX.1 Kontext (docs/kontext.md): --image REF (a PNG/JPEG) samples as\n"
          "FluxKontextPipeline with REF as its image; --max_area N (default 1048576) sets\n"
          "the output size as the pipeline does; --no_auto_resize is its _auto_resize=False\n"
          "(else REF must already be its PREFERRED_KONTEXT_RESOLUTIONS size: others refused).\n"
          "\n"
          "LoRA (docs/lora.md): --lora FILE (peft's pytorch_lora_weights.safetensors, a\n"
          "kohya/ComfyUI or BFL-named LoRA, or a LyCORIS LoCon/LoHa/LoKr file) is folded\n"
          "into the transformer, times --lora_scale S (default 1; diffusers'\n"
          "joint_attention_kwargs {\"scale\": S}; LyCORIS: the multiplier). A model_type\n"
          "lora run's checkpoint samples its base (pretrained_model_path, the pipeline's\n"
          "transformer, else the seeded init) with its own adapter (--ema: its EMA adapter),\n"
          "which --lora replaces.\n"
          "\n"
          "An SDXL pipeline (docs/sdxl.md): --pretrained DIR of a StableDiffusionXLPipeline\n"
          "(read from its model_index.json, or --model_family sdxl) samples as that pipeline\n"
          "does: classifier-free guidance with [--negative_prompt TEXT] (none: zeros, as\n"
          "force_zeros_for_empty_prompt), [--guidance_scale G] (= --guidance, default 5),\n"
          "[--guidance_rescale R] (0..1, default 0), [--scheduler euler|ddim|dpm++2m]\n"
          "(default: the pipeline's scheduler_config.json; the others from its config, as\n"
          "SimpleTuner swaps them), time_ids (H, W, 0, 0, H, W). Defaults: 50 steps, the\n"
          "pipeline's size (unet sample_size x the VAE factor: 1024 for SDXL 1.0; sides\n"
          "multiples of the VAE factor x 2^(U-net levels - 1)), seed 0. A progress line per\n"
          "step on stderr.\n");
}

/* --model_family and what an SDXL pipeline does not take yet, refused by name. */
static int sdxl_options(const char *family, int sdxl, const char *pretrained, const char *ckpt,
                        const char *lora, const char *flavour, const char *image, long msl,
                        int ema) {
  ct_err err = {0};
  if (family && ct_family_check(family, &err)) {
    fprintf(stderr, "ctuner sample: --model_family: %s\n", err.msg);
    return 2;
  }
  if (family && !pretrained) {
    fprintf(stderr, "ctuner sample: --model_family goes with --pretrained DIR\n");
    return 2;
  }
  if (family && !sdxl && ct_cli_is_sdxl_pipeline(pretrained)) {
    fprintf(stderr, "ctuner sample: %s is a StableDiffusionXLPipeline, not model_family %s\n",
            pretrained, family);
    return 2;
  }
  const char *no = !sdxl     ? NULL
                   : ckpt    ? "--checkpoint (a training run's U-net: not yet)"
                   : lora    ? "--lora (a U-net LoRA: not yet)"
                   : flavour ? "--flavour (SDXL has one)"
                   : image   ? "--image (FLUX.1 Kontext's reference image)"
                   : msl     ? "--max_sequence_length (CLIP's 77 tokens)"
                   : ema     ? "--ema"
                             : NULL;
  if (no) {
    fprintf(stderr, "ctuner sample: an SDXL pipeline does not take %s\n", no);
    return 2;
  }
  return 0;
}

/* The prompts of `ctuner sample`: --prompt, or one per line of --prompts-file. */
static int read_prompts(const char *prompt, const char *pfile, char ***out, int *nout) {
  char **prompts = NULL;
  int n = 0;
  if (prompt) {
    prompts = malloc(sizeof *prompts);
    if (!prompts) return 1;
    prompts[n++] = strdup(prompt);
  } else {
    FILE *f = fopen(pfile, "r");
    if (!f) {
      fprintf(stderr, "ctuner sample: cannot open --prompts-file %s\n", pfile);
      return 1;
    }
    char line[4096];
    int cap = 0;
    while (fgets(line, sizeof line, f)) {
      line[strcspn(line, "\r\n")] = 0;
      if (!line[0]) continue;
      if (n == cap) {
        cap = cap ? cap * 2 : 64;
        prompts = realloc(prompts, cap * sizeof *prompts);
      }
      prompts[n++] = strdup(line);
    }
    fclose(f);
    if (n == 0) {
      fprintf(stderr, "ctuner sample: %s holds no prompts\n", pfile);
      free(prompts);
      return 1;
    }
  }
  *out = prompts;
  *nout = n;
  return 0;
}

/* Prompts longer than the model's tokenizer_max_length keeps: one warning. */
static void warn_long_prompts(const ct_pipeline *p, char **prompts, int n) {
  int over = 0;
  size_t longest = 0;
  for (int i = 0; i < n; i++) {
    const ct_bpe *bpe = ct_textenc_bpe(p->te);
    size_t l = bpe ? (size_t)ct_bpe_tokens(bpe, prompts[i], NULL, 0) : strlen(prompts[i]);
    if (l + 2 > (size_t)p->T) over++;
    if (l > longest) longest = l;
  }
  if (over)
    fprintf(stderr,
            "ctuner sample: warning: %d prompt(s) longer than the %d %s the model's "
            "tokenizer_max_length %d keeps are truncated (longest %zu)\n",
            over, p->T - 2, ct_textenc_bpe(p->te) ? "tokens" : "bytes", p->T, longest);
}

/* A checkpoint's own sampling settings: its validation steps, guidance, shift and
 * seed; the size is the validation resolution, else the training one. */
static void sample_defaults(const ct_pipeline *p, ct_sample_opts *so) {
  *so = (ct_sample_opts){0,
                         0,
                         (int)p->cfg.validation_num_inference_steps,
                         (float)p->cfg.validation_guidance,
                         (float)p->cfg.flow_shift,
                         (uint64_t)p->cfg.validation_seed,
                         p->cfg.flow_schedule_auto_shift,
                         NULL,
                         p->cfg.validation_negative_prompt};
  int w = 0, h = 0;
  if (p->cfg.validation_resolution) {
    char x;
    if (sscanf(p->cfg.validation_resolution, "%d%c%d", &w, &x, &h) != 3)
      h = w = atoi(p->cfg.validation_resolution);
  }
  if (w <= 0) {
    int res = (int)p->cfg.resolution;
    if (res <= 0) {
      const ct_mmdit_preset *pr = ct_mmdit_preset_find(p->cfg.preset);
      res = pr ? (pr->lat_h > pr->lat_w ? pr->lat_h : pr->lat_w) * p->codec_scale : 32;
    }
    w = h = res;
  }
  so->width = w, so->height = h;
}

/* `ctuner sample`'s options as given (unset numbers are negative). */
typedef struct sample_cli {
  const char *ckpt, *prompt, *outp, *pfile, *odir;
  const char *pretrained, *flavour, *lora, *image;
  const char *negative, *scheduler, *family; /* SDXL's */
  long max_area;                             /* FluxKontextPipeline's */
  int auto_resize, kontext_opt, ema;
  double lora_scale, rescale, guidance;
  long steps, seed, width, height, per, msl;
} sample_cli;

/* The numeric options; 1 when argv[*i] is none of them, 2 on a bad value. */
static int sample_number(int argc, char **argv, int *i, sample_cli *o) {
  const char *v;
  int r;
  if ((r = ct_cli_opt(argc, argv, i, "guidance_rescale", &v))) {
    if (r < 0 || ct_cli_float("guidance_rescale", v, &o->rescale)) return 2;
    if (!(o->rescale >= 0 && o->rescale <= 1)) {
      fprintf(stderr, "ctuner sample: --guidance_rescale must be in [0, 1]\n");
      return 2;
    }
  } else if ((r = ct_cli_opt(argc, argv, i, "lora_scale", &v))) {
    if (r < 0 || ct_cli_float("lora_scale", v, &o->lora_scale)) return 2;
  } else if ((r = ct_cli_opt(argc, argv, i, "max_sequence_length", &v))) {
    if (r < 0 || ct_cli_int("max_sequence_length", v, 1, 4096, &o->msl)) return 2;
  } else if ((r = ct_cli_opt(argc, argv, i, "max_area", &v))) {
    if (r < 0 || ct_cli_int("max_area", v, 64, 1L << 26, &o->max_area)) return 2;
    o->kontext_opt = 1;
  } else if ((r = ct_cli_opt(argc, argv, i, "steps", &v))) {
    if (r < 0 || ct_cli_int("steps", v, 1, 1000, &o->steps)) return 2;
  } else if ((r = ct_cli_opt(argc, argv, i, "seed", &v))) {
    if (r < 0 || ct_cli_int("seed", v, 0, 1L << 62, &o->seed)) return 2;
  } else if ((r = ct_cli_opt(argc, argv, i, "width", &v))) {
    if (r < 0 || ct_cli_int("width", v, 2, 4096, &o->width)) return 2;
  } else if ((r = ct_cli_opt(argc, argv, i, "height", &v))) {
    if (r < 0 || ct_cli_int("height", v, 2, 4096, &o->height)) return 2;
  } else if ((r = ct_cli_opt(argc, argv, i, "per-prompt", &v))) {
    if (r < 0 || ct_cli_int("per-prompt", v, 1, 64, &o->per)) return 2;
  } else if ((r = ct_cli_opt(argc, argv, i, "guidance", &v)) ||
             (r = ct_cli_opt(argc, argv, i, "guidance_scale", &v))) {
    if (r < 0 || ct_cli_float("guidance", v, &o->guidance)) return 2;
  } else {
    return 1;
  }
  return 0;
}

/* argv into *o: 0, -1 after --help, 2 on a bad option. */
static int sample_parse(int argc, char **argv, sample_cli *o) {
  *o = (sample_cli){.max_area = 1024L * 1024L,
                    .auto_resize = 1,
                    .lora_scale = 1.0,
                    .rescale = -1,
                    .guidance = -1,
                    .steps = -1,
                    .seed = -1,
                    .width = -1,
                    .height = -1,
                    .per = 1};
  for (int i = 1; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_sample_help(stdout);
      return -1;
    } else if (!strcmp(argv[i], "--ema")) {
      o->ema = 1;
    } else if (!strcmp(argv[i], "--no_auto_resize")) {
      o->auto_resize = 0, o->kontext_opt = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "checkpoint", &o->ckpt)) ||
               (r = ct_cli_opt(argc, argv, &i, "prompt", &o->prompt)) ||
               (r = ct_cli_opt(argc, argv, &i, "out", &o->outp)) ||
               (r = ct_cli_opt(argc, argv, &i, "prompts-file", &o->pfile)) ||
               (r = ct_cli_opt(argc, argv, &i, "out-dir", &o->odir)) ||
               (r = ct_cli_opt(argc, argv, &i, "pretrained", &o->pretrained)) ||
               (r = ct_cli_opt(argc, argv, &i, "flavour", &o->flavour)) ||
               (r = ct_cli_opt(argc, argv, &i, "lora", &o->lora)) ||
               (r = ct_cli_opt(argc, argv, &i, "negative_prompt", &o->negative)) ||
               (r = ct_cli_opt(argc, argv, &i, "scheduler", &o->scheduler)) ||
               (r = ct_cli_opt(argc, argv, &i, "model_family", &o->family)) ||
               (r = ct_cli_opt(argc, argv, &i, "image", &o->image))) {
      if (r < 0) return 2;
    } else if ((r = sample_number(argc, argv, &i, o)) != 1) {
      if (r) return 2;
    } else {
      fprintf(stderr, "ctuner sample: unknown option '%s'\n", argv[i]);
      ct_cmd_sample_help(stderr);
      return 2;
    }
  }
  return 0;
}

/* The rules between the options; sets *sdxl. 0 or 2. */
static int sample_check(const sample_cli *o, int *sdxl) {
  if ((!o->ckpt && !o->pretrained) || (!o->prompt && !o->pfile) || (o->prompt && o->pfile) ||
      (o->prompt && !o->outp) || (o->pfile && !o->odir) || (o->pretrained && o->ema)) {
    fprintf(stderr,
            "ctuner sample: need --checkpoint (or --pretrained) and either --prompt with --out or "
            "--prompts-file with --out-dir (--ema is for ctuner's own checkpoints)\n");
    ct_cmd_sample_help(stderr);
    return 2;
  }
  if (o->image && !o->pretrained) {
    fprintf(stderr, "ctuner sample: --image (FLUX.1 Kontext) needs --pretrained\n");
    return 2;
  }
  if (o->kontext_opt && !o->image && !(o->flavour && !strcmp(o->flavour, "kontext"))) {
    fprintf(stderr,
            "ctuner sample: --max_area and --no_auto_resize are FluxKontextPipeline's: "
            "they need --image or --flavour kontext\n");
    return 2;
  }
  ct_err err = {0};
  if (ct_lora_check_multiplier(o->lora_scale, &err)) {
    fprintf(stderr, "ctuner sample: --%s\n", err.msg);
    return 2;
  }
  *sdxl = o->pretrained && ((o->family && !strcmp(o->family, "sdxl")) ||
                            (!o->family && ct_cli_is_sdxl_pipeline(o->pretrained)));
  if (sdxl_options(o->family, *sdxl, o->pretrained, o->ckpt, o->lora, o->flavour, o->image, o->msl,
                   o->ema))
    return 2;
  if (!*sdxl && (o->negative || o->scheduler || o->rescale >= 0)) {
    fprintf(stderr,
            "ctuner sample: --%s is for an SDXL pipeline (--pretrained DIR of a "
            "StableDiffusionXLPipeline); FLUX.1 samples without a CFG pass\n",
            o->negative    ? "negative_prompt"
            : o->scheduler ? "scheduler"
                           : "guidance_rescale");
    return 2;
  }
  return 0;
}

/* Images from one of ctuner's own checkpoints (DIR resolved). 0 or 1. */
static int sample_checkpoint(const sample_cli *o, const char *dir, char **prompts, int n) {
  ct_err err = {0};
  ct_pipeline p = {0};
  int rc = 1;
  if (ct_pipeline_from_checkpoint_lora(dir, o->ema, o->lora, o->lora_scale, &p, &err)) {
    fprintf(stderr, "ctuner sample: %s\n", err.msg);
    goto done;
  }
  warn_long_prompts(&p, prompts, n);
  ct_sample_opts so;
  sample_defaults(&p, &so);
  if (o->steps > 0) so.steps = (int)o->steps;
  if (o->guidance >= 0) so.guidance = (float)o->guidance;
  if (o->seed >= 0) so.seed = (uint64_t)o->seed;
  if (o->width > 0) so.width = (int)o->width;
  if (o->height > 0) so.height = (int)o->height;
  if (o->odir) {
    struct stat sb;
    if (stat(o->odir, &sb) != 0 && mkdir(o->odir, 0755) != 0) {
      fprintf(stderr, "ctuner sample: cannot create --out-dir %s\n", o->odir);
      goto done;
    }
  }
  const int chunk = 16, per = (int)o->per;
  int written = 0;
  for (int q = 0; q < n * per; q += chunk) {
    int m = n * per - q < chunk ? n * per - q : chunk;
    const char *pp[16];
    ct_image imgs[16];
    for (int k = 0; k < m; k++) pp[k] = prompts[(q + k) / per];
    if (ct_sample_images(p.model, p.te, p.T, &p.codec, pp, m, (uint64_t)q, &so, imgs, &err)) {
      fprintf(stderr, "ctuner sample: %s\n", err.msg);
      goto done;
    }
    for (int k = 0; k < m; k++) {
      const int bad = ct_cli_write_sample(o->outp, o->odir, q + k, pp[k], &imgs[k]);
      ct_image_free(&imgs[k]);
      if (bad) {
        for (int j = k + 1; j < m; j++) ct_image_free(&imgs[j]);
        goto done;
      }
      written++;
    }
  }
  printf(
      "{\"images\": %d, \"width\": %d, \"height\": %d, \"steps\": %d, \"guidance\": %g, \"ema\": "
      "%s, \"out\": \"%s\"}\n",
      written, so.width, so.height, so.steps, so.guidance, o->ema ? "true" : "false",
      o->outp ? o->outp : o->odir);
  rc = 0;
done:
  if (p.model || p.te) ct_pipeline_free(&p);
  return rc;
}

int ct_cmd_sample(int argc, char **argv) {
  sample_cli o;
  int sdxl = 0, rc = sample_parse(argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;
  if (sample_check(&o, &sdxl)) return 2;
  char dir[4096] = "";
  if (o.ckpt && ct_cli_checkpoint_dir("sample", o.ckpt, dir, sizeof dir)) return 1;
  char **prompts = NULL;
  int n = 0;
  if (read_prompts(o.prompt, o.pfile, &prompts, &n)) return 1;
  if (sdxl) {
    const ct_sdxl_sample_args a = {o.pretrained, o.negative,   o.scheduler,
                                   (int)o.steps, o.guidance,   o.rescale > 0 ? o.rescale : 0.0,
                                   o.seed,       (int)o.width, (int)o.height,
                                   (int)o.per,   o.outp,       o.odir};
    rc = ct_cmd_sample_sdxl(&a, (const char *const *)prompts, n);
  } else if (o.pretrained) {
    const ct_flux_sample_args a = {
        o.pretrained, o.ckpt ? dir : NULL, o.flavour,     (int)o.msl, (int)o.steps, o.guidance,
        o.seed,       (int)o.width,        (int)o.height, (int)o.per, o.outp,       o.odir,
        o.lora,       o.lora_scale,        o.image,       o.max_area, o.auto_resize};
    rc = ct_cmd_sample_flux(&a, (const char *const *)prompts, n);
  } else {
    rc = sample_checkpoint(&o, dir, prompts, n);
  }
  for (int i = 0; i < n; i++) free(prompts[i]);
  free(prompts);
  return rc;
}

int ct_cli_checkpoint_dir(const char *cmd, const char *arg, char *dir, size_t n) {
  if (strncmp(arg, "latest:", 7)) {
    snprintf(dir, n, "%s", arg);
    return 0;
  }
  ct_err err = {0};
  if (ct_checkpoint_latest(arg + 7, dir, n, NULL, &err)) {
    fprintf(stderr, "ctuner %s: %s\n", cmd, err.msg);
    return -1;
  }
  return 0;
}
