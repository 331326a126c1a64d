/* The Accelerate config of `ctuner launch` (accel.h): the YAML document (read
 * by ct_yaml_parse, YAML 1.1 as Accelerate's PyYAML reads it) walked key by
 * key against Accelerate's ClusterConfig.
 *
 * Every key Accelerate knows has a row in `keys` below saying what it means
 * here: read (machines, processes, precision, the DeepSpeed plugin keys),
 * accepted because it asks for what ctuner does anyway (use_cpu, rdzv_backend
 * static, zero3_init_flag), a warning naming it and why it changes nothing
 * (debug, torch.compile, TPU settings, ...; only when its value asks for
 * something), or refused (FSDP, fp16/fp8, SageMaker, tensor/context
 * parallelism). Keys Accelerate does not know are refused all at once, as
 * Accelerate refuses them. Messages are "FILE:LINE: key: ...".
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/accel.h"
#include "ctuner/yaml.h"

typedef struct rd {
  const char *path;
  ct_accel *c;
  const ct_json *ds; /* deepspeed_config map, or NULL */
  char unknown[512]; /* keys Accelerate does not know */
  char ds_keys[256]; /* deepspeed_config keys read (for the "ignored" note) */
} rd;

/* A scalar's text as written ("" for null); NULL for a map or list. */
static const char *text(const ct_json *v) {
  if (v->type == CT_JSON_ARRAY || v->type == CT_JSON_OBJECT) return NULL;
  return v->str ? v->str : "";
}

/* Asks for nothing: null, false, 0, "", "no"/"none"/"false", an empty map or list. */
static int is_off(const ct_json *v) {
  switch (v->type) {
    case CT_JSON_NULL:
      return 1;
    case CT_JSON_BOOL:
      return !v->boolean;
    case CT_JSON_NUMBER:
      return v->num == 0;
    case CT_JSON_ARRAY:
    case CT_JSON_OBJECT:
      return v->n == 0;
    case CT_JSON_STRING:
      return !*v->str || !strcasecmp(v->str, "no") || !strcasecmp(v->str, "none") ||
             !strcasecmp(v->str, "false");
  }
  return 0;
}

static int refuse(rd *r, const ct_json *v, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(rd *r, const ct_json *v, const char *fmt, ...) {
  va_list ap;
  if (v)
    fprintf(stderr, "ctuner launch: %s:%d: ", r->path, v->line);
  else
    fprintf(stderr, "ctuner launch: %s: ", r->path);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return -1;
}

/* The one warning of a key that changes nothing here. */
static int noeffect(rd *r, const char *key, const ct_json *v, const char *why) {
  const char *t = text(v);
  fprintf(stderr, "ctuner launch: %s:%d: warning: %s%s%s has no effect here: %s\n", r->path,
          v->line, key, t ? " " : "", t ? t : "", why);
  return 0;
}

/* An integer: a YAML int, or a quoted one ('2'), which Accelerate passes on as text and its
 * readers turn into a number. */
static int get_int(rd *r, const char *key, const ct_json *v, long lo, long hi, long *out) {
  long x = 0;
  int ok = v->type == CT_JSON_NUMBER && v->is_int;
  if (ok) x = (long)v->i64;
  if (v->type == CT_JSON_STRING && *v->str) {
    char *end;
    errno = 0;
    x = strtol(v->str, &end, 10);
    ok = !errno && !*end;
  }
  if (!ok || x < lo || x > hi)
    return refuse(r, v, "%s: expected an integer in [%ld, %ld], got '%s'", key, lo, hi,
                  text(v) ? text(v) : "a map or list");
  *out = x;
  return 0;
}

/* The shortest decimal that reads back as x (0.01, not 0.01000000000000000021). */
static void fmt_num(double x, char *buf, size_t n) {
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, n, "%.*g", p, x);
    if (strtod(buf, NULL) == x) return;
  }
}

/* A scalar into buf; booleans and numbers as written (`distributed_type: NO`
 * unquoted is YAML 1.1's false, and plainly means "NO"). */
static int get_str(rd *r, const char *key, const ct_json *v, char *buf, size_t n) {
  const char *t = text(v);
  if (!t) return refuse(r, v, "%s: expected a value, got a map or list", key);
  if (strlen(t) >= n) return refuse(r, v, "%s: value longer than %zu bytes", key, n - 1);
  snprintf(buf, n, "%s", t);
  return 0;
}

