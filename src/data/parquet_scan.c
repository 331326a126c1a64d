/* parquet_scan.c: the Parquet reader's column scan (ct_parquet_scan): a
 * reader per selected column pulls one page at a time (header, body,
 * decompression, the chunk's dictionary) and decodes its values one at a time
 * with streaming decoders (RLE/bit-packed hybrid, DELTA_*, BYTE_STREAM_SPLIT),
 * every size and offset checked against what is left. parquet.c has the
 * design, open and the footer.
 */
#include <limits.h>
#include <snappy-c.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "ctuner/alloc.h"
#include "ctuner/parquet.h"
#include "data/parquet_int.h"

/* ---- bit-level decoders ---- */

static uint64_t get_bits(const uint8_t *base, uint64_t bitpos, int w) {
  uint64_t v = 0;
  int got = 0;
  while (got < w) {
    int sh = (int)(bitpos & 7);
    int take = 8 - sh < w - got ? 8 - sh : w - got;
    uint64_t b = (uint64_t)(base[bitpos >> 3] >> sh) & ((1u << take) - 1);
    v |= b << got;
    got += take;
    bitpos += (uint64_t)take;
  }
  return v;
}

static int uvarint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
  uint64_t v = 0;
  for (int i = 0; i < 10; i++) {
    if (*p >= end) return -1;
    uint8_t b = *(*p)++;
    v |= (uint64_t)(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      *out = v;
      return 0;
    }
  }
  return -1;
}

static int svarint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
  uint64_t u;
  if (uvarint(p, end, &u)) return -1;
  *out = (u >> 1) ^ (0 - (u & 1));
  return 0;
}

/* RLE / bit-packed hybrid (levels, dictionary indices, RLE booleans). */
typedef struct rle {
  const uint8_t *p, *end;
  int bw;
  uint64_t n; /* values left in the current run */
  int is_rle;
  uint64_t val;
  const uint8_t *bits;
  uint64_t bitpos;
} rle;

static void rle_init(rle *r, const uint8_t *p, const uint8_t *end, int bw) {
  memset(r, 0, sizeof *r);
  r->p = p;
  r->end = end;
  r->bw = bw;
}

static int rle_next(rle *r, uint64_t *out) {
  while (r->n == 0) {
    uint64_t h;
    if (uvarint(&r->p, r->end, &h)) return -1;
    size_t avail = (size_t)(r->end - r->p);
    if (h & 1) {
      uint64_t groups = h >> 1;
      if (groups > ((uint64_t)1 << 56)) groups = (uint64_t)1 << 56;
      uint64_t vals = groups * 8, bytes = groups * (uint64_t)r->bw;
      if (bytes > avail) { /* a short last run: only the values present */
        bytes = avail;
        vals = (uint64_t)avail * 8 / (uint64_t)r->bw;
      }
      r->is_rle = 0;
      r->bits = r->p;
      r->bitpos = 0;
      r->p += bytes;
      r->n = vals;
    } else {
      int nb = (r->bw + 7) / 8;
      if ((size_t)nb > avail) return -1;
      uint64_t v = 0;
      for (int i = 0; i < nb; i++) v |= (uint64_t)r->p[i] << (8 * i);
      r->p += nb;
      r->is_rle = 1;
      r->val = v;
      r->n = h >> 1;
    }
  }
  r->n--;
  if (r->is_rle) {
    *out = r->val;
  } else {
    *out = get_bits(r->bits, r->bitpos, r->bw);
    r->bitpos += (uint64_t)r->bw;
  }
  return 0;
}

static int bit_width(uint64_t max) {
  int w = 0;
  while (max) {
    w++;
    max >>= 1;
  }
  return w;
}

/* DELTA_BINARY_PACKED, streamed one miniblock at a time. */
typedef struct dbp {
  const uint8_t *p, *end;
  uint64_t per_mini, nmini, total, emitted;
  uint64_t last, min_delta;
  const uint8_t *widths;
  uint64_t mini; /* next miniblock of the current block */
  const uint8_t *mbits;
  uint64_t mbitpos, mbits_len, mleft;
  int w;
} dbp;

static int dbp_init(dbp *d, const uint8_t *p, const uint8_t *end) {
  memset(d, 0, sizeof *d);
  uint64_t block, nmini, total, first;
  if (uvarint(&p, end, &block) || uvarint(&p, end, &nmini) || uvarint(&p, end, &total) ||
      svarint(&p, end, &first))
    return -1;
  if (block == 0 || block % 128 || block > (1u << 20) || nmini == 0 || block % nmini ||
      (block / nmini) % 32)
    return -1;
  d->p = p;
  d->end = end;
  d->per_mini = block / nmini;
  d->nmini = nmini;
  d->total = total;
  d->last = first;
  d->mini = nmini; /* forces a block header before the first miniblock */
  return 0;
}

