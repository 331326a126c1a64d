/* cache.c: latent and text-embedding cache files.
 *
 * An entry is a small safetensors file (float32 tensors + string metadata
 * naming what it was made from: source, sizes, crop, codec or encoder), raw
 * or wrapped in gzip (compress_disk_cache / compress_cache) or zstd
 * (cache_compression: zstd). Readers never trust the name: they detect the
 * wrapper by its magic bytes (gzip 1f 8b, zstd 28 b5 2f fd), bound the
 * unpacked size, validate the safetensors header, compare the metadata and
 * the CRC-32 of the data section (metadata "data_crc32", so that flipped bytes
 * in an uncompressed entry are noticed; entries written before it existed
 * carry none and are read as they are); anything wrong is CT_ERR_FORMAT so
 * that the caller rebuilds the entry.
 * Writes are atomic (ctuner/fs.h): a crash leaves the old entry or none.
 * Names: SHA-256 / MD5 hex digests (ctuner/hash.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "ctuner/comm.h"
#include "ctuner/fs.h"
#include "ctuner/safetensors.h"
#include "data/data_int.h"

ct_status ct_cache_pack(ct_cache_comp c, const void *in, size_t n, void **out, size_t *on,
                        ct_err *err) {
  *out = NULL;
  *on = 0;
  if (c == CT_CACHE_RAW) {
    *out = malloc(n ? n : 1);
    if (!*out) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    memcpy(*out, in, n);
    *on = n;
    return CT_OK;
  }
  if (c == CT_CACHE_ZSTD) {
    size_t cap = ZSTD_compressBound(n);
    void *b = malloc(cap);
    if (!b) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    size_t r = ZSTD_compress(b, cap, in, n, 3);
    if (ZSTD_isError(r)) {
      free(b);
      return ct_errf(err, CT_ERR_INTERNAL, "zstd compression failed: %s", ZSTD_getErrorName(r));
    }
    *out = b, *on = r;
    return CT_OK;
  }
  z_stream z;
  memset(&z, 0, sizeof z);
  if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) !=
      Z_OK) /* +16: gzip wrapper */
    return ct_errf(err, CT_ERR_INTERNAL, "zlib deflateInit2 failed");
  size_t cap = deflateBound(&z, (uLong)n) + 32;
  unsigned char *b = malloc(cap);
  if (!b) {
    deflateEnd(&z);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  z.next_in = (Bytef *)(uintptr_t)in;
  z.avail_in = (uInt)n;
  z.next_out = b;
  z.avail_out = (uInt)cap;
  int r = deflate(&z, Z_FINISH);
  size_t got = cap - z.avail_out;
  deflateEnd(&z);
  if (r != Z_STREAM_END) {
    free(b);
    return ct_errf(err, CT_ERR_INTERNAL, "gzip compression failed (%d)", r);
  }
  *out = b, *on = got;
  return CT_OK;
}

