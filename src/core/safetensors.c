/* safetensors.c: validated reader (mmap) and atomic writer for .safetensors.
 *
 * Reader: the file is mapped read-only; ct_st_parse validates the whole header
 * before any tensor pointer is handed out: header length bounded by
 * CT_ST_MAX_HEADER and inside the file, header starts with '{' and is strict
 * JSON (ctuner/json.h) with no duplicate keys, every tensor has a known dtype,
 * at most CT_ST_MAX_DIMS non-negative integer dims, [begin, end] inside the data
 * section and dtype size x numel == end - begin (all with overflow checks), and
 * no two non-empty tensors overlap (checked on the list sorted by offset).
 * Holes in the data section are allowed. Every message starts with the path
 * (or "<memory>") and names the tensor; names from the file are printed with
 * non-printable bytes escaped. Tensor data pointers point into the mapping and
 * need not be aligned (the data section starts at 8 + header length).
 *
 * Writer: tensors are borrowed float32 buffers, stored as F32/F16/BF16 in
 * insertion order with contiguous offsets; the header is padded with spaces to
 * a multiple of 8 bytes. The file is written to PATH.tmp.<pid>, flushed and
 * fsynced, renamed over PATH, and the directory is fsynced; on failure before
 * the rename the temporary file is removed and PATH is untouched.
 *
 * Assumes a little-endian host (as safetensors data is little-endian).
 */
#include "ctuner/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/json.h"
#include "ctuner/log.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define NAME_BUF 160 /* printable form of a name in messages */

/* ------------------------------------------------------------------ dtypes */

static const struct {
  const char *name;
  size_t size;
} dtypes[CT_DTYPE_COUNT] = {
    [CT_DTYPE_F32] = {"F32", 4},   [CT_DTYPE_F16] = {"F16", 2}, [CT_DTYPE_BF16] = {"BF16", 2},
    [CT_DTYPE_F64] = {"F64", 8},   [CT_DTYPE_I64] = {"I64", 8}, [CT_DTYPE_I32] = {"I32", 4},
    [CT_DTYPE_I16] = {"I16", 2},   [CT_DTYPE_I8] = {"I8", 1},   [CT_DTYPE_U8] = {"U8", 1},
    [CT_DTYPE_BOOL] = {"BOOL", 1},
};

const char *ct_dtype_name(ct_dtype d) {
  return (unsigned)d < CT_DTYPE_COUNT ? dtypes[d].name : "unknown";
}

size_t ct_dtype_size(ct_dtype d) {
  return (unsigned)d < CT_DTYPE_COUNT ? dtypes[d].size : 0;
}

int ct_dtype_parse(const char *s, ct_dtype *out) {
  int r = -1;
  if (!s) return -1;
  for (int d = 0; d < CT_DTYPE_COUNT; d++) {
    if (!strcmp(s, dtypes[d].name)) {
      if (out) *out = (ct_dtype)d;
      r = 0;
      break;
    }
  }
  return r;
}

/* ------------------------------------------------------------ conversions */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t ct_f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7FFFFFFFu;
  uint16_t h;
  if (a > 0x7F800000u) { /* NaN: keep it NaN (quiet), keep top payload bits */
    h = (uint16_t)(0x7E00u | ((a >> 13) & 0x3FFu));
  } else if (a >= 0x477FF000u) { /* >= 65520 rounds to infinity (and inf itself) */
    h = 0x7C00u;
  } else if (a >= 0x38800000u) { /* normal f16: >= 2^-14 */
    uint32_t b = a - (112u << 23);
    b += 0xFFFu + ((b >> 13) & 1u);
    h = (uint16_t)(b >> 13);
  } else if (a > 0x33000000u) { /* subnormal f16: (2^-25, 2^-14) */
    uint32_t e = a >> 23;
    uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e; /* value = mant * 2^(e-150) = (mant >> shift) * 2^-24 */
    uint32_t r = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) r++;
    h = (uint16_t)r;
  } else { /* <= 2^-25 rounds to zero (2^-25 is a tie, to even: 0) */
    h = 0;
  }
  return (uint16_t)(sign | h);
}

float ct_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu;
  float f;
  if (e == 0) {
    f = (float)m * 0x1p-24f; /* zero or subnormal, exact */
    if (sign) f = -f;
  } else if (e == 31) {
    f = bits_f32(sign | 0x7F800000u | (m << 13));
  } else {
    f = bits_f32(sign | ((e + 112u) << 23) | (m << 13));
  }
  return f;
}

ct_status ct_st_to_f32(const ct_st_tensor *t, float *out, size_t n, ct_err *err) {
  if (t && n != t->numel)
    return ct_errf(err, CT_ERR_SHAPE, "tensor '%s' has %zu elements but the buffer holds %zu",
                   t->name ? t->name : "?", t->numel, n);
  return ct_st_to_f32_range(t, 0, n, out, err);
}

