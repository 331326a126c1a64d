/* parquet_thrift.c: the Thrift compact protocol, just enough of it to read a
 * Parquet footer (FileMetaData, SchemaElement, RowGroup, ColumnChunk,
 * ColumnMetaData) and page headers (PageHeader, DataPageHeader,
 * DataPageHeaderV2, DictionaryPageHeader).
 *
 * Design: a cursor over one in-memory buffer; each struct parser walks the
 * field headers, reads the fields it knows with the expected wire type and
 * skips everything else (unknown ids, unexpected types, nested structs, lists,
 * sets and maps) with a generic skipper. Untrusted input is bounded: nesting
 * depth (PQ_MAX_DEPTH), every varint (10 bytes), every length and element
 * count against the bytes left (each element takes at least one byte), so a
 * parse is linear in the buffer. Errors set t->bad and a message; t->eof says
 * the buffer ended early (the page-header reader then reads more).
 * Not supported: the binary protocol, Thrift "set"/"map" contents we need
 * (none are needed; they are skipped).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "data/parquet_int.h"

#define PQ_MAX_DEPTH 32

enum {
  T_STOP = 0,
  T_TRUE = 1,
  T_FALSE = 2,
  T_BYTE = 3,
  T_I16 = 4,
  T_I32 = 5,
  T_I64 = 6,
  T_DOUBLE = 7,
  T_BINARY = 8,
  T_LIST = 9,
  T_SET = 10,
  T_MAP = 11,
  T_STRUCT = 12
};

void pq_thrift_init(pq_thrift *t, const void *buf, size_t n) {
  memset(t, 0, sizeof *t);
  t->start = t->p = (const uint8_t *)buf;
  t->end = t->p + n;
}

__attribute__((format(printf, 2, 3))) static int fail(pq_thrift *t, const char *fmt, ...) {
  if (!t->bad) {
    int n =
        snprintf(t->msg, sizeof t->msg, "at footer/header byte %zu: ", (size_t)(t->p - t->start));
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof t->msg)
      vsnprintf(t->msg + n, sizeof t->msg - (size_t)n, fmt, ap);
    va_end(ap);
  }
  t->bad = 1;
  return -1;
}

static int truncated(pq_thrift *t) {
  t->eof = 1;
  return fail(t, "Thrift data ends early");
}

static size_t left(const pq_thrift *t) {
  return (size_t)(t->end - t->p);
}

static int varint(pq_thrift *t, uint64_t *out) {
  uint64_t v = 0;
  *out = 0;
  for (int i = 0; i < 10; i++) {
    if (t->p >= t->end) return truncated(t);
    uint8_t b = *t->p++;
    v |= (uint64_t)(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      *out = v;
      return 0;
    }
  }
  return fail(t, "varint longer than 10 bytes");
}

static int zigzag(pq_thrift *t, int64_t *out) {
  uint64_t u;
  if (varint(t, &u)) return -1;
  *out = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
  return 0;
}

static int rd_i64(pq_thrift *t, int64_t *out) {
  return zigzag(t, out);
}

static int rd_i32(pq_thrift *t, int *out) {
  int64_t v;
  if (zigzag(t, &v)) return -1;
  if (v < INT32_MIN || v > INT32_MAX) return fail(t, "i32 value %lld out of range", (long long)v);
  *out = (int)v;
  return 0;
}

static int rd_binary(pq_thrift *t, const uint8_t **s, size_t *n) {
  uint64_t len = 0;
  *s = NULL;
  *n = 0;
  if (varint(t, &len)) return -1;
  if (len > left(t)) {
    if (len > (uint64_t)CT_PQ_MAX_FOOTER)
      return fail(t, "string of %llu bytes", (unsigned long long)len);
    return truncated(t);
  }
  *s = t->p;
  *n = (size_t)len;
  t->p += len;
  return 0;
}

/* List/set header: element type and count (checked against the bytes left). */
static int rd_list(pq_thrift *t, int *etype, size_t *count) {
  if (t->p >= t->end) return truncated(t);
  uint8_t b = *t->p++;
  uint64_t n = b >> 4;
  *count = 0;
  if (n == 15 && varint(t, &n)) return -1;
  *etype = b & 0x0f;
  if (n > left(t)) {
    if (n > (uint64_t)CT_PQ_MAX_FOOTER)
      return fail(t, "list of %llu elements", (unsigned long long)n);
    return truncated(t);
  }
  *count = (size_t)n;
  return 0;
}

