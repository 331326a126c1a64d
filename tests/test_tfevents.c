/* test_tfevents.c: suite `tfevents` — CRC-32C against RFC 3720's test
 * vectors, TFRecord framing and the Event protobufs byte for byte against
 * the bytes TensorBoard's own protobuf classes serialize (event_pb2 et al.,
 * tensorboard 2.21, recorded here so the test is offline), and the writer:
 * a file of valid records opening with session_log START, a resumed run's
 * second file ordered after the first. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/fs.h"
#include "ctuner/tfevents.h"
#include "harness.h"

static const unsigned char WALL_1_5[] = {0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f}; /* wall_time 1.5 */

static int bytes_eq(const ct_tb_buf *b, const unsigned char *want, size_t n) {
  if (b->n != n || memcmp(b->p, want, n)) {
    fprintf(stderr, "  got %zu bytes:", b->n);
    for (size_t i = 0; i < b->n; i++) fprintf(stderr, " %02x", b->p[i]);
    fprintf(stderr, "\n");
    return 0;
  }
  return 1;
}

CT_TEST(tfevents, crc32c_rfc3720_vectors) {
  unsigned char buf[48];
  memset(buf, 0, 32);
  CHECK(ct_tb_crc32c(0, buf, 32) == 0x8A9136AAu);
  memset(buf, 0xff, 32);
  CHECK(ct_tb_crc32c(0, buf, 32) == 0x62A8AB43u);
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
  CHECK(ct_tb_crc32c(0, buf, 32) == 0x46DD794Eu);
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)(31 - i);
  CHECK(ct_tb_crc32c(0, buf, 32) == 0x113FDB5Cu);
  static const unsigned char iscsi_read[48] = {
      0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
      0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  CHECK(ct_tb_crc32c(0, iscsi_read, 48) == 0xD9963A56u);
  CHECK(ct_tb_crc32c(0, "123456789", 9) == 0xE3069283u);
  /* running crc: in two pieces as in one */
  CHECK(ct_tb_crc32c(ct_tb_crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u);
  CHECK(ct_tb_masked_crc(0xE3069283u) == 0xc78ab0e5u);
}

CT_TEST(tfevents, record_frame) {
  ct_tb_buf b = {0};
  ct_tb_event_version(&b, 1.5);
  static const unsigned char want[] = {0x09, 0,    0,    0,   0,   0,   0,   0xf8,
                                       0x3f, 0x1a, 0x0d, 'b', 'r', 'a', 'i', 'n',
                                       '.',  'E',  'v',  'e', 'n', 't', ':', '2'};
  CHECK(bytes_eq(&b, want, sizeof want));
  unsigned char head[12], tail[4];
  ct_tb_frame(b.p, b.n, head, tail);
  static const unsigned char whead[12] = {0x18, 0, 0, 0, 0, 0, 0, 0, 0xa3, 0x7f, 0x4b, 0x22};
  static const unsigned char wtail[4] = {0x2a, 0x28, 0x64, 0x6c};
  CHECK(!memcmp(head, whead, 12));
  CHECK(!memcmp(tail, wtail, 4));
  ct_tb_buf_free(&b);
}

CT_TEST(tfevents, protobuf_bytes_match_tensorboard) {
  ct_tb_buf b = {0};
  ct_tb_event_scalar(&b, 1.5, 3, "loss", 0.25f);
  static const unsigned char scalar[] = {0x10, 0x03, 0x2a, 0x0d, 0x0a, 0x0b, 0x0a, 0x04, 0x6c,
                                         0x6f, 0x73, 0x73, 0x15, 0x00, 0x00, 0x80, 0x3e};
  unsigned char want[128];
  memcpy(want, WALL_1_5, 9);
  memcpy(want + 9, scalar, sizeof scalar);
  CHECK(bytes_eq(&b, want, 9 + sizeof scalar));
  ct_tb_buf_free(&b);

  ct_tb_event_image(&b, 1.5, 300, "v/a", 3, 2, 3, "PNG", 3);
  static const unsigned char image[] = {0x10, 0xac, 0x02, 0x2a, 0x14, 0x0a, 0x12, 0x0a, 0x03,
                                        0x76, 0x2f, 0x61, 0x22, 0x0b, 0x08, 0x02, 0x10, 0x03,
                                        0x18, 0x03, 0x22, 0x03, 0x50, 0x4e, 0x47};
  memcpy(want + 9, image, sizeof image);
  CHECK(bytes_eq(&b, want, 9 + sizeof image));
  ct_tb_buf_free(&b);

  ct_tb_event_text(&b, 1.5, 1, "config", "hi");
  static const unsigned char text[] = {0x10, 0x01, 0x2a, 0x1e, 0x0a, 0x1c, 0x0a, 0x06, 0x63,
                                       0x6f, 0x6e, 0x66, 0x69, 0x67, 0x42, 0x08, 0x08, 0x07,
                                       0x12, 0x00, 0x42, 0x02, 0x68, 0x69, 0x4a, 0x08, 0x0a,
                                       0x06, 0x0a, 0x04, 0x74, 0x65, 0x78, 0x74};
  memcpy(want + 9, text, sizeof text);
  CHECK(bytes_eq(&b, want, 9 + sizeof text));
  ct_tb_buf_free(&b);

  ct_tb_event_start(&b, 1.5, 5);
  static const unsigned char start[] = {0x10, 0x05, 0x3a, 0x02, 0x08, 0x01};
  memcpy(want + 9, start, sizeof start);
  CHECK(bytes_eq(&b, want, 9 + sizeof start));
  ct_tb_buf_free(&b);
}

/* The records of an event file, each frame's CRCs checked; the data of
 * record i into *rec (malloc'd) when i == want. Returns the count, -1 on a
 * bad frame. */
static int read_records(const char *path, int want, unsigned char **rec, size_t *rn) {
  size_t n = 0;
  unsigned char *d = ct_test_slurp(path, &n);
  if (!d) return -1;
  int count = 0;
  size_t off = 0;
  while (off < n) {
    if (n - off < 16) goto bad;
    uint64_t len = 0;
    for (int i = 0; i < 8; i++) len |= (uint64_t)d[off + i] << (8 * i);
    if (len > n - off - 16) goto bad;
    unsigned char head[12], tail[4];
    ct_tb_frame(d + off + 12, (size_t)len, head, tail);
    if (memcmp(head, d + off, 12) || memcmp(tail, d + off + 12 + len, 4)) goto bad;
    if (count == want && rec) {
      *rec = malloc(len ? len : 1);
      memcpy(*rec, d + off + 12, len);
      *rn = (size_t)len;
    }
    count++;
    off += 16 + (size_t)len;
  }
  free(d);
  return count;
bad:
  free(d);
  return -1;
}

/* Event files in dir, sorted by name (as TensorBoard reads them). */
static int list_events(const char *dir, char names[4][1024]) {
  int n = 0;
  DIR *dd = opendir(dir);
  if (!dd) return 0;
  for (struct dirent *e; (e = readdir(dd));)
    if (!strncmp(e->d_name, "events.out.tfevents.", 20) && n < 4)
      snprintf(names[n++], 1024, "%s/%s", dir, e->d_name);
  closedir(dd);
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      if (strcmp(names[j], names[i]) < 0) {
        char t[1024];
        memcpy(t, names[i], 1024), memcpy(names[i], names[j], 1024), memcpy(names[j], t, 1024);
      }
  return n;
}

CT_TEST(tfevents, writer_files_records_and_resume) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/tfevents_w", ct_test_tmpdir());
  ct_err err = {0};
  ct_rm_rf(dir, &err);
  ct_tb *tb = NULL;
  REQUIRE(ct_tb_open(dir, 1, &tb, &err) == CT_OK);
  ct_tb_set_wall_time(tb, 1.5);
  CHECK(strstr(ct_tb_path(tb), "/events.out.tfevents.") != NULL);
  CHECK(ct_tb_scalar(tb, "loss", 3, 0.25, &err) == CT_OK);
  CHECK(ct_tb_image(tb, "v/a", 300, 3, 2, 3, "PNG", 3, &err) == CT_OK);
  CHECK(ct_tb_text(tb, "config", 1, "hi", &err) == CT_OK);
  CHECK(ct_tb_close(tb, &err) == CT_OK);
  /* the resume: a second file, named after the first even in the same second */
  REQUIRE(ct_tb_open(dir, 5, &tb, &err) == CT_OK);
  CHECK(ct_tb_close(tb, &err) == CT_OK);
  char names[4][1024];
  REQUIRE(list_events(dir, names) == 2);
  unsigned char *rec = NULL;
  size_t rn = 0;
  CHECK(read_records(names[0], 2, &rec, &rn) == 5); /* version, START, scalar, image, text */
  ct_tb_buf b = {0};
  ct_tb_event_scalar(&b, 1.5, 3, "loss", 0.25f);
  CHECK(rec && rn == b.n && !memcmp(rec, b.p, rn));
  ct_tb_buf_free(&b);
  free(rec);
  rec = NULL;
  CHECK(read_records(names[1], 1, &rec, &rn) == 2); /* version, session_log START at 5 */
  static const unsigned char start[] = {0x10, 0x05, 0x3a, 0x02, 0x08, 0x01};
  CHECK(rec && rn == 9 + sizeof start && !memcmp(rec + 9, start, sizeof start));
  free(rec);
  /* a flipped byte is caught by the frame's CRC */
  size_t n = 0;
  unsigned char *d = ct_test_slurp(names[0], &n);
  REQUIRE(d && n > 40);
  d[30] ^= 1;
  char bad[600];
  snprintf(bad, sizeof bad, "%s/corrupt", dir);
  REQUIRE(ct_write_file_atomic(bad, d, n, &err) == CT_OK);
  free(d);
  CHECK(read_records(bad, -1, NULL, NULL) == -1);
  /* first_step 0: no START */
  REQUIRE(ct_tb_open(dir, 0, &tb, &err) == CT_OK);
  CHECK(ct_tb_close(tb, &err) == CT_OK);
  REQUIRE(list_events(dir, names) == 3);
  CHECK(read_records(names[2], -1, NULL, NULL) == 1);
  /* a directory that cannot be made: an error naming it */
  CHECK(ct_tb_open("/proc/ctuner-no/such", 0, &tb, &err) != CT_OK && tb == NULL);
  ct_rm_rf(dir, &err);
}
