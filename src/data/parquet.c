/* parquet.c: ctuner's Apache Parquet reader (public API in ctuner/parquet.h):
 * sources, open (tail, footer, schema) and the column getters; the pages,
 * encodings and the scan are in parquet_scan.c.
 *
 * Design: open reads the 8-byte tail (`len` + "PAR1"), the footer (bounded by
 * CT_PQ_MAX_FOOTER) and derives the leaf columns from the schema tree
 * (parquet_thrift.c parses the Thrift compact structs). A scan walks the row
 * groups; per selected column a reader (`colrd`) pulls one page at a time
 * through the source's read_at: the page header (read in growing pieces up to
 * CT_PQ_MAX_PAGE_HEADER), then the page (at most CT_PQ_MAX_PAGE), decompressed
 * into a buffer reused across pages, plus the chunk's dictionary page. Values
 * are decoded one at a time by streaming decoders (RLE/bit-packed hybrid for
 * levels and dictionary indices, DELTA_* and BYTE_STREAM_SPLIT) so memory
 * never depends on the row count, only on the largest page.
 *
 * Every size, offset and count read from the file is checked against what is
 * left (chunk inside the file, page inside the chunk, value inside the page)
 * before it is used; malformed input returns CT_ERR_FORMAT naming the file,
 * column, row group and what was wrong.
 *
 * Not supported (CT_ERR_UNSUPPORTED with a message): repeated columns (lists,
 * maps), codecs other than UNCOMPRESSED/SNAPPY/GZIP/ZSTD, BIT_PACKED
 * definition levels, encrypted files, column chunks in other files. Logical
 * types are not interpreted (a DATE is its INT32, a DECIMAL its raw bytes or
 * integer), except that UINT_8/16/32 are zero-extended.
 */
#include "ctuner/parquet.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "data/parquet_int.h"

#define MAX_PATH_LEN 4096 /* dotted column path */
#define MAX_SCHEMA_DEPTH 64
#define READ_PIECE (4u << 20) /* one read_at call at most */

/* ---- sources ---- */

