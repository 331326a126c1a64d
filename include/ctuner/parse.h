/* Small parsers of values users write in configs (src/core/parse.c):
 * {env:VAR} expansion in strings and byte sizes such as "10G". Shared by the
 * config keys, multidatabackend.json, webhook configs and the health checks. */
#ifndef CTUNER_PARSE_H
#define CTUNER_PARSE_H

#include "ctuner/status.h"

/* Replace every {env:VAR} in `in` by the variable's value (malloc'd result in
 * *out); an unset variable is an error naming it. where: a prefix for error
 * messages ("command line: ", "config.json: ..."), or NULL. */
ct_status ct_expand_env(const char *in, const char *where, char **out, ct_err *err);
/* "10G", "500M", "1.5GiB", "1048576" -> bytes (binary units); -1 if malformed. */
long long ct_parse_bytes(const char *s);

#endif