ct_status ct_st_to_f32_range(const ct_st_tensor *t, size_t first, size_t n, float *out,
                             ct_err *err) {
  ct_status st = CT_OK;
  if (!t || (!out && n)) {
    st = ct_errf(err, CT_ERR_INVALID, "ct_st_to_f32: NULL argument");
    goto out;
  }
  if (first > t->numel || n > t->numel - first) {
    st = ct_errf(err, CT_ERR_RANGE, "tensor '%s' has %zu elements, not [%zu, %zu)",
                 t->name ? t->name : "?", t->numel, first, first + n);
    goto out;
  }
  const unsigned char *src = (const unsigned char *)t->data + first * ct_dtype_size(t->dtype);
  switch (t->dtype) {
    case CT_DTYPE_F32:
      if (n) memcpy(out, src, n * 4);
      break;
    case CT_DTYPE_F16:
#pragma omp parallel for schedule(static) if (n > 65536)
      for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        out[i] = ct_f16_to_f32(h);
      }
      break;
    case CT_DTYPE_BF16:
#pragma omp parallel for schedule(static) if (n > 65536)
      for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        out[i] = ct_bf16_to_f32(h);
      }
      break;
    default:
      st = ct_errf(err, CT_ERR_UNSUPPORTED,
                   "tensor '%s' has dtype %s; only F32, F16 and BF16 convert to float32",
                   t->name ? t->name : "?", ct_dtype_name(t->dtype));
      break;
  }
out:
  return st;
}

/* ----------------------------------------------------------------- reader */

/* The public struct plus a name index for ct_st_find (SQLite "Int" pattern). */
typedef struct st_file_int {
  ct_st_file pub;
  ct_st_tensor **by_name; /* ntensors pointers sorted by name */
} st_file_int;

/* Printable form of a name from the file: non-printable bytes as \xNN, cut. */
static const char *pname(const char *s, char buf[NAME_BUF]) {
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (o + 8 >= NAME_BUF) {
      memcpy(buf + o, "...", 3);
      o += 3;
      break;
    }
    if (*p >= 0x20 && *p < 0x7f && *p != '\\') {
      buf[o++] = (char)*p;
    } else if (*p >= 0x80) {
      buf[o++] = (char)*p; /* UTF-8, validated by the JSON reader */
    } else {
      o += (size_t)snprintf(buf + o, NAME_BUF - o, "\\x%02X", *p);
    }
  }
  buf[o] = '\0';
  return buf;
}