static ct_status fd_read_at(void *ctx, uint64_t off, void *buf, size_t n, ct_err *err) {
  ct_parquet *pq = ctx;
  uint8_t *b = buf;
  while (n) {
    ssize_t r = pread(pq->fd, b, n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return ct_errf(err, CT_ERR_IO, "%s: read at offset %llu: %s", pq->name,
                     (unsigned long long)off, strerror(errno));
    if (r == 0)
      return ct_errf(err, CT_ERR_IO, "%s: file shrank while reading (offset %llu)", pq->name,
                     (unsigned long long)off);
    b += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return CT_OK;
}

static ct_status mem_read_at(void *ctx, uint64_t off, void *buf, size_t n, ct_err *err) {
  ct_parquet *pq = ctx;
  memcpy(buf, pq->mem + off, n);
  return CT_OK;
}

/* Reads [off, off+n) in pieces of at most READ_PIECE; the range is checked. */
ct_status pq_read_range(ct_parquet *pq, uint64_t off, void *buf, size_t n, ct_err *err) {
  if (off > pq->src.size || n > pq->src.size - off)
    return ct_errf(err, CT_ERR_FORMAT,
                   "%s: read of %zu bytes at offset %llu is past the end (%llu bytes)", pq->name, n,
                   (unsigned long long)off, (unsigned long long)pq->src.size);
  uint8_t *b = buf;
  while (n) {
    size_t k = n < READ_PIECE ? n : READ_PIECE;
    ct_status st = pq->src.read_at(pq->src.ctx, off, b, k, err);
    if (st) return st;
    b += k;
    off += k;
    n -= k;
  }
  return CT_OK;
}

/* ---- names ---- */

const char *pq_type_name(int t) {
  static const char *n[] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                            "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
  return t >= 0 && t < 8 ? n[t] : "unknown type";
}

const char *pq_codec_name(int c) {
  static const char *n[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
                            "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};
  return c >= 0 && c < 8 ? n[c] : "unknown";
}

const char *pq_enc_name(int e) {
  static const char *n[] = {
      "PLAIN",          "GROUP_VAR_INT",       "PLAIN_DICTIONARY",        "RLE",
      "BIT_PACKED",     "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
      "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
  return e >= 0 && e < 10 ? n[e] : "unknown";
}

static const char *logical_name(const pq_leaf *l) {
  static const char *lt[] = {"",        "STRING",  "MAP",      "LIST",      "ENUM",
                             "DECIMAL", "DATE",    "TIME",     "TIMESTAMP", "",
                             "INTEGER", "NULL",    "JSON",     "BSON",      "UUID",
                             "FLOAT16", "VARIANT", "GEOMETRY", "GEOGRAPHY"};
  static const char *ct[] = {"UTF8",
                             "MAP",
                             "MAP_KEY_VALUE",
                             "LIST",
                             "ENUM",
                             "DECIMAL",
                             "DATE",
                             "TIME_MILLIS",
                             "TIME_MICROS",
                             "TIMESTAMP_MILLIS",
                             "TIMESTAMP_MICROS",
                             "UINT_8",
                             "UINT_16",
                             "UINT_32",
                             "UINT_64",
                             "INT_8",
                             "INT_16",
                             "INT_32",
                             "INT_64",
                             "JSON",
                             "BSON",
                             "INTERVAL"};
  int id = l->logical - 1; /* LogicalType union member id */
  if (id > 0 && id < (int)(sizeof lt / sizeof *lt) && lt[id][0]) return lt[id];
  if (l->converted_type >= 0 && l->converted_type < (int)(sizeof ct / sizeof *ct))
    return ct[l->converted_type];
  return "";
}

static int leaf_is_string(const pq_leaf *l) {
  return l->type == PQ_BYTE_ARRAY &&
         (l->logical == 2 || l->logical == 5 || l->logical == 13 || l->converted_type == 0 ||
          l->converted_type == 4 || l->converted_type == 19);
}

/* ---- open ---- */

/* Depth-first walk of the schema list from element *idx (children of a group
 * follow it), building leaves with their max definition/repetition levels. */
static ct_status walk_schema(ct_parquet *pq, int *idx, int nchildren, const char *prefix, int def,
                             int rep, int depth, ct_err *err) {
  if (depth > MAX_SCHEMA_DEPTH)
    return ct_errf(err, CT_ERR_FORMAT, "%s: schema nested deeper than %d levels", pq->name,
                   MAX_SCHEMA_DEPTH);
  for (int c = 0; c < nchildren; c++) {
    if (*idx >= pq->meta.nschema)
      return ct_errf(err, CT_ERR_FORMAT,
                     "%s: schema declares more children than its %d elements hold", pq->name,
                     pq->meta.nschema);
    const pq_schema_el *e = &pq->meta.schema[(*idx)++];
    if (!e->name)
      return ct_errf(err, CT_ERR_FORMAT, "%s: schema element %d has no name", pq->name, *idx - 1);
    if (e->repetition < PQ_REQUIRED || e->repetition > PQ_REPEATED)
      return ct_errf(err, CT_ERR_FORMAT, "%s: column '%s' has repetition type %d", pq->name,
                     e->name, e->repetition);
    char path[MAX_PATH_LEN];
    int n = snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", e->name);
    if (n < 0 || n >= (int)sizeof path)
      return ct_errf(err, CT_ERR_FORMAT, "%s: column path longer than %d bytes", pq->name,
                     MAX_PATH_LEN - 1);
    int d = def + (e->repetition != PQ_REQUIRED), r = rep + (e->repetition == PQ_REPEATED);
    if (e->num_children < 0)
      return ct_errf(err, CT_ERR_FORMAT, "%s: column '%s' has %d children", pq->name, path,
                     e->num_children);
    if (e->num_children > 0) {
      ct_status st = walk_schema(pq, idx, e->num_children, path, d, r, depth + 1, err);
      if (st) return st;
      continue;
    }
    if (!e->has_type || e->type < PQ_BOOLEAN || e->type > PQ_FLBA)
      return ct_errf(err, CT_ERR_FORMAT, "%s: leaf column '%s' has no valid physical type",
                     pq->name, path);
    if (e->type == PQ_FLBA && e->type_length <= 0)
      return ct_errf(err, CT_ERR_FORMAT, "%s: column '%s' is FIXED_LEN_BYTE_ARRAY of length %d",
                     pq->name, path, e->type_length);
    pq_leaf *l = &pq->leaves[pq->nleaf++];
    l->name = strdup(path);
    if (!l->name) return ct_errf(err, CT_ERR_NOMEM, "%s: out of memory", pq->name);
    l->type = e->type;
    l->type_length = e->type == PQ_FLBA ? e->type_length : 0;
    l->max_def = d;
    l->max_rep = r;
    l->converted_type = e->converted_type;
    l->logical = e->logical;
  }
  return CT_OK;
}

static ct_status open_footer(ct_parquet *pq, ct_err *err) {
  ct_status st = CT_OK;
  uint8_t tail[8], head[4];
  uint8_t *buf = NULL;
  uint64_t size = pq->src.size;
  if (size < 12) {
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s: %llu bytes is too short for a Parquet file (at least 12: \"PAR1\", footer, "
                 "length, \"PAR1\")",
                 pq->name, (unsigned long long)size);
    goto out;
  }
  if ((st = pq_read_range(pq, 0, head, 4, err)) || (st = pq_read_range(pq, size - 8, tail, 8, err)))
    goto out;
  if (!memcmp(tail + 4, "PARE", 4)) {
    st =
        ct_errf(err, CT_ERR_UNSUPPORTED, "%s: encrypted Parquet files are not supported", pq->name);
    goto out;
  }
  if (memcmp(head, "PAR1", 4) || memcmp(tail + 4, "PAR1", 4)) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: not a Parquet file (no \"PAR1\" magic at the %s)",
                 pq->name, memcmp(head, "PAR1", 4) ? "start" : "end");
    goto out;
  }
  uint32_t flen = (uint32_t)tail[0] | (uint32_t)tail[1] << 8 | (uint32_t)tail[2] << 16 |
                  (uint32_t)tail[3] << 24;
  if (flen > size - 12) {
    st = ct_errf(err, CT_ERR_FORMAT,
                 "%s: footer length %u is more than the %llu bytes between the magic numbers "
                 "(truncated or corrupt file)",
                 pq->name, flen, (unsigned long long)(size - 12));
    goto out;
  }
  if (flen > CT_PQ_MAX_FOOTER) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: footer of %u bytes is over the %u-byte limit", pq->name,
                 flen, CT_PQ_MAX_FOOTER);
    goto out;
  }
  if (flen == 0) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: empty footer", pq->name);
    goto out;
  }
  pq->data_end = size - 8 - flen;
  buf = ct_alloc(CT_MEM_BUFFERS, flen);
  if (!buf) {
    st = ct_errf(err, CT_ERR_NOMEM, "%s: out of memory for a %u-byte footer", pq->name, flen);
    goto out;
  }
  if ((st = pq_read_range(pq, pq->data_end, buf, flen, err))) goto out;
  pq_thrift t;
  pq_thrift_init(&t, buf, flen);
  if (pq_parse_file_meta(&t, &pq->meta)) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: bad footer (FileMetaData): %s", pq->name, t.msg);
    goto out;
  }
  pq_meta *m = &pq->meta;
  if (m->nschema < 1 || m->num_rows < 0) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: footer lacks %s", pq->name,
                 m->nschema < 1 ? "a schema" : "a valid row count");
    goto out;
  }
  pq->leaves = ct_calloc(CT_MEM_OTHER, (size_t)m->nschema, sizeof *pq->leaves);
  if (!pq->leaves) {
    st = ct_errf(err, CT_ERR_NOMEM, "%s: out of memory", pq->name);
    goto out;
  }
  int idx = 1;
  if (m->schema[0].num_children < 0) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: schema root has %d children", pq->name,
                 m->schema[0].num_children);
    goto out;
  }
  if ((st = walk_schema(pq, &idx, m->schema[0].num_children, "", 0, 0, 1, err))) goto out;
  if (idx != m->nschema) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: schema has %d elements but its tree covers %d", pq->name,
                 m->nschema, idx);
    goto out;
  }
  int64_t sum = 0;
  for (int g = 0; g < m->nrg; g++) {
    const pq_row_group *rg = &m->rgs[g];
    if (rg->num_rows < 0 || rg->num_rows > INT64_MAX - sum) {
      st = ct_errf(err, CT_ERR_FORMAT, "%s: row group %d has an invalid row count %lld", pq->name,
                   g, (long long)rg->num_rows);
      goto out;
    }
    sum += rg->num_rows;
    if (rg->ncols != pq->nleaf) {
      st =
          ct_errf(err, CT_ERR_FORMAT, "%s: row group %d has %d column chunks, the schema %d leaves",
                  pq->name, g, rg->ncols, pq->nleaf);
      goto out;
    }
  }
  if (sum != m->num_rows) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: row groups hold %lld rows, the footer says %lld",
                 pq->name, (long long)sum, (long long)m->num_rows);
    goto out;
  }