static void add_name(char *list, size_t n, const char *name) {
  const size_t l = strlen(list);
  snprintf(list + l, n - l, "%s%s", l ? ", " : "", name);
}

/* ---- deepspeed_config ---- */

static int ds_key(rd *r, const char *k, const ct_json *v) {
  ct_accel *c = r->c;
  static const char *const with_file[] = {
      "gradient_accumulation_steps", "gradient_clipping",      "zero_stage",
      "offload_optimizer_device",    "offload_param_device",   "offload_param_nvme_path",
      "offload_optimizer_nvme_path", "zero3_save_16bit_model", NULL};
  for (int q = 0; with_file[q]; q++)
    if (!strcmp(k, with_file[q])) add_name(c->ds_inline, sizeof c->ds_inline, k);
  if (!strcmp(k, "gradient_clipping")) { /* a number, or a quoted one (Accelerate passes text on) */
    char *end = NULL;
    const double g = v->type == CT_JSON_NUMBER   ? v->num
                     : v->type == CT_JSON_STRING ? strtod(v->str, &end)
                                                 : -1;
    if (!(g >= 0) || g == HUGE_VAL || (end && (end == v->str || *end)))
      return refuse(r, v, "gradient_clipping: expected a number >= 0, got '%s'",
                    text(v) ? text(v) : "a map or list");
    fmt_num(g, c->grad_clip, sizeof c->grad_clip);
    return 0;
  }
  if (!strcmp(k, "zero_stage")) return get_int(r, k, v, 0, 3, &c->zero_stage);
  if (!strcmp(k, "gradient_accumulation_steps"))
    return get_int(r, k, v, 1, 1 << 20, &c->grad_accum);
  if (!strcmp(k, "offload_optimizer_device"))
    return get_str(r, k, v, c->offload_opt, sizeof c->offload_opt);
  if (!strcmp(k, "offload_param_device"))
    return get_str(r, k, v, c->offload_param, sizeof c->offload_param);
  if (!strcmp(k, "offload_optimizer_nvme_path") || !strcmp(k, "offload_param_nvme_path"))
    return is_off(v) ? 0 : get_str(r, k, v, c->nvme_path, sizeof c->nvme_path);
  if (!strcmp(k, "deepspeed_config_file"))
    return is_off(v) ? 0 : get_str(r, k, v, c->ds_file, sizeof c->ds_file);
  if (!strcmp(k, "deepspeed_hostfile")) {
    if (is_off(v) || c->hostfile_key) return 0;
    c->hostfile_key = "deepspeed_config.deepspeed_hostfile"; /* "HOST slots=N", as Open MPI's */
    return get_str(r, k, v, c->hostfile, sizeof c->hostfile);
  }
  if (!strcmp(k, "zero3_init_flag"))
    return 0; /* ctuner's stage 3 always initialises each rank's shard only */
  if (!strcmp(k, "zero3_save_16bit_model"))
    return is_off(v) ? 0
                     : noeffect(r, k, v,
                                "ctuner saves the whole model (float32 model.safetensors) at "
                                "every stage");
  if (!strcmp(k, "deepspeed_multinode_launcher")) {
    const char *t = text(v);
    return !t || is_off(v) || !strcmp(t, "standard") || !strcmp(t, "openmpi")
               ? 0
               : noeffect(r, k, v,
                          "ctuner launch always starts the ranks with Open MPI's mpirun (or srun, "
                          "--launcher srun)");
  }
  if (!strcmp(k, "deepspeed_inclusion_filter") || !strcmp(k, "deepspeed_exclusion_filter"))
    return is_off(v)
               ? 0
               : refuse(r, v, "%s: not supported; list exactly the machines to use in the hostfile",
                        k);
  if (!strcmp(k, "deepspeed_moe_layer_cls_names"))
    return is_off(v) ? 0 : noeffect(r, k, v, "the MMDiT has no mixture-of-experts layers");
  fprintf(stderr,
          "ctuner launch: %s:%d: warning: deepspeed_config.%s is not a key Accelerate reads; "
          "ignored\n",
          r->path, v->line, k);
  return 0;
}

