/* Standard LoRA adapters on the MMDiT (docs/lora.md, docs/design/lora.md).
 *
 * peft targets diffusers' modules (attn.to_q, proj_mlp, norm_out.linear, ...);
 * ctuner's MMDiT keeps BFL's fused tensors. An adapter is a diffusers module
 * mapped (src/model/flux_names.c) onto row pieces of one BFL weight: its
 * forward adds scale * B (A drop(x)) to those output rows, scale =
 * lora_alpha / lora_rank (peft's). All adapters live in one flat buffer
 * (A [rank, in] then B [out, rank] per adapter, in the MMDiT's segment
 * order), so the trainer's strategies shard it like any model's. The
 * backward recomputes A x (rank is small): no activation storage. */
#ifndef CTUNER_LORA_H
#define CTUNER_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "ctuner/backend.h"
#include "ctuner/mmdit.h"
#include "ctuner/status.h"

typedef struct ct_lora_piece {
  int64_t bfl_row, dif_row, rows; /* rows [bfl_row, +rows) of the base = rows of B from dif_row */
} ct_lora_piece;

/* An adapter's algorithm: peft's LoRA, or one of LyCORIS's (docs/lora.md). */
typedef enum ct_lora_algo {
  CT_ALGO_PEFT = 0, /* lora_A [r, in], lora_B [out, r] */
  CT_ALGO_LOCON,    /* LyCORIS lora/locon: lora_down.weight [r, in], lora_up.weight [out, r] */
  CT_ALGO_LOHA,     /* hada_w1_a [out, r], hada_w1_b [r, in], hada_w2_a, hada_w2_b */
  CT_ALGO_LOKR      /* lokr_w1 [ol, im] or _a/_b, lokr_w2 [ok, in] or _a/_b */
} ct_lora_algo;

/* One parameter tensor of an adapter: its key after the module name, shape,
 * offset in the flat buffer, and its initialisation (LyCORIS's). */
typedef struct ct_lora_tensor {
  char key[24]; /* e.g. "hada_w1_a", "lora_down.weight", "lora_magnitude_vector" */
  int rows, cols;
  size_t off;
  char init; /* 'z' zero, 'u' uniform [-v, v], 'n' normal(0, v) */
  float init_v;
} ct_lora_tensor;

typedef struct ct_lora_adapter {
  char module[112];    /* diffusers module, e.g. transformer_blocks.0.attn.to_q */
  char base[96];       /* ctuner's weight, e.g. double_blocks.0.img_attn.qkv.weight */
  int in, out;         /* A [rank, in], B [out, rank]; out = the module's rows */
  int seg;             /* the MMDiT segment of the base weight */
  size_t a_off, b_off; /* floats within the adapter buffer */
  int npieces;
  ct_lora_piece piece[2];
  int algo;     /* ct_lora_algo */
  int rank;     /* the adapter's rank (LyCORIS: dim, per module) */
  float scale;  /* what B A (or the rebuilt weight) is multiplied by: alpha / rank (x multiplier) */
  double alpha; /* LyCORIS: the .alpha tensor saved */
  int nt;       /* tensors: PEFT/LoCon 2 (A-like first, B-like second; DoRA: 3, the magnitude
                   [out, 1] third), LoHa 4, LoKr 2..4 */
  ct_lora_tensor t[4];
  int lokr[4];          /* LoKr: ol, ok, im, in (out = ol ok, in = im in) */
  int w1_full, w2_full; /* LoKr: lokr_w1 / lokr_w2 whole, else _a x _b */
} ct_lora_adapter;

typedef struct ct_lora_opts {
  int rank;       /* lora_rank >= 1 */
  double alpha;   /* lora_alpha > 0 */
  double dropout; /* lora_dropout in [0, 1) */
  uint64_t seed;  /* dropout masks */
  int dora;       /* use_dora: peft's DoRA (a magnitude per output row; lora_dropout 0) */
} ct_lora_opts;