static int dbp_next(dbp *d, uint64_t *out) {
  if (d->emitted >= d->total) return -1;
  if (d->emitted++ == 0) {
    *out = d->last;
    return 0;
  }
  if (d->mleft == 0) {
    if (d->mini == d->nmini) {
      if (svarint(&d->p, d->end, &d->min_delta)) return -1;
      if ((uint64_t)(d->end - d->p) < d->nmini) return -1;
      d->widths = d->p;
      d->p += d->nmini;
      d->mini = 0;
    }
    d->w = d->widths[d->mini++];
    if (d->w > 64) return -1;
    uint64_t bytes = d->per_mini * (uint64_t)d->w / 8, avail = (uint64_t)(d->end - d->p);
    if (bytes > avail) bytes = avail;
    d->mbits = d->p;
    d->mbitpos = 0;
    d->mbits_len = bytes * 8;
    d->p += bytes;
    d->mleft = d->per_mini;
  }
  if (d->mbitpos + (uint64_t)d->w > d->mbits_len) return -1;
  uint64_t v = get_bits(d->mbits, d->mbitpos, d->w);
  d->mbitpos += (uint64_t)d->w;
  d->mleft--;
  d->last += d->min_delta + v;
  *out = d->last;
  return 0;
}

/* Where a DELTA_BINARY_PACKED run starting at p ends (walking block headers). */
static int dbp_end(const uint8_t *p, const uint8_t *end, const uint8_t **out) {
  dbp d;
  if (dbp_init(&d, p, end)) return -1;
  uint64_t remaining = d.total ? d.total - 1 : 0;
  p = d.p;
  while (remaining) {
    uint64_t md;
    if (svarint(&p, end, &md)) return -1;
    if ((uint64_t)(end - p) < d.nmini) return -1;
    const uint8_t *w = p;
    p += d.nmini;
    for (uint64_t m = 0; m < d.nmini && remaining; m++) {
      if (w[m] > 64) return -1;
      uint64_t bytes = d.per_mini * w[m] / 8;
      if (bytes > (uint64_t)(end - p)) return -1;
      p += bytes;
      remaining -= remaining < d.per_mini ? remaining : d.per_mini;
    }
  }
  *out = p;
  return 0;
}

/* ---- column reader ---- */

typedef struct colrd {
  ct_parquet *pq;
  int col, rg;
  const pq_leaf *lf;
  const pq_chunk *ch;
  uint64_t pos, end;
  int page_no;
  int64_t page_left; /* values (incl. nulls) left in the current data page */
  /* buffers, reused across pages (CT_MEM_BUFFERS) */
  uint8_t *hbuf, *cbuf, *pbuf, *dbuf, *vbuf;
  size_t hcap, ccap, pcap, dcap, vcap;
  uint32_t *doff;
  size_t doffcap;
  /* dictionary */
  int have_dict;
  uint64_t dict_n;
  size_t dict_len;
  /* levels and values of the current page */
  rle def;
  int enc;
  const uint8_t *vp, *vend;
  uint64_t bitpos; /* PLAIN booleans */
  rle idx;         /* dictionary indices / RLE booleans */
  int idx_ready;
  dbp d1, d2;      /* DELTA_*: lengths/prefixes, suffix lengths */
  size_t prev_len; /* DELTA_BYTE_ARRAY */
  uint64_t bss_n, bss_i;
} colrd;

