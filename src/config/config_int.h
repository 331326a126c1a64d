/* config_int.h: what the files of the config module share (private to
 * src/config). config.c owns the key table and sets values; envfile.c reads
 * SimpleTuner's config.env, toml.c its config.toml, problems.c the problem
 * list, suggest.c the "did you mean". */
#ifndef CT_CONFIG_INT_H
#define CT_CONFIG_INT_H

#include "ctuner/config.h"
#include "ctuner/json.h"

/* Where a value comes from: a file position or the command line. */
typedef struct cfg_src {
  ct_config_origin origin;
  const char *file; /* NULL for the command line */
  int line, col;
} cfg_src;

/* Sets key (SimpleTuner spelling, "--" allowed) from text as the command
 * line does; unknown, refused and no-effect keys become problems. */
ct_status ct_cfg_set_text(ct_config *cfg, const char *key, const char *value, const cfg_src *src,
                          ct_config_problems *probs);
/* Sets key from a JSON (or TOML) value; src->line/col are the value's. */
ct_status ct_cfg_set_value(ct_config *cfg, const char *key, const ct_json *v, const cfg_src *src,
                           ct_config_problems *probs);
/* Sets every member of a parsed config object (config.json, config.toml). */
ct_status ct_cfg_set_object(ct_config *cfg, const ct_json *obj, const char *file,
                            ct_config_problems *probs);
/* config.env text (envfile.c). */
ct_status ct_cfg_load_env(ct_config *cfg, const char *text, size_t len, const char *file,
                          ct_config_problems *probs);
/* "line L, column C: msg" (ct_json's and ct_config_toml_parse's errors) into
 * line, col and the rest; 0s and the whole text if it has no such prefix. */
const char *ct_cfg_split_pos(const char *msg, int *line, int *col);

/* Alias i (a SimpleTuner spelling accepted as the key it names, *key), or
 * NULL past the end (config.c). */
const char *ct_cfg_alias_at(size_t i, const char **key);
/* Why a SimpleTuner key ctuner does not implement is refused when set
 * (TREAD, distillation, ...), or NULL (names.c). */
const char *ct_cfg_not_here(const char *key);
/* What ctuner does with a SimpleTuner option it has no key for (names.c):
 * CT_ST_NONE (not one of SimpleTuner's), CT_ST_NO_EFFECT (accepted, one
 * warning) or CT_ST_REFUSED (an error); *why says what ctuner does. value:
 * the key's value as text ("true", "0", "none" for null, "[...]") or NULL;
 * an option that only acts when set is no-effect at its off values. */
typedef enum { CT_ST_NONE, CT_ST_NO_EFFECT, CT_ST_REFUSED } ct_st_action;
ct_st_action ct_cfg_st_option(const char *key, const char *value, const char **why);
/* Row i of that table (its key; a '*' at the end is a prefix): 1, or 0 past
 * the end (tests: no row is also a key). */
size_t ct_cfg_st_option_at(size_t i, const char **key);

/* Rule i between keys (rules.c): *key is the key its problem is filed
 * under; with err, runs it (CT_OK or why in err); CT_ERR_RANGE past the end. */
ct_status ct_cfg_rule_at(size_t i, const ct_config *c, const char **key, ct_err *err);

#endif