static int skip(pq_thrift *t, int type);

static int skip_struct(pq_thrift *t) {
  if (++t->depth > PQ_MAX_DEPTH) return fail(t, "structs nested deeper than %d", PQ_MAX_DEPTH);
  for (;;) {
    if (t->p >= t->end) return truncated(t);
    uint8_t b = *t->p++;
    if (b == 0) break;
    if ((b >> 4) == 0) {
      int64_t id;
      if (zigzag(t, &id)) return -1;
    }
    if (skip(t, b & 0x0f)) return -1;
  }
  t->depth--;
  return 0;
}

static int skip(pq_thrift *t, int type) {
  uint64_t u = 0;
  const uint8_t *s = NULL;
  size_t n = 0;
  int et = 0;
  switch (type) {
    case T_TRUE:
    case T_FALSE:
      return 0; /* the value is in the field header */
    case T_BYTE:
      if (t->p >= t->end) return truncated(t);
      t->p++;
      return 0;
    case T_I16:
    case T_I32:
    case T_I64:
      return varint(t, &u);
    case T_DOUBLE:
      if (left(t) < 8) return truncated(t);
      t->p += 8;
      return 0;
    case T_BINARY:
      return rd_binary(t, &s, &n);
    case T_LIST:
    case T_SET:
      if (rd_list(t, &et, &n)) return -1;
      if (++t->depth > PQ_MAX_DEPTH)
        return fail(t, "containers nested deeper than %d", PQ_MAX_DEPTH);
      for (size_t i = 0; i < n; i++) {
        /* booleans inside containers take one byte each */
        if (et == T_TRUE || et == T_FALSE) {
          if (t->p >= t->end) return truncated(t);
          t->p++;
        } else if (skip(t, et)) {
          return -1;
        }
      }
      t->depth--;
      return 0;
    case T_MAP: {
      if (varint(t, &u)) return -1;
      if (u == 0) return 0;
      if (t->p >= t->end) return truncated(t);
      uint8_t kv = *t->p++;
      if (u > left(t) / 2 + 1)
        return u > (uint64_t)CT_PQ_MAX_FOOTER
                   ? fail(t, "map of %llu entries", (unsigned long long)u)
                   : truncated(t);
      if (++t->depth > PQ_MAX_DEPTH)
        return fail(t, "containers nested deeper than %d", PQ_MAX_DEPTH);
      for (uint64_t i = 0; i < u; i++) {
        for (int k = 0; k < 2; k++) {
          int ty = k ? (kv & 0x0f) : (kv >> 4);
          if (ty == T_TRUE || ty == T_FALSE) {
            if (t->p >= t->end) return truncated(t);
            t->p++;
          } else if (skip(t, ty)) {
            return -1;
          }
        }
      }
      t->depth--;
      return 0;
    }
    case T_STRUCT:
      return skip_struct(t);
    default:
      return fail(t, "unknown Thrift type %d", type);
  }
}

/* Next field of the current struct: 1 (id/type set), 0 at STOP, -1 on error. */
static int field(pq_thrift *t, int *last, int *id, int *type) {
  if (t->p >= t->end) return truncated(t);
  uint8_t b = *t->p++;
  if (b == 0) return 0;
  int delta = b >> 4;
  if (delta) {
    *id = *last + delta;
  } else {
    int64_t v;
    if (zigzag(t, &v)) return -1;
    if (v < INT16_MIN || v > INT16_MAX) return fail(t, "field id %lld out of range", (long long)v);
    *id = (int)v;
  }
  *last = *id;
  *type = b & 0x0f;
  if (*type == T_STOP || *type > T_STRUCT) return fail(t, "unknown Thrift type %d", *type);
  return 1;
}

