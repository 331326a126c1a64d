/* Checkpoints: output_dir/checkpoint-<step>/ with model.safetensors (Flux
 * names), ema.safetensors, optimizer.safetensors, text_encoder.safetensors,
 * config.json and training_state.json, then .guard ("complete").
 *
 * Sharded optimizers (ZeRO on several ranks) write no optimizer.safetensors:
 * each rank writes zero/rank-R-of-N.safetensors with its part of every state
 * as fragments — tensor "<state>/<parameter name>" holding the parameter's
 * elements [start, start + length), start in the metadata under the same key —
 * and .guard follows only when every rank's file is durable. A loader of any
 * world size or stage reads the fragments that meet its range.
 *
 * Crash safety: everything is written into checkpoint-<step>-tmp, fsynced,
 * renamed to checkpoint-<step>, and only then is .guard written (temp file +
 * rename + directory fsync). A directory without a guard, or with the -tmp
 * suffix, is never taken as a checkpoint. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/optim.h"
#include "ctuner/safetensors.h"
#include "train/model.h"
#include "train_int.h"

long ct_checkpoint_step(const char *name) {
  if (strncmp(name, "checkpoint-", 11)) return -1;
  const char *p = name + 11;
  if (!*p) return -1;
  long v = 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9' || v > 100000000000L) return -1;
    v = v * 10 + (*p - '0');
  }
  return v;
}

static int guarded(const char *dir) {
  char p[4200], buf[16] = {0};
  if (ct_pathf(p, sizeof p, "%s/.guard", dir)) return 0;
  FILE *f = fopen(p, "rb");
  if (!f) return 0;
  size_t r = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[r] = 0;
  return !strncmp(buf, CT_CKPT_GUARD, strlen(CT_CKPT_GUARD));
}

ct_status ct_checkpoint_latest(const char *out, char *path, size_t n, long *step, ct_err *err) {
  DIR *d = opendir(out);
  if (!d) return ct_errf(err, CT_ERR_NOT_FOUND, "no checkpoints: cannot open %s", out);
  long best = -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    long s = ct_checkpoint_step(e->d_name);
    if (s < 0 || s <= best) continue;
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", out, e->d_name);
    struct stat lst;
    if (lstat(p, &lst) || !S_ISDIR(lst.st_mode)) { /* a link is not this run's checkpoint */
      CT_WARN("ignoring %s: not a directory (a symbolic link?)", p);
      continue;
    }
    if (!guarded(p)) {
      CT_WARN("ignoring %s: no .guard (an interrupted checkpoint write)", p);
      continue;
    }
    best = s;
  }
  closedir(d);
  if (best < 0) return ct_errf(err, CT_ERR_NOT_FOUND, "no complete checkpoint in %s", out);
  snprintf(path, n, "%s/checkpoint-%ld", out, best);
  if (step) *step = best;
  return CT_OK;
}

void ct_checkpoint_clean_tmp(const char *out) {
  DIR *d = opendir(out);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (strncmp(e->d_name, "checkpoint-", 11) || l < 4 || strcmp(e->d_name + l - 4, "-tmp"))
      continue;
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", out, e->d_name);
    ct_err err = {0};
    if (ct_rm_rf(p, &err))
      CT_WARN("cannot remove stale %s: %s", p, err.msg);
    else
      CT_INFO("removed stale %s (an interrupted checkpoint write)", p);
  }
  closedir(d);
}

static int cmp_long(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return (x > y) - (x < y);
}

/* Keep the newest `limit` checkpoints (guarded or not); never the one just written. */
static void rotate(const char *out, long limit, long keep) {
  if (limit <= 0) return;
  DIR *d = opendir(out);
  if (!d) return;
  long steps[4096];
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < 4096) {
    long s = ct_checkpoint_step(e->d_name);
    if (s >= 0) steps[n++] = s;
  }
  closedir(d);
  qsort(steps, n, sizeof *steps, cmp_long);
  for (size_t i = 0; i + (size_t)limit < n; i++) {
    if (steps[i] == keep) continue;
    char p[4200];
    snprintf(p, sizeof p, "%s/checkpoint-%ld", out, steps[i]);
    ct_err err = {0};
    if (ct_rm_rf(p, &err))
      CT_WARN("checkpoints_total_limit: cannot remove %s: %s", p, err.msg);
    else
      CT_INFO("checkpoints_total_limit=%ld: removed %s", limit, p);
  }
}