ct_status ct_cache_unpack(const void *in, size_t n, size_t max, void **out, size_t *on, int *owned,
                          ct_err *err) {
  const unsigned char *p = in;
  *out = NULL, *on = 0, *owned = 0;
  if (n >= 4 && p[0] == 0x28 && p[1] == 0xb5 && p[2] == 0x2f && p[3] == 0xfd) {
    unsigned long long sz = ZSTD_getFrameContentSize(in, n);
    if (sz == ZSTD_CONTENTSIZE_ERROR || sz == ZSTD_CONTENTSIZE_UNKNOWN || sz > max)
      return ct_errf(err, CT_ERR_FORMAT, "zstd frame with an unknown or too large size");
    void *b = malloc(sz ? (size_t)sz : 1);
    if (!b) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    size_t r = ZSTD_decompress(b, (size_t)sz, in, n);
    if (ZSTD_isError(r) || r != sz) {
      free(b);
      return ct_errf(err, CT_ERR_FORMAT, "corrupt zstd data: %s",
                     ZSTD_isError(r) ? ZSTD_getErrorName(r) : "short");
    }
    *out = b, *on = r, *owned = 1;
    return CT_OK;
  }
  if (n >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 16) != Z_OK)
      return ct_errf(err, CT_ERR_INTERNAL, "zlib inflateInit2 failed");
    size_t cap = n * 4 + 1024, got = 0;
    if (cap > max + 1) cap = max + 1;
    unsigned char *b = malloc(cap);
    ct_status st = b ? CT_OK : ct_errf(err, CT_ERR_NOMEM, "out of memory");
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)n;
    while (!st) {
      z.next_out = b + got;
      z.avail_out = (uInt)(cap - got);
      int r = inflate(&z, Z_NO_FLUSH);
      got = cap - z.avail_out;
      if (r == Z_STREAM_END) break;
      if (r != Z_OK && r != Z_BUF_ERROR) {
        st =
            ct_errf(err, CT_ERR_FORMAT, "corrupt gzip data (%s)", z.msg ? z.msg : "inflate failed");
      } else if (z.avail_out == 0) {
        if (cap > max) {
          st = ct_errf(err, CT_ERR_FORMAT, "gzip data unpacks to more than %zu bytes", max);
        } else {
          size_t nc = cap * 2 > max + 1 ? max + 1 : cap * 2;
          unsigned char *nb = realloc(b, nc);
          if (!nb)
            st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
          else
            b = nb, cap = nc;
        }
      } else if (z.avail_in == 0) {
        st = ct_errf(err, CT_ERR_FORMAT, "truncated gzip data");
      }
    }
    inflateEnd(&z);
    if (st) {
      free(b);
      return st;
    }
    *out = b, *on = got, *owned = 1;
    return CT_OK;
  }
  *out = (void *)(uintptr_t)in, *on = n;
  return CT_OK;
}