__attribute__((format(printf, 4, 5))) static ct_status cerr(colrd *rd, ct_err *err, ct_status st,
                                                            const char *fmt, ...) {
  char m[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  return ct_errf(err, st, "%s: column '%s' row group %d: %s", rd->pq->name, rd->lf->name, rd->rg,
                 m);
}

static int grow(uint8_t **buf, size_t *cap, size_t n) {
  if (n <= *cap && *buf) return 0;
  ct_free(*buf);
  *cap = 0;
  *buf = ct_alloc(CT_MEM_BUFFERS, n ? n : 1);
  if (!*buf) return -1;
  *cap = n ? n : 1;
  return 0;
}

static void colrd_free(colrd *rd) {
  ct_free(rd->hbuf);
  ct_free(rd->cbuf);
  ct_free(rd->pbuf);
  ct_free(rd->dbuf);
  ct_free(rd->vbuf);
  ct_free(rd->doff);
}

static ct_status chunk_open(colrd *rd, int rg, ct_err *err) {
  ct_parquet *pq = rd->pq;
  rd->rg = rg;
  rd->ch = &pq->meta.rgs[rg].cols[rd->col];
  const pq_chunk *c = rd->ch;
  rd->page_left = 0;
  rd->page_no = 0;
  rd->have_dict = 0;
  rd->dict_n = 0;
  if (!c->has_meta) return cerr(rd, err, CT_ERR_FORMAT, "column chunk has no ColumnMetaData");
  if (c->has_file_path)
    return cerr(rd, err, CT_ERR_UNSUPPORTED, "column chunk is stored in another file (file_path)");
  if (c->type != rd->lf->type)
    return cerr(rd, err, CT_ERR_FORMAT, "column chunk has type %s (%d), the schema %s",
                pq_type_name(c->type), c->type, pq_type_name(rd->lf->type));
  if (c->codec != PQ_CODEC_NONE && c->codec != PQ_CODEC_SNAPPY && c->codec != PQ_CODEC_GZIP &&
      c->codec != PQ_CODEC_ZSTD)
    return cerr(
        rd, err, CT_ERR_UNSUPPORTED,
        "compression %s (%d) is not supported (supported: UNCOMPRESSED, SNAPPY, GZIP, ZSTD)",
        pq_codec_name(c->codec), c->codec);
  int64_t start = c->data_page_offset;
  if (c->dictionary_page_offset >= 4 && c->dictionary_page_offset < start)
    start = c->dictionary_page_offset;
  if (start < 4 || (uint64_t)start >= pq->data_end || c->total_compressed_size < 0 ||
      (uint64_t)c->total_compressed_size > pq->data_end - (uint64_t)start)
    return cerr(rd, err, CT_ERR_FORMAT,
                "column chunk at offset %lld of %lld bytes is outside the data area [4, %llu)",
                (long long)start, (long long)c->total_compressed_size,
                (unsigned long long)pq->data_end);
  rd->pos = (uint64_t)start;
  rd->end = (uint64_t)start + (uint64_t)c->total_compressed_size;
  return CT_OK;
}

/* Decompress exactly dst_n bytes into dst. */
static ct_status decompress(colrd *rd, const uint8_t *src, size_t n, uint8_t *dst, size_t dst_n,
                            ct_err *err) {
  int codec = rd->ch->codec;
  if (codec == PQ_CODEC_SNAPPY) {
    size_t len;
    if (snappy_uncompressed_length((const char *)src, n, &len) != SNAPPY_OK || len != dst_n)
      return cerr(rd, err, CT_ERR_FORMAT, "page %d: snappy data is corrupt or not %zu bytes long",
                  rd->page_no, dst_n);
    if (dst_n == 0) return CT_OK;
    if (snappy_uncompress((const char *)src, n, (char *)dst, &len) != SNAPPY_OK || len != dst_n)
      return cerr(rd, err, CT_ERR_FORMAT, "page %d: corrupt snappy data", rd->page_no);
    return CT_OK;
  }
  if (codec == PQ_CODEC_ZSTD) {
    size_t r = ZSTD_decompress(dst, dst_n, src, n);
    if (ZSTD_isError(r))
      return cerr(rd, err, CT_ERR_FORMAT, "page %d: zstd: %s", rd->page_no, ZSTD_getErrorName(r));
    if (r != dst_n)
      return cerr(rd, err, CT_ERR_FORMAT, "page %d: zstd gave %zu bytes, the header says %zu",
                  rd->page_no, r, dst_n);
    return CT_OK;
  }
  /* GZIP: gzip or zlib framing (auto-detected), raw deflate as a fallback;
   * concatenated gzip members are joined. */
  if (dst_n == 0) return CT_OK;
  if (n > UINT_MAX || dst_n > UINT_MAX)
    return cerr(rd, err, CT_ERR_FORMAT, "page %d: gzip page too large", rd->page_no);
  for (int attempt = 0; attempt < 2; attempt++) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, attempt ? -15 : 15 + 32) != Z_OK)
      return cerr(rd, err, CT_ERR_NOMEM, "page %d: zlib init failed", rd->page_no);
    zs.next_in = (Bytef *)src;
    zs.avail_in = (uInt)n;
    zs.next_out = dst;
    zs.avail_out = (uInt)dst_n;
    int zr;
    for (;;) {
      zr = inflate(&zs, Z_FINISH);
      if (zr == Z_STREAM_END && zs.avail_in > 0 && zs.avail_out > 0 && !attempt) {
        if (inflateReset(&zs) != Z_OK) break;
        continue;
      }
      break;
    }
    size_t got = dst_n - zs.avail_out;
    inflateEnd(&zs);
    if (zr == Z_STREAM_END && got == dst_n) return CT_OK;
    if (!attempt && zr == Z_DATA_ERROR && got == 0) continue; /* maybe raw deflate */
    break;
  }
  return cerr(rd, err, CT_ERR_FORMAT, "page %d: gzip data is corrupt or not %zu bytes long",
              rd->page_no, dst_n);
}

/* Read a page body of `csize` bytes at off and leave `usize` decompressed
 * bytes in rd->pbuf; the first `keep` bytes are stored uncompressed (v2
 * levels). */
static ct_status load_body(colrd *rd, uint64_t off, size_t csize, size_t usize, size_t keep,
                           int compressed, ct_err *err) {
  ct_status st;
  if (grow(&rd->pbuf, &rd->pcap, usize))
    return cerr(rd, err, CT_ERR_NOMEM, "out of memory for a %zu-byte page", usize);
  if (!compressed) {
    if (csize != usize)
      return cerr(rd, err, CT_ERR_FORMAT,
                  "page %d: uncompressed page has compressed size %zu but uncompressed size %zu",
                  rd->page_no, csize, usize);
    return pq_read_range(rd->pq, off, rd->pbuf, usize, err);
  }
  if (keep > csize || keep > usize)
    return cerr(rd, err, CT_ERR_FORMAT, "page %d: level bytes (%zu) exceed the page (%zu/%zu)",
                rd->page_no, keep, csize, usize);
  if (grow(&rd->cbuf, &rd->ccap, csize))
    return cerr(rd, err, CT_ERR_NOMEM, "out of memory for a %zu-byte page", csize);
  if ((st = pq_read_range(rd->pq, off, rd->cbuf, csize, err))) return st;
  memcpy(rd->pbuf, rd->cbuf, keep);
  return decompress(rd, rd->cbuf + keep, csize - keep, rd->pbuf + keep, usize - keep, err);
}

