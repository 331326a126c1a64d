/* `ctuner launch`: an Accelerate config (YAML) turned into the mpirun command
 * that runs `ctuner train` on every process of every machine
 * (docs/distributed.md, "Launching from an Accelerate config").
 *
 * The YAML reader takes what `accelerate config` writes: `key: value` lines,
 * comments, quotes, and one nested map (deepspeed_config). Keys ctuner has no
 * use for (compute_environment, gpu_ids, rdzv_backend, ...) are accepted and
 * ignored; the ones it uses are checked, and an error names file:line.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

typedef struct acc_cfg {
  long num_machines, num_processes, machine_rank, main_process_port, zero_stage, grad_accum;
  char main_process_ip[256], mixed_precision[32], distributed_type[64], offload_opt[32],
      offload_param[32];
  char nvme_path[1024];
  char ds_file[1024];  /* deepspeed_config.deepspeed_config_file */
  char grad_clip[64];  /* deepspeed_config.gradient_clipping ("" unset) */
  char ds_inline[256]; /* inline DeepSpeed keys given (Accelerate refuses them beside a file) */
} acc_cfg;

void ct_cmd_launch_help(FILE *f) {
  fprintf(f,
          "usage: ctuner launch --accelerate-config FILE [--hostfile F] [--dry-run] -- train "
          "[options]\n"
          "\n"
          "Reads an Accelerate config (num_machines, num_processes, machine_rank,\n"
          "main_process_ip, main_process_port, mixed_precision, distributed_type,\n"
          "deepspeed_config.zero_stage / gradient_accumulation_steps / offload_*_device)\n"
          "and runs `mpirun -np num_processes --map-by ppr:<per machine>:node ... ctuner\n"
          "train ...` with the matching --zero_stage and --gradient_accumulation_steps\n"
          "(and --deepspeed_config=<deepspeed_config_file>) before your own options, which win.\n"
          "Run it once, on machine_rank 0; mpirun starts the ranks of the other machines\n"
          "listed in --hostfile (required when num_machines > 1). --dry-run prints the\n"
          "command instead of running it.\n");
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
  return s;
}

/* Strips a trailing comment (outside quotes) and surrounding quotes. */
static char *yaml_value(char *v) {
  char q = 0;
  for (char *p = v; *p; p++) {
    if (!q && (*p == '"' || *p == '\''))
      q = *p;
    else if (q && *p == q)
      q = 0;
    else if (!q && *p == '#' && (p == v || isspace((unsigned char)p[-1]))) {
      *p = 0;
      break;
    }
  }
  v = trim(v);
  size_t n = strlen(v);
  if (n >= 2 && (v[0] == '"' || v[0] == '\'') && v[n - 1] == v[0]) {
    v[n - 1] = 0;
    v++;
  }
  return v;
}

static int yaml_int(const char *path, int line, const char *key, const char *v, long lo, long hi,
                    long *out) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi) {
    fprintf(stderr, "ctuner launch: %s:%d: %s: expected an integer in [%ld, %ld], got '%s'\n", path,
            line, key, lo, hi, v);
    return -1;
  }
  *out = x;
  return 0;
}

/* One key of the nested deepspeed_config map; 0 or -1 (message printed). */
static int ds_key(const char *path, int line, const char *k, const char *v, acc_cfg *c) {
  int rc = 0;
  static const char *const with_file[] = {
      "gradient_accumulation_steps", "gradient_clipping",      "zero_stage",
      "offload_optimizer_device",    "offload_param_device",   "offload_param_nvme_path",
      "offload_optimizer_nvme_path", "zero3_save_16bit_model", NULL};
  for (int q = 0; with_file[q]; q++)
    if (!strcmp(k, with_file[q])) { /* present at all, as Accelerate checks */
      const size_t l = strlen(c->ds_inline);
      snprintf(c->ds_inline + l, sizeof c->ds_inline - l, "%s%s", l ? ", " : "", k);
    }
  if (!strcmp(k, "gradient_clipping")) {
    char *end;
    const double g = strtod(v, &end);
    if (end == v || *end || !(g >= 0)) {
      fprintf(stderr, "ctuner launch: %s:%d: gradient_clipping: expected a number >= 0, got '%s'\n",
              path, line, v);
      rc = -1;
    } else {
      snprintf(c->grad_clip, sizeof c->grad_clip, "%s", v);
    }
  } else if (!strcmp(k, "zero_stage"))
    rc = yaml_int(path, line, k, v, 0, 3, &c->zero_stage);
  else if (!strcmp(k, "gradient_accumulation_steps"))
    rc = yaml_int(path, line, k, v, 1, 1 << 20, &c->grad_accum);
  else if (!strcmp(k, "offload_optimizer_device"))
    snprintf(c->offload_opt, sizeof c->offload_opt, "%s", v);
  else if (!strcmp(k, "offload_param_device"))
    snprintf(c->offload_param, sizeof c->offload_param, "%s", v);
  else if ((!strcmp(k, "offload_optimizer_nvme_path") || !strcmp(k, "offload_param_nvme_path")) &&
           *v && strcmp(v, "none"))
    snprintf(c->nvme_path, sizeof c->nvme_path, "%s", v);
  else if (!strcmp(k, "deepspeed_config_file") && *v && strcmp(v, "none"))
    snprintf(c->ds_file, sizeof c->ds_file, "%s", v);
  return rc;
}