static void fmt_shape(const ct_st_tensor *t, char *buf, size_t cap) {
  size_t o = 0;
  o += (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < t->ndim && o < cap; d++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
  if (o < cap) snprintf(buf + o, cap - o, "]");
}

static int cmp_str_ptr(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_tensor_name(const void *a, const void *b) {
  const ct_st_tensor *x = *(ct_st_tensor *const *)a, *y = *(ct_st_tensor *const *)b;
  return strcmp(x->name, y->name);
}

static int cmp_tensor_offset(const void *a, const void *b) {
  const ct_st_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

static const char *type_article(ct_json_type t) {
  return (t == CT_JSON_ARRAY || t == CT_JSON_OBJECT) ? "an" : "a";
}

static void free_file(st_file_int *fi) {
  if (!fi) return;
  ct_st_file *f = &fi->pub;
  for (size_t i = 0; i < f->ntensors; i++) free(f->tensors[i].name);
  free(f->tensors);
  for (size_t i = 0; i < f->nmeta; i++) {
    free(f->meta_keys[i]);
    free(f->meta_values[i]);
  }
  free(f->meta_keys);
  free(f->meta_values);
  free(fi->by_name);
  if (f->map) munmap(f->map, f->map_size);
  free(f->path);
  free(fi);
}

static char *dupstr(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static ct_status parse_metadata(const char *label, const ct_json *m, ct_st_file *f, ct_err *err) {
  ct_status st = CT_OK;
  char nb[NAME_BUF];
  char **sorted = NULL;
  if (m->type != CT_JSON_OBJECT) {
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s: __metadata__ is %s %s; it must be an object of string "
                 "to string",
                 label, type_article(m->type), ct_json_type_name(m->type));
    goto out;
  }
  if (m->n == 0) goto out;
  f->meta_keys = calloc(m->n, sizeof(char *));
  f->meta_values = calloc(m->n, sizeof(char *));
  sorted = malloc(m->n * sizeof(char *));
  if (!f->meta_keys || !f->meta_values || !sorted) {
    st = ct_errf(err, CT_ERR_NOMEM, "%s: out of memory reading __metadata__", label);
    goto out;
  }
  for (size_t i = 0; i < m->n; i++) {
    const ct_json *v = &m->items[i];
    if (v->type != CT_JSON_STRING) {
      st = ct_errf(err, CT_ERR_FORMAT,
                   "%s: __metadata__ value for key '%s' is %s %s; it must be "
                   "a string",
                   label, pname(m->keys[i], nb), type_article(v->type), ct_json_type_name(v->type));
      goto out;
    }
    if (strlen(v->str) != v->len) {
      st = ct_errf(err, CT_ERR_FORMAT, "%s: __metadata__ value for key '%s' contains U+0000", label,
                   pname(m->keys[i], nb));
      goto out;
    }
    sorted[i] = m->keys[i];
  }
  qsort(sorted, m->n, sizeof(char *), cmp_str_ptr);
  for (size_t i = 1; i < m->n; i++) {
    if (!strcmp(sorted[i - 1], sorted[i])) {
      st = ct_errf(err, CT_ERR_FORMAT, "%s: __metadata__ key '%s' appears more than once", label,
                   pname(sorted[i], nb));
      goto out;
    }
  }
  for (size_t i = 0; i < m->n; i++) {
    f->meta_keys[i] = dupstr(m->keys[i]);
    f->meta_values[i] = dupstr(m->items[i].str);
    f->nmeta = i + 1;
    if (!f->meta_keys[i] || !f->meta_values[i]) {
      st = ct_errf(err, CT_ERR_NOMEM, "%s: out of memory reading __metadata__", label);
      goto out;
    }
  }
out:
  free(sorted);
  return st;
}

/* Read a JSON value that must be a non-negative integer. */
static int get_uint(const ct_json *v, uint64_t *out) {
  if (!v || v->type != CT_JSON_NUMBER || !v->is_int || v->i64 < 0) return -1;
  *out = (uint64_t)v->i64;
  return 0;
}

static ct_status parse_tensor(const char *label, const char *name, const ct_json *e,
                              size_t data_size, ct_st_tensor *t, ct_err *err) {
  ct_status st = CT_OK;
  char nb[NAME_BUF], sb[256];
  const ct_json *dt, *sh, *off;
  if (e->type != CT_JSON_OBJECT) {
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s: tensor '%s': entry is %s %s; it must be an object "
                 "with dtype, shape and data_offsets",
                 label, pname(name, nb), type_article(e->type), ct_json_type_name(e->type));
    goto out;
  }
  dt = ct_json_get(e, "dtype");
  if (!dt || dt->type != CT_JSON_STRING) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: tensor '%s': %s", label, pname(name, nb),
                 dt ? "dtype is not a string" : "missing \"dtype\"");
    goto out;
  }
  if (strlen(dt->str) != dt->len || ct_dtype_parse(dt->str, &t->dtype)) {
    char db[NAME_BUF];
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "%s: tensor '%s': unknown or unsupported dtype '%s' "
                 "(supported: F32 F16 BF16 F64 I64 I32 I16 I8 U8 BOOL)",
                 label, pname(name, nb), pname(dt->str, db));
    goto out;
  }
  sh = ct_json_get(e, "shape");
  if (!sh || sh->type != CT_JSON_ARRAY) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: tensor '%s': %s", label, pname(name, nb),
                 sh ? "shape is not an array" : "missing \"shape\"");
    goto out;
  }
  if (sh->n > CT_ST_MAX_DIMS) {
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "%s: tensor '%s': shape has %zu dimensions; at most %d "
                 "are supported",
                 label, pname(name, nb), sh->n, CT_ST_MAX_DIMS);
    goto out;
  }
  t->ndim = (int)sh->n;
  size_t numel = 1;
  int overflow = 0;
  for (size_t d = 0; d < sh->n; d++) {
    uint64_t v;
    if (get_uint(&sh->items[d], &v)) {
      st = ct_errf(err, CT_ERR_FORMAT,
                   "%s: tensor '%s': shape entry %zu is not a non-negative "
                   "integer",
                   label, pname(name, nb), d);
      goto out;
    }
    t->shape[d] = (int64_t)v;
    if (v > SIZE_MAX || ct_mul_size(numel, (size_t)v, &numel)) overflow = 1;
  }
  fmt_shape(t, sb, sizeof sb);
  size_t nbytes = 0;
  if (overflow || ct_mul_size(numel, ct_dtype_size(t->dtype), &nbytes)) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: tensor '%s': %s shape %s is too large (size overflows)",
                 label, pname(name, nb), ct_dtype_name(t->dtype), sb);
    goto out;
  }
  t->numel = numel;
  off = ct_json_get(e, "data_offsets");
  uint64_t b, en;
  if (!off || off->type != CT_JSON_ARRAY || off->n != 2 || get_uint(&off->items[0], &b) ||
      get_uint(&off->items[1], &en)) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: tensor '%s': %s", label, pname(name, nb),
                 off ? "data_offsets must be an array of two non-negative integers [begin, end]"
                     : "missing \"data_offsets\"");
    goto out;
  }
  if (b > en) {
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s: tensor '%s': data_offsets [%llu, %llu] has begin after "
                 "end",
                 label, pname(name, nb), (unsigned long long)b, (unsigned long long)en);
    goto out;
  }
  if (en > data_size) {
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s: tensor '%s': data_offsets [%llu, %llu] end past the "
                 "data section (%zu bytes)",
                 label, pname(name, nb), (unsigned long long)b, (unsigned long long)en, data_size);
    goto out;
  }
  t->begin = (size_t)b;
  t->end = (size_t)en;
  if (t->end - t->begin != nbytes) {
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s: tensor '%s': %s shape %s needs %zu bytes but "
                 "data_offsets span %zu",
                 label, pname(name, nb), ct_dtype_name(t->dtype), sb, nbytes, t->end - t->begin);
    goto out;
  }