static int read_ds(rd *r) {
  int rc = 0;
  if (r->ds->type != CT_JSON_OBJECT)
    return r->ds->type == CT_JSON_NULL ? 0 : refuse(r, r->ds, "deepspeed_config: expected a map");
  for (size_t i = 0; i < r->ds->n && !rc; i++) rc = ds_key(r, r->ds->keys[i], &r->ds->items[i]);
  return rc;
}

/* ---- top-level keys ---- */

typedef int (*key_fn)(rd *r, const char *k, const ct_json *v);

static int k_compute_env(rd *r, const char *k, const ct_json *v) {
  const char *t = text(v);
  if (t && (!*t || !strcmp(t, "LOCAL_MACHINE"))) return 0;
  if (t && !strcmp(t, "AMAZON_SAGEMAKER"))
    return refuse(r, v,
                  "compute_environment AMAZON_SAGEMAKER: SageMaker jobs are started by Accelerate "
                  "itself; run ctuner launch on the machines (compute_environment: LOCAL_MACHINE)");
  return refuse(r, v, "compute_environment %s: use LOCAL_MACHINE", t ? t : "(a map)");
}
static int k_dist(rd *r, const char *k, const ct_json *v) {
  return get_str(r, k, v, r->c->distributed_type, sizeof r->c->distributed_type);
}
static int k_nproc(rd *r, const char *k, const ct_json *v) {
  return v->type == CT_JSON_NULL || (v->is_int && v->i64 == -1)
             ? 0
             : get_int(r, k, v, 1, 1 << 20, &r->c->num_processes);
}
static int k_nmach(rd *r, const char *k, const ct_json *v) {
  return get_int(r, k, v, 1, 1 << 16, &r->c->num_machines);
}
static int k_mrank(rd *r, const char *k, const ct_json *v) {
  return get_int(r, k, v, 0, 1 << 16, &r->c->machine_rank);
}
static int k_ip(rd *r, const char *k, const ct_json *v) {
  return v->type == CT_JSON_NULL
             ? 0
             : get_str(r, k, v, r->c->main_process_ip, sizeof r->c->main_process_ip);
}
static int k_port(rd *r, const char *k,
                  const ct_json *v) { /* null: what `accelerate config` writes for one machine */
  return v->type == CT_JSON_NULL ? 0 : get_int(r, k, v, 1, 65535, &r->c->main_process_port);
}
static int k_mp(rd *r, const char *k, const ct_json *v) {
  return v->type == CT_JSON_NULL
             ? 0
             : get_str(r, k, v, r->c->mixed_precision, sizeof r->c->mixed_precision);
}
static int k_fp16(rd *r, const char *k,
                  const ct_json *v) { /* Accelerate's old spelling of mixed_precision: fp16 */
  if (!is_off(v) && !*r->c->mixed_precision)
    snprintf(r->c->mixed_precision, sizeof r->c->mixed_precision, "fp16");
  return 0;
}
static int k_same(rd *r, const char *k, const ct_json *v) {
  if (v->type == CT_JSON_NULL) return 0;
  if (v->type != CT_JSON_BOOL)
    return refuse(r, v, "same_network: expected true or false, got '%s'",
                  text(v) ? text(v) : "a map");
  r->c->same_network = v->boolean;
  return 0;
}
static int k_rdzv(rd *r, const char *k, const ct_json *v) {
  const char *t = text(v);
  return is_off(v) || (t && !strcmp(t, "static"))
             ? 0
             : noeffect(r, k, v,
                        "mpirun gives every rank its place up front (a static rendezvous); elastic "
                        "rendezvous is torchrun's");
}
static int k_ignore(rd *r, const char *k, const ct_json *v) {
  return 0;
}
static int k_gpu_ids(rd *r, const char *k, const ct_json *v) {
  const char *t = text(v);
  return is_off(v) || (t && !strcmp(t, "all")) ? 0
                                               : noeffect(r, k, v, "ctuner computes on CPU cores");
}
static int k_main_fn(rd *r, const char *k, const ct_json *v) {
  const char *t = text(v);
  return is_off(v) || (t && !strcmp(t, "main"))
             ? 0
             : noeffect(r, k, v,
                        "it names a Python function for Accelerate's notebook and TPU launches");
}
static int k_flag(rd *r, const char *k,
                  const ct_json *v) { /* no effect when it asks for something */
  static const struct {
    const char *key, *why;
  } why[] = {
      {"debug",
       "Accelerate's debug mode checks collective shapes; ctuner's collectives are fixed by its "
       "code"},
      {"enable_cpu_affinity", "mpirun already binds each rank to its own cores"},
      {"downcast_bf16", "it is for TPUs"},
      {"ipex_config", "it configures Intel's extension for PyTorch"},
      {"tpu_name", "TPU pod settings are for accelerate tpu-config"},
  };
  if (is_off(v)) return 0;
  const char *w = "TPU pod settings are for accelerate tpu-config";
  for (size_t i = 0; i < sizeof why / sizeof *why; i++)
    if (!strcmp(k, why[i].key)) w = why[i].why;
  if (!strcmp(k, "ipex_config") && v->type == CT_JSON_OBJECT) {
    const ct_json *x = ct_json_get(v, "ipex");
    if (!x || is_off(x)) return 0;
  }
  return noeffect(r, k, v, w);
}
static int k_dynamo(rd *r, const char *k, const ct_json *v) {
  const ct_json *b = v->type == CT_JSON_OBJECT ? ct_json_get(v, "dynamo_backend") : v;
  if (!b || is_off(b)) return 0; /* includes `dynamo_backend: NO` (YAML 1.1 reads it as false) */
  return noeffect(r, v->type == CT_JSON_OBJECT ? "dynamo_config.dynamo_backend" : k, b,
                  "torch.compile has no counterpart; ctuner's kernels are compiled C");
}
static int k_mpirun(rd *r, const char *k, const ct_json *v) {
  if (v->type != CT_JSON_OBJECT)
    return is_off(v) ? 0 : refuse(r, v, "mpirun_config: expected a map");
  const ct_json *h = ct_json_get(v, "mpirun_hostfile"), *ccl = ct_json_get(v, "mpirun_ccl");
  if (ccl && !is_off(ccl) && !(text(ccl) && !strcmp(text(ccl), "0")))
    noeffect(r, "mpirun_config.mpirun_ccl", ccl,
             "it sets oneCCL's worker count; ctuner's collectives are Open MPI's");
  if (!h || is_off(h)) return 0;
  r->c->hostfile_key = "mpirun_config.mpirun_hostfile";
  return get_str(r, k, h, r->c->hostfile, sizeof r->c->hostfile);
}
static int k_parallelism(rd *r, const char *k, const ct_json *v) {
  if (v->type != CT_JSON_OBJECT)
    return is_off(v) ? 0 : refuse(r, v, "parallelism_config: expected a map");
  for (size_t i = 0; i < v->n; i++) {
    const ct_json *x = &v->items[i];
    if (strstr(v->keys[i], "dp_replicate")) continue; /* plain data parallel */
    if (x->type == CT_JSON_NUMBER && x->num > 1)
      return refuse(r, x,
                    "parallelism_config.%s %s: ctuner splits work over ranks by data only (data "
                    "parallel and ZeRO); tensor, context and FSDP sharding are not supported",
                    v->keys[i], text(x));
  }
  return 0;
}
static int k_other_plugin(rd *r, const char *k, const ct_json *v) { /* fsdp, megatron_lm, tp, fp8 */
  const char *dt = r->c->distributed_type;
  if (is_off(v)) return 0;
  if ((!strcmp(k, "fsdp_config") && !strcmp(dt, "FSDP")) ||
      (!strcmp(k, "megatron_lm_config") && !strcmp(dt, "MEGATRON_LM")) ||
      (!strcmp(k, "fp8_config") && !strcmp(r->c->mixed_precision, "fp8")))
    return 0; /* read by what is refused below (distributed_type, mixed_precision) */
  if (!strcmp(k, "tp_config") && v->type == CT_JSON_OBJECT) {
    const ct_json *tp = ct_json_get(v, "tp_size");
    if (tp && tp->type == CT_JSON_NUMBER && tp->num > 1)
      return refuse(r, tp,
                    "tp_config.tp_size %s: tensor parallelism is not supported; ctuner "
                    "splits work over ranks by data only",
                    text(tp));
  }
  fprintf(stderr,
          "ctuner launch: %s:%d: warning: %s is ignored, as Accelerate ignores it with "
          "distributed_type %s%s\n",
          r->path, v->line, k, dt, !strcmp(k, "fp8_config") ? " and no fp8 mixed precision" : "");
  return 0;
}

