/* `ctuner bench memory`: bytes per rank by category, measured in a real
 * training run (ct_train_run, two steps of AdamW on a generated dataset), beside
 * the ZeRO formula for the stage (docs/distributed.md, docs/performance.md).
 * With --ranks N outside an MPI launch it runs itself under mpirun. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ctuner/alloc.h"
#include "ctuner/comm.h"
#include "ctuner/config.h"
#include "ctuner/log.h"
#include "ctuner/mmdit.h"
#include "ctuner/synth.h"
#include "ctuner/train.h"

void ct_cmd_bench_memory_help(FILE *f) {
  fprintf(
      f,
      "usage: ctuner bench memory [--preset NAME] [--stage S] [--ranks N] [--mixed_precision "
      "no|bf16]\n"
      "                           [--gradient_checkpointing N] [--offload_optimizer "
      "none|nvme]\n"
      "                           [--offload_param none|nvme] [--model_type full|lora]\n"
      "                           [--lora_rank R] [--flux_lora_target T] [--lora_dropout P]\n"
      "                           [--base_model_precision "
      "no_change|bf16|int8-quanto|int8-torchao]\n"
      "                           [--base_model_default_dtype fp32|bf16]\n"
      "                           [--model_family sdxl --pretrained DIR]\n"
      "       ctuner bench memory --plan [--preset NAME | --pretrained DIR] [--stage S] [--ranks "
      "N]\n"
      "                           [--model_family flux|sdxl] [--model_flavour F]\n"
      "                           [--mixed_precision no|bf16] [--gradient_checkpointing N]\n"
      "                           [--offload_optimizer none|cpu|nvme] [--offload_param "
      "none|cpu|nvme]\n"
      "                           [--offload_buffer_size FLOATS] [--use_ema] [--batch B]\n"
      "                           [--resolution PX] [--tokens T] [--model_type full|lora]\n"
      "                           [--lora_rank R] [--flux_lora_target T]\n"
      "\n"
      "Trains 2 steps of AdamW (batch 1 per rank, 16x16 images) with ZeRO stage S\n"
      "(default 0) and prints one JSON line from rank 0: the largest per-rank peak\n"
      "bytes of trainable parameters, gradients and optimizer state, the ZeRO\n"
      "formula (fp32: params 4Ψ, grads 4Ψ, AdamW 8Ψ; bf16: params 2Ψ, grads 2Ψ,\n"
      "float32 master weights + AdamW 12Ψ; stage 1 divides the optimizer part by N,\n"
      "stage 2 also the gradients, stage 3 everything) and their ratio, and the\n"
      "peaks outside the formula (activations; buffers: communication scratch,\n"
      "buckets, the weights gathered for the final checkpoint). --ranks N (default:\n"
      "the MPI world, else 1) re-runs this command under mpirun -np N when it was\n"
      "not started by an MPI launcher. --gradient_checkpointing N trains with\n"
      "gradient_checkpointing on and gradient_checkpointing_interval N (0: off, the\n"
      "default): the activations peak drops. --offload_optimizer / --offload_param nvme\n"
      "train with the swap file in the run's temporary directory (the peaks include\n"
      "the start-up, before the state and weights move to the file).\n"
      "--model_type lora trains LoRA adapters (--lora_rank R, default 16;\n"
      "--flux_lora_target T, default all; lora_dropout 0.1) on the frozen base: Ψ is\n"
      "the adapters', params count them and the float32 base (at stage 3 this rank's\n"
      "byte range of it), and the formula's params add the base, 4Ψ_base (/N at stage\n"
      "3); base_mb gives the base alone (docs/lora.md).\n"
      "\n"
      "--plan computes the same per-rank bytes from the parameter table without\n"
      "allocating the model or training (no MPI; --ranks N is arithmetic): params,\n"
      "grads and optimizer (AdamW state; bf16: the float32 master weights; --use_ema:\n"
      "the EMA; offload nvme: the state, or at stage 3 the float32 weights, go to the\n"
      "swap file — swap_mb — and three sub-group buffers stay, as ctuner train does;\n"
      "startup_optimizer_mb is the peak before the state moves out), the activation\n"
      "arena of one step for --batch (default 1) at --resolution pixels (default 64,\n"
      "as the measured mode's bucket; 1024 for flux-dev; a pipeline's VAE sample_size)\n"
      "and --tokens text tokens (default: the preset's; 512 for FLUX.1), and the\n"
      "frozen parts in\n"
      "their stored dtype: for --pretrained DIR (a diffusers FLUX.1 pipeline, or its\n"
      "transformer/) text_encoder_2, text_encoder and vae from their safetensors\n"
      "headers; for --preset flux-dev FLUX.1-dev's T5-XXL, CLIP-L and VAE in bf16\n"
      "(f32_mb: the same widened to float32, as the CLIP and VAE loaders hold them).\n"
      "buffers_mb: ZeRO's buckets, slots and bf16 scratch (zero), and the full float32\n"
      "weights rank 0 gathers for a checkpoint or validation (gather_rank0). Not\n"
      "planned: the communicator's scratch, the frozen encoders' activations, the data\n"
      "pipeline.\n"
      "\n"
      "--model_type lora (both modes; the same LoRA options): the adapters of\n"
      "--flux_lora_target at --lora_rank are the trained model (psi, grads, optimizer),\n"
      "the frozen base is counted in params at --base_model_precision's bytes (int8:\n"
      "1 byte per parameter + a float32 scale per output row; bf16: 2), its segment\n"
      "read scratch in buffers, the adapters' scratch in activations; the formula's\n"
      "params add the base (a float32 base is sharded at stage 3, a narrow one is whole\n"
      "on every rank); --plan's \"lora\" reports base_mb and\n"
      "base_bytes_per_param (docs/lora.md).\n"
      "\n"
      "--model_family sdxl (default flux): the U-net's full fine-tune. Measured: the\n"
      "U-net of the StableDiffusionXLPipeline --pretrained DIR trained 2 steps as above\n"
      "(params also hold its VAE, float32). --plan: the U-net of --pretrained DIR\n"
      "(unet/config.json; the frozen CLIP-L, CLIP-G and VAE from their headers), else\n"
      "SDXL 1.0 base's (built in; frozen parts float32 as published), activations\n"
      "from ct_unet_plan_memory at --batch and --resolution (default: the U-net's\n"
      "sample_size x the VAE factor, 1024) with 77 tokens, and per_rank_mb: device\n"
      "(params, grads, activations, scratch, ZeRO buffers, the optimizer unless\n"
      "offloaded) and host (the optimizer under --offload_optimizer cpu|nvme). ZeRO-2/3,\n"
      "bf16 and offload_param are planned on paper; trainable_in_this_build and\n"
      "not_yet say what ctuner train cannot run for SDXL yet (docs/performance.md).\n");
}

/* The formula's frozen base of a LoRA run (0 for full fine-tuning): 4 bytes
 * per base parameter, divided by N at stage 3. */
