/* A YAML reader over libyaml that gives the same tree as json.h.
 *
 * One document of YAML 1.1 read the way PyYAML's safe_load reads it (which is
 * what Accelerate uses for its config files): plain scalars resolved by
 * YAML 1.1's rules — null (~, null, empty), booleans (true/false, yes/no,
 * on/off in their three spellings), integers (decimal, 0x, 0o/leading-0 octal,
 * 0b, '_' separators, 1:30 sexagesimal), floats (1.5, 1.0e+3, .inf, .nan; "1e5"
 * has no dot and stays a string, as in PyYAML) — quoted and block scalars
 * strings; the standard tags (!!str, !!int, !!float, !!bool, !!null, !!map,
 * !!seq; !!binary and !!timestamp kept as their text); anchors, aliases and
 * merge keys (<<). Other tags are refused, as safe_load refuses them.
 *
 * Every scalar keeps its text as written in `str`/`len`, whatever its type,
 * so messages can quote it. A key given twice keeps its first position and
 * its last value (a Python dict) and logs a warning. Alias expansion is
 * bounded (CT_YAML_MAX_NODES nodes in all) and nesting by CT_JSON_MAX_DEPTH.
 * Errors say "line L, column C: ...". An empty document is CT_JSON_NULL.
 */
#ifndef CTUNER_YAML_H
#define CTUNER_YAML_H

#include <stddef.h>

#include "ctuner/json.h"
#include "ctuner/status.h"

#define CT_YAML_MAX_NODES 100000

ct_status ct_yaml_parse(const char *text, size_t len, ct_json **out, ct_err *err);
/* Reads (at most max bytes) and parses a file; errors start with the path
 * (CT_ERR_NOT_FOUND if it is missing). */
ct_status ct_yaml_parse_file(const char *path, size_t max, ct_json **out, ct_err *err);

#endif
