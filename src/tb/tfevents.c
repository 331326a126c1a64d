/* TensorBoard event files (include/ctuner/tfevents.h, docs/tensorboard.md).
 *
 * A file is a sequence of TFRecords: uint64 length (little endian), masked
 * CRC-32C of those 8 bytes, the bytes of one Event protobuf, masked CRC-32C
 * of them. The first record is Event{wall_time, file_version
 * "brain.Event:2"}; each later one carries a Summary (scalar as
 * simple_value, image as Summary.Image, text as the text plugin's string
 * tensor) or a SessionLog. The protobufs are encoded by hand from the field
 * numbers of tensorboard/compat/proto (event.proto, summary.proto,
 * tensor.proto, tensor_shape.proto); nothing here reads event files.
 *
 * CRC-32C is the reflected Castagnoli polynomial with a byte table built
 * once; event files are small (scalars, a few PNGs per validation), so the
 * portable loop is fast enough. */
#include "ctuner/tfevents.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctuner/fs.h"

/* ---- CRC-32C and the TFRecord frame ---- */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    crc_table[i] = c;
  }
}

uint32_t ct_tb_crc32c(uint32_t crc, const void *data, size_t n) {
  pthread_once(&crc_once, crc_init);
  const unsigned char *p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t ct_tb_masked_crc(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le(unsigned char *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

void ct_tb_frame(const void *data, size_t n, unsigned char head[12], unsigned char tail[4]) {
  put_le(head, (uint64_t)n, 8);
  put_le(head + 8, ct_tb_masked_crc(ct_tb_crc32c(0, head, 8)), 4);
  put_le(tail, ct_tb_masked_crc(ct_tb_crc32c(0, data, n)), 4);
}

/* ---- protobuf encoding ---- */

enum { WIRE_VARINT = 0, WIRE_I64 = 1, WIRE_LEN = 2, WIRE_I32 = 5 };

void ct_tb_buf_free(ct_tb_buf *b) {
  free(b->p);
  *b = (ct_tb_buf){0};
}

static void put(ct_tb_buf *b, const void *d, size_t n) {
  if (b->oom) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p, b->cap = cap;
  }
  if (n) memcpy(b->p + b->n, d, n);
  b->n += n;
}

static void varint(ct_tb_buf *b, uint64_t v) {
  unsigned char t[10];
  int n = 0;
  do {
    t[n] = (unsigned char)(v & 0x7f);
    v >>= 7;
    if (v) t[n] |= 0x80;
    n++;
  } while (v);
  put(b, t, (size_t)n);
}

static void key(ct_tb_buf *b, int field, int wire) {
  varint(b, (uint64_t)field << 3 | (uint64_t)wire);
}

static void field_varint(ct_tb_buf *b, int field, uint64_t v) {
  if (!v) return; /* proto3 default */
  key(b, field, WIRE_VARINT);
  varint(b, v);
}

static void field_bytes(ct_tb_buf *b, int field, const void *d, size_t n) {
  key(b, field, WIRE_LEN);
  varint(b, n);
  put(b, d, n);
}

static void field_str(ct_tb_buf *b, int field, const char *s) {
  field_bytes(b, field, s, strlen(s));
}

/* A sub-message field: its body (built in m) appended with its length. */
static void field_msg(ct_tb_buf *b, int field, ct_tb_buf *m) {
  if (m->oom) b->oom = 1;
  field_bytes(b, field, m->p, m->n);
  ct_tb_buf_free(m);
}

/* Event.wall_time (1, double), Event.step (2, int64). */
static void event_head(ct_tb_buf *b, double wall_time, long step) {
  unsigned char t[8];
  uint64_t u;
  memcpy(&u, &wall_time, 8);
  put_le(t, u, 8);
  key(b, 1, WIRE_I64);
  put(b, t, 8);
  if (step > 0) field_varint(b, 2, (uint64_t)step);
}

/* Event.summary (5) holding one Summary.value (1) whose body is v. */
static void event_summary(ct_tb_buf *b, ct_tb_buf *v) {
  ct_tb_buf s = {0};
  field_msg(&s, 1, v);
  field_msg(b, 5, &s);
}

void ct_tb_event_version(ct_tb_buf *b, double wall_time) {
  event_head(b, wall_time, 0);
  field_str(b, 3, "brain.Event:2"); /* Event.file_version */
}

void ct_tb_event_scalar(ct_tb_buf *b, double wall_time, long step, const char *tag, float value) {
  event_head(b, wall_time, step);
  ct_tb_buf v = {0};
  field_str(&v, 1, tag); /* Value.tag */
  unsigned char t[4];
  uint32_t u;
  memcpy(&u, &value, 4);
  put_le(t, u, 4);
  key(&v, 2, WIRE_I32); /* Value.simple_value */
  put(&v, t, 4);
  event_summary(b, &v);
}

void ct_tb_event_image(ct_tb_buf *b, double wall_time, long step, const char *tag, int w, int h,
                       int channels, const void *img, size_t n) {
  event_head(b, wall_time, step);
  ct_tb_buf im = {0}, v = {0};
  field_varint(&im, 1, (uint64_t)h);        /* Image.height */
  field_varint(&im, 2, (uint64_t)w);        /* Image.width */
  field_varint(&im, 3, (uint64_t)channels); /* Image.colorspace: 1 grey, 3 RGB, 4 RGBA */
  field_bytes(&im, 4, img, n);              /* Image.encoded_image_string */
  field_str(&v, 1, tag);
  field_msg(&v, 4, &im); /* Value.image */
  event_summary(b, &v);
}

void ct_tb_event_text(ct_tb_buf *b, double wall_time, long step, const char *tag,
                      const char *text) {
  event_head(b, wall_time, step);
  ct_tb_buf pd = {0}, md = {0}, shape = {0}, t = {0}, v = {0};
  field_str(&pd, 1, "text"); /* PluginData.plugin_name; content: empty TextPluginData */
  field_msg(&md, 1, &pd);    /* SummaryMetadata.plugin_data */
  field_varint(&t, 1, 7);    /* TensorProto.dtype = DT_STRING */
  field_msg(&t, 2, &shape);  /* TensorProto.tensor_shape: a scalar (no dims) */
  field_str(&t, 8, text);    /* TensorProto.string_val */
  field_str(&v, 1, tag);
  field_msg(&v, 8, &t);  /* Value.tensor */
  field_msg(&v, 9, &md); /* Value.metadata */
  event_summary(b, &v);
}

void ct_tb_event_start(ct_tb_buf *b, double wall_time, long step) {
  event_head(b, wall_time, step);
  ct_tb_buf sl = {0};
  field_varint(&sl, 1, 1); /* SessionLog.status = START */
  field_msg(b, 7, &sl);    /* Event.session_log */
}

/* ---- the writer ---- */

struct ct_tb {
  FILE *f;
  double wall_time; /* 0: the clock */
  char path[4200];
};

static double now_wall(const ct_tb *tb) {
  if (tb->wall_time > 0) return tb->wall_time;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The newest <time> among dir's event files, or 0. */
static long newest_file_time(const char *dir) {
  static const char pre[] = "events.out.tfevents.";
  long best = 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, pre, sizeof pre - 1)) continue;
    long t = strtol(e->d_name + sizeof pre - 1, NULL, 10);
    if (t > best) best = t;
  }
  closedir(d);
  return best;
}