/* State i of the optimizer: its own array, or the caller's copy (offload). */
static float *state_of(const ct_ckpt_io *io, size_t i, const char **name) {
  float *p = ct_optim_state(io->opt, i, name);
  return io->opt_states ? io->opt_states[i] : p;
}

static ct_status save_optim(const char *path, const ct_ckpt_io *io, ct_err *err) {
  struct ct_optim *o = io->opt;
  ct_st_writer *w;
  if (ct_st_writer_new(&w)) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = ct_st_writer_meta(w, "optimizer", ct_optim_kind_name(ct_optim_get_kind(o)), err);
  if (!io->opt_states) ct_st_writer_set_reader(w, io->read); /* the optimizer's own: maybe device */
  int64_t shape[1] = {(int64_t)ct_optim_numel(o)};
  for (size_t i = 0; i < ct_optim_nstate(o) && !st; i++) {
    const char *name;
    float *s = state_of(io, i, &name);
    st = ct_st_writer_add_f32(w, name, 1, shape, s, CT_DTYPE_F32, err);
  }
  if (!st) st = ct_st_writer_write(w, path, err);
  ct_st_writer_free(w);
  return st;
}

/* [a, b) = parameter p's floats inside [lo, hi) of the flat buffer; 0 if none. */
static int meet(const ct_model_param *p, size_t lo, size_t hi, size_t *a, size_t *b) {
  *a = p->offset > lo ? p->offset : lo;
  *b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
  return *a < *b;
}

ct_status ct_checkpoint_write_fragments(const char *tmp, const ct_ckpt_io *io,
                                        const ct_train_state *s, int rank, int world, ct_err *err) {
  char p[4300], key[256], val[32];
  snprintf(p, sizeof p, "%s/" CT_CKPT_ZERO_DIR "/rank-%d-of-%d.safetensors", tmp, rank, world);
  ct_st_writer *w;
  if (ct_st_writer_new(&w)) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_status st = ct_st_writer_meta(w, "format", "ctuner-zero-fragments-1", err);
  struct ct_optim *o = io->opt; /* NULL: this rank's shard is empty; the file says so */
  /* the optimizer's kind, as optimizer.safetensors names it and loaders compare */
  if (!st)
    st = ct_st_writer_meta(w, "optimizer",
                           o ? ct_optim_kind_name(ct_optim_get_kind(o)) : s->optimizer, err);
  snprintf(val, sizeof val, "%d", world);
  if (!st) st = ct_st_writer_meta(w, "world", val, err);
  snprintf(val, sizeof val, "%d", rank);
  if (!st) st = ct_st_writer_meta(w, "rank", val, err);
  const size_t lo = io->opt_offset, hi = o ? lo + ct_optim_numel(o) : lo;
  const size_t np = io->model->ntab;
  const ct_model_param *tab = io->model->tab;
  for (size_t i = 0; o && i < ct_optim_nstate(o) && !st; i++) {
    const char *name;
    const float *data = state_of(io, i, &name);
    for (size_t k = 0; k < np && !st; k++) {
      size_t a, b;
      if (!meet(&tab[k], lo, hi, &a, &b)) continue;
      int64_t shape[1] = {(int64_t)(b - a)};
      snprintf(key, sizeof key, "%s/%s", name, tab[k].name);
      snprintf(val, sizeof val, "%zu", a - tab[k].offset);
      st = ct_st_writer_add_f32(w, key, 1, shape, data + (a - lo), CT_DTYPE_F32, err);
      if (!st) st = ct_st_writer_meta(w, key, val, err);
    }
  }
  if (!st) st = ct_st_writer_write(w, p, err);
  ct_st_writer_free(w);
  return st;
}

