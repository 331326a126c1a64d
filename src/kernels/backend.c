/* The registry of compute backends (include/ctuner/backend.h): a constant
 * table of the backends compiled in, looked up by name.
 *
 * Each backend is one file defining a const ct_backend (backend_cpu.c today);
 * adding one is a row here. The first row is the default.
 * Not here: any op (the backend files), choosing a backend from a config.
 */
#include <stdio.h>
#include <string.h>

#include "ctuner/backend.h"

extern const ct_backend ct_backend_cpu; /* backend_cpu.c */

static const ct_backend *const registry[] = {
    &ct_backend_cpu,
};
#define NREG (sizeof registry / sizeof registry[0])

size_t ct_backend_count(void) {
  return NREG;
}

const ct_backend *ct_backend_at(size_t i) {
  return i < NREG ? registry[i] : NULL;
}

const ct_backend *ct_backend_default(void) {
  return registry[0];
}

ct_status ct_backend_get(const char *name, const ct_backend **out, ct_err *err) {
  *out = NULL;
  for (size_t i = 0; name && i < NREG; i++)
    if (!strcmp(registry[i]->name, name)) {
      *out = registry[i];
      return CT_OK;
    }
  char list[256] = "";
  for (size_t i = 0; i < NREG; i++) {
    size_t len = strlen(list);
    snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", registry[i]->name);
  }
  return ct_errf(err, CT_ERR_NOT_FOUND, "unknown compute backend '%s'; compiled in: %s",
                 name ? name : "(null)", list);
}