static int enter(pq_thrift *t) {
  if (++t->depth > PQ_MAX_DEPTH) return fail(t, "structs nested deeper than %d", PQ_MAX_DEPTH);
  return 0;
}

/* Struct-parser scaffolding: FIELD_LOOP opens the loop, I32/I64 read a field of
 * the right type and skip it otherwise. */
#define FIELD_LOOP                     \
  int last_ = 0, id_ = 0, ty_ = 0, r_; \
  if (enter(t)) return -1;             \
  while ((r_ = field(t, &last_, &id_, &ty_)) > 0)
#define FIELD_END        \
  if (r_ < 0) return -1; \
  t->depth--;            \
  return 0

static int get_i32(pq_thrift *t, int ty, int *out) {
  if (ty == T_I32 || ty == T_I16 || ty == T_BYTE) {
    if (ty == T_BYTE) {
      if (t->p >= t->end) return truncated(t);
      *out = (int8_t)*t->p++;
      return 0;
    }
    return rd_i32(t, out);
  }
  return skip(t, ty);
}

static int get_i64(pq_thrift *t, int ty, int64_t *out) {
  if (ty == T_I64 || ty == T_I32 || ty == T_I16) return rd_i64(t, out);
  return skip(t, ty);
}

static int get_bool(pq_thrift *t, int ty, int *out) {
  if (ty == T_TRUE || ty == T_FALSE) {
    *out = ty == T_TRUE;
    return 0;
  }
  return skip(t, ty);
}

/* LogicalType is a union: record which member is set (id + 1 in `logical`). */
static int parse_logical(pq_thrift *t, int *logical) {
  FIELD_LOOP {
    if (!*logical) *logical = id_ + 1;
    if (skip(t, ty_)) return -1;
  }
  FIELD_END;
}

static int parse_schema_el(pq_thrift *t, pq_schema_el *e) {
  e->type = -1;
  e->repetition = PQ_REQUIRED;
  e->converted_type = -1;
  FIELD_LOOP {
    int rc = 0;
    switch (id_) {
      case 1:
        rc = get_i32(t, ty_, &e->type);
        if (ty_ == T_I32) e->has_type = 1;
        break;
      case 2:
        rc = get_i32(t, ty_, &e->type_length);
        break;
      case 3:
        rc = get_i32(t, ty_, &e->repetition);
        break;
      case 4:
        if (ty_ == T_BINARY) {
          const uint8_t *s = NULL;
          size_t n = 0;
          if (rd_binary(t, &s, &n)) return -1;
          free(e->name);
          e->name = malloc(n + 1);
          if (!e->name) return fail(t, "out of memory");
          memcpy(e->name, s, n);
          e->name[n] = 0;
        } else {
          rc = skip(t, ty_);
        }
        break;
      case 5:
        rc = get_i32(t, ty_, &e->num_children);
        break;
      case 6:
        rc = get_i32(t, ty_, &e->converted_type);
        break;
      case 10:
        rc = ty_ == T_STRUCT ? parse_logical(t, &e->logical) : skip(t, ty_);
        break;
      default:
        rc = skip(t, ty_);
    }
    if (rc) return -1;
  }
  FIELD_END;
}