/* Every rank's fragments that meet this optimizer's range, into its states. */
static ct_status load_fragments(const char *dir, const ct_ckpt_io *io, ct_err *err) {
  struct ct_optim *o = io->opt;
  const size_t n = ct_optim_numel(o), lo = io->opt_offset, hi = lo + n;
  const size_t nst = ct_optim_nstate(o);
  const char *want = ct_optim_kind_name(ct_optim_get_kind(o));
  char p[4300];
  /* the world size of the writer: rank 0's file names it */
  int world = 0;
  DIR *d = NULL;
  snprintf(p, sizeof p, "%s/" CT_CKPT_ZERO_DIR, dir);
  if ((d = opendir(p))) {
    struct dirent *e;
    int r, wsz;
    char tail;
    while ((e = readdir(d)))
      if (sscanf(e->d_name, "rank-%d-of-%d.safetensor%c", &r, &wsz, &tail) == 3 && r == 0)
        world = wsz;
    closedir(d);
  }
  if (world < 1)
    return ct_errf(err, CT_ERR_IO, "%s: no rank-0-of-N.safetensors: the checkpoint is incomplete",
                   p);
  const size_t np = io->model->ntab;
  const ct_model_param *tab = io->model->tab;
  size_t want_floats = 0, a, b;
  for (size_t k = 0; k < np; k++)
    if (meet(&tab[k], lo, hi, &a, &b)) want_floats += b - a;
  size_t *got = calloc(nst ? nst : 1, sizeof *got);
  if (!got) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < nst; i++) {
    const char *name;
    memset(state_of(io, i, &name), 0, n * sizeof(float));
  }
  ct_status st = CT_OK;
  for (int r = 0; r < world && !st; r++) {
    snprintf(p, sizeof p, "%s/" CT_CKPT_ZERO_DIR "/rank-%d-of-%d.safetensors", dir, r, world);
    ct_st_file *f;
    st = ct_st_open(p, &f, err);
    if (st) {
      ct_err_prefix(err, "a sharded checkpoint needs every rank's fragments: ");
      break;
    }
    const char *kind = ct_st_meta(f, "optimizer");
    if (!kind || strcmp(kind, want))
      st = ct_errf(err, CT_ERR_INVALID,
                   "%s: optimizer state is for '%s' but the config says '%s'; resume with the same "
                   "optimizer or set resume_from_checkpoint to none",
                   p, kind ? kind : "?", want);
    for (size_t t = 0; t < f->ntensors && !st; t++) {
      const ct_st_tensor *x = &f->tensors[t];
      const char *slash = strchr(x->name, '/');
      const char *start = ct_st_meta(f, x->name);
      size_t si = nst;
      float *dst = NULL;
      for (size_t i = 0; slash && i < nst; i++) {
        const char *name;
        float *sd = state_of(io, i, &name);
        if (strlen(name) == (size_t)(slash - x->name) &&
            !strncmp(name, x->name, (size_t)(slash - x->name)))
          si = i, dst = sd;
      }
      const ct_model_param *prm = slash ? ct_model_find(io->model, slash + 1) : NULL;
      char *endp = NULL;
      unsigned long long s0 = start ? strtoull(start, &endp, 10) : 0;
      if (si == nst || !prm || !start || !endp || *endp || x->ndim != 1 || s0 > prm->numel ||
          x->numel > prm->numel - s0) {
        st = ct_errf(
            err, CT_ERR_INVALID,
            "%s: fragment '%s' does not fit this model and optimizer (state, parameter, start or "
            "length); was it written for another model?",
            p, x->name);
        break;
      }
      const size_t g0 = prm->offset + (size_t)s0, g1 = g0 + x->numel;
      const size_t c0 = g0 > lo ? g0 : lo, c1 = g1 < hi ? g1 : hi;
      if (c0 >= c1) continue;
      st = ct_st_to_f32_range(x, c0 - g0, c1 - c0, dst + (c0 - lo), err);
      got[si] += c1 - c0;
    }
    ct_st_close(f);
  }
  for (size_t i = 0; i < nst && !st; i++)
    if (got[i] != want_floats) {
      const char *name;
      state_of(io, i, &name);
      st = ct_errf(err, CT_ERR_INVALID,
                   "%s/" CT_CKPT_ZERO_DIR
                   ": the fragments of state '%s' cover %zu of the %zu floats this rank "
                   "needs; the checkpoint is incomplete or inconsistent",
                   dir, name, got[i], want_floats);
    }
  free(got);
  return st;
}

