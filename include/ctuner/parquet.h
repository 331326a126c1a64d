/* ctuner's own Apache Parquet reader (no external parquet library).
 *
 * Opens a file (or any byte source with a read_at callback, e.g. S3 later, or
 * a memory buffer for fuzzing), parses the Thrift compact footer and streams
 * rows of selected flat columns to a callback. Memory is bounded: per selected
 * column one decompressed page and its dictionary, read in bounded pieces.
 *
 * Supported: flat leaves (required/optional, also inside non-repeated groups,
 * named "group.leaf"); physical types BOOLEAN, INT32, INT64, INT96, FLOAT,
 * DOUBLE, BYTE_ARRAY, FIXED_LEN_BYTE_ARRAY; data pages v1 and v2; encodings
 * PLAIN, PLAIN_DICTIONARY, RLE_DICTIONARY, RLE (booleans),
 * DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY,
 * BYTE_STREAM_SPLIT; codecs UNCOMPRESSED, SNAPPY, GZIP, ZSTD. Repeated columns
 * (lists, maps) may be present but selecting one is CT_ERR_UNSUPPORTED.
 * Malformed input is CT_ERR_FORMAT with a message naming the file, column,
 * row group and what was wrong. See docs/parquet.md.
 */
#ifndef CTUNER_PARQUET_H
#define CTUNER_PARQUET_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/status.h"

typedef struct ct_parquet ct_parquet;

/* A random-access byte source of `size` bytes. read_at must fill exactly n
 * bytes at off (the reader never asks past size) or fail with a message. */
typedef struct ct_pq_source {
  void *ctx;
  uint64_t size;
  ct_status (*read_at)(void *ctx, uint64_t off, void *buf, size_t n, ct_err *err);
} ct_pq_source;

/* Limits (also in docs/parquet.md). */
#define CT_PQ_MAX_FOOTER (64u << 20)      /* FileMetaData bytes */
#define CT_PQ_MAX_PAGE (256u << 20)       /* one page, compressed or not */
#define CT_PQ_MAX_PAGE_HEADER (16u << 20) /* one Thrift PageHeader */

ct_status ct_parquet_open(const char *path, ct_parquet **out, ct_err *err);
/* src is copied; src->ctx must outlive the ct_parquet. name is used in messages. */
ct_status ct_parquet_open_source(const ct_pq_source *src, const char *name, ct_parquet **out,
                                 ct_err *err);
/* data must outlive the ct_parquet (it is not copied). */
ct_status ct_parquet_open_mem(const void *data, size_t n, ct_parquet **out, ct_err *err);
void ct_parquet_free(ct_parquet *pq); /* NULL is a no-op */

int64_t ct_parquet_num_rows(const ct_parquet *pq);
int ct_parquet_num_row_groups(const ct_parquet *pq);
/* Leaf columns in schema order; nested leaves are named "parent.child". */
int ct_parquet_num_columns(const ct_parquet *pq);
const char *ct_parquet_column_name(const ct_parquet *pq, int i);     /* NULL if out of range */
int ct_parquet_column_index(const ct_parquet *pq, const char *name); /* -1 if absent */

typedef struct ct_pq_column_info {
  const char *name;
  const char *physical; /* "INT64", "BYTE_ARRAY", ... */
  const char *logical;  /* "STRING", "DATE", ... or "" when not annotated */
  int type_length;      /* FIXED_LEN_BYTE_ARRAY bytes, else 0 */
  int optional;         /* nullable (some level is OPTIONAL) */
  int is_float;         /* physical FLOAT (values still come as CT_PQ_DOUBLE) */
  int is_string;        /* BYTE_ARRAY annotated STRING/UTF8/ENUM/JSON */
  int supported;        /* 0 for repeated columns (lists, maps) */
} ct_pq_column_info;
/* Fills out for column i; CT_ERR_RANGE if i is out of range. */
ct_status ct_parquet_column_info(const ct_parquet *pq, int i, ct_pq_column_info *out);

typedef enum ct_pq_kind { CT_PQ_NULL, CT_PQ_BOOL, CT_PQ_INT, CT_PQ_DOUBLE, CT_PQ_BYTES } ct_pq_kind;

/* BOOL/INT in i, DOUBLE in d, BYTES in s/len (not NUL-terminated; valid only
 * during the callback). INT32/INT64 -> INT, FLOAT/DOUBLE -> DOUBLE,
 * BYTE_ARRAY/FIXED_LEN_BYTE_ARRAY/INT96 -> BYTES. */
typedef struct ct_pq_value {
  ct_pq_kind kind;
  int64_t i;
  double d;
  const char *s;
  size_t len;
} ct_pq_value;

/* vals[k] is the value of cols[k] in this row; nonzero stops the scan (not an error). */
typedef int (*ct_pq_row_fn)(void *ctx, int64_t row, const ct_pq_value *vals);

/* Streams every row of the selected columns (cols == NULL: all columns, in
 * order; ncols is then ignored) to fn, row group by row group. Selecting a
 * repeated column is CT_ERR_UNSUPPORTED (see ct_pq_column_info.supported). */
ct_status ct_parquet_scan(ct_parquet *pq, const int *cols, int ncols, ct_pq_row_fn fn, void *ctx,
                          ct_err *err);

#endif
