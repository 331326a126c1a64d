/* A frozen MMDiT base in its stored / quantised dtype (base_model_precision,
 * docs/lora.md): bf16, or int8 weight-only with per-output-channel float32
 * scales as optimum-quanto's qint8 and torchao's int8_weight_only compute
 * them (ct_quantize_int8). The forward and the dX backward read every such
 * weight through a view (kernels.h ct_wview) that the GEMM dequantises tile by
 * tile while packing, in float32; no float32 copy of the weights stays.
 *
 * Design: one buffer (category params) holds, 64-byte aligned, [the float32
 * parameters: biases, norm scales, unquantised weights][the int8 rows'
 * scales][the narrow weights' elements], in table order within each part;
 * m->qv gives every parameter's view into it, which the views of mmdit.c
 * read instead of the flat float32 buffer (freed). The plan
 * (ct_mmdit_quant_bytes) walks the same table with the same rule.
 * Not here: the GEMM (src/kernels), where the precision comes from (the
 * trainer, src/train/task_mmdit.c), the memory plan's totals (memplan.c).
 */
#include <stdlib.h>
#include <string.h>

#include "ctuner/backend.h"
#include "ctuner/mmdit.h"
#include "model/mmdit_int.h"

static int precision_code(const char *p) {
  if (!strcmp(p, "no_change")) return CT_WDT_F32;
  if (!strcmp(p, "bf16")) return CT_WDT_BF16;
  if (!strcmp(p, "int8-quanto") || !strcmp(p, "int8-torchao")) return CT_WDT_I8;
  return -1;
}

int ct_mmdit_quant_dtype(const ct_param *p, const char *precision, int default_bf16) {
  const int code = precision_code(precision);
  if (code < 0) return -1;
  const size_t n = strlen(p->name);
  const int weight = p->ndim == 2 && n > 7 && !strcmp(p->name + n - 7, ".weight");
  if (!weight || code == CT_WDT_F32) return CT_WDT_F32;
  if (code == CT_WDT_I8 && !strcmp(p->name, "final_layer.linear.weight"))
    return default_bf16 ? CT_WDT_BF16 : CT_WDT_F32; /* quanto's exclude: proj_out */
  return code;
}

static size_t align64(size_t n) {
  return (n + 63) & ~(size_t)63;
}

/* The three parts' bytes: float32 parameters, int8 scales, narrow elements. */
static void parts(const ct_param *tab, size_t n, const char *precision, int default_bf16,
                  size_t part[3]) {
  part[0] = part[1] = part[2] = 0;
  for (size_t i = 0; i < n; i++) {
    const int dt = ct_mmdit_quant_dtype(&tab[i], precision, default_bf16);
    if (dt == CT_WDT_F32) {
      part[0] += tab[i].numel * sizeof(float);
    } else {
      if (dt == CT_WDT_I8) part[1] += (size_t)tab[i].shape[0] * sizeof(float);
      part[2] += tab[i].numel * ct_wdtype_size((ct_wdtype)dt);
    }
  }
}

size_t ct_mmdit_quant_bytes(const ct_param *tab, size_t n, const char *precision,
                            int default_bf16) {
  size_t part[3];
  parts(tab, n, precision, default_bf16, part);
  return align64(part[0]) + align64(part[1]) + align64(part[2]);
}

size_t ct_mmdit_param_bytes(const ct_mmdit *m) {
  return m->qv ? m->qbytes : m->numel * sizeof(float);
}

/* Every parameter of segment s (floats src, the segment's own) into its
 * place in the buffer; at[] are the three parts' next offsets. */
static void store_segment(ct_mmdit *m, int s, const float *src, const char *precision,
                          int default_bf16, size_t at[3]) {
  const ct_quant_kind kind = strcmp(precision, "int8-torchao") ? CT_QUANT_QUANTO : CT_QUANT_TORCHAO;
  char *buf = m->qbuf;
  for (size_t i = 0; i < m->nparams; i++) {
    const ct_param *p = &m->params[i];
    if (p->offset < m->seg_off[s] || p->offset >= m->seg_off[s + 1]) continue;
    const float *w = src + (p->offset - m->seg_off[s]);
    const ct_wdtype dt = (ct_wdtype)ct_mmdit_quant_dtype(p, precision, default_bf16);
    ct_wview *v = &m->qv[i];
    v->dtype = dt;
    if (dt == CT_WDT_F32) {
      memcpy(buf + at[0], w, p->numel * sizeof(float));
      v->data = buf + at[0];
      at[0] += p->numel * sizeof(float);
      continue;
    }
    v->data = buf + at[2];
    if (dt == CT_WDT_BF16) {
      ct_to_bf16(p->numel, w, (uint16_t *)(buf + at[2]));
    } else {
      float *sc = (float *)(buf + at[1]);
      ct_quantize_int8(kind, (int)p->shape[0], (int)p->shape[1], w, (int8_t *)(buf + at[2]), sc);
      v->scales = sc;
      at[1] += (size_t)p->shape[0] * sizeof(float);
    }
    at[2] += p->numel * ct_wdtype_size(dt);
  }
}