/* SimpleTuner's flux_lora_target presets: the peft target_modules list
 * (NULL-terminated), or NULL for an unknown name. */
const char *const *ct_lora_preset(const char *name);
const char *ct_lora_preset_names(void); /* "mmdit, context, ..." for messages */

typedef struct ct_lora ct_lora;
/* The adapters of every module of cfg's diffusers transformer that a target
 * matches as peft matches (the name equals it or ends with "." it). Refused
 * by name: no module matched, rank above a module's smaller side, a bad
 * alpha or dropout. flags: CT_LORA_GRADS (own gradient buffer),
 * CT_LORA_NO_PARAMS (storage through ct_lora_bind_segment only). Parameters
 * start at zero: fill them with ct_lora_init_range or ct_lora_load. */
#define CT_LORA_GRADS 1
#define CT_LORA_NO_PARAMS 2
ct_status ct_lora_new(const ct_mmdit_config *cfg, const char *const *targets, const ct_lora_opts *o,
                      int flags, ct_lora **out, ct_err *err);
void ct_lora_free(ct_lora *l);
size_t ct_lora_numel(const ct_lora *l);
const ct_lora_adapter *ct_lora_adapters(const ct_lora *l, size_t *n);
const ct_lora_opts *ct_lora_options(const ct_lora *l);
float ct_lora_scale(const ct_lora *l);
float *ct_lora_params(ct_lora *l);
float *ct_lora_grads(ct_lora *l);
/* Borrowed storage instead of the own buffers (NULL: none). */
void ct_lora_use_params(ct_lora *l, float *w);
void ct_lora_use_grads(ct_lora *l, float *g);
/* Compute backend of the adapters' own buffers (parameters, gradients,
 * scratch): the CPU backend from creation (init and loading are host code),
 * then moved here, as ct_mmdit_set_backend moves the MMDiT they bind to (the
 * forward and backward compute on the MMDiT's backend, which must share this
 * one's memory). A backend without host memory is refused for LyCORIS and
 * DoRA adapters, and one lacking dropout_fwd/bwd when lora_dropout > 0. */
ct_status ct_lora_set_backend(ct_lora *l, const struct ct_backend_ops *be, ct_err *err);
const struct ct_backend_ops *ct_lora_backend(const ct_lora *l);
/* w in place of the parameter pointer (nothing freed or owned), the previous
 * one returned: a host copy for ct_lora_save, swapped back before computing. */
float *ct_lora_swap_params(ct_lora *l, float *w);

/* Segments: the MMDiT segments holding adapters, in order; k-th is [off, off+n). */
int ct_lora_nsegments(const ct_lora *l);
void ct_lora_segment(const ct_lora *l, int k, size_t *off, size_t *numel);
int ct_lora_segment_of(const ct_lora *l, int mmdit_seg); /* -1: no adapters there */
/* The first MMDiT segment holding adapters: a frozen model's backward stops there. */
int ct_lora_first_mmdit_segment(const ct_lora *l);
/* Segment k's parameters / gradients at w / g (NULL: the own buffers). */
void ct_lora_bind_segment(ct_lora *l, int k, float *w, float *g);

/* Initial values of floats [lo, hi) into out: "default" (peft: A kaiming-
 * uniform, bound 1/sqrt(in); B zero) or "gaussian" (A ~ N(0, 1/rank); B zero). */
ct_status ct_lora_init_range(const ct_lora *l, const char *init_type, uint64_t seed, size_t lo,
                             size_t hi, float *out, ct_err *err);
/* Tensor names of the saved file: transformer.<module>.lora_A.weight / lora_B.weight. */
void ct_lora_tensor_name(const ct_lora_adapter *a, int which_b, char *out, size_t cap);
/* Any adapter's tensor k (< a->nt) under the saved file's name: peft's, or
 * LyCORIS's <prefix>_<module, dots as _>.<key>. */
void ct_lora_tensor_fullname(const ct_lora *l, const ct_lora_adapter *a, int k, char *out,
                             size_t cap);

