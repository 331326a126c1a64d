/* sampler.c: which samples each optimizer step takes, and the position.
 *
 * Plain data in, plain data out (sampler.h has the rules): bucket sizes and
 * names, a seed and the batch shape make a sampler; ct_sampler_next draws a
 * step's bucket, ct_sampler_select gives a rank's micro-batch of it. The
 * position (epoch, steps drawn, entries consumed per bucket, samples seen) is
 * all the state there is (sampler_state.json in checkpoints), so a sampler
 * restored from it continues with exactly the selections the uninterrupted
 * one makes. No I/O, no threads: the dataset's prefetch thread drives it.
 */
#include "data/sampler.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/hash.h"
#include "ctuner/json.h"
#include "ctuner/rng.h"

#define STREAM_PERM 0x5045524d00000000ull
#define STREAM_DSPICK 0x4453504b00000000ull
#define STREAM_BUCKET 0x424b504b00000000ull

/* ---------------------------------------------------------------- setup */

static ct_status add_set(ct_sampler *s, const ct_sampler_set *in, ct_err *err) {
  const int k = s->nsets;
  if (!in->id) return ct_errf(err, CT_ERR_INVALID, "sampler: set %d has no id", k);
  for (int j = 0; j < k; j++)
    if (!strcmp(s->sets[j].id, in->id))
      return ct_errf(err, CT_ERR_INVALID, "sampler: two sets are called '%s'", in->id);
  if (!(in->probability > 0))
    return ct_errf(err, CT_ERR_INVALID, "sampler: set '%s' has probability %g (must be > 0)",
                   in->id, in->probability);
  if (in->repeats < 0 || in->nb < 0 || (in->nb && !in->b))
    return ct_errf(err, CT_ERR_INVALID, "sampler: set '%s' has repeats %ld and %d bucket(s)",
                   in->id, in->repeats, in->nb);
  ct_sampler_fset *f = &s->sets[k];
  if (!(f->id = strdup(in->id))) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  s->nsets++;
  f->probability = in->probability, f->repeats = in->repeats;
  f->boff = s->nbt, f->nb = in->nb;
  for (int b = 0; b < in->nb; b++) {
    const ct_sampler_bucket *ib = &in->b[b];
    ct_sampler_fbucket *fb = &s->b[s->nbt];
    if (!ib->key || ib->n == 0)
      return ct_errf(err, CT_ERR_INVALID, "sampler: set '%s': bucket %d is %s", in->id, b,
                     ib->key ? "empty" : "unnamed");
    if (ib->n > SIZE_MAX / 2 / ((size_t)in->repeats + 1))
      return ct_errf(err, CT_ERR_RANGE, "sampler: set '%s': bucket %s: %zu images x %ld repeats",
                     in->id, ib->key, ib->n, in->repeats);
    if (!(fb->key = strdup(ib->key))) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    s->nbt++;
    fb->n = ib->n, fb->entries = ib->n * ((size_t)in->repeats + 1), fb->set = k;
    if (!(s->perm[s->nbt - 1] = malloc(fb->entries * sizeof(size_t))))
      return ct_errf(err, CT_ERR_NOMEM, "out of memory for the sample order");
  }
  return CT_OK;
}

ct_status ct_sampler_init(ct_sampler *s, const ct_sampler_set *sets, int nsets, uint64_t seed,
                          size_t B, int ranks, int accum, ct_err *err) {
  memset(s, 0, sizeof *s);
  s->perm_epoch = -1;
  ct_status st = CT_OK;
  if (nsets < 0 || (nsets && !sets) || B == 0 || ranks <= 0 || accum <= 0 ||
      B > SIZE_MAX / (size_t)ranks / (size_t)accum) {
    st =
        ct_errf(err, CT_ERR_INVALID, "sampler: %d set(s), batch %zu x %d rank(s) x %d accumulation",
                nsets, B, ranks, accum);
    goto out;
  }
  s->seed = seed, s->B = B, s->ranks = ranks, s->accum = accum;
  s->E = B * (size_t)ranks * (size_t)accum;
  int nbt = 0;
  for (int k = 0; k < nsets; k++) nbt += sets[k].nb > 0 ? sets[k].nb : 0;
  s->sets = calloc((size_t)nsets + 1, sizeof *s->sets);
  s->b = calloc((size_t)nbt + 1, sizeof *s->b);
  s->perm = calloc((size_t)nbt + 1, sizeof *s->perm);
  if (!s->sets || !s->b || !s->perm) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (int k = 0; k < nsets && !st; k++) st = add_set(s, &sets[k], err);
  if (!st) st = ct_sampler_pos_init(s, &s->pos, err);
out:
  return st;
}