ct_status ct_cache_encode(ct_cache_comp c, const ct_cache_tensor *t, int nt,
                          const char *const *meta, int nmeta, void **out, size_t *on, ct_err *err) {
  /* safetensors bytes by hand: header JSON, padded to 8, then the data */
  size_t data = 0;
  char hdr[4096];
  int h = snprintf(hdr, sizeof hdr, "{");
  for (int i = 0; i < nt; i++) {
    size_t numel = 1;
    for (int d = 0; d < t[i].ndim; d++) numel *= (size_t)t[i].shape[d];
    h += snprintf(hdr + h, sizeof hdr - (size_t)h, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[",
                  i ? "," : "", t[i].name);
    for (int d = 0; d < t[i].ndim; d++)
      h += snprintf(hdr + h, sizeof hdr - (size_t)h, "%s%lld", d ? "," : "",
                    (long long)t[i].shape[d]);
    h += snprintf(hdr + h, sizeof hdr - (size_t)h, "],\"data_offsets\":[%zu,%zu]}", data,
                  data + numel * 4);
    data += numel * 4;
  }
  h += snprintf(hdr + h, sizeof hdr - (size_t)h, "%s\"__metadata__\":{", nt ? "," : "");
  for (int i = 0; i < nmeta; i++) {
    h += snprintf(hdr + h, sizeof hdr - (size_t)h, "%s\"%s\":\"", i ? "," : "", meta[2 * i]);
    for (const char *s = meta[2 * i + 1]; *s && h < (int)sizeof hdr - 8; s++) {
      if (*s == '"' || *s == '\\') hdr[h++] = '\\';
      if ((unsigned char)*s < 0x20) continue;
      hdr[h++] = *s;
    }
    hdr[h] = '\0';
    h += snprintf(hdr + h, sizeof hdr - (size_t)h, "\"");
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  for (int i = 0; i < nt; i++) {
    size_t numel = 1, left;
    for (int d = 0; d < t[i].ndim; d++) numel *= (size_t)t[i].shape[d];
    const unsigned char *p = (const unsigned char *)t[i].data;
    for (left = numel * 4; left; p += 1u << 30, left -= left < (1u << 30) ? left : (1u << 30))
      crc = crc32(crc, p, (uInt)(left < (1u << 30) ? left : (1u << 30)));
  }
  h += snprintf(hdr + h, sizeof hdr - (size_t)h, "%s\"data_crc32\":\"%08lx\"}}", nmeta ? "," : "",
                (unsigned long)crc);
  if (h >= (int)sizeof hdr - 8) return ct_errf(err, CT_ERR_RANGE, "cache entry header too long");
  while (h % 8) hdr[h++] = ' ';
  size_t total = 8 + (size_t)h + data;
  unsigned char *buf = malloc(total);
  if (!buf) return ct_errf(err, CT_ERR_NOMEM, "out of memory for a %zu-byte cache entry", total);
  uint64_t hl = (uint64_t)h;
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hl >> (8 * i));
  memcpy(buf + 8, hdr, (size_t)h);
  size_t off = 8 + (size_t)h;
  for (int i = 0; i < nt; i++) {
    size_t numel = 1;
    for (int d = 0; d < t[i].ndim; d++) numel *= (size_t)t[i].shape[d];
    memcpy(buf + off, t[i].data, numel * 4); /* little-endian host */
    off += numel * 4;
  }
  ct_status st = ct_cache_pack(c, buf, total, out, on, err);
  free(buf);
  return st;
}

ct_status ct_cache_write(const char *path, ct_cache_comp c, const ct_cache_tensor *t, int nt,
                         const char *const *meta, int nmeta, ct_err *err) {
  void *packed = NULL;
  size_t pn = 0;
  ct_status st = ct_cache_encode(c, t, nt, meta, nmeta, &packed, &pn, err);
  if (st) ct_err_prefix(err, "%s: ", path);
  if (!st) st = ct_write_file_replace(path, packed, pn, err); /* readers validate entries */
  free(packed);
  return st;
}

ct_status ct_cache_put(ct_storage *s, const char *key, ct_cache_comp c, const ct_cache_tensor *t,
                       int nt, const char *const *meta, int nmeta, ct_err *err) {
  void *packed = NULL;
  size_t pn = 0;
  ct_status st = ct_cache_encode(c, t, nt, meta, nmeta, &packed, &pn, err);
  if (st) ct_err_prefix(err, "%s: %s: ", ct_storage_describe(s), key);
  if (!st) st = ct_storage_put(s, key, packed, pn, 0, err); /* readers validate entries */
  free(packed);
  return st;
}

/* The data section's CRC-32 against the metadata's data_crc32, if any. */
static ct_status check_crc(const ct_st_file *f, const void *buf, size_t n, ct_err *err) {
  const char *want = ct_st_meta(f, "data_crc32");
  if (!want) return CT_OK; /* written before entries carried one */
  const unsigned char *b = buf;
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++) hl |= (uint64_t)b[i] << (8 * i);
  /* ct_st_parse has checked that 8 + hl <= n */
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t off = 8 + (size_t)hl; off < n;) {
    size_t k = n - off < (1u << 30) ? n - off : (1u << 30);
    crc = crc32(crc, b + off, (uInt)k);
    off += k;
  }
  char got[16];
  snprintf(got, sizeof got, "%08lx", (unsigned long)crc);
  if (strcmp(got, want))
    return ct_errf(err, CT_ERR_FORMAT, "data checksum mismatch (CRC-32 %s, stored %.8s)", got,
                   want);
  return CT_OK;
}