/* Every key of Accelerate's ClusterConfig (and the two old spellings its
 * process_config converts). `late` ones are read after the others, when
 * distributed_type and mixed_precision are known. */
static const struct {
  const char *name;
  key_fn fn;
  int late;
} keys[] = {
    {"compute_environment", k_compute_env, 0},
    {"distributed_type", k_dist, 0},
    {"num_processes", k_nproc, 0},
    {"num_machines", k_nmach, 0},
    {"machine_rank", k_mrank, 0},
    {"main_process_ip", k_ip, 0},
    {"main_process_port", k_port, 0},
    {"mixed_precision", k_mp, 0},
    {"fp16", k_fp16, 1},
    {"same_network", k_same, 0},
    {"rdzv_backend", k_rdzv, 0},
    {"use_cpu", k_ignore, 0}, /* ctuner computes on CPUs either way */
    {"gpu_ids", k_gpu_ids, 0},
    {"main_training_function", k_main_fn, 0},
    {"debug", k_flag, 0},
    {"enable_cpu_affinity", k_flag, 0},
    {"downcast_bf16", k_flag, 0},
    {"ipex_config", k_flag, 0},
    {"tpu_name", k_flag, 0},
    {"tpu_zone", k_flag, 0},
    {"tpu_use_cluster", k_flag, 0},
    {"tpu_use_sudo", k_flag, 0},
    {"command_file", k_flag, 0},
    {"commands", k_flag, 0},
    {"tpu_vm", k_flag, 0},
    {"tpu_env", k_flag, 0},
    {"dynamo_config", k_dynamo, 0},
    {"dynamo_backend", k_dynamo, 0},
    {"mpirun_config", k_mpirun, 0},
    {"parallelism_config", k_parallelism, 0},
    {"fsdp_config", k_other_plugin, 1},
    {"megatron_lm_config", k_other_plugin, 1},
    {"tp_config", k_other_plugin, 1},
    {"fp8_config", k_other_plugin, 1},
    {"deepspeed_config", k_ignore, 0}, /* read_ds, after the checks of distributed_type */
};

