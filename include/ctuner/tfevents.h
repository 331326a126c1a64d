/* TensorBoard event files written natively (docs/tensorboard.md): the
 * TFRecord framing (length, masked CRC-32C of the length, data, masked
 * CRC-32C of the data) around hand-encoded Event protobufs carrying
 * scalars, PNG images, text (the text plugin's string tensor) and the
 * session_log START that marks a resumed run.
 *
 * One writer is one events.out.tfevents.<time>.<host>.<pid>.<n> file in a
 * directory; records are buffered by stdio and reach the file at
 * ct_tb_flush and ct_tb_close. Not thread-safe: one writer per thread. */
#ifndef CTUNER_TFEVENTS_H
#define CTUNER_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/status.h"

/* CRC-32C (Castagnoli, reflected 0x82F63B78): crc of data appended to a
 * running crc (start with 0). ct_tb_crc32c(0, "123456789", 9) = 0xE3069283. */
uint32_t ct_tb_crc32c(uint32_t crc, const void *data, size_t n);
/* TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t ct_tb_masked_crc(uint32_t crc);
/* The TFRecord frame of n bytes: 12 bytes before the data (length, its
 * masked CRC) into head, 4 after (the data's masked CRC) into tail. */
void ct_tb_frame(const void *data, size_t n, unsigned char head[12], unsigned char tail[4]);

/* A growable byte buffer holding one encoded Event (or part of one). */
typedef struct ct_tb_buf {
  unsigned char *p;
  size_t n, cap;
  int oom; /* an append failed: the buffer is unusable */
} ct_tb_buf;
void ct_tb_buf_free(ct_tb_buf *b);

/* Event encoders, appended to b (proto3: fields at their default are left
 * out). step < 0 leaves the step out too. */
void ct_tb_event_version(ct_tb_buf *b, double wall_time);
void ct_tb_event_scalar(ct_tb_buf *b, double wall_time, long step, const char *tag, float value);
/* An encoded image (PNG, JPEG) of w x h pixels, channels 1, 3 or 4. */
void ct_tb_event_image(ct_tb_buf *b, double wall_time, long step, const char *tag, int w, int h,
                       int channels, const void *img, size_t n);
/* Markdown text as the text plugin's scalar DT_STRING tensor. */
void ct_tb_event_text(ct_tb_buf *b, double wall_time, long step, const char *tag, const char *text);
/* session_log { status: START }: TensorBoard drops what the directory holds
 * at steps >= step (an earlier attempt's steps a resumed run repeats). */
void ct_tb_event_start(ct_tb_buf *b, double wall_time, long step);

typedef struct ct_tb ct_tb;

/* Open a new event file in dir (made if missing) and write its file_version
 * record. The name's time is later than every event file already in dir,
 * so TensorBoard reads them in the order they were written. first_step > 0:
 * then a session_log START at first_step, the first step this run logs.
 * Write one in every run, fresh or resumed: TensorBoard's server ignores
 * the first START of a directory, and at each later one drops the steps >=
 * first_step that earlier runs wrote (a resumed run's repeated steps). */
ct_status ct_tb_open(const char *dir, long first_step, ct_tb **out, ct_err *err);
/* Wall time of the records that follow; 0: the clock (the default). Tests. */
void ct_tb_set_wall_time(ct_tb *tb, double wall_time);
const char *ct_tb_path(const ct_tb *tb);
ct_status ct_tb_scalar(ct_tb *tb, const char *tag, long step, double value, ct_err *err);
ct_status ct_tb_image(ct_tb *tb, const char *tag, long step, int w, int h, int channels,
                      const void *img, size_t n, ct_err *err);
ct_status ct_tb_text(ct_tb *tb, const char *tag, long step, const char *text, ct_err *err);
ct_status ct_tb_flush(ct_tb *tb, ct_err *err);
/* Flush and close; NULL is a no-op. */
ct_status ct_tb_close(ct_tb *tb, ct_err *err);

#endif
