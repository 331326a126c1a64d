/* fuzz_yaml.c: libFuzzer target for the YAML reader (ct_yaml_parse over
 * libyaml: Accelerate configs are outside input). Checked: a failure has a
 * message and no tree; a tree is well formed (every scalar has its text,
 * every map key is a string, containers hold what their counts say, nesting
 * within CT_JSON_MAX_DEPTH), and nothing leaks (ASan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/log.h"
#include "ctuner/yaml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t check(const ct_json *j, int depth) {
  size_t nodes = 1;
  if (depth > CT_JSON_MAX_DEPTH + 1) abort();
  switch (j->type) {
    case CT_JSON_ARRAY:
    case CT_JSON_OBJECT:
      if (j->n && !j->items) abort();
      if (j->type == CT_JSON_OBJECT && j->n && !j->keys) abort();
      for (size_t i = 0; i < j->n; i++) {
        if (j->type == CT_JSON_OBJECT && !j->keys[i]) abort();
        nodes += check(&j->items[i], depth + 1);
      }
      break;
    case CT_JSON_NULL:
      if (depth > 1 && !j->str) abort(); /* a scalar (the empty document has none) */
      break;
    default:
      if (!j->str || strlen(j->str) != j->len) abort();
  }
  return nodes;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ct_json *j = NULL;
  ct_err err = {0};
  ct_log_set_level(CT_LOG_ERROR); /* repeated keys warn; that is not a finding */
  ct_status st = ct_yaml_parse((const char *)data, size, &j, &err);
  if (st) {
    if (j || !err.msg[0]) abort();
    if (st != CT_ERR_FORMAT && st != CT_ERR_UNSUPPORTED && st != CT_ERR_RANGE && st != CT_ERR_NOMEM)
      abort();
    return 0;
  }
  if (!j || check(j, 1) > CT_YAML_MAX_NODES) abort();
  ct_json_free(j);
  return 0;
}