out:
  ct_free(buf);
  return st;
}

static ct_status open_common(ct_parquet *pq, ct_parquet **out, ct_err *err) {
  ct_status st = open_footer(pq, err);
  if (st) {
    ct_parquet_free(pq);
    return st;
  }
  *out = pq;
  return CT_OK;
}

static ct_parquet *new_pq(const char *name) {
  ct_parquet *pq = calloc(1, sizeof *pq);
  if (!pq) return NULL;
  pq->fd = -1;
  snprintf(pq->name, sizeof pq->name, "%s", name ? name : "parquet");
  return pq;
}

ct_status ct_parquet_open_source(const ct_pq_source *src, const char *name, ct_parquet **out,
                                 ct_err *err) {
  *out = NULL;
  if (!src || !src->read_at)
    return ct_errf(err, CT_ERR_INVALID, "ct_parquet_open_source: no read_at callback");
  ct_parquet *pq = new_pq(name);
  if (!pq) return ct_errf(err, CT_ERR_NOMEM, "%s: out of memory", name ? name : "parquet");
  pq->src = *src;
  return open_common(pq, out, err);
}

ct_status ct_parquet_open_mem(const void *data, size_t n, ct_parquet **out, ct_err *err) {
  *out = NULL;
  ct_parquet *pq = new_pq("<memory>");
  if (!pq) return ct_errf(err, CT_ERR_NOMEM, "parquet: out of memory");
  pq->mem = data;
  pq->src = (ct_pq_source){.ctx = pq, .size = n, .read_at = mem_read_at};
  return open_common(pq, out, err);
}