void ct_sampler_free(ct_sampler *s) {
  if (!s) return;
  for (int k = 0; s->sets && k < s->nsets; k++) free(s->sets[k].id);
  for (int b = 0; s->b && b < s->nbt; b++) free(s->b[b].key);
  for (int b = 0; s->perm && b < s->nbt; b++) free(s->perm[b]);
  free(s->sets);
  free(s->b);
  free(s->perm);
  ct_sampler_pos_free(&s->pos);
  memset(s, 0, sizeof *s);
}

ct_status ct_sampler_pos_init(const ct_sampler *s, ct_sampler_pos *p, ct_err *err) {
  memset(p, 0, sizeof *p);
  p->consumed = calloc((size_t)s->nbt + 1, sizeof(size_t));
  return p->consumed ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
}

void ct_sampler_pos_copy(const ct_sampler *s, ct_sampler_pos *dst, const ct_sampler_pos *src) {
  dst->epoch = src->epoch, dst->step = src->step, dst->seen = src->seen;
  memcpy(dst->consumed, src->consumed, (size_t)s->nbt * sizeof(size_t));
}

void ct_sampler_pos_free(ct_sampler_pos *p) {
  if (!p) return;
  free(p->consumed);
  p->consumed = NULL;
}

/* -------------------------------------------------------------- drawing */

/* Every bucket's order for an epoch: its images x (repeats + 1), shuffled by
 * a Philox-keyed Fisher-Yates (the same on every rank and run). */
static void make_perms(ct_sampler *s, long epoch) {
  if (s->perm_epoch == epoch) return;
  for (int f = 0; f < s->nbt; f++) {
    const ct_sampler_fbucket *fb = &s->b[f];
    size_t n = fb->entries, *p = s->perm[f];
    uint64_t key =
        ct_hash_str(s->sets[fb->set].id) ^ (ct_hash_str(fb->key) * 0x9e3779b97f4a7c15ull);
    for (size_t i = 0; i < n; i++) p[i] = i % fb->n;
    for (size_t i = n; i > 1; i--) {
      uint32_t r[4];
      ct_philox4x32(s->seed, STREAM_PERM ^ key, ((uint64_t)epoch << 32) + i, r);
      size_t j = (size_t)((((uint64_t)r[0] << 32) | r[1]) % i);
      size_t t = p[i - 1];
      p[i - 1] = p[j];
      p[j] = t;
    }
  }
  s->perm_epoch = epoch;
}

/* Whole steps bucket f has left at p. */
static size_t steps_left(const ct_sampler *s, const ct_sampler_pos *p, int f) {
  return (s->b[f].entries - p->consumed[f]) / s->E;
}

/* A set can take a step when one of its buckets has E entries left. */
static int set_open(const ct_sampler *s, const ct_sampler_pos *p, int k) {
  const ct_sampler_fset *fs = &s->sets[k];
  for (int b = 0; b < fs->nb; b++)
    if (steps_left(s, p, fs->boff + b) > 0) return 1;
  return 0;
}

/* The set of this step (by probability among the open ones), then its bucket
 * (by whole steps left); -1 when no set is open. */
