/* The registry of compute backends (include/ctuner/backend.h): a
 * table of the backends compiled in (cpu-bf16's row filled on first use),
 * looked up by name.
 *
 * Each backend is one file defining a const ct_backend_ops (backend_cpu.c today,
 * which also builds its bf16-compute sibling "cpu-bf16" on first use);
 * adding one is a row here. The first row is the default.
 * Also ct_backend_move, the one helper models use to move an owned buffer
 * to another backend.
 * Not here: any op (the backend files), choosing a backend from a config.
 */
#include "ctuner/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

extern const ct_backend_ops ct_backend_cpu;      /* backend_cpu.c */
const ct_backend_ops *ct_backend_cpu_bf16(void); /* backend_cpu.c, built on first use */

static const ct_backend_ops *registry[] = {
    &ct_backend_cpu, NULL, /* cpu-bf16 */
};
#define NREG (sizeof registry / sizeof registry[0])

static once_flag reg_once = ONCE_FLAG_INIT;
static void reg_init(void) {
  registry[1] = ct_backend_cpu_bf16();
}

size_t ct_backend_count(void) {
  return NREG;
}

const ct_backend_ops *ct_backend_at(size_t i) {
  call_once(&reg_once, reg_init);
  return i < NREG ? registry[i] : NULL;
}

const ct_backend_ops *ct_backend_default(void) {
  return registry[0];
}

ct_status ct_backend_get(const char *name, const ct_backend_ops **out, ct_err *err) {
  call_once(&reg_once, reg_init);
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

ct_status ct_backend_with_compute(const ct_backend_ops *be, ct_compute c,
                                  const ct_backend_ops **out, ct_err *err) {
  call_once(&reg_once, reg_init);
  *out = NULL;
  if (be->compute == c) {
    *out = be;
    return CT_OK;
  }
  for (size_t i = 0; i < NREG; i++)
    if (registry[i]->compute == c && registry[i]->alloc == be->alloc &&
        registry[i]->free == be->free) {
      *out = registry[i];
      return CT_OK;
    }
  return ct_errf(err, CT_ERR_NOT_FOUND, "compute backend %s has no %s sibling", be->name,
                 c == CT_COMPUTE_BF16 ? "bf16-compute" : "float32-compute");
}

ct_status ct_backend_move(const ct_backend_ops *from, const ct_backend_ops *to, ct_mem_cat cat,
                          size_t bytes, void **p, ct_err *err) {
  ct_status st = CT_OK;
  void *host = NULL, *np = NULL;
  if (!*p || from == to || !bytes) goto out;
  if (from->alloc == to->alloc && from->free == to->free) goto out; /* the same memory */
  host = malloc(bytes);
  np = to->alloc(cat, bytes);
  if (!host || !np) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory moving %zu bytes from compute backend %s to %s",
                 bytes, from->name, to->name);
    to->free(np);
    goto out;
  }
  from->copy_out(host, *p, bytes);
  to->copy_in(np, host, bytes);
  to->synchronize();
  from->free(*p);
  *p = np;
out:
  free(host);
  return st;
}