static ct_status load_optim(const char *path, const ct_ckpt_io *io, ct_err *err) {
  struct ct_optim *o = io->opt;
  ct_st_file *f;
  ct_status st = ct_st_open(path, &f, err);
  if (st) return st;
  const char *kind = ct_st_meta(f, "optimizer");
  const char *want = ct_optim_kind_name(ct_optim_get_kind(o));
  if (!kind || strcmp(kind, want))
    st = ct_errf(err, CT_ERR_INVALID,
                 "%s: optimizer state is for '%s' but the config says '%s'; resume with the same "
                 "optimizer or set resume_from_checkpoint to none",
                 path, kind ? kind : "?", want);
  /* the state of the whole model (a single process wrote it); this rank
   * reads its range [off, off + n) */
  const size_t n = ct_optim_numel(o), off = io->opt_offset;
  const size_t full = ct_model_numel(io->model);
  for (size_t i = 0; i < ct_optim_nstate(o) && !st; i++) {
    const char *name;
    float *s = state_of(io, i, &name);
    const ct_st_tensor *x = ct_st_find(f, name);
    if (!x || x->numel != full) {
      st = ct_errf(err, CT_ERR_SHAPE, "%s: state %s is %s", path, name,
                   x ? "of the wrong size" : "missing");
      break;
    }
    size_t have = off >= full ? 0 : (full - off < n ? full - off : n);
    st = ct_st_to_f32_range(x, off < full ? off : full, have, s, err);
    memset(s + have, 0, (n - have) * sizeof(float));
  }
  ct_st_close(f);
  return st;
}

static ct_status write_state(const char *path, const ct_train_state *s, ct_err *err) {
  char buf[2048];
  int n = snprintf(
      buf, sizeof buf,
      "{\n  \"global_step\": %ld,\n  \"optimizer_steps\": %ld,\n  \"epoch\": %ld,\n"
      "  \"epoch_step\": %ld,\n  \"samples_seen\": %ld,\n  \"nonfinite_run\": %ld,\n"
      "  \"nonfinite_total\": %ld,\n  \"last_loss\": %.17g,\n  \"config_digest\": \"%s\",\n"
      "  \"optimizer\": \"%s\",\n  \"rng\": {\"generator\": \"philox4x32-10\", \"sample_counter\": "
      "%ld},\n"
      "  \"exhausted_backends\": [],\n  \"repeats\": {}\n}\n",
      s->global_step, s->opt_steps, s->epoch, s->epoch_pos, s->samples_seen, s->nonfinite_run,
      s->nonfinite_total, s->last_loss, s->digest, s->optimizer, s->samples_seen);
  return ct_write_file_atomic(path, buf, (size_t)n, err);
}

static ct_status get_long(const ct_json *j, const char *k, long *out, const char *path,
                          ct_err *err) {
  const ct_json *v = ct_json_get(j, k);
  if (!v || v->type != CT_JSON_NUMBER || !v->is_int || v->i64 < 0)
    return ct_errf(err, CT_ERR_FORMAT, "%s: '%s' is missing or not a non-negative integer", path,
                   k);
  *out = (long)v->i64;
  return CT_OK;
}

