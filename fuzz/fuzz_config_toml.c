/* fuzz_config_toml.c: libFuzzer target for the two hand-written readers of
 * SimpleTuner's config formats (src/config/toml.c, src/config/envfile.c),
 * both outside input. Byte 0 picks the reader (even: config.toml, odd:
 * config.env); the rest is the file. Checked: a TOML document that reads is
 * an object with a name for every member; a failure says why with a
 * "line L, column C:" position; every collected problem has a message; the
 * values reach the key table (ct_cfg_set_object) without a crash; nothing
 * leaks (ASan). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_problems(const ct_config_problems *p) {
  for (size_t i = 0; i < p->n; i++)
    if (!p->v[i].msg[0]) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *text = (const char *)data + 1;
  const size_t len = size - 1;
  ct_config cfg;
  ct_config_defaults(&cfg);
  ct_config_problems probs = {0};
  if (data[0] % 2 == 0) {
    ct_json *j = NULL;
    ct_err err = {0};
    ct_status st = ct_config_toml_parse(text, len, &j, &err);
    if (st == CT_OK) {
      if (!j || j->type != CT_JSON_OBJECT) abort();
      for (size_t i = 0; i < j->n; i++)
        if (!j->keys[i]) abort();
      ct_cfg_set_object(&cfg, j, "f.toml", &probs);
    } else {
      int line, col;
      if (j) abort();
      if (st != CT_ERR_NOMEM && sscanf(err.msg, "line %d, column %d:", &line, &col) != 2) abort();
    }
    ct_json_free(j);
  } else {
    char *copy = malloc(len + 1); /* the loader is given NUL-terminated text */
    if (!copy) return 0;
    memcpy(copy, text, len);
    copy[len] = 0;
    ct_status st = ct_cfg_load_env(&cfg, copy, len, "f.env", &probs);
    if ((st == CT_OK) != (probs.errors == 0)) abort();
    free(copy);
  }
  check_problems(&probs);
  ct_config_problems_free(&probs);
  ct_config_free(&cfg);
  return 0;
}