static size_t fixed_size(const pq_leaf *l) {
  switch (l->type) {
    case PQ_INT32:
    case PQ_FLOAT:
      return 4;
    case PQ_INT64:
    case PQ_DOUBLE:
      return 8;
    case PQ_INT96:
      return 12;
    case PQ_FLBA:
      return (size_t)l->type_length;
    default:
      return 0; /* BOOLEAN (bits), BYTE_ARRAY (variable) */
  }
}

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) {
  return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* A fixed-size value (not BOOLEAN/BYTE_ARRAY) from its bytes. */
static void fixed_value(const pq_leaf *l, const uint8_t *p, ct_pq_value *v) {
  switch (l->type) {
    case PQ_INT32: {
      uint32_t u = le32(p);
      v->kind = CT_PQ_INT;
      int ct = l->converted_type;
      v->i = (ct >= 11 && ct <= 13) ? (int64_t)u : (int64_t)(int32_t)u; /* UINT_8/16/32 */
      break;
    }
    case PQ_INT64:
      v->kind = CT_PQ_INT;
      v->i = (int64_t)le64(p);
      break;
    case PQ_FLOAT: {
      uint32_t u = le32(p);
      float f;
      memcpy(&f, &u, 4);
      v->kind = CT_PQ_DOUBLE;
      v->d = f;
      break;
    }
    case PQ_DOUBLE: {
      uint64_t u = le64(p);
      memcpy(&v->d, &u, 8);
      v->kind = CT_PQ_DOUBLE;
      break;
    }
    default:
      v->kind = CT_PQ_BYTES;
      v->s = (const char *)p;
      v->len = fixed_size(l);
  }
}

static ct_status load_dict(colrd *rd, const pq_page_header *h, ct_err *err) {
  const pq_leaf *l = rd->lf;
  if (!h->has_dict || h->num_values < 0)
    return cerr(rd, err, CT_ERR_FORMAT,
                "page %d: dictionary page without a valid DictionaryPageHeader", rd->page_no);
  if (h->encoding != PQ_ENC_PLAIN && h->encoding != PQ_ENC_PLAIN_DICTIONARY)
    return cerr(rd, err, CT_ERR_UNSUPPORTED,
                "page %d: dictionary page encoding %s is not supported", rd->page_no,
                pq_enc_name(h->encoding));
  /* the decompressed page is in pbuf: keep it as the dictionary */
  uint8_t *tmp = rd->dbuf;
  size_t tcap = rd->dcap;
  rd->dbuf = rd->pbuf;
  rd->dcap = rd->pcap;
  rd->pbuf = tmp;
  rd->pcap = tcap;
  size_t n = (size_t)h->uncompressed_size;
  uint64_t nv = (uint64_t)h->num_values;
  rd->dict_len = n;
  if (l->type == PQ_BYTE_ARRAY) {
    if (nv > n / 4)
      return cerr(rd, err, CT_ERR_FORMAT, "dictionary claims %llu strings in %zu bytes",
                  (unsigned long long)nv, n);
    if (nv > rd->doffcap || !rd->doff) {
      ct_free(rd->doff);
      rd->doffcap = 0;
      rd->doff = ct_alloc(CT_MEM_BUFFERS, (size_t)(nv ? nv : 1) * sizeof(uint32_t));
      if (!rd->doff) return cerr(rd, err, CT_ERR_NOMEM, "out of memory for the dictionary");
      rd->doffcap = (size_t)nv;
    }
    size_t off = 0;
    for (uint64_t i = 0; i < nv; i++) {
      if (n - off < 4)
        return cerr(rd, err, CT_ERR_FORMAT, "dictionary string %llu is past the page end",
                    (unsigned long long)i);
      uint32_t len = le32(rd->dbuf + off);
      if (len > n - off - 4)
        return cerr(rd, err, CT_ERR_FORMAT,
                    "dictionary string %llu of %u bytes is past the page end",
                    (unsigned long long)i, len);
      rd->doff[i] = (uint32_t)off;
      off += 4 + (size_t)len;
    }
  } else if (l->type == PQ_BOOLEAN) {
    if (nv > (uint64_t)n * 8)
      return cerr(rd, err, CT_ERR_FORMAT, "dictionary claims %llu booleans in %zu bytes",
                  (unsigned long long)nv, n);
  } else {
    size_t sz = fixed_size(l);
    if (nv > n / sz)
      return cerr(rd, err, CT_ERR_FORMAT, "dictionary claims %llu values of %zu bytes in %zu bytes",
                  (unsigned long long)nv, sz, n);
  }
  rd->dict_n = nv;
  rd->have_dict = 1;
  return CT_OK;
}

static ct_status setup_values(colrd *rd, int enc, const uint8_t *p, const uint8_t *end,
                              ct_err *err) {
  const pq_leaf *l = rd->lf;
  int t = l->type;
  rd->enc = enc;
  rd->vp = p;
  rd->vend = end;
  rd->bitpos = 0;
  rd->idx_ready = 0;
  int ok = 1;
  switch (enc) {
    case PQ_ENC_PLAIN:
      break;
    case PQ_ENC_PLAIN_DICTIONARY:
    case PQ_ENC_RLE_DICTIONARY:
      if (!rd->have_dict)
        return cerr(rd, err, CT_ERR_FORMAT,
                    "page %d: dictionary-encoded page but no dictionary page", rd->page_no);
      break;
    case PQ_ENC_RLE:
      if (t != PQ_BOOLEAN) {
        ok = 0;
        break;
      }
      if (end - p < 4 || le32(p) > (uint64_t)(end - p - 4))
        return cerr(rd, err, CT_ERR_FORMAT,
                    "page %d: RLE boolean length prefix is past the page end", rd->page_no);
      rle_init(&rd->idx, p + 4, p + 4 + le32(p), 1);
      rd->idx_ready = 1;
      break;
    case PQ_ENC_DELTA_BINARY_PACKED:
      if (t != PQ_INT32 && t != PQ_INT64) {
        ok = 0;
        break;
      }
      if (p < end && dbp_init(&rd->d1, p, end))
        return cerr(rd, err, CT_ERR_FORMAT, "page %d: bad DELTA_BINARY_PACKED header", rd->page_no);
      if (p == end) memset(&rd->d1, 0, sizeof rd->d1);
      break;
    case PQ_ENC_DELTA_LENGTH_BYTE_ARRAY:
    case PQ_ENC_DELTA_BYTE_ARRAY: {
      if (t != PQ_BYTE_ARRAY && !(enc == PQ_ENC_DELTA_BYTE_ARRAY && t == PQ_FLBA)) {
        ok = 0;
        break;
      }
      memset(&rd->d1, 0, sizeof rd->d1);
      memset(&rd->d2, 0, sizeof rd->d2);
      rd->prev_len = 0;
      if (p == end) break; /* all nulls */
      const uint8_t *q;
      if (dbp_init(&rd->d1, p, end) || dbp_end(p, end, &q))
        return cerr(rd, err, CT_ERR_FORMAT, "page %d: bad %s lengths", rd->page_no,
                    pq_enc_name(enc));
      if (enc == PQ_ENC_DELTA_BYTE_ARRAY) {
        const uint8_t *q2;
        if (dbp_init(&rd->d2, q, end) || dbp_end(q, end, &q2))
          return cerr(rd, err, CT_ERR_FORMAT, "page %d: bad DELTA_BYTE_ARRAY suffix lengths",
                      rd->page_no);
        q = q2;
      }
      rd->vp = q;
      break;
    }
    case PQ_ENC_BYTE_STREAM_SPLIT: {
      size_t k = fixed_size(l);
      if (!k) {
        ok = 0;
        break;
      }
      size_t nb = (size_t)(end - p);
      if (nb % k)
        return cerr(rd, err, CT_ERR_FORMAT,
                    "page %d: BYTE_STREAM_SPLIT data of %zu bytes is not a "
                    "multiple of %zu",
                    rd->page_no, nb, k);
      rd->bss_n = nb / k;
      rd->bss_i = 0;
      break;
    }
    default:
      return cerr(rd, err, CT_ERR_UNSUPPORTED, "page %d: encoding %s (%d) is not supported",
                  rd->page_no, pq_enc_name(enc), enc);
  }
  if (!ok)
    return cerr(rd, err, CT_ERR_UNSUPPORTED, "page %d: encoding %s is not supported for %s",
                rd->page_no, pq_enc_name(enc), pq_type_name(t));
  return CT_OK;
}

/* Reads the next page header; loads dictionary pages, skips index pages, and
 * stops at the next data page (levels and value decoder set up). */
static ct_status load_page(colrd *rd, ct_err *err) {
  ct_status st;
  ct_parquet *pq = rd->pq;
  for (;;) {
    if (rd->pos >= rd->end)
      return cerr(rd, err, CT_ERR_FORMAT,
                  "column chunk ends after %d pages with rows still missing (row group has %lld)",
                  rd->page_no, (long long)pq->meta.rgs[rd->rg].num_rows);
    uint64_t room = rd->end - rd->pos;
    size_t n = room < FIRST_HEADER_READ ? (size_t)room : FIRST_HEADER_READ;
    pq_page_header h;
    pq_thrift t;
    for (;;) {
      if (grow(&rd->hbuf, &rd->hcap, n))
        return cerr(rd, err, CT_ERR_NOMEM, "out of memory for a page header");
      if ((st = pq_read_range(pq, rd->pos, rd->hbuf, n, err))) return st;
      pq_thrift_init(&t, rd->hbuf, n);
      if (!pq_parse_page_header(&t, &h)) break;
      if (!t.eof || n >= room || n >= CT_PQ_MAX_PAGE_HEADER)
        return cerr(rd, err, CT_ERR_FORMAT, "page %d header at offset %llu: %s", rd->page_no,
                    (unsigned long long)rd->pos, t.msg);
      n = room < (uint64_t)n * 2 ? (size_t)room : n * 2;
      if (n > CT_PQ_MAX_PAGE_HEADER) n = CT_PQ_MAX_PAGE_HEADER;
    }
    size_t hlen = (size_t)(t.p - t.start);
    uint64_t left = room - hlen;
    if (h.compressed_size < 0 || h.uncompressed_size < 0)
      return cerr(rd, err, CT_ERR_FORMAT, "page %d header lacks valid page sizes", rd->page_no);
    if ((uint64_t)h.compressed_size > left)
      return cerr(rd, err, CT_ERR_FORMAT,
                  "page %d header claims %lld bytes, more than the %llu left in the chunk",
                  rd->page_no, (long long)h.compressed_size, (unsigned long long)left);
    if (h.compressed_size > CT_PQ_MAX_PAGE || h.uncompressed_size > CT_PQ_MAX_PAGE)
      return cerr(rd, err, CT_ERR_FORMAT,
                  "page %d of %lld bytes (%lld uncompressed) is over the %u-byte limit",
                  rd->page_no, (long long)h.compressed_size, (long long)h.uncompressed_size,
                  CT_PQ_MAX_PAGE);
    uint64_t body = rd->pos + hlen;
    size_t csize = (size_t)h.compressed_size, usize = (size_t)h.uncompressed_size;
    rd->pos = body + csize;
    int compressed = rd->ch->codec != PQ_CODEC_NONE;
    if (h.type == PQ_PAGE_DICTIONARY) {
      if ((st = load_body(rd, body, csize, usize, 0, compressed, err))) return st;
      if ((st = load_dict(rd, &h, err))) return st;
      rd->page_no++;
      continue;
    }
    if (h.type != PQ_PAGE_DATA && h.type != PQ_PAGE_DATA_V2) { /* index or unknown: skip */
      rd->page_no++;
      continue;
    }
    int v2 = h.type == PQ_PAGE_DATA_V2;
    if ((v2 && !h.has_dp2) || (!v2 && !h.has_dp) || h.num_values < 0 || h.num_values > INT32_MAX)
      return cerr(rd, err, CT_ERR_FORMAT, "page %d: data page without a valid %s", rd->page_no,
                  v2 ? "DataPageHeaderV2" : "DataPageHeader");
    const pq_leaf *l = rd->lf;
    const uint8_t *p, *end;
    if (!v2) {
      if ((st = load_body(rd, body, csize, usize, 0, compressed, err))) return st;
      p = rd->pbuf;
      end = p + usize;
      if (l->max_def > 0) {
        if (h.def_encoding != PQ_ENC_RLE)
          return cerr(rd, err, CT_ERR_UNSUPPORTED,
                      "page %d: definition levels encoded as %s (only RLE)", rd->page_no,
                      pq_enc_name(h.def_encoding));
        if (end - p < 4 || le32(p) > (uint64_t)(end - p - 4))
          return cerr(rd, err, CT_ERR_FORMAT,
                      "page %d: definition levels length is past the page end", rd->page_no);
        uint32_t dl = le32(p);
        rle_init(&rd->def, p + 4, p + 4 + dl, bit_width((uint64_t)l->max_def));
        p += 4 + dl;
      }
    } else {
      if (h.def_len < 0 || h.rep_len < 0 || h.def_len > h.compressed_size ||
          h.rep_len > h.compressed_size - h.def_len || h.def_len + h.rep_len > h.uncompressed_size)
        return cerr(rd, err, CT_ERR_FORMAT,
                    "page %d: level lengths (%lld + %lld) exceed the page (%zu bytes)", rd->page_no,
                    (long long)h.rep_len, (long long)h.def_len, csize);
      size_t keep = (size_t)(h.def_len + h.rep_len);
      if ((st = load_body(rd, body, csize, usize, keep, compressed && h.is_compressed, err)))
        return st;
      p = rd->pbuf + h.rep_len;
      end = rd->pbuf + usize;
      if (l->max_def > 0) rle_init(&rd->def, p, p + h.def_len, bit_width((uint64_t)l->max_def));
      p += h.def_len;
    }
    if ((st = setup_values(rd, h.encoding, p, end, err))) return st;
    rd->page_left = h.num_values;
    rd->page_no++;
    if (rd->page_left > 0) return CT_OK;
  }
}

static ct_status next_bytes(colrd *rd, const uint8_t **s, size_t *len, ct_err *err) {
  size_t avail = (size_t)(rd->vend - rd->vp);
  if (*len > avail)
    return cerr(rd, err, CT_ERR_FORMAT,
                "page %d: value of %zu bytes is past the page end (%zu left)", rd->page_no - 1,
                *len, avail);
  *s = rd->vp;
  rd->vp += *len;
  return CT_OK;
}

static ct_status decode_value(colrd *rd, ct_pq_value *v, ct_err *err) {
  const pq_leaf *l = rd->lf;
  int pg = rd->page_no - 1;
  uint64_t u;
  switch (rd->enc) {
    case PQ_ENC_PLAIN:
      if (l->type == PQ_BOOLEAN) {
        if (rd->bitpos >= (uint64_t)(rd->vend - rd->vp) * 8) goto short_page;
        v->kind = CT_PQ_BOOL;
        v->i = (rd->vp[rd->bitpos >> 3] >> (rd->bitpos & 7)) & 1;
        rd->bitpos++;
      } else if (l->type == PQ_BYTE_ARRAY) {
        if (rd->vend - rd->vp < 4) goto short_page;
        size_t len = le32(rd->vp);
        rd->vp += 4;
        const uint8_t *s = NULL;
        ct_status st = next_bytes(rd, &s, &len, err);
        if (st) return st;
        v->kind = CT_PQ_BYTES;
        v->s = (const char *)s;
        v->len = len;
      } else {
        size_t k = fixed_size(l);
        if ((size_t)(rd->vend - rd->vp) < k) goto short_page;
        fixed_value(l, rd->vp, v);
        rd->vp += k;
      }
      return CT_OK;
    case PQ_ENC_PLAIN_DICTIONARY:
    case PQ_ENC_RLE_DICTIONARY:
      if (!rd->idx_ready) {
        if (rd->vp >= rd->vend) goto short_page;
        int bw = rd->vp[0];
        if (bw > 32)
          return cerr(rd, err, CT_ERR_FORMAT, "page %d: dictionary index bit width %d", pg, bw);
        rle_init(&rd->idx, rd->vp + 1, rd->vend, bw);
        rd->idx_ready = 1;
      }
      if (rle_next(&rd->idx, &u)) goto short_page;
      if (u >= rd->dict_n)
        return cerr(rd, err, CT_ERR_FORMAT,
                    "page %d: dictionary index %llu, the dictionary has %llu entries", pg,
                    (unsigned long long)u, (unsigned long long)rd->dict_n);
      if (l->type == PQ_BYTE_ARRAY) {
        uint32_t off = rd->doff[u];
        v->kind = CT_PQ_BYTES;
        v->s = (const char *)rd->dbuf + off + 4;
        v->len = le32(rd->dbuf + off);
      } else if (l->type == PQ_BOOLEAN) {
        v->kind = CT_PQ_BOOL;
        v->i = (rd->dbuf[u >> 3] >> (u & 7)) & 1;
      } else {
        fixed_value(l, rd->dbuf + u * fixed_size(l), v);
      }
      return CT_OK;
    case PQ_ENC_RLE:
      if (rle_next(&rd->idx, &u)) goto short_page;
      v->kind = CT_PQ_BOOL;
      v->i = (int64_t)(u & 1);
      return CT_OK;
    case PQ_ENC_DELTA_BINARY_PACKED:
      if (dbp_next(&rd->d1, &u)) goto short_page;
      v->kind = CT_PQ_INT;
      v->i = l->type == PQ_INT32 ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
      if (l->type == PQ_INT32 && l->converted_type >= 11 && l->converted_type <= 13)
        v->i = (int64_t)(uint32_t)u;
      return CT_OK;
    case PQ_ENC_DELTA_LENGTH_BYTE_ARRAY: {
      if (dbp_next(&rd->d1, &u)) goto short_page;
      size_t len = (size_t)(uint32_t)u;
      if ((int32_t)(uint32_t)u < 0)
        return cerr(rd, err, CT_ERR_FORMAT, "page %d: negative string length", pg);
      const uint8_t *s = NULL;
      ct_status st = next_bytes(rd, &s, &len, err);
      if (st) return st;
      v->kind = CT_PQ_BYTES;
      v->s = (const char *)s;
      v->len = len;
      return CT_OK;
    }
    case PQ_ENC_DELTA_BYTE_ARRAY: {
      uint64_t pre, suf;
      if (dbp_next(&rd->d1, &pre) || dbp_next(&rd->d2, &suf)) goto short_page;
      if ((int32_t)(uint32_t)pre < 0 || (int32_t)(uint32_t)suf < 0 || (uint32_t)pre > rd->prev_len)
        return cerr(rd, err, CT_ERR_FORMAT,
                    "page %d: DELTA_BYTE_ARRAY prefix %lld / suffix %lld invalid (previous value "
                    "%zu bytes)",
                    pg, (long long)(int32_t)(uint32_t)pre, (long long)(int32_t)(uint32_t)suf,
                    rd->prev_len);
      size_t plen = (uint32_t)pre, slen = (uint32_t)suf;
      const uint8_t *s = NULL;
      ct_status st = next_bytes(rd, &s, &slen, err);
      if (st) return st;
      if (plen + slen > rd->vcap || !rd->vbuf) {
        size_t ncap = (plen + slen) * 2 + 64;
        uint8_t *nb = ct_alloc(CT_MEM_BUFFERS, ncap);
        if (!nb) return cerr(rd, err, CT_ERR_NOMEM, "out of memory");
        if (rd->vbuf) memcpy(nb, rd->vbuf, plen);
        ct_free(rd->vbuf);
        rd->vbuf = nb;
        rd->vcap = ncap;
      }
      memcpy(rd->vbuf + plen, s, slen);
      rd->prev_len = plen + slen;
      if (l->type == PQ_FLBA && rd->prev_len != (size_t)l->type_length)
        return cerr(rd, err, CT_ERR_FORMAT,
                    "page %d: value of %zu bytes in a FIXED_LEN_BYTE_ARRAY(%d)", pg, rd->prev_len,
                    l->type_length);
      v->kind = CT_PQ_BYTES;
      v->s = (const char *)rd->vbuf;
      v->len = rd->prev_len;
      return CT_OK;
    }
    case PQ_ENC_BYTE_STREAM_SPLIT: {
      if (rd->bss_i >= rd->bss_n) goto short_page;
      size_t k = fixed_size(l);
      uint8_t tmp[64], *buf = tmp;
      if (k > sizeof tmp) { /* long FLBA: assemble in vbuf */
        if (grow(&rd->vbuf, &rd->vcap, k)) return cerr(rd, err, CT_ERR_NOMEM, "out of memory");
        buf = rd->vbuf;
      }
      for (size_t j = 0; j < k; j++) buf[j] = rd->vp[j * rd->bss_n + rd->bss_i];
      rd->bss_i++;
      fixed_value(l, buf, v);
      return CT_OK;
    }
    default:
      return cerr(rd, err, CT_ERR_INTERNAL, "encoding %d", rd->enc);
  }
short_page:
  return cerr(rd, err, CT_ERR_FORMAT, "page %d: %s values end before the page's value count", pg,
              pq_enc_name(rd->enc));
}

static ct_status next_value(colrd *rd, ct_pq_value *v, ct_err *err) {
  ct_status st;
  while (rd->page_left <= 0)
    if ((st = load_page(rd, err))) return st;
  rd->page_left--;
  memset(v, 0, sizeof *v);
  if (rd->lf->max_def > 0) {
    uint64_t d;
    if (rle_next(&rd->def, &d))
      return cerr(rd, err, CT_ERR_FORMAT,
                  "page %d: definition levels end before the page's value count", rd->page_no - 1);
    if (d > (uint64_t)rd->lf->max_def)
      return cerr(rd, err, CT_ERR_FORMAT, "page %d: definition level %llu above the maximum %d",
                  rd->page_no - 1, (unsigned long long)d, rd->lf->max_def);
    if (d < (uint64_t)rd->lf->max_def) {
      v->kind = CT_PQ_NULL;
      return CT_OK;
    }
  }
  return decode_value(rd, v, err);
}

ct_status ct_parquet_scan(ct_parquet *pq, const int *cols, int ncols, ct_pq_row_fn fn, void *ctx,
                          ct_err *err) {
  ct_status st = CT_OK;
  colrd *rds = NULL;
  ct_pq_value *vals = NULL;
  if (!cols) ncols = pq->nleaf;
  if (ncols < 0 || !fn) return ct_errf(err, CT_ERR_INVALID, "%s: bad scan arguments", pq->name);
  rds = calloc((size_t)(ncols ? ncols : 1), sizeof *rds);
  vals = calloc((size_t)(ncols ? ncols : 1), sizeof *vals);
  if (!rds || !vals) {
    st = ct_errf(err, CT_ERR_NOMEM, "%s: out of memory", pq->name);
    goto out;
  }
  for (int k = 0; k < ncols; k++) {
    int c = cols ? cols[k] : k;
    if (c < 0 || c >= pq->nleaf) {
      st = ct_errf(err, CT_ERR_RANGE, "%s: column index %d out of range (the file has %d columns)",
                   pq->name, c, pq->nleaf);
      goto out;
    }
    if (pq->leaves[c].max_rep > 0) {
      st = ct_errf(err, CT_ERR_UNSUPPORTED,
                   "%s: column '%s' is repeated (a list or map); only flat columns (required or "
                   "optional values) can be read",
                   pq->name, pq->leaves[c].name);
      goto out;
    }
    rds[k].pq = pq;
    rds[k].col = c;
    rds[k].lf = &pq->leaves[c];
  }
  int64_t row = 0;
  for (int g = 0; g < pq->meta.nrg; g++) {
    int64_t nr = pq->meta.rgs[g].num_rows;
    if (nr == 0) continue;
    for (int k = 0; k < ncols; k++)
      if ((st = chunk_open(&rds[k], g, err))) goto out;
    for (int64_t r = 0; r < nr; r++, row++) {
      for (int k = 0; k < ncols; k++)
        if ((st = next_value(&rds[k], &vals[k], err))) goto out;
      if (fn(ctx, row, vals)) goto out;
    }
  }
out:
  for (int k = 0; rds && k < ncols; k++) colrd_free(&rds[k]);
  free(rds);
  free(vals);
  return st;
}
