/* textenc_int.h: the CLIP text encoder's internals shared by textenc.c and
 * clip_dir.c (reading a transformers CLIPTextModel directory). */
#ifndef CT_TEXT_TEXTENC_INT_H
#define CT_TEXT_TEXTENC_INT_H

#include "ctuner/textenc.h"

/* ct_textenc_new without the seeded init: the weights are uninitialised,
 * for a caller that loads them next. */
ct_status ct_textenc_alloc(const ct_textenc_config *cfg, ct_textenc **out, ct_err *err);

#endif
