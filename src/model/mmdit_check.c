/* Parity check of the MMDiT against a golden file written by the PyTorch peer
 * (scripts/mmdit_torch.py golden): the config comes from the file's
 * metadata, the weights from param.*, the inputs from input.*; we recompute
 * x_t, v_pred, the flow-matching loss and every parameter gradient and report
 * the largest error of each relative to the reference tensor's largest value. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/alloc.h"
#include "ctuner/json.h"
#include "ctuner/kernels.h"
#include "ctuner/mmdit.h"
#include "ctuner/safetensors.h"

static ct_status meta_ints(const ct_st_file *f, const char *path, const char *key, int *out, int n,
                           ct_err *err) {
  const char *s = ct_st_meta(f, key);
  ct_json *j = NULL;
  ct_status st = CT_OK;
  if (!s)
    return ct_errf(err, CT_ERR_FORMAT,
                   "%s: metadata key '%s' missing (not a golden file of mmdit_torch.py?)", path,
                   key);
  st = ct_json_parse(s, strlen(s), &j, err);
  if (st) {
    ct_err_prefix(err, "%s: metadata '%s': ", path, key);
    return st;
  }
  if (n == 1 && j->type == CT_JSON_NUMBER && j->is_int) {
    out[0] = (int)j->i64;
  } else if (n > 1 && j->type == CT_JSON_ARRAY && j->n == (size_t)n) {
    for (int i = 0; i < n && !st; i++) {
      if (j->items[i].type != CT_JSON_NUMBER || !j->items[i].is_int)
        st = ct_errf(err, CT_ERR_FORMAT, "%s: metadata '%s' item %d is not an integer", path, key,
                     i);
      else
        out[i] = (int)j->items[i].i64;
    }
  } else {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: metadata '%s' = %s: expected %s", path, key, s,
                 n == 1 ? "an integer" : "an array of integers");
  }
  ct_json_free(j);
  return st;
}

static ct_status read_tensor(const ct_st_file *f, const char *path, const char *name, size_t numel,
                             float **out, ct_err *err) {
  const ct_st_tensor *t = ct_st_find(f, name);
  if (!t) return ct_errf(err, CT_ERR_NOT_FOUND, "%s: tensor '%s' missing", path, name);
  if (t->numel != numel)
    return ct_errf(err, CT_ERR_SHAPE, "%s: tensor '%s' has %zu elements, the config implies %zu",
                   path, name, t->numel, numel);
  *out = ct_alloc(CT_MEM_BUFFERS, numel * sizeof(float) + 64);
  if (!*out) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  return ct_st_to_f32(t, *out, numel, err);
}

static double rel_err(const float *a, const float *b, size_t n) {
  double md = 0, mb = 0;
  for (size_t i = 0; i < n; i++) {
    double dd = fabs((double)a[i] - b[i]);
    if (!(dd <= md)) md = dd; /* NaN propagates */
    if (fabs(b[i]) > mb) mb = fabs(b[i]);
  }
  return md / (mb > 1e-30 ? mb : 1e-30);
}