static ct_status write_record(ct_tb *tb, ct_tb_buf *b, ct_err *err) {
  ct_status st = CT_OK;
  unsigned char head[12], tail[4];
  if (b->oom) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory for a TensorBoard record");
    goto out;
  }
  ct_tb_frame(b->p, b->n, head, tail);
  if (fwrite(head, 1, 12, tb->f) != 12 || fwrite(b->p, 1, b->n, tb->f) != b->n ||
      fwrite(tail, 1, 4, tb->f) != 4)
    st = ct_errf(err, CT_ERR_IO, "%s: write failed: %s", tb->path, strerror(errno));
out:
  ct_tb_buf_free(b);
  return st;
}

ct_status ct_tb_open(const char *dir, long first_step, ct_tb **out, ct_err *err) {
  static atomic_int counter;
  *out = NULL;
  ct_status st = ct_mkdir_p(dir, err);
  if (st) return st;
  ct_tb *tb = calloc(1, sizeof *tb);
  if (!tb) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  for (char *c = host; *c; c++)
    if (*c == '/') *c = '_';
  long t = (long)time(NULL), last = newest_file_time(dir);
  if (t <= last) t = last + 1; /* readers take the files in name order */
  if (ct_pathf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%010ld.%s.%ld.%d", dir, t, host,
               (long)getpid(), atomic_fetch_add(&counter, 1))) {
    st = ct_errf(err, CT_ERR_RANGE, "path too long: %s", dir);
    goto out;
  }
  tb->f = fopen(tb->path, "wbx");
  if (!tb->f) {
    st = ct_errf(err, CT_ERR_IO, "%s: cannot create: %s", tb->path, strerror(errno));
    goto out;
  }
  ct_tb_buf b = {0};
  ct_tb_event_version(&b, now_wall(tb));
  st = write_record(tb, &b, err);
  if (!st && first_step > 0) {
    ct_tb_event_start(&b, now_wall(tb), first_step);
    st = write_record(tb, &b, err);
  }
  if (!st) st = ct_tb_flush(tb, err);
out:
  if (st) {
    ct_tb_close(tb, NULL);
    tb = NULL;
  }
  *out = tb;
  return st;
}

void ct_tb_set_wall_time(ct_tb *tb, double wall_time) {
  tb->wall_time = wall_time;
}

const char *ct_tb_path(const ct_tb *tb) {
  return tb->path;
}

ct_status ct_tb_scalar(ct_tb *tb, const char *tag, long step, double value, ct_err *err) {
  ct_tb_buf b = {0};
  ct_tb_event_scalar(&b, now_wall(tb), step, tag, (float)value);
  return write_record(tb, &b, err);
}

ct_status ct_tb_image(ct_tb *tb, const char *tag, long step, int w, int h, int channels,
                      const void *img, size_t n, ct_err *err) {
  ct_tb_buf b = {0};
  ct_tb_event_image(&b, now_wall(tb), step, tag, w, h, channels, img, n);
  return write_record(tb, &b, err);
}

ct_status ct_tb_text(ct_tb *tb, const char *tag, long step, const char *text, ct_err *err) {
  ct_tb_buf b = {0};
  ct_tb_event_text(&b, now_wall(tb), step, tag, text);
  return write_record(tb, &b, err);
}

ct_status ct_tb_flush(ct_tb *tb, ct_err *err) {
  if (fflush(tb->f) || ferror(tb->f))
    return ct_errf(err, CT_ERR_IO, "%s: write failed: %s", tb->path, strerror(errno));
  return CT_OK;
}

ct_status ct_tb_close(ct_tb *tb, ct_err *err) {
  ct_status st = CT_OK;
  if (!tb) return st;
  if (tb->f) {
    st = ct_tb_flush(tb, err);
    if (fclose(tb->f) && !st)
      st = ct_errf(err, CT_ERR_IO, "%s: close failed: %s", tb->path, strerror(errno));
  }
  free(tb);
  return st;
}