out:
  return st;
}

static ct_status parse_impl(const char *label, const unsigned char *buf, size_t size,
                            st_file_int **out, ct_err *err) {
  ct_status st = CT_OK;
  st_file_int *fi = NULL;
  ct_json *root = NULL;
  char **names = NULL;
  char nb[NAME_BUF], nb2[NAME_BUF];
  *out = NULL;
  if (size == 0) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: file is empty (0 bytes); not a safetensors file", label);
    goto out;
  }
  if (size < 8) {
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s: file is %zu bytes, shorter than the 8-byte header "
                 "length",
                 label, size);
    goto out;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
  if (hlen > CT_ST_MAX_HEADER) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: header length %llu exceeds the %u-byte limit", label,
                 (unsigned long long)hlen, (unsigned)CT_ST_MAX_HEADER);
    goto out;
  }
  if (hlen > size - 8) {
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s: header length %llu runs past the end of the file "
                 "(%zu bytes): the file is truncated or not safetensors",
                 label, (unsigned long long)hlen, size);
    goto out;
  }
  const char *hdr = (const char *)buf + 8;
  size_t data_size = size - 8 - (size_t)hlen;
  if (hlen == 0) {
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s: header does not start with '{' (the header is empty); "
                 "not a safetensors file",
                 label);
    goto out;
  }
  if (hdr[0] != '{') {
    unsigned char c = (unsigned char)hdr[0];
    char found[16];
    if (c >= 0x20 && c < 0x7f)
      snprintf(found, sizeof found, "'%c'", c);
    else
      snprintf(found, sizeof found, "byte 0x%02X", c);
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s: header does not start with '{' (found %s); a "
                 "safetensors header is a JSON object",
                 label, found);
    goto out;
  }
  if ((st = ct_json_parse(hdr, (size_t)hlen, &root, err))) {
    ct_err_prefix(err, "%s: header JSON: ", label);
    goto out;
  }
  if (root->type != CT_JSON_OBJECT) { /* cannot happen after '{', kept for clarity */
    st = ct_errf(err, CT_ERR_FORMAT, "%s: header is not a JSON object", label);
    goto out;
  }
  fi = calloc(1, sizeof *fi);
  if (!fi) {
    st = ct_errf(err, CT_ERR_NOMEM, "%s: out of memory", label);
    goto out;
  }
  ct_st_file *f = &fi->pub;
  size_t nt = 0, nmeta_entries = 0;
  for (size_t i = 0; i < root->n; i++) {
    if (!strcmp(root->keys[i], "__metadata__"))
      nmeta_entries++;
    else
      nt++;
  }
  if (nmeta_entries > 1) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: \"__metadata__\" appears %zu times in the header", label,
                 nmeta_entries);
    goto out;
  }
  if (nt) {
    f->tensors = calloc(nt, sizeof(ct_st_tensor));
    names = malloc(nt * sizeof(char *));
    fi->by_name = malloc(nt * sizeof(ct_st_tensor *));
    if (!f->tensors || !names || !fi->by_name) {
      st = ct_errf(err, CT_ERR_NOMEM, "%s: out of memory for %zu tensors", label, nt);
      goto out;
    }
  }
  /* Names first, so duplicates are reported before anything else about them. */
  for (size_t i = 0, k = 0; i < root->n; i++)
    if (strcmp(root->keys[i], "__metadata__")) names[k++] = root->keys[i];
  if (nt) qsort(names, nt, sizeof(char *), cmp_str_ptr);
  for (size_t i = 1; i < nt; i++) {
    if (!strcmp(names[i - 1], names[i])) {
      st = ct_errf(err, CT_ERR_FORMAT,
                   "%s: tensor '%s' appears more than once in the header "
                   "(duplicate key)",
                   label, pname(names[i], nb));
      goto out;
    }
  }
  for (size_t i = 0; i < root->n; i++) {
    const char *key = root->keys[i];
    if (!strcmp(key, "__metadata__")) {
      if ((st = parse_metadata(label, &root->items[i], f, err))) goto out;
      continue;
    }
    ct_st_tensor *t = &f->tensors[f->ntensors];
    t->name = dupstr(key);
    if (!t->name) {
      st = ct_errf(err, CT_ERR_NOMEM, "%s: out of memory", label);
      goto out;
    }
    f->ntensors++;
    if ((st = parse_tensor(label, key, &root->items[i], data_size, t, err))) goto out;
    t->data = buf + 8 + hlen + t->begin;
  }
  /* Overlaps, on the list sorted by offset. Empty tensors never overlap. */
  if (nt) qsort(f->tensors, nt, sizeof(ct_st_tensor), cmp_tensor_offset);
  const ct_st_tensor *reach = NULL; /* non-empty tensor reaching furthest so far */
  for (size_t i = 0; i < nt; i++) {
    const ct_st_tensor *t = &f->tensors[i];
    if (t->begin == t->end) continue;
    if (reach && t->begin < reach->end) {
      st = ct_errf(err, CT_ERR_FORMAT, "%s: tensors '%s' [%zu, %zu] and '%s' [%zu, %zu] overlap",
                   label, pname(reach->name, nb), reach->begin, reach->end, pname(t->name, nb2),
                   t->begin, t->end);
      goto out;
    }
    if (!reach || t->end > reach->end) reach = t;
  }
  for (size_t i = 0; i < nt; i++) fi->by_name[i] = &f->tensors[i];
  if (nt) qsort(fi->by_name, nt, sizeof(ct_st_tensor *), cmp_tensor_name);
  *out = fi;
  fi = NULL;