/* The buffer and views; each segment's float32 values from the model's own
 * buffer, or read one segment at a time into a scratch buffer (category
 * buffers, the largest segment's size: never the whole model in float32). */
static ct_status quantize(ct_mmdit *m, const char *precision, int default_bf16, ct_mmdit_reader rd,
                          void *user, ct_err *err) {
  size_t part[3];
  parts(m->params, m->nparams, precision, default_bf16, part);
  const size_t o1 = align64(part[0]), o2 = o1 + align64(part[1]);
  size_t maxseg = 0;
  for (int s = 0; s < m->nseg; s++)
    if (m->seg_off[s + 1] - m->seg_off[s] > maxseg) maxseg = m->seg_off[s + 1] - m->seg_off[s];
  m->qbytes = o2 + align64(part[2]);
  m->qv = calloc(m->nparams, sizeof *m->qv);
  m->qbuf = m->be->alloc(CT_MEM_PARAMS, m->qbytes);
  float *tmp = m->w ? NULL : m->be->alloc(CT_MEM_BUFFERS, maxseg * sizeof(float));
  ct_status st = CT_OK;
  if (!m->qv || !m->qbuf || (!m->w && !tmp))
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory storing the base as %s (%.1f MiB)", precision,
                 (double)m->qbytes / 1048576.0);
  size_t at[3] = {0, o1, o2};
  for (int s = 0; s < m->nseg && !st; s++) {
    const float *src = m->w ? m->w + m->seg_off[s] : tmp;
    if (!m->w) st = rd(user, m->seg_off[s], m->seg_off[s + 1], tmp, err);
    if (!st) store_segment(m, s, src, precision, default_bf16, at);
  }
  m->be->free(tmp);
  if (st) {
    free(m->qv);
    m->be->free(m->qbuf);
    m->qv = NULL;
    m->qbuf = NULL;
    return st;
  }
  if (m->own_w) m->be->free(m->w);
  m->w = NULL;
  m->own_w = 0;
  ct_mmdit_set_frozen(m, 1); /* rebinds every view to the stored parameters */
  return CT_OK;
}

static ct_status check_state(const ct_mmdit *m, const char *precision, int code, int need_w,
                             ct_err *err) {
  if (code < 0)
    return ct_errf(err, CT_ERR_INVALID,
                   "base_model_precision %s: ctuner stores a frozen base as no_change, bf16, "
                   "int8-quanto or int8-torchao",
                   precision);
  if (m->qv || m->g || (need_w ? !(m->own_w && m->w) : m->w != NULL))
    return ct_errf(err, CT_ERR_INVALID,
                   "base_model_precision %s: only a frozen model without gradients and %s is "
                   "stored quantised",
                   precision,
                   need_w ? "with its own float32 parameters" : "without parameters (NO_PARAMS)");
  return CT_OK;
}

ct_status ct_mmdit_quantize(ct_mmdit *m, const char *precision, int default_bf16, ct_err *err) {
  const int code = precision_code(precision);
  if (code == CT_WDT_F32) return CT_OK;
  ct_status st = check_state(m, precision, code, 1, err);
  return st ? st : quantize(m, precision, default_bf16, NULL, NULL, err);
}

ct_status ct_mmdit_quantize_from(ct_mmdit *m, const char *precision, int default_bf16,
                                 ct_mmdit_reader rd, void *user, ct_err *err) {
  const int code = precision_code(precision);
  if (code == CT_WDT_F32)
    return ct_errf(err, CT_ERR_INVALID, "base_model_precision no_change: nothing to quantise");
  ct_status st = check_state(m, precision, code, 0, err);
  return st ? st : quantize(m, precision, default_bf16, rd, user, err);
}
