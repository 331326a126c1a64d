/* The trainer's text conditioning: what turns captions into the MMDiT's
 * context sequence (B, T, d) and pooled vector (B, dp). Two kinds:
 *  - builtin: ctuner's own CLIP-like encoder (byte or BPE tokenizer) feeding
 *    both, d == dp (the presets);
 *  - flux: FluxPipeline's pair — T5 v1.1 over T tokens as the sequence and
 *    CLIP-L's pooled output over its 77 tokens as the vector.
 * After the text cache is built the Flux encoders are released
 * (ct_textcond_release): the prompts encoded then (validation, "") stay
 * answerable from a memo, any other prompt is an error. Private to src/train. */
#ifndef CT_TEXTCOND_H
#define CT_TEXTCOND_H

#include <stddef.h>

#include "ctuner/config.h"
#include "ctuner/status.h"
#include "ctuner/textenc.h"

struct ct_flux_pipe;

typedef struct ct_textcond {
  int kind; /* CT_TEXTCOND_BUILTIN | CT_TEXTCOND_FLUX */
  int T, d, dp;
  ct_textenc *te; /* builtin: the encoder (owns its BPE); flux: CLIP-L (NULL once released) */
  struct ct_t5 *t5;
  struct ct_spm *spm;
  ct_bpe *bpe; /* flux: CLIP's tokenizer (kept after release) */
  int clip_len, t5_zero;
  /* memo of released encoders */
  int nmemo;
  char **memo;
  float *memo_txt, *memo_y;
} ct_textcond;

enum { CT_TEXTCOND_BUILTIN = 0, CT_TEXTCOND_FLUX = 1 };

/* builtin: the config's encoder (ct_textenc_from_config), d = dp = hidden. */
ct_status ct_textcond_builtin(const ct_config *cfg, int hidden, const char *ckpt_dir, int T,
                              ct_textcond **out, ct_err *err);
/* flux: CLIP-L and T5 with their tokenizers from the pipeline; t5_zero:
 * t5_padding zero (the sequence's padding rows set to 0, as SimpleTuner). */
ct_status ct_textcond_flux(const struct ct_flux_pipe *p, int t5_zero, ct_textcond **out,
                           ct_err *err);
/* n prompts -> txt (n, T, d), y (n, dp). */
ct_status ct_textcond_encode(ct_textcond *c, const char *const *prompts, int n, float *txt,
                             float *y, ct_err *err);
/* Tokens of a caption without the special ones, and how many special tokens
 * the encoder adds (BOS/EOS: 2; T5's </s>: 1), for the truncation warning. */
size_t ct_textcond_tokens(const ct_textcond *c, const char *caption);
int ct_textcond_specials(const ct_textcond *c);
/* Bytes of the flux T5's weights (ct_t5_weight_bytes), 0 when there is none. */
size_t ct_textcond_t5_bytes(const ct_textcond *c);
const char *ct_textcond_unit(const ct_textcond *c);
/* flux: encode keep[0..n) into the memo, then free the encoders' weights. builtin: nothing. */
ct_status ct_textcond_release(ct_textcond *c, const char *const *keep, int n, ct_err *err);
void ct_textcond_free(ct_textcond *c);

#endif
