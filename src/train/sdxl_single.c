/* The single-file SDXL checkpoint's names (ctuner/diffusion.h,
 * docs/sdxl.md): Stability's sd_xl_base_1.0.safetensors holds
 *
 *   conditioner.embedders.0.transformer.<transformers CLIPTextModel names>
 *   conditioner.embedders.1.model.<OpenCLIP text tower names>
 *   first_stage_model.<LDM AutoencoderKL names>
 *   model.diffusion_model.<LDM U-net names>
 *
 * mapped as diffusers 0.42.1 loaders/single_file_utils.py does it
 * (convert_open_clip_checkpoint: resblocks -> encoder.layers, in_proj split
 * into q/k/v, text_projection transposed; convert_ldm_vae_checkpoint:
 * down.i.block.j -> down_blocks.i.resnets.j, up blocks reversed, mid.attn_1's
 * q/k/v/proj_out 1x1 convs -> to_q/to_k/to_v/to_out.0 linears,
 * nin_shortcut -> conv_shortcut, norm_out -> conv_norm_out). The U-net's
 * names are left to the U-net's own map (CT_SDXL_SF_UNET). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/diffusion.h"

static int starts(const char *s, const char *p) {
  return !strncmp(s, p, strlen(p));
}

/* "<prefix>N.<rest>": N and rest, or -1. */
static int indexed(const char *s, const char *prefix, const char **rest) {
  if (!starts(s, prefix)) return -1;
  char *end;
  long v = strtol(s + strlen(prefix), &end, 10);
  if (end == s + strlen(prefix) || *end != '.' || v < 0 || v > 10000) return -1;
  *rest = end + 1;
  return (int)v;
}

static ct_sdxl_sf_part open_clip(const char *k, char names[3][192], ct_sdxl_sf_op *op) {
  static const struct {
    const char *from, *to;
  } FIXED[] = {{"token_embedding.weight", "text_model.embeddings.token_embedding.weight"},
               {"positional_embedding", "text_model.embeddings.position_embedding.weight"},
               {"ln_final.weight", "text_model.final_layer_norm.weight"},
               {"ln_final.bias", "text_model.final_layer_norm.bias"}};
  for (size_t i = 0; i < sizeof FIXED / sizeof *FIXED; i++)
    if (!strcmp(k, FIXED[i].from)) {
      snprintf(names[0], 192, "%s", FIXED[i].to);
      return CT_SDXL_SF_TEXT2;
    }
  if (!strcmp(k, "text_projection")) {
    snprintf(names[0], 192, "text_projection.weight");
    *op = CT_SDXL_SF_TRANSPOSE;
    return CT_SDXL_SF_TEXT2;
  }
  if (!strcmp(k, "logit_scale") || !strcmp(k, "attn_mask")) return CT_SDXL_SF_IGNORED;
  const char *r;
  const int l = indexed(k, "transformer.resblocks.", &r);
  if (l < 0) return CT_SDXL_SF_UNKNOWN;
  static const struct {
    const char *from, *to;
  } LAYER[] = {{"ln_1.", "layer_norm1."},
               {"ln_2.", "layer_norm2."},
               {"attn.out_proj.", "self_attn.out_proj."},
               {"mlp.c_fc.", "mlp.fc1."},
               {"mlp.c_proj.", "mlp.fc2."}};
  for (size_t i = 0; i < sizeof LAYER / sizeof *LAYER; i++)
    if (starts(r, LAYER[i].from)) {
      snprintf(names[0], 192, "text_model.encoder.layers.%d.%s%s", l, LAYER[i].to,
               r + strlen(LAYER[i].from));
      return CT_SDXL_SF_TEXT2;
    }
  const char *what = !strcmp(r, "attn.in_proj_weight") ? "weight"
                     : !strcmp(r, "attn.in_proj_bias") ? "bias"
                                                       : NULL;
  if (!what) return CT_SDXL_SF_UNKNOWN;
  const char qkv[3] = {'q', 'k', 'v'};
  for (int i = 0; i < 3; i++)
    snprintf(names[i], 192, "text_model.encoder.layers.%d.self_attn.%c_proj.%s", l, qkv[i], what);
  *op = CT_SDXL_SF_QKV;
  return CT_SDXL_SF_TEXT2;
}

/* A resnet's or the mid attention's tail: nin_shortcut -> conv_shortcut,
 * norm -> group_norm, q/k/v/proj_out -> to_q/to_k/to_v/to_out.0. */