static double lora_base_formula_of(const char *preset, const char *mtype, long stage, int N) {
  if (strcmp(mtype, "lora")) return 0;
  ct_config cfg;
  ct_config_defaults(&cfg);
  ct_mmdit_config mc;
  ct_err err = {0};
  ct_param *tab = NULL;
  size_t ntab = 0, numel = 0;
  double psi = 0;
  if (!ct_config_set(&cfg, "preset", preset, &err) &&
      !ct_train_model_config(&cfg, &mc, NULL, NULL, &err) &&
      !ct_mmdit_param_table(&mc, &tab, &ntab, &numel, &err))
    for (size_t i = 0; i < ntab; i++) psi += (double)tab[i].numel;
  free(tab);
  ct_config_free(&cfg);
  return 4.0 * psi / (stage >= 3 ? N : 1);
}

static int relaunch(int argc, char **argv, long ranks) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    perror("ctuner bench memory: /proc/self/exe");
    return 1;
  }
  self[n] = 0;
  char np[32];
  snprintf(np, sizeof np, "%ld", ranks);
  char **av = calloc((size_t)argc + 16, sizeof *av);
  if (!av) return 1;
  int k = 0;
  av[k++] = "mpirun";
  av[k++] = "--oversubscribe";
  if (getuid() == 0) av[k++] = "--allow-run-as-root";
  av[k++] = "-np";
  av[k++] = np;
  av[k++] = self;
  for (int i = 0; i < argc; i++) av[k++] = argv[i]; /* "bench", "memory" and its options */
  av[k] = NULL;
  fflush(stdout);
  execvp("mpirun", av);
  perror("ctuner bench memory: cannot run mpirun (scripts/deps.sh installs openmpi-bin)");
  free(av);
  return 1;
}