static int draw_bucket(const ct_sampler *s, const ct_sampler_pos *p, int *set) {
  double wsum = 0;
  for (int k = 0; k < s->nsets; k++)
    if (set_open(s, p, k)) wsum += s->sets[k].probability;
  if (!(wsum > 0)) return -1;
  const uint64_t key = ((uint64_t)p->epoch << 32) + (uint64_t)p->step;
  double u = ct_rng_uniform(s->seed, STREAM_DSPICK, key) * wsum, acc = 0;
  int pick = -1, last = -1;
  for (int k = 0; k < s->nsets && pick < 0; k++)
    if (set_open(s, p, k)) {
      last = k;
      acc += s->sets[k].probability;
      if (u < acc) pick = k;
    }
  if (pick < 0) pick = last;
  const ct_sampler_fset *fs = &s->sets[pick];
  double bsum = 0;
  for (int b = 0; b < fs->nb; b++) bsum += (double)steps_left(s, p, fs->boff + b);
  double v = ct_rng_uniform(s->seed, STREAM_BUCKET, key) * bsum;
  int bp = -1, bl = -1;
  acc = 0;
  for (int b = 0; b < fs->nb && bp < 0; b++) {
    double steps = (double)steps_left(s, p, fs->boff + b);
    if (steps <= 0) continue;
    bl = b;
    acc += steps;
    if (v < acc) bp = b;
  }
  if (bp < 0) bp = bl;
  *set = pick;
  return bp;
}

ct_status ct_sampler_next(ct_sampler *s, ct_sampler_step *out, ct_err *err) {
  ct_sampler_pos *p = &s->pos;
  memset(out, 0, sizeof *out);
  for (int pass = 0; pass < 2; pass++) {
    int set = -1, b = draw_bucket(s, p, &set);
    if (b >= 0) {
      const int f = s->sets[set].boff + b;
      out->set = set, out->bucket = b, out->flat = f;
      out->epoch = p->epoch, out->base = p->consumed[f], out->first_id = p->seen;
      p->consumed[f] += s->E;
      p->step++;
      p->seen += s->E;
      return CT_OK;
    }
    /* every bucket is done: a new epoch */
    p->epoch++;
    p->step = 0;
    memset(p->consumed, 0, (size_t)s->nbt * sizeof(size_t));
    out->new_epoch = 1;
  }
  return ct_errf(err, CT_ERR_INVALID, "sampler: no bucket of %d set(s) holds a step's %zu entries",
                 s->nsets, s->E);
}

void ct_sampler_select(ct_sampler *s, const ct_sampler_step *st, int m, int rank, size_t *img,
                       uint64_t *ids) {
  CT_ASSERT(m >= 0 && m < s->accum && rank >= 0 && rank < s->ranks);
  CT_ASSERT(st->flat >= 0 && st->flat < s->nbt && st->base + s->E <= s->b[st->flat].entries);
  make_perms(s, st->epoch);
  const size_t *perm = s->perm[st->flat];
  for (size_t i = 0; i < s->B; i++) {
    const size_t off = ((size_t)m * (size_t)s->ranks + (size_t)rank) * s->B + i;
    img[i] = perm[st->base + off];
    ids[i] = st->first_id + off;
  }
}

/* ---------------------------------------------------------------- state */

char *ct_sampler_state_json(const ct_sampler *s, const ct_sampler_pos *p) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n); /* a string builder: no file is touched */
  if (!f) return NULL;
  fprintf(f,
          "{\"version\": %d, \"epoch\": %ld, \"step_in_epoch\": %ld, \"samples_seen\": %llu, "
          "\"datasets\": {",
          CT_SAMPLER_STATE_VERSION, p->epoch, p->step, (unsigned long long)p->seen);
  for (int k = 0; k < s->nsets; k++) {
    const ct_sampler_fset *fs = &s->sets[k];
    fprintf(f, "%s", k ? ", " : "");
    ct_json_fput_str(f, fs->id);
    fprintf(f, ": {\"repeats\": %ld, \"consumed\": {", fs->repeats);
    for (int b = 0; b < fs->nb; b++)
      fprintf(f, "%s\"%s\": %zu", b ? ", " : "", s->b[fs->boff + b].key, p->consumed[fs->boff + b]);
    fprintf(f, "}}");
  }
  fprintf(f, "}}");
  if (fclose(f)) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* A non-negative integer field of the state, or an error naming it. */