out:
  free(names);
  ct_json_free(root);
  free_file(fi);
  return st;
}

ct_status ct_st_parse(const void *buf, size_t size, ct_st_file **out, ct_err *err) {
  ct_status st = CT_OK;
  st_file_int *fi = NULL;
  if (!out || (!buf && size)) {
    st = ct_errf(err, CT_ERR_INVALID, "ct_st_parse: NULL argument");
    goto out;
  }
  *out = NULL;
  if ((st = parse_impl("<memory>", buf, size, &fi, err))) goto out;
  *out = &fi->pub;
out:
  return st;
}

ct_status ct_st_open(const char *path, ct_st_file **out, ct_err *err) {
  ct_status st = CT_OK;
  int fd = -1;
  void *map = NULL;
  size_t size = 0;
  st_file_int *fi = NULL;
  struct stat sb;
  if (!path || !out) {
    st = ct_errf(err, CT_ERR_INVALID, "ct_st_open: NULL argument");
    goto out;
  }
  *out = NULL;
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    st = ct_errf(err, errno == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO, "%s: cannot open: %s", path,
                 strerror(errno));
    goto out;
  }
  if (fstat(fd, &sb) != 0) {
    st = ct_errf(err, CT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    goto out;
  }
  if (!S_ISREG(sb.st_mode)) {
    st = ct_errf(err, CT_ERR_IO, "%s: not a regular file", path);
    goto out;
  }
  if (sb.st_size < 0 || (uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
    st = ct_errf(err, CT_ERR_RANGE, "%s: file too large to map", path);
    goto out;
  }
  size = (size_t)sb.st_size;
  if (size == 0) { /* mmap of 0 bytes fails; report it as what it is */
    st = parse_impl(path, NULL, 0, &fi, err);
    goto out;
  }
  map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    map = NULL;
    st = ct_errf(err, CT_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, size, strerror(errno));
    goto out;
  }
  if ((st = parse_impl(path, map, size, &fi, err))) goto out;
  fi->pub.map = map;
  fi->pub.map_size = size;
  map = NULL;
  fi->pub.path = dupstr(path);
  if (!fi->pub.path) {
    st = ct_errf(err, CT_ERR_NOMEM, "%s: out of memory", path);
    goto out;
  }
  *out = &fi->pub;
  fi = NULL;
out:
  free_file(fi);
  if (map) munmap(map, size);
  if (fd >= 0) close(fd);
  return st;
}

void ct_st_close(ct_st_file *f) {
  if (!f) return;
  free_file((st_file_int *)f); /* pub is the first member */
}

const ct_st_tensor *ct_st_find(const ct_st_file *f, const char *name) {
  const ct_st_tensor *r = NULL;
  if (!f || !name) goto out;
  const st_file_int *fi = (const st_file_int *)f;
  size_t lo = 0, hi = f->ntensors;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(fi->by_name[mid]->name, name);
    if (c == 0) {
      r = fi->by_name[mid];
      break;
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
out:
  return r;
}

const char *ct_st_meta(const ct_st_file *f, const char *key) {
  const char *r = NULL;
  if (!f || !key) goto out;
  for (size_t i = 0; i < f->nmeta; i++) {
    if (!strcmp(f->meta_keys[i], key)) {
      r = f->meta_values[i];
      break;
    }
  }
out:
  return r;
}

/* ----------------------------------------------------------------- writer */

typedef struct wt_tensor {
  char *name;
  int ndim;
  int64_t shape[CT_ST_MAX_DIMS];
  size_t numel, nbytes;
  const float *data;
  ct_dtype dtype;
} wt_tensor;

struct ct_st_writer {
  ct_st_read_fn read; /* NULL: the data is host memory */
  wt_tensor *t;
  size_t n, cap;
  char **mk, **mv;
  size_t nm, mcap;
};

ct_status ct_st_writer_new(ct_st_writer **out) {
  ct_status st = CT_OK;
  if (!out) {
    st = CT_ERR_INVALID;
    goto out;
  }
  *out = calloc(1, sizeof(ct_st_writer));
  if (!*out) st = CT_ERR_NOMEM;
out:
  return st;
}

void ct_st_writer_set_reader(ct_st_writer *w, ct_st_read_fn read) {
  if (w) w->read = read;
}

void ct_st_writer_free(ct_st_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n; i++) free(w->t[i].name);
  free(w->t);
  for (size_t i = 0; i < w->nm; i++) {
    free(w->mk[i]);
    free(w->mv[i]);
  }
  free(w->mk);
  free(w->mv);
  free(w);
}