ct_status ct_mmdit_check_golden(const char *path, ct_mmdit_check_report *r, ct_err *err) {
  ct_status st = CT_OK;
  ct_st_file *f = NULL;
  ct_mmdit *m = NULL;
  float *x0 = NULL, *eps = NULL, *t = NULL, *txt = NULL, *y = NULL, *xt_ref = NULL, *v_ref = NULL,
        *loss_ref = NULL, *xt = NULL, *v = NULL, *target = NULL, *dv = NULL, *gref = NULL;
  int hw[2], axes[3];
  memset(r, 0, sizeof *r);
  st = ct_st_open(path, &f, err);
  if (st) goto out;
  ct_mmdit_config *c = &r->cfg;
  c->patch = 2;
  c->mlp_ratio = 4;
  c->qkv_bias = 1;
  c->theta = 10000.f;
  if ((st = meta_ints(f, path, "lat", &c->in_channels, 1, err)) ||
      (st = meta_ints(f, path, "hidden", &c->hidden, 1, err)) ||
      (st = meta_ints(f, path, "heads", &c->heads, 1, err)) ||
      (st = meta_ints(f, path, "axes", axes, 3, err)) ||
      (st = meta_ints(f, path, "nd", &c->depth_double, 1, err)) ||
      (st = meta_ints(f, path, "ns", &c->depth_single, 1, err)) ||
      (st = meta_ints(f, path, "ctx", &c->context_in_dim, 1, err)) ||
      (st = meta_ints(f, path, "vec", &c->vec_in_dim, 1, err)) ||
      (st = meta_ints(f, path, "B", &r->B, 1, err)) ||
      (st = meta_ints(f, path, "hw", hw, 2, err)) || (st = meta_ints(f, path, "T", &r->T, 1, err)))
    goto out;
  memcpy(c->axes_dim, axes, sizeof axes);
  r->H = hw[0];
  r->W = hw[1];
  if (r->B < 1 || r->T < 0 || r->H < 2 || r->W < 2 || r->H % 2 || r->W % 2 || r->B > 65536 ||
      r->H > 4096 || r->W > 4096 || r->T > 65536) {
    st = ct_errf(err, CT_ERR_FORMAT, "%s: batch shape B=%d hw=%d,%d T=%d is not usable", path, r->B,
                 r->H, r->W, r->T);
    goto out;
  }
  st = ct_mmdit_new(c, 0, 1, &m, err);
  if (st) goto out;
  st = ct_mmdit_load(m, path, "param.", err);
  if (st) goto out;
  size_t B = (size_t)r->B, nx = B * c->in_channels * r->H * r->W;
  if ((st = read_tensor(f, path, "input.x0", nx, &x0, err)) ||
      (st = read_tensor(f, path, "input.eps", nx, &eps, err)) ||
      (st = read_tensor(f, path, "input.t", B, &t, err)) ||
      (st = read_tensor(f, path, "input.txt", B * r->T * c->context_in_dim, &txt, err)) ||
      (st = read_tensor(f, path, "input.y", B * c->vec_in_dim, &y, err)) ||
      (st = read_tensor(f, path, "output.xt", nx, &xt_ref, err)) ||
      (st = read_tensor(f, path, "output.v_pred", nx, &v_ref, err)) ||
      (st = read_tensor(f, path, "output.loss", 1, &loss_ref, err)))
    goto out;
  xt = ct_alloc(CT_MEM_BUFFERS, nx * sizeof(float));
  v = ct_alloc(CT_MEM_BUFFERS, nx * sizeof(float));
  target = ct_alloc(CT_MEM_BUFFERS, nx * sizeof(float));
  dv = ct_alloc(CT_MEM_BUFFERS, nx * sizeof(float));
  if (!xt || !v || !target || !dv) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
    goto out;
  }
  size_t per = nx / B;
  for (size_t i = 0; i < nx; i++) {
    float tt = t[i / per];
    xt[i] = (1.0f - tt) * x0[i] + tt * eps[i];
    target[i] = eps[i] - x0[i];
  }
  ct_mmdit_batch in = {r->B, r->H, r->W, r->T, xt, t, txt, y, NULL};
  st = ct_mmdit_forward(m, &in, v, err);
  if (st) goto out;
  r->loss = ct_mmdit_backend(m)->mse_fwd_bwd(nx, v, target, 1.0f, dv);
  r->loss_ref = loss_ref[0];
  st = ct_mmdit_backward(m, dv, err);
  if (st) goto out;
  r->err_xt = rel_err(xt, xt_ref, nx);
  r->err_v = rel_err(v, v_ref, nx);
  r->err_loss = fabs(r->loss - r->loss_ref) / fmax(fabs(r->loss_ref), 1e-30);
  if (!(r->loss == r->loss)) r->err_loss = INFINITY;
  size_t np;
  const ct_param *tab = ct_mmdit_table(m, &np);
  r->nparams = np;
  r->numel = ct_mmdit_numel(m);
  const float *g = ct_mmdit_grads(m);
  char name[160];
  for (size_t i = 0; i < np; i++) {
    snprintf(name, sizeof name, "grad.%s", tab[i].name);
    ct_free(gref);
    gref = NULL;
    st = read_tensor(f, path, name, tab[i].numel, &gref, err);
    if (st) goto out;
    double e = rel_err(g + tab[i].offset, gref, tab[i].numel);
    if (!(e <= r->err_grad)) {
      r->err_grad = e;
      snprintf(r->worst_grad, sizeof r->worst_grad, "%s", tab[i].name);
    }
  }
out:
  ct_free(x0);
  ct_free(eps);
  ct_free(t);
  ct_free(txt);
  ct_free(y);
  ct_free(xt_ref);
  ct_free(v_ref);
  ct_free(loss_ref);
  ct_free(xt);
  ct_free(v);
  ct_free(target);
  ct_free(dv);
  ct_free(gref);
  ct_mmdit_free(m);
  ct_st_close(f);
  return st;
}