ct_status ct_cache_decode(const void *raw, size_t n, const ct_cache_tensor *t, float *const *out,
                          int nt, const char *const *meta, int nmeta, ct_err *err) {
  void *un = NULL;
  size_t un_n = 0;
  int owned = 0;
  ct_st_file *f = NULL;
  ct_status st = ct_cache_unpack(raw, n, (size_t)1 << 30, &un, &un_n, &owned, err);
  if (!st) st = ct_st_parse(un, un_n, &f, err);
  if (!st) st = check_crc(f, un, un_n, err);
  for (int i = 0; i < nmeta && !st; i++) {
    const char *v = ct_st_meta(f, meta[2 * i]);
    if (!v || strcmp(v, meta[2 * i + 1]))
      st = ct_errf(err, CT_ERR_FORMAT, "made for %s=%s, wanted %s", meta[2 * i],
                   v ? v : "(missing)", meta[2 * i + 1]);
  }
  for (int i = 0; i < nt && !st; i++) {
    const ct_st_tensor *x = ct_st_find(f, t[i].name);
    size_t numel = 1;
    for (int d = 0; d < t[i].ndim; d++) numel *= (size_t)t[i].shape[d];
    if (!x || x->numel != numel)
      st = ct_errf(err, CT_ERR_FORMAT, "tensor %s %s", t[i].name,
                   x ? "has the wrong size" : "is missing");
    else
      st = ct_st_to_f32(x, out[i], numel, err);
  }
  ct_st_close(f);
  if (owned) free(un);
  if (st && st != CT_ERR_NOMEM) {
    st = CT_ERR_FORMAT;
    if (err) err->status = st;
  }
  return st;
}

ct_status ct_cache_read(const char *path, const ct_cache_tensor *t, float *const *out, int nt,
                        const char *const *meta, int nmeta, ct_err *err) {
  char *raw = NULL;
  size_t n = 0;
  ct_status st = ct_read_file(path, (size_t)1 << 30, &raw, &n, err);
  if (st) return st;
  st = ct_cache_decode(raw, n, t, out, nt, meta, nmeta, err);
  free(raw);
  if (st && st != CT_ERR_NOMEM) ct_err_prefix(err, "%s: ", path);
  return st;
}

ct_status ct_cache_get(ct_storage *s, const char *key, const ct_cache_tensor *t, float *const *out,
                       int nt, const char *const *meta, int nmeta, ct_err *err) {
  char *raw = NULL;
  size_t n = 0;
  ct_status st = ct_storage_get(s, key, (size_t)1 << 30, &raw, &n, err);
  if (st) return st;
  st = ct_cache_decode(raw, n, t, out, nt, meta, nmeta, err);
  free(raw);
  if (st && st != CT_ERR_NOMEM) ct_err_prefix(err, "%s: %s: ", ct_storage_describe(s), key);
  return st;
}

ct_status ct_data_allgatherv(struct ct_comm *comm, const void *mine, size_t n, char **all,
                             size_t **off, ct_err *err) {
  int size = comm ? ct_comm_size(comm) : 1;
  *all = NULL;
  *off = calloc((size_t)size + 1, sizeof(size_t));
  if (!*off) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  if (size == 1) {
    *all = malloc(n ? n : 1);
    if (!*all) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
    memcpy(*all, mine, n);
    (*off)[1] = n;
    return CT_OK;
  }
  uint64_t me = n, *lens = calloc((size_t)size, sizeof *lens);
  char *pad = NULL, *got = NULL;
  ct_status st = lens ? ct_comm_allgather_bytes(comm, &me, lens, sizeof me, err)
                      : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  uint64_t mx = 1;
  for (int r = 0; !st && r < size; r++) {
    if (lens[r] > mx) mx = lens[r];
    (*off)[r + 1] = (*off)[r] + (size_t)lens[r];
  }
  if (!st && mx > ((uint64_t)1 << 31) - 1)
    st = ct_errf(err, CT_ERR_RANGE, "a rank's discovery results are larger than 2 GiB");
  if (!st) {
    pad = calloc(1, (size_t)mx);
    got = malloc((size_t)mx * (size_t)size);
    *all = malloc((*off)[size] ? (*off)[size] : 1);
    if (!pad || !got || !*all)
      st = ct_errf(err, CT_ERR_NOMEM, "out of memory gathering discovery results");
  }
  if (!st) {
    memcpy(pad, mine, n);
    st = ct_comm_allgather_bytes(comm, pad, got, (size_t)mx, err);
  }
  for (int r = 0; !st && r < size; r++)
    memcpy(*all + (*off)[r], got + (size_t)r * mx, (size_t)lens[r]);
  free(lens);
  free(pad);
  free(got);
  return st;
}