/* This process's peak bytes of params, grads, optimizer, activations and
 * buffers, as the largest over the ranks (each rank's slot of an all-reduce). */
static ct_status peaks_max(ct_comm *comm, int rank, int N, double mx[5], ct_err *err) {
  ct_mem_stats ms;
  ct_mem_get_stats(&ms);
  double *v = calloc((size_t)5 * N, sizeof *v);
  if (!v) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  const ct_mem_cat cats[5] = {CT_MEM_PARAMS, CT_MEM_GRADS, CT_MEM_OPTIMIZER, CT_MEM_ACTIVATIONS,
                              CT_MEM_BUFFERS};
  for (int k = 0; k < 5; k++) v[5 * rank + k] = (double)ms.peak[cats[k]];
  ct_status st = ct_comm_allreduce_f64(comm, v, (size_t)5 * N, err);
  for (int k = 0; k < 5; k++) mx[k] = 0;
  for (int r = 0; r < N && !st; r++)
    for (int k = 0; k < 5; k++)
      if (v[5 * r + k] > mx[k]) mx[k] = v[5 * r + k];
  free(v);
  return st;
}

/* model_type lora: the frozen base's bytes at precision (whole on every
 * rank, in params), beside the adapters' formula. */
static double base_bytes(const char *preset, const char *precision, const char *default_dtype) {
  ct_config cfg;
  ct_err err = {0};
  ct_mmdit_config mc;
  ct_param *tab = NULL;
  size_t n = 0, numel = 0;
  double b = 0;
  ct_config_defaults(&cfg);
  if (!ct_config_set(&cfg, "preset", preset, &err) &&
      !ct_train_model_config(&cfg, &mc, NULL, NULL, &err) &&
      !ct_mmdit_param_table(&mc, &tab, &n, &numel, &err))
    b = strcmp(precision, "no_change")
            ? (double)ct_mmdit_quant_bytes(tab, n, precision, !strcmp(default_dtype, "bf16"))
            : 4.0 * (double)numel;
  free(tab);
  ct_config_free(&cfg);
  return b;
}

typedef struct mem_args {
  const char *preset, *mp, *offopt, *offpar, *mtype, *lrank, *ltarget, *ldrop, *lprec, *lddt;
  long stage, ranks, ckpt;
  const char *family, *pretrained; /* model_family flux (the preset) or sdxl (a pipeline) */
} mem_args;

/* The options of the measured mode: -1 to go on, else the exit code. */
static int parse_mem_args(int argc, char **argv, mem_args *a) {
  *a = (mem_args){"bench",     "no",   "none", "none", "full", "16",   "all", "0.1",
                  "no_change", "fp32", 0,      0,      0,      "flux", NULL};
  const char *v;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_bench_memory_help(stdout);
      return 0;
    } else if ((r = ct_cli_opt(argc, argv, &i, "preset", &a->preset)) ||
               (r = ct_cli_opt(argc, argv, &i, "mixed_precision", &a->mp)) ||
               (r = ct_cli_opt(argc, argv, &i, "offload_optimizer", &a->offopt)) ||
               (r = ct_cli_opt(argc, argv, &i, "offload_param", &a->offpar)) ||
               (r = ct_cli_opt(argc, argv, &i, "model_type", &a->mtype)) ||
               (r = ct_cli_opt(argc, argv, &i, "lora_rank", &a->lrank)) ||
               (r = ct_cli_opt(argc, argv, &i, "flux_lora_target", &a->ltarget)) ||
               (r = ct_cli_opt(argc, argv, &i, "lora_dropout", &a->ldrop)) ||
               (r = ct_cli_opt(argc, argv, &i, "base_model_precision", &a->lprec)) ||
               (r = ct_cli_opt(argc, argv, &i, "base_model_default_dtype", &a->lddt)) ||
               (r = ct_cli_opt(argc, argv, &i, "model_family", &a->family)) ||
               (r = ct_cli_opt(argc, argv, &i, "pretrained", &a->pretrained))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "stage", &v))) {
      if (r < 0 || ct_cli_int("stage", v, 0, 3, &a->stage)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "gradient_checkpointing", &v))) {
      if (r < 0 || ct_cli_int("gradient_checkpointing", v, 0, 1000, &a->ckpt)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "ranks", &v))) {
      if (r < 0 || ct_cli_int("ranks", v, 1, 1024, &a->ranks)) return 2;
    } else {
      fprintf(stderr, "ctuner bench memory: unknown option '%s'\n", argv[i]);
      ct_cmd_bench_memory_help(stderr);
      return 2;
    }
  }
  return -1;
}