/* Grow an array of `elem`-byte items so that index n fits. */
static int grow_arr(void **arr, size_t *cap, size_t n, size_t elem) {
  int r = 0;
  if (n < *cap) goto out;
  size_t ncap = *cap ? *cap * 2 : 16;
  size_t bytes;
  if (ncap <= n || ct_mul_size(ncap, elem, &bytes)) {
    r = -1;
    goto out;
  }
  void *p = realloc(*arr, bytes);
  if (!p) {
    r = -1;
    goto out;
  }
  *arr = p;
  *cap = ncap;
out:
  return r;
}

ct_status ct_st_writer_add_f32(ct_st_writer *w, const char *name, int ndim, const int64_t *shape,
                               const float *data, ct_dtype store_as, ct_err *err) {
  ct_status st = CT_OK;
  char nb[NAME_BUF];
  if (!w || !name || (ndim > 0 && !shape)) {
    st = ct_errf(err, CT_ERR_INVALID, "ct_st_writer_add_f32: NULL argument");
    goto out;
  }
  if (!name[0] || !strcmp(name, "__metadata__") || !ct_utf8_valid(name, strlen(name))) {
    st = ct_errf(err, CT_ERR_INVALID,
                 "tensor name '%s' is not allowed (empty, reserved or not "
                 "UTF-8)",
                 pname(name, nb));
    goto out;
  }
  if (store_as != CT_DTYPE_F32 && store_as != CT_DTYPE_F16 && store_as != CT_DTYPE_BF16) {
    st = ct_errf(err, CT_ERR_UNSUPPORTED,
                 "tensor '%s': cannot store float32 data as %s; use "
                 "F32, F16 or BF16",
                 pname(name, nb), ct_dtype_name(store_as));
    goto out;
  }
  if (ndim < 0 || ndim > CT_ST_MAX_DIMS) {
    st = ct_errf(err, CT_ERR_INVALID, "tensor '%s': %d dimensions; 0 to %d are supported",
                 pname(name, nb), ndim, CT_ST_MAX_DIMS);
    goto out;
  }
  size_t numel = 1, nbytes;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0 || (uint64_t)shape[d] > SIZE_MAX ||
        ct_mul_size(numel, (size_t)shape[d], &numel)) {
      st = ct_errf(err, CT_ERR_INVALID,
                   "tensor '%s': shape entry %d (%lld) is negative or too "
                   "large",
                   pname(name, nb), d, (long long)shape[d]);
      goto out;
    }
  }
  if (ct_mul_size(numel, ct_dtype_size(store_as), &nbytes) ||
      ct_mul_size(numel, sizeof(float), NULL)) {
    st = ct_errf(err, CT_ERR_INVALID, "tensor '%s': too many elements", pname(name, nb));
    goto out;
  }
  if (numel && !data) {
    st = ct_errf(err, CT_ERR_INVALID, "tensor '%s': NULL data for %zu elements", pname(name, nb),
                 numel);
    goto out;
  }
  for (size_t i = 0; i < w->n; i++) {
    if (!strcmp(w->t[i].name, name)) {
      st = ct_errf(err, CT_ERR_INVALID, "tensor '%s' was already added to this writer",
                   pname(name, nb));
      goto out;
    }
  }
  if (grow_arr((void **)&w->t, &w->cap, w->n, sizeof(wt_tensor))) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory adding tensor '%s'", pname(name, nb));
    goto out;
  }
  wt_tensor *t = &w->t[w->n];
  memset(t, 0, sizeof *t);
  t->name = dupstr(name);
  if (!t->name) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory adding tensor '%s'", pname(name, nb));
    goto out;
  }
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  t->numel = numel;
  t->nbytes = nbytes;
  t->data = data;
  t->dtype = store_as;
  w->n++;
out:
  return st;
}