static int parse_col_meta(pq_thrift *t, pq_chunk *c) {
  c->has_meta = 1;
  FIELD_LOOP {
    int rc = 0;
    switch (id_) {
      case 1:
        rc = get_i32(t, ty_, &c->type);
        break;
      case 4:
        rc = get_i32(t, ty_, &c->codec);
        break;
      case 5:
        rc = get_i64(t, ty_, &c->num_values);
        break;
      case 6:
        rc = get_i64(t, ty_, &c->total_uncompressed_size);
        break;
      case 7:
        rc = get_i64(t, ty_, &c->total_compressed_size);
        break;
      case 9:
        rc = get_i64(t, ty_, &c->data_page_offset);
        break;
      case 11:
        rc = get_i64(t, ty_, &c->dictionary_page_offset);
        break;
      default:
        rc = skip(t, ty_);
    }
    if (rc) return -1;
  }
  FIELD_END;
}

static int parse_chunk(pq_thrift *t, pq_chunk *c) {
  c->type = c->codec = -1;
  c->num_values = c->total_compressed_size = c->total_uncompressed_size = -1;
  c->data_page_offset = c->dictionary_page_offset = -1;
  FIELD_LOOP {
    int rc = 0;
    if (id_ == 1 && ty_ == T_BINARY) c->has_file_path = 1;
    if (id_ == 3 && ty_ == T_STRUCT)
      rc = parse_col_meta(t, c);
    else
      rc = skip(t, ty_);
    if (rc) return -1;
  }
  FIELD_END;
}

static int parse_row_group(pq_thrift *t, pq_row_group *g) {
  g->num_rows = -1;
  FIELD_LOOP {
    int rc = 0;
    if (id_ == 1 && ty_ == T_LIST && !g->cols) {
      int et;
      size_t n;
      if (rd_list(t, &et, &n)) return -1;
      if (et != T_STRUCT) return fail(t, "RowGroup.columns holds Thrift type %d, not structs", et);
      g->cols = ct_calloc(CT_MEM_OTHER, n ? n : 1, sizeof *g->cols);
      if (!g->cols) return fail(t, "out of memory");
      g->ncols = (int)n;
      if (++t->depth > PQ_MAX_DEPTH) return fail(t, "nesting too deep");
      for (size_t i = 0; i < n; i++)
        if (parse_chunk(t, &g->cols[i])) return -1;
      t->depth--;
    } else if (id_ == 3) {
      rc = get_i64(t, ty_, &g->num_rows);
    } else {
      rc = skip(t, ty_);
    }
    if (rc) return -1;
  }
  FIELD_END;
}

int pq_parse_file_meta(pq_thrift *t, pq_meta *m) {
  m->num_rows = -1;
  FIELD_LOOP {
    int rc = 0, et;
    size_t n;
    if (id_ == 2 && ty_ == T_LIST && !m->schema) {
      if (rd_list(t, &et, &n)) return -1;
      if (et != T_STRUCT)
        return fail(t, "FileMetaData.schema holds Thrift type %d, not structs", et);
      if (n > INT32_MAX / 2) return fail(t, "%zu schema elements", n);
      m->schema = ct_calloc(CT_MEM_OTHER, n ? n : 1, sizeof *m->schema);
      if (!m->schema) return fail(t, "out of memory");
      m->nschema = (int)n;
      if (++t->depth > PQ_MAX_DEPTH) return fail(t, "nesting too deep");
      for (size_t i = 0; i < n; i++)
        if (parse_schema_el(t, &m->schema[i])) return -1;
      t->depth--;
    } else if (id_ == 4 && ty_ == T_LIST && !m->rgs) {
      if (rd_list(t, &et, &n)) return -1;
      if (et != T_STRUCT)
        return fail(t, "FileMetaData.row_groups holds Thrift type %d, not structs", et);
      if (n > INT32_MAX / 2) return fail(t, "%zu row groups", n);
      m->rgs = ct_calloc(CT_MEM_OTHER, n ? n : 1, sizeof *m->rgs);
      if (!m->rgs) return fail(t, "out of memory");
      m->nrg = (int)n;
      if (++t->depth > PQ_MAX_DEPTH) return fail(t, "nesting too deep");
      for (size_t i = 0; i < n; i++)
        if (parse_row_group(t, &m->rgs[i])) return -1;
      t->depth--;
    } else if (id_ == 3) {
      rc = get_i64(t, ty_, &m->num_rows);
    } else {
      rc = skip(t, ty_);
    }
    if (rc) return -1;
  }
  FIELD_END;
}

