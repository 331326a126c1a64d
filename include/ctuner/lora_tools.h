/* LoRA tools (docs/lora.md): an adapter file opened onto a transformer of
 * any config, folded into the base weights (`ctuner lora merge`,
 * `ctuner sample --lora`), and written in the kohya / ComfyUI key layout
 * (`ctuner lora export --format comfyui`). */
#ifndef CTUNER_LORA_TOOLS_H
#define CTUNER_LORA_TOOLS_H

#include "ctuner/lora.h"
#include "ctuner/mmdit.h"
#include "ctuner/status.h"

/* A pytorch_lora_weights.safetensors (peft names,
 * transformer.<module>.lora_A/B.weight) as adapters on cfg's transformer,
 * holding the file's values: the modules are the file's, the rank its A's
 * (one for all), alpha its lora_adapter_metadata's lora_alpha, else the rank
 * (diffusers' default for a file without it). Refused, naming the file and
 * what is wrong: not a safetensors file, kohya/ComfyUI names, mixed ranks,
 * use_dora, modules this transformer lacks or tensors of other shapes (an
 * adapter for another model). */
ct_status ct_lora_open_file(const ct_mmdit_config *cfg, const char *path, ct_lora **out,
                            ct_err *err);

/* multiplier: diffusers' lora_scale (joint_attention_kwargs {"scale": s},
 * set_adapters' weight, fuse_lora's lora_scale): the adapter adds
 * multiplier * alpha / rank * B A. Refused if not finite. */
ct_status ct_lora_check_multiplier(double multiplier, ct_err *err);

/* Every adapted base weight of m += multiplier * scale * B A (float32,
 * through the name map's row pieces): the model with the adapter folded in.
 * m must have the config the adapter was opened on. */
ct_status ct_lora_merge(ct_mmdit *m, const ct_lora *l, double multiplier, ct_err *err);

/* Any adapter file (below) folded into m: ct_lora_open_file + ct_lora_merge
 * for a peft file, ct_lora_merge_any for the other layouts. */
ct_status ct_lora_merge_file(ct_mmdit *m, const char *path, double multiplier, ct_err *err);

/* What ct_lora_merge_any found in a file. */
typedef struct ct_lora_file_info {
  int modules;              /* modules folded in */
  int bfl_named;            /* of them named by BFL weight (kohya, ComfyUI, BFL) */
  int lora, loha, lokr;     /* of them LoRA/LoCon, LoHa, LoKr */
  int skipped_text_encoder; /* text-encoder tensors not applied (one warning) */
} ct_lora_file_info;

/* 1 when path is a peft adapter file (every tensor transformer.<module>
 * .lora_A/lora_B.weight or .lora_magnitude_vector, or diffusers'
 * lora_adapter_metadata), or cannot be read (the peft route says why). */
int ct_lora_file_is_peft(const char *path);

/* An adapter file in the other layouts users bring, folded into m's weights
 * (docs/lora.md, "Adapter files"): kohya / ComfyUI (lora_unet_<BFL name, '.'
 * as '_'>.lora_down.weight / lora_up.weight / alpha, fused qkv and linear1
 * whole; diffusion_model.<BFL name>.lora_down...), BFL names with
 * lora_A/lora_B, diffusers' lora_transformer_<module> and LyCORIS files
 * (<lora_prefix>_<module>: LoCon lora_down/up, LoHa hada_w1_a.., LoKr
 * lokr_w1.., each with its .alpha; the prefix from the lycoris_config
 * metadata, default lycoris). Per module W += multiplier * ΔW, ΔW as LyCORIS
 * and ComfyUI rebuild it (scale alpha / rank, no alpha or 0: 1; LoKr with
 * both factors whole: 1). BFL-named modules change all rows of the BFL
 * weight in BFL order; diffusers-named ones their rows through the name map.
 * peft-keyed modules without an alpha tensor take the file's
 * lora_adapter_metadata lora_alpha (a peft file with text-encoder adapters
 * comes here). Text-encoder tensors are counted and skipped with one warning. Refused,
 * naming the tensor: DoRA, Tucker cores, full diffs, LoRA biases, unknown
 * keys, modules this transformer lacks, wrong shapes. info may be NULL. */
ct_status ct_lora_merge_any(ct_mmdit *m, const char *path, double multiplier,
                            ct_lora_file_info *info, ct_err *err);

/* The adapter in kohya's Flux key layout, which ComfyUI, Forge, sd-scripts
 * and diffusers' load_lora_weights read: per adapted BFL weight W (e.g.
 * double_blocks.0.img_attn.qkv.weight) lora_unet_<W's name without
 * ".weight", '.' -> '_'> .lora_down.weight [n r, in], .lora_up.weight
 * [rows of W, n r] and .alpha (a scalar), where n adapters share W (to_q,
 * to_k, to_v on qkv; to_q, to_k, to_v, proj_mlp on linear1): down =
 * cat(A_1 .. A_n), up block-diagonal (adapter i's B, times multiplier *
 * alpha / rank, in its rows of W and columns [i r, (i+1) r); rows no
 * adapter covers zero; norm_out.linear's halves back in BFL's shift;scale
 * order) and alpha = n r, so every reader's alpha / rank * up down is
 * exactly multiplier * scale * sum_i B_i A_i (the scale is in up because
 * diffusers' converter ignores alpha on final_layer). dtype: CT_DTYPE_F32,
 * F16 or BF16; written atomically. cfg: the transformer l was made for. */
ct_status ct_lora_export_kohya(const ct_mmdit_config *cfg, const ct_lora *l, double multiplier,
                               const char *path, int dtype, ct_err *err);

#endif