/* What ctuner cannot do with the config, named; 0 or -1. */
static int check(rd *r, const ct_json *root) {
  ct_accel *c = r->c;
  const char *dt = c->distributed_type;
  const ct_json *at_dt = ct_json_get(root, "distributed_type");
  static const char *const dp[] = {"NO",         "MULTI_CPU", "MULTI_GPU", "DEEPSPEED",
                                   "MULTI_XPU",  "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA",
                                   "MULTI_MUSA", "MULTI_HPU"};
  int known = 0;
  for (size_t i = 0; i < sizeof dp / sizeof *dp; i++) known |= !strcmp(dt, dp[i]);
  if (!known)
    return refuse(r, at_dt,
                  "distributed_type %s is not supported; use MULTI_GPU, MULTI_CPU, DEEPSPEED or NO "
                  "(for FSDP's full sharding use DEEPSPEED with zero_stage 3)",
                  dt);
  const ct_json *at_mp = ct_json_get(root, "mixed_precision");
  if (*c->mixed_precision && strcmp(c->mixed_precision, "no") && strcmp(c->mixed_precision, "bf16"))
    return refuse(r, at_mp ? at_mp : ct_json_get(root, "fp16"),
                  "mixed_precision %s: use no or bf16 (%s)", c->mixed_precision,
                  !strcmp(c->mixed_precision, "fp8")
                      ? "ctuner has no fp8 kernels"
                      : "fp16 needs loss scaling ctuner does not do");
  for (int i = 0; i < 2; i++) {
    const char *d = i ? c->offload_param : c->offload_opt;
    if (*d && strcmp(d, "none") && strcmp(d, "cpu") && strcmp(d, "nvme"))
      return refuse(r, r->ds, "%s %s: use none, cpu or nvme",
                    i ? "offload_param_device" : "offload_optimizer_device", d);
  }
  if (c->num_processes % c->num_machines)
    return refuse(r, ct_json_get(root, "num_processes"),
                  "num_processes %ld is not a multiple of num_machines %ld: every machine must run "
                  "the same number of ranks (%ld / %ld leaves %ld over)",
                  c->num_processes, c->num_machines, c->num_processes, c->num_machines,
                  c->num_processes % c->num_machines);
  if (c->machine_rank >= c->num_machines)
    return refuse(r, ct_json_get(root, "machine_rank"),
                  "machine_rank %ld must be below num_machines %ld", c->machine_rank,
                  c->num_machines);
  return 0;
}

