/* fuzz_config.c: libFuzzer target for the configuration readers — a
 * SimpleTuner config.json (ct_config_load_file, then validation, the
 * DeepSpeed fold and the canonical dump), a multidatabackend.json
 * (ct_backend_parse) and a DeepSpeed JSON given inline (deepspeed_config).
 *
 * Byte 0 picks the reader (and the world size for the DeepSpeed fold); the
 * rest is the document. config.json is read from a file (the loader takes a
 * path), written once per input under /tmp. Checked: every failure carries a
 * message and hands back nothing; a loaded config dumps to JSON that parses;
 * every dataset of a parsed backend is found by its id. Logging is off (the
 * loaders warn about keys with no effect). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/config.h"
#include "ctuner/data.h"
#include "ctuner/json.h"
#include "ctuner/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void dump_parses(const ct_config *cfg) {
  char *js = ct_config_to_json(cfg);
  if (!js) abort();
  ct_json *j = NULL;
  ct_err err = {0};
  if (ct_json_parse(js, strlen(js), &j, &err) != CT_OK) abort();
  ct_json_free(j);
  free(js);
}

static void config_json(const uint8_t *doc, size_t n, int world) {
  static char path[64];
  if (!path[0]) snprintf(path, sizeof path, "/tmp/fuzz_config_%d.json", (int)getpid());
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  fwrite(doc, 1, n, f);
  fclose(f);
  ct_config cfg;
  memset(&cfg, 0, sizeof cfg);
  ct_config_defaults(&cfg);
  ct_err err = {0};
  if (ct_config_load_file(&cfg, path, &err) != CT_OK) {
    if (!err.msg[0]) abort();
  } else {
    dump_parses(&cfg);
    memset(&err, 0, sizeof err);
    if (ct_config_validate(&cfg, &err) != CT_OK && !err.msg[0]) abort();
    memset(&err, 0, sizeof err);
    if (ct_deepspeed_apply(&cfg, world, &err) != CT_OK && !err.msg[0]) abort();
    dump_parses(&cfg);
  }
  ct_config_free(&cfg);
}

static void backend_json(const uint8_t *doc, size_t n) {
  ct_backend *b = NULL;
  ct_err err = {0};
  if (ct_backend_parse((const char *)doc, n, "multidatabackend.json", &b, &err) != CT_OK) {
    if (!err.msg[0] || b) abort();
    return;
  }
  for (int i = 0; i < b->n; i++)
    if (b->ds[i].id && !ct_backend_find(b, b->ds[i].id)) abort();
  ct_backend_free(b);
}

static void deepspeed_inline(const uint8_t *doc, size_t n, int world) {
  /* inline JSON is text starting with '{' (anything else would be a path) */
  char *text = malloc(n + 2);
  if (!text) return;
  text[0] = '{';
  memcpy(text + 1, doc, n);
  text[n + 1] = 0;
  ct_config cfg;
  memset(&cfg, 0, sizeof cfg);
  ct_config_defaults(&cfg);
  ct_err err = {0};
  if (ct_config_set(&cfg, "deepspeed_config", text, &err) != CT_OK) {
    if (!err.msg[0]) abort();
  } else if (ct_deepspeed_apply(&cfg, world, &err) != CT_OK) {
    if (!err.msg[0]) abort();
  } else {
    dump_parses(&cfg);
  }
  ct_config_free(&cfg);
  free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  ct_log_set_level(CT_LOG_OFF);
  int world = 1 + (data[0] >> 2) % 4;
  switch (data[0] % 3) {
    case 0:
      config_json(data + 1, size - 1, world);
      break;
    case 1:
      backend_json(data + 1, size - 1);
      break;
    default:
      deepspeed_inline(data + 1, size - 1, world);
      break;
  }
  return 0;
}