/* What ctuner cannot do with an Accelerate config, named; 0 or -1. */
static int check_accelerate(const char *path, acc_cfg *c) {
  const char *dt = c->distributed_type;
  if (strcmp(dt, "NO") && strcmp(dt, "MULTI_GPU") && strcmp(dt, "MULTI_CPU") &&
      strcmp(dt, "DEEPSPEED")) {
    fprintf(stderr,
            "ctuner launch: %s: distributed_type %s is not supported; use MULTI_GPU, MULTI_CPU, "
            "DEEPSPEED or NO (for FSDP's full sharding use DEEPSPEED with zero_stage 3)\n",
            path, dt);
    return -1;
  }
  if (*c->ds_file && !strcmp(dt, "NO")) { /* Accelerate reads deepspeed_config only for DEEPSPEED */
    fprintf(stderr,
            "ctuner launch: %s: distributed_type NO: deepspeed_config_file %s is ignored, as "
            "Accelerate "
            "does\n",
            path, c->ds_file);
    c->ds_file[0] = 0;
  }
  if (*c->ds_file && *c->ds_inline) {
    fprintf(stderr,
            "ctuner launch: %s: deepspeed_config_file %s and the inline DeepSpeed keys %s: "
            "Accelerate refuses "
            "both at once (the file would silently win); put them in the DeepSpeed file\n",
            path, c->ds_file, c->ds_inline);
    return -1;
  }
  if (*c->mixed_precision && strcmp(c->mixed_precision, "no") &&
      strcmp(c->mixed_precision, "bf16")) {
    fprintf(stderr,
            "ctuner launch: %s: mixed_precision %s: use no or bf16 (fp16 needs loss scaling ctuner "
            "does "
            "not do)\n",
            path, c->mixed_precision);
    return -1;
  }
  for (int i = 0; i < 2; i++) {
    const char *d = i ? c->offload_param : c->offload_opt;
    if (*d && strcmp(d, "none") && strcmp(d, "cpu") && strcmp(d, "nvme")) {
      fprintf(stderr, "ctuner launch: %s: %s %s: use none, cpu or nvme\n", path,
              i ? "offload_param_device" : "offload_optimizer_device", d);
      return -1;
    }
  }
  if (c->num_processes % c->num_machines) {
    fprintf(
        stderr,
        "ctuner launch: %s: num_processes %ld is not a multiple of num_machines %ld: every machine "
        "must run the same number of ranks (%ld / %ld leaves %ld over)\n",
        path, c->num_processes, c->num_machines, c->num_processes, c->num_machines,
        c->num_processes % c->num_machines);
    return -1;
  }
  if (c->machine_rank >= c->num_machines) {
    fprintf(stderr, "ctuner launch: %s: machine_rank %ld must be below num_machines %ld\n", path,
            c->machine_rank, c->num_machines);
    return -1;
  }
  return 0;
}