/* ---- LyCORIS (lora_type lycoris, src/model/lycoris.c) ----
 * The adapters a lycoris_config JSON (as SimpleTuner passes it to LyCORIS's
 * create_lycoris, apply_preset included) puts on cfg's transformer. Every
 * key is used, refused by name, or warned about once. */
ct_status ct_lycoris_new(const ct_mmdit_config *cfg, const char *config_path, int flags,
                         ct_lora **out, ct_err *err);
/* The config's keys and values alone (no model): what ct_lycoris_new would
 * refuse for them, without its warnings (the trainer checks before caching). */
ct_status ct_lycoris_check(const char *config_path, ct_err *err);
/* LyCORIS: the multiplier while no batch is set (validation sampling:
 * SimpleTuner's validation_lycoris_strength); with a batch set (training)
 * lycoris_config's multiplier applies. */
void ct_lora_set_validation_multiplier(ct_lora *l, double m);
/* 1 for LyCORIS adapters (their files use LyCORIS's names and metadata). */
int ct_lora_is_lycoris(const ct_lora *l);
/* pytorch_lora_weights.safetensors: every adapter (w: the whole flat buffer)
 * under peft's names, the LoraConfig as diffusers' lora_adapter_metadata
 * (target_modules: the exact module names), written atomically. */
ct_status ct_lora_save(const ct_lora *l, const float *w, const char *path, ct_err *err);
/* Floats [lo, hi) of a saved adapter file into out. Missing, unexpected or
 * wrongly shaped tensors, or a rank/alpha in its metadata other than ours:
 * one error naming them. */
ct_status ct_lora_load(const ct_lora *l, const char *path, size_t lo, size_t hi, float *out,
                       ct_err *err);

/* The next forward's batch: B samples with global ids (dropout masks are
 * keyed by (seed, adapter, sample id, row within the sample, column), so N
 * ranks draw what 1 rank draws); until ct_lora_set_batch(l, 0, NULL) every
 * forward and backward is a training one. Without a batch (inference,
 * validation) there is no dropout, as in peft's eval mode. */
void ct_lora_set_batch(ct_lora *l, int B, const uint64_t *ids);
/* on = 1: every adapter is left out of the forward (standard, DoRA and
 * LyCORIS alike), so the MMDiT computes the frozen base model's output, as
 * peft's disable_adapter / LyCORIS's set_multiplier(0) do; for
 * is_regularisation_data's target (docs/lora.md). No backward in between. */
void ct_lora_set_bypass(ct_lora *l, int on);

/* ---- what the MMDiT calls (src/model/mmdit.c) ----
 * site: the adapters of one base weight (ct_lora_site: -1 none). Only pieces
 * whose base rows lie in [row_lo, row_hi) take part; y / dy column j is base
 * row row_lo + j. fwd adds to y; bwd adds scale * dX to dx (if not NULL) and
 * accumulates dA, dB (if the segment has gradients). */
int ct_lora_site(const ct_lora *l, const char *base);
/* The site's base weight [rows, in] and bias as they live now (DoRA reads them). */
void ct_lora_bind_base(ct_lora *l, int site, const float *w, const float *b);
void ct_lora_fwd(ct_lora *l, const ct_backend_ops *be, int site, int row_lo, int row_hi, int N,
                 const float *x, int ldx, float *y, int ldy);
void ct_lora_bwd(ct_lora *l, const ct_backend_ops *be, int site, int row_lo, int row_hi, int N,
                 const float *x, int ldx, const float *dy, int lddy, float *dx, int lddx);

/* Attach adapters to an MMDiT of the same config (NULL: detach), and freeze
 * its weights: the backward then computes no weight gradient and needs no
 * gradient buffer (only the adapters' and the input gradients), and with
 * adapters attached it stops after the first segment holding any (nothing
 * below it needs a gradient). */
void ct_mmdit_set_lora(ct_mmdit *m, ct_lora *l);
void ct_mmdit_set_frozen(ct_mmdit *m, int frozen);

#endif
