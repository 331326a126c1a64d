/* safetensors read (mmap, validated) and write (atomic).
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"key": "value"}}, then the data section; offsets are
 * relative to the data section.
 * The reader validates everything before handing out a pointer: header length
 * bounded (CT_ST_MAX_HEADER) and inside the file, JSON well formed, known dtype,
 * non-negative integer shapes, dtype size x shape == end - begin without
 * overflow, offsets inside the data section, no two tensors overlapping.
 */
#ifndef CTUNER_SAFETENSORS_H
#define CTUNER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/bf16.h" /* ct_f32_to_bf16, ct_bf16_to_f32 */
#include "ctuner/status.h"

#define CT_ST_MAX_HEADER (100u * 1024u * 1024u)
#define CT_ST_MAX_DIMS 8

typedef enum ct_dtype {
  CT_DTYPE_F32 = 0,
  CT_DTYPE_F16,
  CT_DTYPE_BF16,
  CT_DTYPE_F64,
  CT_DTYPE_I64,
  CT_DTYPE_I32,
  CT_DTYPE_I16,
  CT_DTYPE_I8,
  CT_DTYPE_U8,
  CT_DTYPE_BOOL,
  CT_DTYPE_COUNT
} ct_dtype;

const char *ct_dtype_name(ct_dtype d); /* "F32" ... */
size_t ct_dtype_size(ct_dtype d);
int ct_dtype_parse(const char *s, ct_dtype *out); /* 0 ok, -1 unknown */

typedef struct ct_st_tensor {
  char *name;
  ct_dtype dtype;
  int ndim;
  int64_t shape[CT_ST_MAX_DIMS];
  size_t numel;
  size_t begin, end; /* within the data section */
  const void *data;  /* points into the mapping */
} ct_st_tensor;

typedef struct ct_st_file {
  char *path; /* NULL when parsed from memory */
  void *map;
  size_t map_size;
  size_t ntensors;
  ct_st_tensor *tensors; /* sorted by data offset */
  size_t nmeta;
  char **meta_keys, **meta_values;
} ct_st_file;

/* mmap and validate. Error messages start with the path. */
ct_status ct_st_open(const char *path, ct_st_file **out, ct_err *err);
/* Validate a buffer already in memory (borrowed: must outlive the result). */
ct_status ct_st_parse(const void *buf, size_t size, ct_st_file **out, ct_err *err);
void ct_st_close(ct_st_file *f);
const ct_st_tensor *ct_st_find(const ct_st_file *f, const char *name);
const char *ct_st_meta(const ct_st_file *f, const char *key); /* NULL if absent */
/* Convert a F32/F16/BF16 tensor to float32; n must equal t->numel. */
ct_status ct_st_to_f32(const ct_st_tensor *t, float *out, size_t n, ct_err *err);
/* Elements [first, first + n) of a F32/F16/BF16 tensor to float32. */
ct_status ct_st_to_f32_range(const ct_st_tensor *t, size_t first, size_t n, float *out,
                             ct_err *err);

/* f16 conversions (round to nearest even; NaN kept NaN); bf16 ones are in bf16.h. */
uint16_t ct_f32_to_f16(float f);
float ct_f16_to_f32(uint16_t h);

/* Writer: collect tensors (data borrowed until write), then write atomically:
 * PATH.tmp.<pid> is written, fsynced, renamed over PATH, directory fsynced. */
typedef struct ct_st_writer ct_st_writer;
ct_status ct_st_writer_new(ct_st_writer **out);
/* Add float32 data stored as dtype (F32, F16 or BF16: converted at write). */
ct_status ct_st_writer_add_f32(ct_st_writer *w, const char *name, int ndim, const int64_t *shape,
                               const float *data, ct_dtype store_as, ct_err *err);
ct_status ct_st_writer_meta(ct_st_writer *w, const char *key, const char *value, ct_err *err);
ct_status ct_st_writer_write(ct_st_writer *w, const char *path, ct_err *err);
void ct_st_writer_free(ct_st_writer *w);
/* Where the tensors' data is read from at write time: plain host memory
 * (NULL, the default), or through read(host_dst, src, bytes) in chunks of at
 * most 8 MiB (a compute backend's copy_out: device-resident buffers written
 * without a whole host copy). */
typedef void (*ct_st_read_fn)(void *host_dst, const void *src, size_t bytes);
void ct_st_writer_set_reader(ct_st_writer *w, ct_st_read_fn read);

/* ---- a model's tensors on disk (st_set.c) ----
 * One .safetensors file, or the shards an index names (transformers'
 * model.safetensors.index.json, diffusers'
 * diffusion_pytorch_model.safetensors.index.json: "weight_map" tensor ->
 * shard file name, no paths; checked complete both ways). */
struct ct_json;
typedef struct ct_st_set {
  size_t nf;
  ct_st_file **f;
  char **fname; /* as the index names them (basenames), or the file's path */
  struct ct_json *index;
  const struct ct_json *wmap; /* the index's weight_map, NULL for one file */
} ct_st_set;

/* path: a directory holding BASE.index.json (then the shards it names) or
 * BASE (e.g. "model.safetensors"), or one .safetensors file. Errors name the
 * file; a missing directory says ctuner does not download. */
ct_status ct_st_set_open(ct_st_set *s, const char *path, const char *base, ct_err *err);
void ct_st_set_close(ct_st_set *s);
/* The tensor and the file holding it (*file may be NULL), or NULL. */
const ct_st_tensor *ct_st_set_find(const ct_st_set *s, const char *name, const char **file);

/* One error listing every missing, wrongly shaped and unexpected tensor:
 * "<what>: N missing [a, b]; N wrongly shaped [x in F (has BF16 [3, 4], needs
 * F32/F16/BF16 [4, 4])]; N unexpected [y in F]". */
typedef struct ct_st_check ct_st_check;
ct_status ct_st_check_new(ct_st_check **out, ct_err *err);
/* t NULL: name is missing. Else its dtype must be F32/F16/BF16 and its shape
 * (ndim, shape); returns 1 when it is. */
int ct_st_check_tensor(ct_st_check *c, const ct_st_tensor *t, const char *name, const char *file,
                       int ndim, const int64_t *shape);
void ct_st_check_unexpected(ct_st_check *c, const char *name, const char *file);
int ct_st_check_count(const ct_st_check *c); /* problems so far */
/* Frees c; CT_ERR_SHAPE with the lists (prefixed by the formatted what) if
 * anything was recorded, else CT_OK. */
ct_status ct_st_check_done(ct_st_check *c, ct_err *err, const char *what_fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