static void vae_tail(const char *r, char *out, size_t n, ct_sdxl_sf_op *op) {
  static const struct {
    const char *from, *to;
    int conv1x1;
  } T[] = {{"nin_shortcut.", "conv_shortcut.", 0},
           {"norm.", "group_norm.", 0},
           {"q.", "to_q.", 1},
           {"k.", "to_k.", 1},
           {"v.", "to_v.", 1},
           {"proj_out.", "to_out.0.", 1}};
  for (size_t i = 0; i < sizeof T / sizeof *T; i++)
    if (starts(r, T[i].from)) {
      snprintf(out, n, "%s%s", T[i].to, r + strlen(T[i].from));
      if (T[i].conv1x1 && strstr(r, ".weight")) *op = CT_SDXL_SF_CONV1X1;
      return;
    }
  snprintf(out, n, "%s", r);
}

static ct_sdxl_sf_part ldm_vae(const char *k, int nb, char names[3][192], ct_sdxl_sf_op *op) {
  static const char *const SAME[] = {"quant_conv.",       "post_quant_conv.", "encoder.conv_in.",
                                     "encoder.conv_out.", "decoder.conv_in.", "decoder.conv_out."};
  for (size_t i = 0; i < sizeof SAME / sizeof *SAME; i++)
    if (starts(k, SAME[i])) {
      snprintf(names[0], 192, "%s", k);
      return CT_SDXL_SF_VAE;
    }
  const char *side = starts(k, "encoder.") ? "encoder" : starts(k, "decoder.") ? "decoder" : NULL;
  if (!side) return CT_SDXL_SF_UNKNOWN;
  const char *r = k + strlen(side) + 1, *rest;
  char tail[96];
  if (starts(r, "norm_out.")) {
    snprintf(names[0], 192, "%s.conv_norm_out.%s", side, r + strlen("norm_out."));
    return CT_SDXL_SF_VAE;
  }
  static const struct {
    const char *from, *to;
  } MID[] = {{"mid.block_1.", "mid_block.resnets.0."},
             {"mid.block_2.", "mid_block.resnets.1."},
             {"mid.attn_1.", "mid_block.attentions.0."}};
  for (size_t i = 0; i < sizeof MID / sizeof *MID; i++)
    if (starts(r, MID[i].from)) {
      vae_tail(r + strlen(MID[i].from), tail, sizeof tail, op);
      snprintf(names[0], 192, "%s.%s%s", side, MID[i].to, tail);
      return CT_SDXL_SF_VAE;
    }
  const int enc = side[0] == 'e';
  int b = indexed(r, enc ? "down." : "up.", &rest);
  if (b < 0 || b >= nb) return CT_SDXL_SF_UNKNOWN;
  const int to = enc ? b : nb - 1 - b; /* the decoder's up blocks run the other way */
  const char *blocks = enc ? "down_blocks" : "up_blocks";
  const char *r2;
  const int j = indexed(rest, "block.", &r2);
  if (j >= 0) {
    vae_tail(r2, tail, sizeof tail, op);
    snprintf(names[0], 192, "%s.%s.%d.resnets.%d.%s", side, blocks, to, j, tail);
    return CT_SDXL_SF_VAE;
  }
  const char *sampler = enc ? "downsample.conv." : "upsample.conv.";
  if (!starts(rest, sampler)) return CT_SDXL_SF_UNKNOWN;
  snprintf(names[0], 192, "%s.%s.%d.%s.0.conv.%s", side, blocks, to,
           enc ? "downsamplers" : "upsamplers", rest + strlen(sampler));
  return CT_SDXL_SF_VAE;
}

ct_sdxl_sf_part ct_sdxl_single_map(const char *key, int vae_blocks, char names[3][192],
                                   ct_sdxl_sf_op *op) {
  static const char P1[] = "conditioner.embedders.0.transformer.",
                    P2[] = "conditioner.embedders.1.model.", PV[] = "first_stage_model.",
                    PU[] = "model.diffusion_model.";
  *op = CT_SDXL_SF_COPY;
  names[0][0] = names[1][0] = names[2][0] = 0;
  if (starts(key, P1)) {
    const char *r = key + strlen(P1);
    if (!strcmp(r, "text_model.embeddings.position_ids")) return CT_SDXL_SF_IGNORED;
    if (!starts(r, "text_model.")) return CT_SDXL_SF_UNKNOWN;
    snprintf(names[0], 192, "%s", r);
    return CT_SDXL_SF_TEXT1;
  }
  if (starts(key, P2)) return open_clip(key + strlen(P2), names, op);
  if (starts(key, PV)) return ldm_vae(key + strlen(PV), vae_blocks, names, op);
  if (starts(key, PU)) {
    snprintf(names[0], 192, "%s", key + strlen(PU));
    return CT_SDXL_SF_UNET;
  }
  return CT_SDXL_SF_UNKNOWN;
}