ct_status ct_st_writer_meta(ct_st_writer *w, const char *key, const char *value, ct_err *err) {
  ct_status st = CT_OK;
  char nb[NAME_BUF];
  char *k = NULL, *v = NULL;
  if (!w || !key || !value) {
    st = ct_errf(err, CT_ERR_INVALID, "ct_st_writer_meta: NULL argument");
    goto out;
  }
  if (!ct_utf8_valid(key, strlen(key)) || !ct_utf8_valid(value, strlen(value))) {
    st = ct_errf(err, CT_ERR_INVALID, "metadata '%s': key and value must be UTF-8", pname(key, nb));
    goto out;
  }
  for (size_t i = 0; i < w->nm; i++) {
    if (!strcmp(w->mk[i], key)) {
      st = ct_errf(err, CT_ERR_INVALID, "metadata key '%s' was already added to this writer",
                   pname(key, nb));
      goto out;
    }
  }
  size_t cap = w->mcap;
  if (grow_arr((void **)&w->mk, &cap, w->nm, sizeof(char *)) ||
      grow_arr((void **)&w->mv, &w->mcap, w->nm, sizeof(char *))) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory adding metadata");
    goto out;
  }
  k = dupstr(key);
  v = dupstr(value);
  if (!k || !v) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory adding metadata");
    goto out;
  }
  w->mk[w->nm] = k;
  w->mv[w->nm] = v;
  w->nm++;
  k = v = NULL;
out:
  free(k);
  free(v);
  return st;
}

/* A bounded growable string for the header (curl dynbuf style). */
enum { DB_NOMEM = 1, DB_TOO_LONG = 2 };
typedef struct dynbuf {
  char *p;
  size_t len, cap, max;
  int failed; /* DB_NOMEM or DB_TOO_LONG */
} dynbuf;

static void db_add(dynbuf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (n > b->max - b->len) {
    b->failed = DB_TOO_LONG;
    return;
  }
  if (b->len + n > b->cap) {
    size_t ncap = b->cap ? b->cap : 1024;
    while (ncap < b->len + n) ncap = ncap > b->max / 2 ? b->max : ncap * 2;
    char *q = realloc(b->p, ncap);
    if (!q) {
      b->failed = DB_NOMEM;
      return;
    }
    b->p = q;
    b->cap = ncap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

static void db_str(dynbuf *b, const char *s) {
  db_add(b, s, strlen(s));
}

static void db_json_str(dynbuf *b, const char *s) {
  db_add(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char e[8];
    if (*p == '"') {
      db_add(b, "\\\"", 2);
    } else if (*p == '\\') {
      db_add(b, "\\\\", 2);
    } else if (*p < 0x20) {
      snprintf(e, sizeof e, "\\u%04x", *p);
      db_add(b, e, 6);
    } else {
      db_add(b, (const char *)p, 1);
    }
  }
  db_add(b, "\"", 1);
}

/* A tensor's data read through read (device memory), 8 MiB at a time. */
static ct_status write_data_read(FILE *fp, const wt_tensor *t, ct_st_read_fn read) {
  const size_t chunk = ((size_t)8 << 20) / sizeof(float);
  const size_t cap = t->numel < chunk ? t->numel : chunk;
  float *buf = malloc(cap * sizeof(float));
  uint16_t *h = t->dtype == CT_DTYPE_F32 ? NULL : malloc(cap * sizeof *h);
  ct_status st = buf && (h || t->dtype == CT_DTYPE_F32) ? CT_OK : CT_ERR_NOMEM;
  for (size_t i = 0; !st && i < t->numel; i += chunk) {
    const size_t m = t->numel - i < chunk ? t->numel - i : chunk;
    read(buf, t->data + i, m * sizeof(float));
    for (size_t k = 0; h && k < m; k++)
      h[k] = t->dtype == CT_DTYPE_F16 ? ct_f32_to_f16(buf[k]) : ct_f32_to_bf16(buf[k]);
    if (h ? fwrite(h, 2, m, fp) != m : fwrite(buf, sizeof(float), m, fp) != m) st = CT_ERR_IO;
  }
  free(buf);
  free(h);
  return st;
}

static ct_status write_data(FILE *fp, const wt_tensor *t, ct_st_read_fn read) {
  ct_status st = CT_OK;
  uint16_t tmp[4096];
  if (t->numel == 0) goto out;
  if (read) return write_data_read(fp, t, read);
  if (t->dtype == CT_DTYPE_F32) {
    if (fwrite(t->data, sizeof(float), t->numel, fp) != t->numel) st = CT_ERR_IO;
    goto out;
  }
  for (size_t i = 0; i < t->numel; i += 4096) {
    size_t m = t->numel - i < 4096 ? t->numel - i : 4096;
    for (size_t k = 0; k < m; k++)
      tmp[k] =
          t->dtype == CT_DTYPE_F16 ? ct_f32_to_f16(t->data[i + k]) : ct_f32_to_bf16(t->data[i + k]);
    if (fwrite(tmp, 2, m, fp) != m) {
      st = CT_ERR_IO;
      goto out;
    }
  }
out:
  return st;
}

static void fsync_parent_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = NULL;
  int fd = -1;
  if (!slash) {
    dir = dupstr(".");
  } else {
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    dir = malloc(n + 1);
    if (dir) {
      memcpy(dir, path, n);
      dir[n] = '\0';
    }
  }
  if (!dir) goto out;
  fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL && errno != EROFS))
    CT_WARN("%s: could not fsync directory %s after rename: %s", path, dir, strerror(errno));