static ct_status read_state(const char *path, ct_train_state *s, ct_err *err) {
  ct_json *j = NULL;
  ct_status st = ct_json_parse_file(path, 1 << 20, &j, err);
  if (st) return st;
  memset(s, 0, sizeof *s);
  if (j->type != CT_JSON_OBJECT) st = ct_errf(err, CT_ERR_FORMAT, "%s: not a JSON object", path);
  if (!st) st = get_long(j, "global_step", &s->global_step, path, err);
  if (!st) st = get_long(j, "optimizer_steps", &s->opt_steps, path, err);
  if (!st) st = get_long(j, "epoch", &s->epoch, path, err);
  if (!st) st = get_long(j, "epoch_step", &s->epoch_pos, path, err);
  if (!st) st = get_long(j, "samples_seen", &s->samples_seen, path, err);
  if (!st) st = get_long(j, "nonfinite_run", &s->nonfinite_run, path, err);
  if (!st) st = get_long(j, "nonfinite_total", &s->nonfinite_total, path, err);
  if (!st) {
    const ct_json *v = ct_json_get(j, "last_loss");
    if (v && v->type == CT_JSON_NUMBER) s->last_loss = v->num;
    v = ct_json_get(j, "config_digest");
    if (v && v->type == CT_JSON_STRING) snprintf(s->digest, sizeof s->digest, "%s", v->str);
    v = ct_json_get(j, "optimizer");
    if (v && v->type == CT_JSON_STRING) snprintf(s->optimizer, sizeof s->optimizer, "%s", v->str);
  }
  ct_json_free(j);
  return st;
}

/* Test hook (docs/testing.md): die by SIGKILL in the middle of writing the
 * checkpoint of this step, to prove that a crash leaves nothing that looks valid. */
static void fault_kill(long step) {
  const char *e = getenv("CTUNER_FAULT_KILL_AT_CHECKPOINT");
  if (e && atol(e) == step) raise(SIGKILL);
}

ct_status ct_checkpoint_prepare(const char *out, long step, char *tmp, size_t n, ct_err *err) {
  char dst[4096];
  if (ct_pathf(dst, sizeof dst, "%s/checkpoint-%ld", out, step) || ct_pathf(tmp, n, "%s-tmp", dst))
    return ct_errf(err, CT_ERR_RANGE, "output_dir path is too long: %s", out);
  ct_status st = ct_rm_rf(tmp, err);
  if (!st) st = ct_mkdir_p(tmp, err);
  char z[4200];
  snprintf(z, sizeof z, "%s/" CT_CKPT_ZERO_DIR, tmp);
  if (!st) st = ct_mkdir_p(z, err);
  return st;
}

ct_status ct_checkpoint_write_main(const char *tmp, const ct_ckpt_io *io, const ct_train_state *s,
                                   int fragments, ct_err *err) {
  char p[4200];
  ct_status st = io->model->ops->save(io->model, tmp, err);
  if (!st) fault_kill(s->global_step);
  if (!st && io->ema) {
    snprintf(p, sizeof p, "%s/ema.safetensors", tmp);
    st = ct_model_save_flat_read(io->model, p, io->ema, io->read, err);
  }
  if (!st && io->opt && !fragments) {
    snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp);
    st = save_optim(p, io, err);
  }
  if (!st && !fragments) { /* a single process: no fragment directory */
    snprintf(p, sizeof p, "%s/" CT_CKPT_ZERO_DIR, tmp);
    rmdir(p);
  }
  if (!st && io->extra) st = io->extra(io->extra_user, tmp, err); /* the task's own files */
  if (!st) {
    char *cj = ct_config_to_json(io->cfg);
    snprintf(p, sizeof p, "%s/config.json", tmp);
    st = cj ? ct_write_file_atomic(p, cj, strlen(cj), err)
            : ct_errf(err, CT_ERR_NOMEM, "out of memory");
    free(cj);
  }
  if (!st) {
    snprintf(p, sizeof p, "%s/training_state.json", tmp);
    st = write_state(p, s, err);
    if (!st && io->sampler_json) {
      snprintf(p, sizeof p, "%s/sampler_state.json", tmp);
      st = ct_write_file_atomic(p, io->sampler_json, strlen(io->sampler_json), err);
    }
  }
  return st;
}