ct_status ct_parquet_open(const char *path, ct_parquet **out, ct_err *err) {
  *out = NULL;
  ct_parquet *pq = new_pq(path);
  if (!pq) return ct_errf(err, CT_ERR_NOMEM, "%s: out of memory", path);
  pq->fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  if (pq->fd < 0 || fstat(pq->fd, &sb) != 0) {
    ct_status st = ct_errf(err, errno == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO,
                           "cannot open %s: %s", path, strerror(errno));
    ct_parquet_free(pq);
    return st;
  }
  if (!S_ISREG(sb.st_mode)) {
    ct_parquet_free(pq);
    return ct_errf(err, CT_ERR_INVALID, "%s: not a regular file", path);
  }
  pq->src = (ct_pq_source){.ctx = pq, .size = (uint64_t)sb.st_size, .read_at = fd_read_at};
  return open_common(pq, out, err);
}

void ct_parquet_free(ct_parquet *pq) {
  if (!pq) return;
  if (pq->fd >= 0) close(pq->fd);
  for (int i = 0; pq->leaves && i < pq->nleaf; i++) free(pq->leaves[i].name);
  ct_free(pq->leaves);
  pq_meta_free(&pq->meta);
  free(pq);
}

int64_t ct_parquet_num_rows(const ct_parquet *pq) {
  return pq->meta.num_rows;
}
int ct_parquet_num_row_groups(const ct_parquet *pq) {
  return pq->meta.nrg;
}
int ct_parquet_num_columns(const ct_parquet *pq) {
  return pq->nleaf;
}

const char *ct_parquet_column_name(const ct_parquet *pq, int i) {
  return i >= 0 && i < pq->nleaf ? pq->leaves[i].name : NULL;
}

int ct_parquet_column_index(const ct_parquet *pq, const char *name) {
  for (int i = 0; i < pq->nleaf; i++)
    if (!strcmp(pq->leaves[i].name, name)) return i;
  return -1;
}

ct_status ct_parquet_column_info(const ct_parquet *pq, int i, ct_pq_column_info *out) {
  if (i < 0 || i >= pq->nleaf) return CT_ERR_RANGE;
  const pq_leaf *l = &pq->leaves[i];
  out->name = l->name;
  out->physical = pq_type_name(l->type);
  out->logical = logical_name(l);
  out->type_length = l->type_length;
  out->optional = l->max_def > 0;
  out->is_float = l->type == PQ_FLOAT;
  out->is_string = leaf_is_string(l);
  out->supported = l->max_rep == 0;
  return CT_OK;
}
