/* fuzz_spm.c: libFuzzer target for the SentencePiece (T5) tokenizer
 * (src/text/spm*.c): spiece.model (protobuf) and tokenizer.json are outside
 * input, and so is the text they tokenize. Byte 0 of the input picks:
 *   0 mod 3: the rest is a spiece.model, loaded, then a few texts encoded;
 *   1 mod 3: the rest is a tokenizer.json, the same;
 *   2 mod 3: the rest is text, encoded with the committed test tokenizer
 *            (tests/data/t5/tokenizer_2, loaded once; run from the repository root).
 * Checked: a refusal has a message; ids are inside the vocabulary; the
 * FluxPipeline-style encode ends with </s> then padding; no leak (ASan). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/t5.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void encode_checked(const ct_spm *s, const char *text) {
  int32_t ids[64];
  int n = 0;
  ct_err err = {0};
  if (ct_spm_encode(s, text, 64, ids, &n, &err) != CT_OK) {
    if (!err.msg[0]) abort();
    return;
  }
  const int V = ct_spm_vocab_size(s);
  if (n < 1 || n > 64 || ids[n - 1] != ct_spm_eos(s)) abort();
  for (int i = 0; i < 64; i++) {
    if (ids[i] < 0 || ids[i] >= V) abort();
    if (i >= n && ids[i] != ct_spm_pad(s)) abort();
  }
}

/* The bytes as a file (a memfd; the loaders take paths), loaded. */
static void load_and_use(const uint8_t *data, size_t size, int json) {
  int fd = memfd_create(json ? "tokenizer.json" : "spiece.model", MFD_CLOEXEC);
  if (fd < 0) abort();
  if (size && write(fd, data, size) != (ssize_t)size) abort();
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ct_spm *s = NULL;
  ct_err err = {0};
  ct_status st = json ? ct_spm_load_json(path, &s, &err) : ct_spm_load_model(path, &s, &err);
  if (st != CT_OK) {
    if (!err.msg[0] || s) abort();
  } else {
    static const char *const texts[] = {"", "a red circle", "  Hello,  WORLD! 3.14 caf\xc3\xa9 ",
                                        "</s><pad><unk> x",
                                        "\xef\xbc\xa1\xe2\x80\x83\xf0\x9f\x98\x80"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) encode_checked(s, texts[i]);
    ct_spm_free(s);
  }
  close(fd);
}

static ct_spm *test_tokenizer(void) {
  static ct_spm *s;
  if (!s) {
    ct_err err = {0};
    if (ct_spm_load_dir("tests/data/t5/tokenizer_2", &s, &err) != CT_OK) {
      fprintf(stderr, "fuzz_spm: %s (run from the repository root)\n", err.msg);
      abort();
    }
  }
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ct_log_set_level(CT_LOG_ERROR);
  if (size < 1) return 0;
  const int mode = data[0] % 3;
  data++, size--;
  if (mode < 2) {
    load_and_use(data, size, mode == 1);
    return 0;
  }
  char *text = malloc(size + 1);
  if (!text) abort();
  memcpy(text, data, size);
  text[size] = 0;
  if (ct_utf8_valid(text, size) && !memchr(data, 0, size)) encode_checked(test_tokenizer(), text);
  free(text);
  return 0;
}
