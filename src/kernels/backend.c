/* The registry of compute backends (include/ctuner/backend.h): a
 * table of the backends compiled in (cpu-bf16's row filled on first use),
 * looked up by name.
 *
 * Each backend is one file defining a ct_backend_ops (backend_cpu.c, which
 * also builds its bf16-compute sibling "cpu-bf16" on first use; backend_cuda.c
 * with "cuda" and "cuda-bf16" when built with CT_CUDA; backend_sealed.c with
 * the test backends "sealed" and "sealed-bf16", whose memory the host cannot
 * touch); adding one is a row in
 * reg_init. The first row is the default. A backend with an init is listed
 * only when init succeeds (a CUDA build on a machine without a GPU lists only
 * the CPU backends, and asking for "cuda" says why).
 * Also ct_backend_move, the one helper models use to move an owned buffer
 * to another backend.
 * Not here: any op (the backend files), choosing a backend from a config.
 */
#include "ctuner/backend.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

extern const ct_backend_ops ct_backend_cpu;         /* backend_cpu.c */
const ct_backend_ops *ct_backend_cpu_bf16(void);    /* backend_cpu.c, built on first use */
extern const ct_backend_ops ct_backend_sealed;      /* backend_sealed.c: the test backend */
const ct_backend_ops *ct_backend_sealed_bf16(void); /* backend_sealed.c */
#ifdef CT_CUDA
const ct_backend_ops *ct_backend_cuda(void);      /* backend_cuda.c */
const ct_backend_ops *ct_backend_cuda_bf16(void); /* backend_cuda.c */
#endif

/* Every backend compiled in, in registry order (the first is the default);
 * filled on first use. Backends a build can leave out are named in
 * left_out so that asking for one says why it is not there. */
#define NMAX 8
static const ct_backend_ops *compiled[NMAX];
static size_t ncompiled;
static const ct_backend_ops *usable[NMAX];
static ct_err why_not[NMAX]; /* init's reason, per compiled row */
static size_t nusable;
static const char *const left_out[] = {
#ifndef CT_CUDA
    "cuda", "cuda-bf16",
#endif
    NULL};

static once_flag reg_once = ONCE_FLAG_INIT;
static void reg_init(void) {
  compiled[ncompiled++] = &ct_backend_cpu;
  compiled[ncompiled++] = ct_backend_cpu_bf16();
#ifdef CT_CUDA
  compiled[ncompiled++] = ct_backend_cuda();
  compiled[ncompiled++] = ct_backend_cuda_bf16();
#endif
  compiled[ncompiled++] = &ct_backend_sealed; /* a test backend: host memory sealed off */
  compiled[ncompiled++] = ct_backend_sealed_bf16();
  for (size_t i = 0; i < ncompiled; i++)
    if (!compiled[i]->init || compiled[i]->init(&why_not[i]) == CT_OK)
      usable[nusable++] = compiled[i];
}

size_t ct_backend_count(void) {
  call_once(&reg_once, reg_init);
  return nusable;
}

const ct_backend_ops *ct_backend_at(size_t i) {
  call_once(&reg_once, reg_init);
  return i < nusable ? usable[i] : NULL;
}

const ct_backend_ops *ct_backend_default(void) {
  return &ct_backend_cpu;
}

ct_status ct_backend_get(const char *name, const ct_backend_ops **out, ct_err *err) {
  call_once(&reg_once, reg_init);
  *out = NULL;
  for (size_t i = 0; name && i < nusable; i++)
    if (!strcmp(usable[i]->name, name)) {
      *out = usable[i];
      return CT_OK;
    }
  for (size_t i = 0; name && i < ncompiled; i++)
    if (!strcmp(compiled[i]->name, name))
      return ct_errf(err, CT_ERR_UNSUPPORTED, "compute backend %s cannot run here: %s", name,
                     why_not[i].msg[0] ? why_not[i].msg : "its initialisation failed");
  char list[256] = "";
  for (size_t i = 0; i < nusable; i++) {
    size_t len = strlen(list);
    snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", usable[i]->name);
  }
  for (size_t i = 0; name && left_out[i]; i++)
    if (!strcmp(left_out[i], name))
      return ct_errf(err, CT_ERR_NOT_FOUND,
                     "compute backend '%s' is not in this build of ctuner (built without CUDA: "
                     "configure with -DCT_CUDA=ON, docs/cuda.md); usable: %s",
                     name, list);
  return ct_errf(err, CT_ERR_NOT_FOUND, "unknown compute backend '%s'; usable: %s",
                 name ? name : "(null)", list);
}

const char *ct_backend_lacks(const ct_backend_ops *be, const char *ops) {
  static const struct {
    const char *name;
    size_t off;
  } fields[] = {
#define CT_X(f) {#f, offsetof(ct_backend_ops, f)},
      CT_BACKEND_OP_FIELDS(CT_X)
#undef CT_X
  };
  static _Thread_local char word[48];
  for (const char *p = ops; p && *p;) {
    size_t n = strcspn(p, " ");
    if (n) {
      snprintf(word, sizeof word, "%.*s", (int)n, p);
      const void *fn = NULL;
      for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (!strcmp(fields[i].name, word)) memcpy(&fn, (const char *)be + fields[i].off, sizeof fn);
      if (!fn) return word;
    }
    p += n + (p[n] == ' ');
  }
  return NULL;
}

ct_status ct_backend_with_compute(const ct_backend_ops *be, ct_compute c,
                                  const ct_backend_ops **out, ct_err *err) {
  call_once(&reg_once, reg_init);
  *out = NULL;
  if (be->compute == c) {
    *out = be;
    return CT_OK;
  }
  for (size_t i = 0; i < nusable; i++)
    if (usable[i]->compute == c && usable[i]->alloc == be->alloc && usable[i]->free == be->free) {
      *out = usable[i];
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