out:
  if (fd >= 0) close(fd);
  free(dir);
}

ct_status ct_st_writer_write(ct_st_writer *w, const char *path, ct_err *err) {
  ct_status st = CT_OK;
  dynbuf hb = {.max = CT_ST_MAX_HEADER};
  char *tmp = NULL;
  FILE *fp = NULL;
  int created = 0;
  char num[128];
  if (!w || !path || !path[0]) {
    st = ct_errf(err, CT_ERR_INVALID, "ct_st_writer_write: NULL argument or empty path");
    goto out;
  }
  /* Header JSON. */
  db_str(&hb, "{");
  if (w->nm) {
    db_str(&hb, "\"__metadata__\":{");
    for (size_t i = 0; i < w->nm; i++) {
      if (i) db_str(&hb, ",");
      db_json_str(&hb, w->mk[i]);
      db_str(&hb, ":");
      db_json_str(&hb, w->mv[i]);
    }
    db_str(&hb, "}");
  }
  size_t off = 0;
  for (size_t i = 0; i < w->n; i++) {
    const wt_tensor *t = &w->t[i];
    if (i || w->nm) db_str(&hb, ",");
    db_json_str(&hb, t->name);
    db_str(&hb, ":{\"dtype\":\"");
    db_str(&hb, ct_dtype_name(t->dtype));
    db_str(&hb, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t->shape[d]);
      db_str(&hb, num);
    }
    if (t->nbytes > SIZE_MAX - off) {
      st = ct_errf(err, CT_ERR_RANGE, "%s: total tensor data exceeds the address space", path);
      goto out;
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%zu,%zu]}", off, off + t->nbytes);
    db_str(&hb, num);
    off += t->nbytes;
  }
  db_str(&hb, "}");
  while (!hb.failed && hb.len % 8) db_str(&hb, " ");
  if (hb.failed == DB_TOO_LONG) {
    st = ct_errf(err, CT_ERR_RANGE,
                 "%s: the header would be longer than the %u-byte limit "
                 "(too many tensors or metadata)",
                 path, (unsigned)CT_ST_MAX_HEADER);
    goto out;
  }
  if (hb.failed) {
    st = ct_errf(err, CT_ERR_NOMEM, "%s: out of memory building the header", path);
    goto out;
  }
  /* Temporary file next to the target. */
  size_t plen = strlen(path);
  if (plen > SIZE_MAX - 64) {
    st = ct_errf(err, CT_ERR_INVALID, "path too long");
    goto out;
  }
  tmp = malloc(plen + 64);
  if (!tmp) {
    st = ct_errf(err, CT_ERR_NOMEM, "%s: out of memory", path);
    goto out;
  }
  snprintf(tmp, plen + 64, "%s.tmp.%ld", path, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    st = ct_errf(err, CT_ERR_IO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
    goto out;
  }
  created = 1;
  fp = fdopen(fd, "wb");
  if (!fp) {
    st = ct_errf(err, CT_ERR_IO, "%s: fdopen %s: %s", path, tmp, strerror(errno));
    close(fd);
    goto out;
  }
  unsigned char lenb[8];
  uint64_t hl = hb.len;
  for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)(hl >> (8 * i));
  if (fwrite(lenb, 1, 8, fp) != 8 || fwrite(hb.p, 1, hb.len, fp) != hb.len) {
    st = ct_errf(err, CT_ERR_IO, "%s: writing the header to %s: %s", path, tmp, strerror(errno));
    goto out;
  }
  for (size_t i = 0; i < w->n; i++) {
    if (write_data(fp, &w->t[i], w->read)) {
      st = ct_errf(err, CT_ERR_IO, "%s: writing tensor '%s' to %s: %s", path, w->t[i].name, tmp,
                   strerror(errno));
      goto out;
    }
  }
  if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) {
    st = ct_errf(err, CT_ERR_IO, "%s: flushing %s: %s", path, tmp, strerror(errno));
    goto out;
  }
  int rc = fclose(fp);
  fp = NULL;
  if (rc != 0) {
    st = ct_errf(err, CT_ERR_IO, "%s: closing %s: %s", path, tmp, strerror(errno));
    goto out;
  }
  if (rename(tmp, path) != 0) {
    st = ct_errf(err, CT_ERR_IO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
    goto out;
  }
  created = 0;
  fsync_parent_dir(path);
out:
  if (fp) fclose(fp);
  if (created) unlink(tmp);
  free(tmp);
  free(hb.p);
  return st;
}