static int load_accelerate(const char *path, acc_cfg *c) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "ctuner launch: %s: cannot open: %s\n", path, strerror(errno));
    return -1;
  }
  memset(c, 0, sizeof *c);
  c->num_machines = 1;
  c->num_processes = 1;
  c->main_process_port = 29500;
  c->zero_stage = -1;
  c->grad_accum = -1;
  /* mixed_precision stays "" unless the file says: then the training config's own wins */
  snprintf(c->distributed_type, sizeof c->distributed_type, "NO");
  char buf[1024];
  int line = 0, in_ds = 0, rc = 0;
  while (!rc && fgets(buf, sizeof buf, f)) {
    line++;
    if (!strchr(buf, '\n') && !feof(f)) {
      fprintf(stderr, "ctuner launch: %s:%d: line longer than %zu bytes\n", path, line,
              sizeof buf - 1);
      rc = -1;
      break;
    }
    int indent = 0;
    while (buf[indent] == ' ') indent++;
    if (buf[indent] == '\t') {
      fprintf(stderr, "ctuner launch: %s:%d: tab indentation is not YAML; use spaces\n", path,
              line);
      rc = -1;
      break;
    }
    char *s = trim(buf);
    if (!*s || *s == '#' || !strcmp(s, "---")) continue;
    char *colon = strchr(s, ':');
    if (!colon) {
      fprintf(stderr, "ctuner launch: %s:%d: expected 'key: value', got '%s'\n", path, line, s);
      rc = -1;
      break;
    }
    *colon = 0;
    char *k = trim(s), *v = yaml_value(colon + 1);
    if (indent == 0) in_ds = !strcmp(k, "deepspeed_config") && !*v;
    if (indent > 0 && !in_ds)
      continue; /* nested maps ctuner does not read (fsdp_config, dynamo_config) */
    if (in_ds && indent > 0) {
      rc = ds_key(path, line, k, v, c);
      continue;
    }
    if (!strcmp(k, "num_machines"))
      rc = yaml_int(path, line, k, v, 1, 1 << 16, &c->num_machines);
    else if (!strcmp(k, "num_processes"))
      rc = yaml_int(path, line, k, v, 1, 1 << 20, &c->num_processes);
    else if (!strcmp(k, "machine_rank"))
      rc = yaml_int(path, line, k, v, 0, 1 << 16, &c->machine_rank);
    else if (!strcmp(k, "main_process_port")) /* null: one machine (accelerate config writes it) */
      rc = !*v || !strcmp(v, "null") || !strcmp(v, "~")
               ? 0
               : yaml_int(path, line, k, v, 1, 65535, &c->main_process_port);
    else if (!strcmp(k, "main_process_ip"))
      snprintf(c->main_process_ip, sizeof c->main_process_ip, "%s", v);
    else if (!strcmp(k, "mixed_precision"))
      snprintf(c->mixed_precision, sizeof c->mixed_precision, "%s", v);
    else if (!strcmp(k, "distributed_type"))
      snprintf(c->distributed_type, sizeof c->distributed_type, "%s", v);
  }
  fclose(f);
  if (rc) return rc;
  return check_accelerate(path, c);
}

static void print_quoted(const char *a) {
  int plain = *a != 0;
  for (const char *p = a; *p; p++)
    if (!isalnum((unsigned char)*p) && !strchr("-_./=:,+@%", *p)) plain = 0;
  if (plain) {
    fputs(a, stdout);
    return;
  }
  putchar('\'');
  for (const char *p = a; *p; p++) {
    if (*p == '\'')
      fputs("'\\''", stdout);
    else
      putchar(*p);
  }
  putchar('\'');
}

