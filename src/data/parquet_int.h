/* Private structures of the Parquet reader, shared by parquet_thrift.c (the
 * Thrift compact protocol and the footer/page-header structs), parquet.c
 * (open) and parquet_scan.c (pages, encodings, scan). Only the fields the
 * reader uses are kept. */
#ifndef CT_PARQUET_INT_H
#define CT_PARQUET_INT_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/parquet.h"

/* parquet.thrift enums (values fixed by the format). */
enum { PQ_BOOLEAN, PQ_INT32, PQ_INT64, PQ_INT96, PQ_FLOAT, PQ_DOUBLE, PQ_BYTE_ARRAY, PQ_FLBA };
enum { PQ_REQUIRED, PQ_OPTIONAL, PQ_REPEATED };
enum {
  PQ_ENC_PLAIN = 0,
  PQ_ENC_PLAIN_DICTIONARY = 2,
  PQ_ENC_RLE = 3,
  PQ_ENC_BIT_PACKED = 4,
  PQ_ENC_DELTA_BINARY_PACKED = 5,
  PQ_ENC_DELTA_LENGTH_BYTE_ARRAY = 6,
  PQ_ENC_DELTA_BYTE_ARRAY = 7,
  PQ_ENC_RLE_DICTIONARY = 8,
  PQ_ENC_BYTE_STREAM_SPLIT = 9
};
enum {
  PQ_CODEC_NONE,
  PQ_CODEC_SNAPPY,
  PQ_CODEC_GZIP,
  PQ_CODEC_LZO,
  PQ_CODEC_BROTLI,
  PQ_CODEC_LZ4,
  PQ_CODEC_ZSTD,
  PQ_CODEC_LZ4_RAW
};
enum { PQ_PAGE_DATA = 0, PQ_PAGE_INDEX = 1, PQ_PAGE_DICTIONARY = 2, PQ_PAGE_DATA_V2 = 3 };

/* Thrift compact protocol reader over one in-memory buffer. On failure `bad`
 * is set with a message in msg; `eof` additionally says the buffer ended
 * early (so a longer read may succeed). */
typedef struct pq_thrift {
  const uint8_t *p, *start, *end;
  int depth;
  int bad, eof;
  char msg[200];
} pq_thrift;

/* One schema element, as read. */
typedef struct pq_schema_el {
  char *name;
  int has_type, type, type_length, repetition, num_children, converted_type;
  int logical; /* LogicalType union member id + 1, 0 if absent */
} pq_schema_el;

/* One leaf column, derived from the schema. */
typedef struct pq_leaf {
  char *name; /* dotted path */
  int type, type_length;
  int max_def, max_rep;
  int converted_type, logical;
} pq_leaf;

typedef struct pq_chunk {
  int has_meta, has_file_path;
  int type, codec;
  int64_t num_values, total_compressed_size, total_uncompressed_size;
  int64_t data_page_offset, dictionary_page_offset; /* -1 if absent */
} pq_chunk;

typedef struct pq_row_group {
  int64_t num_rows;
  int ncols;
  pq_chunk *cols;
} pq_row_group;

typedef struct pq_meta {
  int64_t num_rows;
  int nschema;
  pq_schema_el *schema;
  int nrg;
  pq_row_group *rgs;
} pq_meta;

typedef struct pq_page_header {
  int type;
  int64_t uncompressed_size, compressed_size;
  /* DATA_PAGE / DATA_PAGE_V2 / DICTIONARY_PAGE */
  int has_dp, has_dp2, has_dict;
  int64_t num_values; /* of the present sub-header */
  int encoding, def_encoding, rep_encoding;
  int64_t num_nulls, num_rows, def_len, rep_len; /* v2 */
  int is_compressed;                             /* v2, default 1 */
} pq_page_header;

/* Parse FileMetaData from buf; 0 on success, else t->msg says why. */
int pq_parse_file_meta(pq_thrift *t, pq_meta *m);
void pq_meta_free(pq_meta *m);
/* Parse a PageHeader; 0 on success (t->p is then just past it). */
int pq_parse_page_header(pq_thrift *t, pq_page_header *h);
void pq_thrift_init(pq_thrift *t, const void *buf, size_t n);

/* ---- shared by parquet.c (open) and parquet_scan.c (pages, scan) ---- */

#define FIRST_HEADER_READ 1024 /* a page header's first read */

struct ct_parquet {
  ct_pq_source src;
  char name[512];
  int fd; /* ct_parquet_open's file, else -1 */
  const uint8_t *mem;
  uint64_t data_end; /* where the footer starts: chunks must end before it */
  pq_meta meta;
  int nleaf;
  pq_leaf *leaves;
};

/* n bytes at off through the source (in READ_PIECE calls). */
ct_status pq_read_range(ct_parquet *pq, uint64_t off, void *buf, size_t n, ct_err *err);
/* Names of a physical type, codec and encoding, for messages. */
const char *pq_type_name(int t);
const char *pq_codec_name(int c);
const char *pq_enc_name(int e);

#endif