static ct_status state_count(const ct_json *j, const char *name, int64_t *out, ct_err *err) {
  const ct_json *v = ct_json_get(j, name);
  if (!v) return ct_errf(err, CT_ERR_FORMAT, "sampler state: no \"%s\"", name);
  if (v->type != CT_JSON_NUMBER || !v->is_int)
    return ct_errf(err, CT_ERR_FORMAT, "sampler state: \"%s\" is not an integer", name);
  if (v->i64 < 0)
    return ct_errf(err, CT_ERR_FORMAT, "sampler state: \"%s\" is negative (%lld)", name,
                   (long long)v->i64);
  *out = v->i64;
  return CT_OK;
}

/* The header of a state: version, epoch, step_in_epoch, samples_seen. */
static ct_status state_header(const ct_json *j, ct_sampler_pos *p, ct_err *err) {
  int64_t version = 0, e = 0, k = 0, seen = 0;
  if (j->type != CT_JSON_OBJECT)
    return ct_errf(err, CT_ERR_FORMAT, "sampler state: not a JSON object");
  ct_status st = state_count(j, "version", &version, err);
  if (!st && version != CT_SAMPLER_STATE_VERSION)
    st = ct_errf(err, CT_ERR_FORMAT, "sampler state: version %lld (this build reads version %d)",
                 (long long)version, CT_SAMPLER_STATE_VERSION);
  if (!st) st = state_count(j, "epoch", &e, err);
  if (!st) st = state_count(j, "step_in_epoch", &k, err);
  if (!st) st = state_count(j, "samples_seen", &seen, err);
  if (!st && (e > LONG_MAX || k > LONG_MAX))
    st = ct_errf(err, CT_ERR_FORMAT, "sampler state: epoch %lld / step_in_epoch %lld out of range",
                 (long long)e, (long long)k);
  if (!st) p->epoch = (long)e, p->step = (long)k, p->seen = (uint64_t)seen;
  return st;
}

ct_status ct_sampler_state_restore(ct_sampler *s, const char *json, int *changed, ct_err *err) {
  ct_json *j = NULL;
  ct_sampler_pos p = {0};
  const ct_json *dsets = NULL;
  *changed = 0;
  ct_status st =
      json ? ct_json_parse(json, strlen(json), &j, err) : ct_errf(err, CT_ERR_FORMAT, "no text");
  if (st) {
    ct_err_prefix(err, "sampler state: ");
    goto out;
  }
  if ((st = ct_sampler_pos_init(s, &p, err)) || (st = state_header(j, &p, err))) goto out;
  dsets = ct_json_get(j, "datasets");
  if (!dsets || dsets->type != CT_JSON_OBJECT) {
    st = ct_errf(err, CT_ERR_FORMAT, "sampler state: \"datasets\" %s",
                 dsets ? "is not an object" : "is missing");
    goto out;
  }
  for (int k = 0; k < s->nsets; k++) {
    const ct_sampler_fset *fs = &s->sets[k];
    const ct_json *x = ct_json_get(dsets, fs->id), *c = x ? ct_json_get(x, "consumed") : NULL;
    if (!c) {
      *changed = 1;
      continue;
    }
    for (int b = 0; b < fs->nb; b++) {
      const ct_sampler_fbucket *fb = &s->b[fs->boff + b];
      const ct_json *v = ct_json_get(c, fb->key);
      if (!v || !v->is_int || v->i64 < 0 || (uint64_t)v->i64 > (uint64_t)fb->entries) {
        *changed = 1;
        continue;
      }
      p.consumed[fs->boff + b] = (size_t)v->i64;
    }
  }
  ct_sampler_pos_copy(s, &s->pos, &p);
out:
  ct_sampler_pos_free(&p);
  ct_json_free(j);
  return st;
}