void pq_meta_free(pq_meta *m) {
  if (!m) return;
  for (int i = 0; m->schema && i < m->nschema; i++) free(m->schema[i].name);
  ct_free(m->schema);
  for (int i = 0; m->rgs && i < m->nrg; i++) ct_free(m->rgs[i].cols);
  ct_free(m->rgs);
  memset(m, 0, sizeof *m);
}

static int parse_dp(pq_thrift *t, pq_page_header *h) {
  h->has_dp = 1;
  FIELD_LOOP {
    int rc = 0;
    switch (id_) {
      case 1:
        rc = get_i64(t, ty_, &h->num_values);
        break;
      case 2:
        rc = get_i32(t, ty_, &h->encoding);
        break;
      case 3:
        rc = get_i32(t, ty_, &h->def_encoding);
        break;
      case 4:
        rc = get_i32(t, ty_, &h->rep_encoding);
        break;
      default:
        rc = skip(t, ty_);
    }
    if (rc) return -1;
  }
  FIELD_END;
}

static int parse_dp2(pq_thrift *t, pq_page_header *h) {
  h->has_dp2 = 1;
  FIELD_LOOP {
    int rc = 0;
    switch (id_) {
      case 1:
        rc = get_i64(t, ty_, &h->num_values);
        break;
      case 2:
        rc = get_i64(t, ty_, &h->num_nulls);
        break;
      case 3:
        rc = get_i64(t, ty_, &h->num_rows);
        break;
      case 4:
        rc = get_i32(t, ty_, &h->encoding);
        break;
      case 5:
        rc = get_i64(t, ty_, &h->def_len);
        break;
      case 6:
        rc = get_i64(t, ty_, &h->rep_len);
        break;
      case 7:
        rc = get_bool(t, ty_, &h->is_compressed);
        break;
      default:
        rc = skip(t, ty_);
    }
    if (rc) return -1;
  }
  FIELD_END;
}

static int parse_dict(pq_thrift *t, pq_page_header *h) {
  h->has_dict = 1;
  FIELD_LOOP {
    int rc = 0;
    switch (id_) {
      case 1:
        rc = get_i64(t, ty_, &h->num_values);
        break;
      case 2:
        rc = get_i32(t, ty_, &h->encoding);
        break;
      default:
        rc = skip(t, ty_);
    }
    if (rc) return -1;
  }
  FIELD_END;
}

int pq_parse_page_header(pq_thrift *t, pq_page_header *h) {
  memset(h, 0, sizeof *h);
  h->type = -1;
  h->uncompressed_size = h->compressed_size = -1;
  h->num_values = -1;
  h->encoding = h->def_encoding = h->rep_encoding = -1;
  h->is_compressed = 1;
  FIELD_LOOP {
    int rc = 0;
    switch (id_) {
      case 1:
        rc = get_i32(t, ty_, &h->type);
        break;
      case 2:
        rc = get_i64(t, ty_, &h->uncompressed_size);
        break;
      case 3:
        rc = get_i64(t, ty_, &h->compressed_size);
        break;
      case 5:
        rc = ty_ == T_STRUCT && !h->has_dp ? parse_dp(t, h) : skip(t, ty_);
        break;
      case 7:
        rc = ty_ == T_STRUCT && !h->has_dict ? parse_dict(t, h) : skip(t, ty_);
        break;
      case 8:
        rc = ty_ == T_STRUCT && !h->has_dp2 ? parse_dp2(t, h) : skip(t, ty_);
        break;
      default:
        rc = skip(t, ty_);
    }
    if (rc) return -1;
  }
  FIELD_END;
}
