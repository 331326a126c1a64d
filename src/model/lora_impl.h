/* ct_lora's insides, shared by lora.c (table, forward, backward), lora_io.c
 * (peft files) and lycoris.c (LyCORIS configs and files). Not a public header. */
#ifndef CTUNER_LORA_IMPL_H
#define CTUNER_LORA_IMPL_H

#include "ctuner/backend.h"
#include "ctuner/lora.h"

/* The adapters of one base weight. */
typedef struct lora_site {
  char base[96];
  int first, n;       /* adapters [first, first + n) */
  const float *w, *b; /* the base weight and bias (ct_lora_bind_base), for DoRA */
} lora_site;

struct ct_lora {
  ct_lora_opts o;
  int bypass; /* ct_lora_set_bypass: the forward adds nothing (the base model alone) */
  float scale;
  ct_lora_adapter *ad;
  size_t nad, numel;
  lora_site *sites;
  int nsites;
  float *w, *g;
  int own_w, own_g;
  int nseg;
  int *seg_of;     /* MMDiT segment -> lora segment or -1 (nmmseg entries) */
  int nmmseg;      /* MMDiT segments */
  size_t *seg_off; /* nseg + 1 */
  float **segw, **segg;
  /* where w, g, scratch and dense live (ct_lora_set_backend; the CPU backend
   * until then) */
  const ct_backend_ops *be;
  uint64_t *ctr; /* host: one dropout call's Philox offsets per row (ctr_cap) */
  size_t ctr_cap;
  uint64_t *ids; /* the micro-batch's sample ids (dropout masks) */
  int nids;
  size_t ids_cap;
  float *scratch; /* u, gu (N x rank), dropout x and dx (N x in) */
  size_t scratch_n;
  float *dense;      /* LoHa / LoKr: the rebuilt weight, its gradient and factors */
  size_t kron_chunk; /* LoKr: tokens per pass (0: as a 16 MB work buffer allows; tests set it) */
  size_t dense_n;
  /* LyCORIS */
  int lyco;
  char prefix[48];   /* apply_preset's lora_prefix, "lycoris" */
  char *lyco_json;   /* the lycoris_config file's text: the saved file's metadata */
  double lyco_mult;  /* multiplier (training) */
  double lyco_vmult; /* validation_lycoris_strength (no batch set) */
};

/* Decides whether the diffusers module (in inputs, out outputs) gets an
 * adapter: 1 (a's algo, rank, scale, alpha, nt and t[k] key/rows/cols/init
 * filled), 0 (none), or an error status. */
typedef ct_status (*ct_lora_pick_fn)(void *user, const char *module, int in, int out,
                                     ct_lora_adapter *a, int *take, ct_err *err);

/* The adapter table over cfg's name map (modules in MMDiT segment order),
 * then segments and buffers as ct_lora_new's flags say. l->o, l->scale set
 * by the caller; on error l is left for ct_lora_free. */
ct_status ct_lora_build(ct_lora *l, const ct_mmdit_config *cfg, ct_lora_pick_fn pick, void *user,
                        int flags, ct_err *err);

/* Tensor k of adapter a where it lives now, and its gradient (NULL: none). */
float *ct_lora_t(const ct_lora *l, const ct_lora_adapter *a, int k);
float *ct_lora_gt(const ct_lora *l, const ct_lora_adapter *a, int k);
/* The LoHa/LoKr scratch, at least n floats (grown as needed). */
float *ct_lora_dense(ct_lora *l, size_t n);

/* LoKr without the rebuilt weight (lora_kron.c): y += scale kron(W1, W2) x
 * per token as W1 X W2^T, and its backward. */
void ct_lokr_fwd(ct_lora *l, const ct_backend_ops *be, const ct_lora_adapter *a, int row_lo, int N,
                 const float *x, int ldx, float *y, int ldy);
void ct_lokr_bwd(ct_lora *l, const ct_backend_ops *be, const ct_lora_adapter *a, int row_lo, int N,
                 const float *x, int ldx, const float *dy, int lddy, float *dx, int lddx);

/* peft's DoRA on adapter i / a (lora_dora.c): the magnitude's initial value
 * (||W row||), the forward and the backward. */
void ct_dora_init(const ct_lora *l, size_t i, float *mag);
void ct_dora_fwd(ct_lora *l, const ct_backend_ops *be, int si, const ct_lora_adapter *a, int row_lo,
                 int N, const float *x, int ldx, float *y, int ldy);
void ct_dora_bwd(ct_lora *l, const ct_backend_ops *be, int si, const ct_lora_adapter *a, int row_lo,
                 int N, const float *x, int ldx, const float *dy, int lddy, float *dx, int lddx);

ct_status ct_lycoris_save(const ct_lora *l, const float *w, const char *path, ct_err *err);
ct_status ct_lycoris_load(const ct_lora *l, const char *path, size_t lo, size_t hi, float *out,
                          ct_err *err);

#endif