/* deepspeed_config: read for DEEPSPEED, ignored with a note otherwise (as Accelerate). */
static int deepspeed(rd *r) {
  ct_accel *c = r->c;
  if (!r->ds || is_off(r->ds)) return 0;
  if (strcmp(c->distributed_type, "DEEPSPEED")) {
    const ct_json *f =
        r->ds->type == CT_JSON_OBJECT ? ct_json_get(r->ds, "deepspeed_config_file") : NULL;
    if (f && !is_off(f))
      fprintf(stderr,
              "ctuner launch: %s:%d: distributed_type %s: deepspeed_config_file %s is ignored, as "
              "Accelerate does (it reads deepspeed_config only for DEEPSPEED)\n",
              r->path, f->line, c->distributed_type, text(f) ? text(f) : "");
    else
      fprintf(stderr,
              "ctuner launch: %s:%d: distributed_type %s: deepspeed_config is ignored, as "
              "Accelerate does (it reads it only for DEEPSPEED)\n",
              r->path, r->ds->line, c->distributed_type);
    return 0;
  }
  if (read_ds(r)) return -1;
  if (*c->ds_file && *c->ds_inline)
    return refuse(r, r->ds,
                  "deepspeed_config_file %s and the inline DeepSpeed keys %s: Accelerate refuses "
                  "both at once (the file would silently win); put them in the DeepSpeed file",
                  c->ds_file, c->ds_inline);
  return 0;
}

static int walk(rd *r, const ct_json *root) {
  for (int late = 0; late < 2; late++)
    for (size_t i = 0; i < root->n; i++) {
      const char *k = root->keys[i];
      size_t q = 0;
      while (q < sizeof keys / sizeof *keys && strcmp(keys[q].name, k)) q++;
      if (q == sizeof keys / sizeof *keys) {
        if (!late) add_name(r->unknown, sizeof r->unknown, k);
        continue;
      }
      if (keys[q].late == late && keys[q].fn(r, k, &root->items[i])) return -1;
    }
  return 0;
}

int ct_accel_load(const char *path, ct_accel *c) {
  ct_json *root = NULL;
  ct_err e = {0};
  int rc = -1;
  rd r = {.path = path, .c = c};
  memset(c, 0, sizeof *c);
  c->num_machines = 1;
  c->num_processes = 1;
  c->main_process_port = -1;
  c->same_network = -1;
  c->zero_stage = -1;
  c->grad_accum = -1;
  if (ct_yaml_parse_file(path, 1 << 20, &root, &e)) {
    fprintf(stderr, "ctuner launch: %s\n", e.msg);
    goto out;
  }
  if (root->type != CT_JSON_OBJECT) {
    refuse(&r, root, "expected a map of Accelerate settings (key: value), got %s",
           root->type == CT_JSON_NULL ? "an empty document" : ct_json_type_name(root->type));
    goto out;
  }
  r.ds = ct_json_get(root, "deepspeed_config");
  if (walk(&r, root)) goto out;
  if (*r.unknown) {
    refuse(&r, NULL,
           "unknown keys: %s; Accelerate refuses them too (a newer Accelerate's keys, or a typo: "
           "fix or remove them)",
           r.unknown);
    goto out;
  }
  if (!ct_json_get(root, "distributed_type")) {
    refuse(&r, NULL,
           "distributed_type is missing; Accelerate requires it (NO, MULTI_CPU, MULTI_GPU or "
           "DEEPSPEED)");
    goto out;
  }
  if (deepspeed(&r) || check(&r, root)) goto out;
  if (!ct_json_get(root, "num_processes") && strcmp(c->distributed_type, "NO"))
    fprintf(stderr,
            "ctuner launch: %s: warning: num_processes is not given: 1 process (Accelerate would "
            "start one per GPU; ctuner has none to count)\n",
            path);
  rc = 0;
out:
  ct_json_free(root);
  return rc;
}
