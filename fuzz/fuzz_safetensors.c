/* fuzz_safetensors.c: libFuzzer target for the safetensors reader and the JSON
 * parser (the two parsers of untrusted bytes in core).
 *
 * Each input is used three ways: (1) as a whole .safetensors file for
 * ct_st_parse, (2) as a JSON text for ct_json_parse, and (3) as a header:
 * the first byte picks a data-section size and the rest becomes the header
 * JSON of a synthetic file, so that mutations reach the tensor validation
 * (dtypes, shapes, offsets, overlaps) without having to keep a length prefix
 * consistent. On success every F32/F16/BF16 tensor is converted and looked up.
 * Every buffer is an exact-size heap copy, so ASan sees any over-read.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_file(const uint8_t *buf, size_t size) {
  ct_st_file *f = NULL;
  ct_err err = {0};
  if (ct_st_parse(buf, size, &f, &err) != CT_OK) {
    if (err.msg[0] == '\0') abort(); /* every failure must say why */
    return;
  }
  for (size_t i = 0; i < f->ntensors; i++) {
    const ct_st_tensor *t = &f->tensors[i];
    if (ct_st_find(f, t->name) != t) abort();
    if (t->dtype == CT_DTYPE_F32 || t->dtype == CT_DTYPE_F16 || t->dtype == CT_DTYPE_BF16) {
      float *out = malloc(t->numel ? t->numel * sizeof(float) : 1);
      if (!out) abort();
      if (ct_st_to_f32(t, out, t->numel, &err) != CT_OK) abort();
      free(out);
    }
  }
  for (size_t i = 0; i < f->nmeta; i++)
    if (ct_st_meta(f, f->meta_keys[i]) == NULL) abort();
  (void)ct_st_find(f, "x");
  (void)ct_st_meta(f, "format");
  ct_st_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* (1) the input as a file */
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  memcpy(copy, data, size);
  check_file(copy, size);

  /* (2) the input as JSON */
  ct_json *j = NULL;
  ct_err err = {0};
  if (ct_json_parse((const char *)copy, size, &j, &err) == CT_OK) {
    (void)ct_json_get(j, "__metadata__");
    ct_json_free(j);
  } else if (err.msg[0] == '\0') {
    abort();
  }
  free(copy);

  /* (3) the input as a header: byte 0 = data size / 4, rest = JSON */
  if (size >= 1) {
    size_t dsize = (size_t)data[0] * 4;
    size_t hl = size - 1;
    size_t total = 8 + hl + dsize;
    uint8_t *buf = calloc(1, total);
    if (!buf) return 0;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, data + 1, hl);
    for (size_t i = 0; i < dsize; i++) buf[8 + hl + i] = (uint8_t)(i * 37);
    check_file(buf, total);
    free(buf);
  }
  return 0;
}