/* --model_family sdxl: the U-net of the pipeline --pretrained DIR, trained
 * on the same generated images (16 x 16: buckets aligned to 8). */
static ct_status family_keys(ct_config *cfg, const mem_args *a, ct_err *err) {
  if (!strcmp(a->family, "flux") && !a->pretrained) return CT_OK;
  if (!strcmp(a->family, "flux"))
    return ct_errf(err, CT_ERR_INVALID,
                   "--pretrained DIR: the measured mode trains a --preset for flux (a pipeline "
                   "only with --model_family sdxl)");
  ct_status st = ct_config_set(cfg, "model_family", a->family, err);
  if (!st && a->pretrained)
    st = ct_config_set(cfg, "pretrained_model_name_or_path", a->pretrained, err);
  if (!st) st = ct_config_set(cfg, "aspect_bucket_alignment", "8", err);
  return st;
}

int ct_cmd_bench_memory(int argc, char **argv) {
  for (int i = 2; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
      break;
    else if (!strcmp(argv[i], "--plan"))
      return ct_bench_memory_plan(argc, argv);
  mem_args a;
  const int pr = parse_mem_args(argc, argv, &a);
  if (pr >= 0) return pr;
  const char *preset = a.preset, *mp = a.mp, *offopt = a.offopt, *offpar = a.offpar;
  const char *mtype = a.mtype, *lrank = a.lrank, *ltarget = a.ltarget, *ldrop = a.ldrop;
  const char *lprec = a.lprec, *lddt = a.lddt;
  const long stage = a.stage, ranks = a.ranks, ckpt = a.ckpt;
  if (strcmp(mp, "no") && strcmp(mp, "bf16")) {
    fprintf(stderr, "ctuner bench memory: --mixed_precision %s: use no or bf16\n", mp);
    return 2;
  }
  const int launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
  if (ranks > 1 && !launched) return relaunch(argc, argv, ranks);

  ct_err err = {0};
  ct_comm *comm = NULL;
  if (ct_comm_init(0, &comm, &err)) {
    fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
    return 1;
  }
  const int rank = ct_comm_rank(comm), N = ct_comm_size(comm);
  int rc = 1;
  char dir[] = "/tmp/ctuner-benchmem.XXXXXX", data[64], backend[80], out[64], swap[64], json[256];
  if (!mkdtemp(dir)) {
    perror("ctuner bench memory: mkdtemp");
    goto done;
  }
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(backend, sizeof backend, "%s/backend.json", dir);
  /* one output_dir for all ranks (checkpoints are written by all): rank 0's */
  char shared[sizeof dir];
  memcpy(shared, dir, sizeof dir);
  if (ct_comm_broadcast(comm, shared, sizeof shared, 0, &err)) {
    fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
    goto done;
  }
  snprintf(out, sizeof out, "%s/run", shared);
  snprintf(swap, sizeof swap, "%s/swap", shared);
  ct_log_set_level(CT_LOG_ERROR);
  if (ct_synth_write_dataset(data, 2 * N, 1, 16, 16, &err)) {
    fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
    goto done;
  }
  snprintf(json, sizeof json,
           "[{\"id\": \"m\", \"type\": \"local\", \"instance_data_dir\": \"%s\"}]", data);
  FILE *f = fopen(backend, "w");
  if (!f || fputs(json, f) < 0 || fclose(f)) {
    perror("ctuner bench memory: backend.json");
    goto done;
  }
  ct_config cfg;
  ct_config_defaults(&cfg);
  char st_s[8], ck_s[24];
  snprintf(st_s, sizeof st_s, "%ld", stage);
  snprintf(ck_s, sizeof ck_s, "%ld", ckpt);
  const char *kv[][2] = {{"preset", preset},
                         {"resolution", "16"},
                         {"train_batch_size", "1"},
                         {"max_train_steps", "2"},
                         {"optimizer", "adamw"},
                         {"use_ema", "false"},
                         {"disable_validation", "true"},
                         {"checkpoint_step_interval", "0"},
                         {"data_backend_config", backend},
                         {"output_dir", out},
                         {"zero_stage", st_s},
                         {"mixed_precision", mp},
                         {"gradient_checkpointing", ckpt ? "true" : "false"},
                         {"gradient_checkpointing_interval", ck_s},
                         {"offload_optimizer", offopt},
                         {"offload_param", offpar},
                         {"offload_param_path", swap},
                         {"model_type", mtype},
                         {"lora_rank", lrank},
                         {"flux_lora_target", ltarget},
                         {"lora_dropout", ldrop},
                         {"base_model_precision", lprec},
                         {"base_model_default_dtype", lddt}};
  ct_status cst = CT_OK;
  for (size_t i = 0; i < sizeof kv / sizeof kv[0] && !cst; i++)
    cst = ct_config_set(&cfg, kv[i][0], kv[i][1], &err);
  if (cst || family_keys(&cfg, &a, &err)) {
    fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
    ct_config_free(&cfg);
    goto done;
  }
  ct_mem_reset_peak();
  ct_train_summary sum;
  if (ct_train_run(&cfg, comm, NULL, NULL, &sum, &err)) {
    fprintf(stderr, "ctuner bench memory: rank %d: %s\n", rank, err.msg);
    ct_config_free(&cfg);
    ct_comm_abort(comm, 1);
    goto done;
  }
  ct_config_free(&cfg);
  double mx[5];
  if (peaks_max(comm, rank, N, mx, &err)) {
    fprintf(stderr, "ctuner bench memory: %s\n", err.msg);
    goto done;
  }
  const double psi = (double)sum.params;
  const int bf = !strcmp(mp, "bf16");
  double fp = (bf ? 2 : 4) * psi, fg = (bf ? 2 : 4) * psi, fo = (bf ? 12 : 8) * psi;
  if (stage >= 1) fo /= N;
  if (stage >= 2) fg /= N;
  if (stage >= 3) fp /= N;
  /* LoRA: the frozen base, 4Ψ_base (/N at stage 3), or at its stored bytes */
  const double base = !strcmp(mtype, "lora") && strcmp(lprec, "no_change")
                          ? base_bytes(preset, lprec, lddt)
                          : lora_base_formula_of(preset, mtype, stage, N);
  fp += base;
  const double mt = mx[0] + mx[1] + mx[2], ft = fp + fg + fo;
  if (rank == 0)
    printf(
        "{\"model_family\": \"%s\", \"preset\": \"%s\", \"ranks\": %d, \"stage\": %ld, "
        "\"mixed_precision\": \"%s\", \"psi\": "
        "%.0f, "
        "\"measured_mb\": {\"params\": %.2f, \"grads\": %.2f, \"optimizer\": %.2f, \"total\": "
        "%.2f}, "
        "\"formula_mb\": {\"params\": %.2f, \"grads\": %.2f, \"optimizer\": %.2f, \"total\": "
        "%.2f}, "
        "\"measured_over_formula\": %.4f, \"outside_formula_mb\": {\"activations\": %.2f, "
        "\"buffers\": %.2f}, \"gradient_checkpointing\": %ld, \"offload_optimizer\": \"%s\", "
        "\"offload_param\": \"%s\", \"model_type\": \"%s\", \"base_mb\": %.2f, "
        "\"bytes\": {\"params\": %.0f, "
        "\"grads\": %.0f, \"optimizer\": %.0f, \"activations\": %.0f, \"buffers\": %.0f}}\n",
        a.family, preset, N, stage, mp, psi, mx[0] / 1048576, mx[1] / 1048576, mx[2] / 1048576,
        mt / 1048576, fp / 1048576, fg / 1048576, fo / 1048576, ft / 1048576, mt / ft,
        mx[3] / 1048576, mx[4] / 1048576, ckpt, offopt, offpar, mtype, base / 1048576, mx[0], mx[1],
        mx[2], mx[3], mx[4]);
  rc = 0;
done:
  if (rc) ct_comm_abort(comm, 1); /* never leave the other ranks waiting */
  if (dir[0] && strncmp(dir + strlen(dir) - 6, "XXXXXX", 6)) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) { /* best effort */
    }
  }
  ct_comm_free(comm);
  return rc;
}