int ct_cmd_launch(int argc, char **argv) {
  const char *acc = NULL, *hostfile = NULL;
  int dry = 0, i = 1;
  for (; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_launch_help(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--dry-run")) {
      dry = 1;
    } else if (!strcmp(argv[i], "--")) {
      i++;
      break;
    } else if ((r = ct_cli_opt(argc, argv, &i, "accelerate-config", &acc)) ||
               (r = ct_cli_opt(argc, argv, &i, "hostfile", &hostfile))) {
      if (r < 0) return 2;
    } else {
      fprintf(stderr, "ctuner launch: unknown option '%s' (the command follows '--')\n", argv[i]);
      ct_cmd_launch_help(stderr);
      return 2;
    }
  }
  if (!acc) {
    fprintf(stderr, "ctuner launch: --accelerate-config FILE is required\n");
    ct_cmd_launch_help(stderr);
    return 2;
  }
  if (i >= argc || strcmp(argv[i], "train")) {
    fprintf(stderr, "ctuner launch: expected '-- train [options]' after the launch options\n");
    return 2;
  }
  acc_cfg c;
  if (load_accelerate(acc, &c)) return 2;
  if (c.machine_rank != 0) {
    fprintf(
        stderr,
        "ctuner launch: %s has machine_rank %ld: run ctuner launch once, on machine_rank 0 (%s); "
        "mpirun starts the ranks of every machine in the hostfile\n",
        acc, c.machine_rank, *c.main_process_ip ? c.main_process_ip : "main_process_ip");
    return 2;
  }
  if (c.num_machines > 1 && !hostfile) {
    fprintf(
        stderr,
        "ctuner launch: num_machines %ld needs --hostfile listing the machines, one per line as "
        "'HOST slots=%ld', %s first\n",
        c.num_machines, c.num_processes / c.num_machines,
        *c.main_process_ip ? c.main_process_ip : "main_process_ip");
    return 2;
  }
  if (hostfile && access(hostfile, R_OK)) {
    fprintf(stderr, "ctuner launch: --hostfile %s: %s\n", hostfile, strerror(errno));
    return 2;
  }
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    snprintf(self, sizeof self, "ctuner");
  else
    self[n] = 0;
  const long per = c.num_processes / c.num_machines;
  char np[32], ppr[64], zs[32], ga[64], dsf[1100];
  snprintf(dsf, sizeof dsf, "--deepspeed_config=%s", c.ds_file);
  snprintf(np, sizeof np, "%ld", c.num_processes);
  snprintf(ppr, sizeof ppr, "ppr:%ld:node", per);
  snprintf(zs, sizeof zs, "--zero_stage=%ld", c.zero_stage);
  snprintf(ga, sizeof ga, "--gradient_accumulation_steps=%ld", c.grad_accum);
  char **av = calloc((size_t)argc + 32, sizeof *av);
  if (!av) return 1;
  int k = 0;
  av[k++] = "mpirun";
  if (getuid() == 0) av[k++] = "--allow-run-as-root";
  av[k++] = "-np";
  av[k++] = np;
  av[k++] = "--map-by";
  av[k++] = ppr;
  if (hostfile) {
    av[k++] = "--hostfile";
    av[k++] = (char *)hostfile;
  } else {
    av[k++] = "--oversubscribe"; /* one machine: allow more ranks than cores */
  }
  if (c.num_machines > 1) { /* ranks talk over TCP between machines */
    av[k++] = "--mca";
    av[k++] = "btl";
    av[k++] = "tcp,self,vader";
  }
  av[k++] = self;
  av[k++] = argv[i]; /* "train" */
  /* what the Accelerate config says comes first, so the user's own options
   * after '--' win (ctuner train applies options in order) */
  if (c.zero_stage >= 0) av[k++] = zs;
  if (c.grad_accum > 0) av[k++] = ga;
  char mp[64], oo[64], op[64], np_[1100];
  if (*c.mixed_precision) { /* absent: the training config's own mixed_precision */
    snprintf(mp, sizeof mp, "--mixed_precision=%s", c.mixed_precision);
    av[k++] = mp;
  }
  char gc[96];
  if (*c.grad_clip) { /* DeepSpeed's gradient_clipping is the global-norm clip */
    snprintf(gc, sizeof gc, "--max_grad_norm=%s", c.grad_clip);
    av[k++] = gc;
  }
  if (*c.offload_opt) {
    snprintf(oo, sizeof oo, "--offload_optimizer=%s", c.offload_opt);
    av[k++] = oo;
  }
  if (*c.offload_param) {
    snprintf(op, sizeof op, "--offload_param=%s", c.offload_param);
    av[k++] = op;
  }
  if (*c.nvme_path) {
    snprintf(np_, sizeof np_, "--offload_param_path=%s", c.nvme_path);
    av[k++] = np_;
  }
  if (*c.ds_file) av[k++] = dsf;
  for (int j = i + 1; j < argc; j++) av[k++] = argv[j];
  av[k] = NULL;
  fprintf(stderr,
          "ctuner launch: %ld machine(s) x %ld process(es) = %ld ranks, distributed_type %s, "
          "zero_stage %s\n",
          c.num_machines, per, c.num_processes, c.distributed_type,
          c.zero_stage >= 0 ? zs + 13 : "from the config");
  if (dry) {
    for (int j = 0; j < k; j++) {
      if (j) putchar(' ');
      print_quoted(av[j]);
    }
    putchar('\n');
    free(av);
    return 0;
  }
  fflush(stdout);
  execvp("mpirun", av);
  fprintf(stderr, "ctuner launch: cannot run mpirun: %s (scripts/deps.sh installs openmpi-bin)\n",
          strerror(errno));
  free(av);
  return 1;
}