ct_status ct_checkpoint_commit(const char *out, const char *tmp, long step, long limit, char *path,
                               size_t pn, ct_err *err) {
  char dst[4096], p[4200];
  snprintf(dst, sizeof dst, "%s/checkpoint-%ld", out, step);
  ct_status st = ct_fsync_dir(tmp, err);
  snprintf(p, sizeof p, "%s/" CT_CKPT_ZERO_DIR, tmp);
  struct stat sb;
  if (!st && stat(p, &sb) == 0) st = ct_fsync_dir(p, err);
  /* Re-saving a step (after a resume) replaces the old directory. */
  if (!st) st = ct_rm_rf(dst, err);
  if (!st && rename(tmp, dst) != 0)
    st = ct_errf(err, CT_ERR_IO, "cannot rename %s to %s: %s", tmp, dst, strerror(errno));
  if (!st) st = ct_fsync_dir(out, err);
  if (!st) {
    snprintf(p, sizeof p, "%s/.guard", dst);
    st = ct_write_file_atomic(p, CT_CKPT_GUARD, strlen(CT_CKPT_GUARD), err);
  }
  if (st) {
    ct_err_prefix(err, "writing checkpoint %s: ", dst);
    return st;
  }
  if (path) snprintf(path, pn, "%s", dst);
  rotate(out, limit, step);
  return CT_OK;
}

ct_status ct_checkpoint_save(const char *out, const ct_ckpt_io *io, const ct_train_state *s,
                             long limit, char *path, size_t pn, ct_err *err) {
  char tmp[4096];
  ct_status st = ct_checkpoint_prepare(out, s->global_step, tmp, sizeof tmp, err);
  if (!st) st = ct_checkpoint_write_main(tmp, io, s, 0, err);
  if (st) {
    ct_err_prefix(err, "writing checkpoint %s: ", tmp);
    return st;
  }
  return ct_checkpoint_commit(out, tmp, s->global_step, limit, path, pn, err);
}

ct_status ct_checkpoint_load(const char *dir, const ct_ckpt_io *io, ct_train_state *s,
                             ct_err *err) {
  char p[4200];
  if (!guarded(dir))
    return ct_errf(
        err, CT_ERR_INVALID,
        "%s is not a complete checkpoint (no .guard); it was interrupted while being written", dir);
  snprintf(p, sizeof p, "%s/training_state.json", dir);
  ct_status st = read_state(p, s, err);
  if (!st && io->sampler_out) {
    size_t sn;
    ct_err se = {0};
    *io->sampler_out = NULL;
    snprintf(p, sizeof p, "%s/sampler_state.json", dir);
    ct_status ss = ct_read_file(p, 16 << 20, io->sampler_out, &sn, &se);
    if (ss && ss != CT_ERR_NOT_FOUND) st = ct_errf(err, ss, "%s", se.msg);
  }
  if (!st) st = io->model->ops->load(io->model, dir, io->w_lo, io->w_hi, io->w_shard, err);
  if (!st && io->ema_out) {
    const size_t lo = io->w_shard ? io->w_lo : 0,
                 hi = io->w_shard ? io->w_hi : ct_model_numel(io->model);
    snprintf(p, sizeof p, "%s/ema.safetensors", dir);
    if (access(p, R_OK) == 0) {
      st = ct_model_load_flat(io->model, p, lo, hi, io->ema_out, err);
    } else {
      CT_WARN("%s has no ema.safetensors; the EMA starts from the loaded weights", dir);
      memcpy(io->ema_out, io->w_shard ? io->w_shard : ct_model_params(io->model),
             (hi - lo) * sizeof(float));
    }
  }
  if (!st && io->opt) {
    struct stat sb;
    snprintf(p, sizeof p, "%s/" CT_CKPT_ZERO_DIR, dir);
    if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
      st = load_fragments(dir, io, err);
    } else {
      snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
      st = load_optim(p, io, err);
    }
  }
  return st;
}
