/* The generic half of the model interface (model.h): the wrapper, name
 * lookup, and flat buffers saved and loaded under the model's tensor names
 * (the EMA, and any model whose weights file uses its table's names). */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/fs.h"
#include "ctuner/safetensors.h"

ct_status ct_model_wrap(const ct_model_ops *ops, void *impl, ct_model_param *tab, size_t ntab,
                        size_t numel, ct_model **out, ct_err *err) {
  ct_model *m = calloc(1, sizeof *m);
  if (!m) {
    free(tab);
    if (ops->free) ops->free(impl);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  *m = (ct_model){ops, impl, tab, ntab, numel};
  *out = m;
  return CT_OK;
}

void ct_model_free(ct_model *m) {
  if (!m) return;
  if (m->ops->free) m->ops->free(m->impl);
  free(m->tab);
  free(m);
}

const ct_model_param *ct_model_find(const ct_model *m, const char *name) {
  for (size_t i = 0; i < m->ntab; i++)
    if (!strcmp(m->tab[i].name, name)) return &m->tab[i];
  return NULL;
}

ct_status ct_model_save_flat(const ct_model *m, const char *path, const float *buf, ct_err *err) {
  return ct_model_save_flat_read(m, path, buf, NULL, err);
}

ct_status ct_model_save_flat_read(const ct_model *m, const char *path, const float *buf,
                                  ct_st_read_fn read, ct_err *err) {
  ct_st_writer *w;
  if (ct_st_writer_new(&w)) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  ct_st_writer_set_reader(w, read);
  ct_status st = CT_OK;
  for (size_t i = 0; i < m->ntab && !st; i++) {
    const ct_model_param *t = &m->tab[i];
    st = ct_st_writer_add_f32(w, t->name, t->ndim, t->shape, buf + t->offset, CT_DTYPE_F32, err);
  }
  if (!st) st = ct_st_writer_write(w, path, err);
  ct_st_writer_free(w);
  return st;
}

/* One error naming up to 8 tensors that are missing or of another size. */
static void note_bad(char *list, size_t n, int *count, const char *name) {
  if ((*count)++ < 8) {
    size_t l = strlen(list);
    snprintf(list + l, n - l, "%s%s", l ? ", " : "", name);
  }
}

ct_status ct_model_save_component(const char *dir, const void *obj,
                                  ct_status (*save_weights)(const void *obj, const char *path,
                                                            ct_err *err),
                                  char *(*config_json)(const void *obj), ct_err *err) {
  char p[4200];
  ct_status st = ct_mkdir_p(dir, err);
  if (st) return st;
  snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
  if ((st = save_weights(obj, p, err))) return st;
  char *cj = config_json(obj);
  snprintf(p, sizeof p, "%s/config.json", dir);
  st = cj ? ct_write_file_atomic(p, cj, strlen(cj), err)
          : ct_errf(err, CT_ERR_NOMEM, "out of memory");
  free(cj);
  return st;
}

ct_status ct_model_load_flat(const ct_model *m, const char *path, size_t lo, size_t hi, float *out,
                             ct_err *err) {
  ct_st_file *f = NULL;
  ct_status st = ct_st_open(path, &f, err);
  if (st) return st;
  char bad[1024] = "";
  int nbad = 0;
  for (size_t i = 0; !st && i < m->ntab; i++) {
    const ct_model_param *p = &m->tab[i];
    const size_t a = p->offset > lo ? p->offset : lo,
                 b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
    if (a >= b) continue;
    const ct_st_tensor *x = ct_st_find(f, p->name);
    if (!x || x->numel != p->numel) {
      note_bad(bad, sizeof bad, &nbad, p->name);
      continue;
    }
    st = ct_st_to_f32_range(x, a - p->offset, b - a, out + (a - lo), err);
  }
  ct_st_close(f);
  if (!st && nbad)
    st = ct_errf(err, CT_ERR_FORMAT, "%s: %d tensor(s) missing or of another size: %s%s", path,
                 nbad, bad, nbad > 8 ? ", ..." : "");
  return st;
}
