/* SDXL's text conditioning and VAE against a tiny random
 * StableDiffusionXLPipeline saved by diffusers 0.42.1 / transformers 5.24
 * (scripts/sdxl_tiny_pipeline.py, tests/data/sdxl_pipe): both tokenizers'
 * ids (tokenizer_2 pads with "!"), every hidden_states[k] of CLIPTextModel
 * (quick_gelu) and CLIPTextModelWithProjection (gelu), encode_prompt's
 * prompt_embeds (hidden_states[-2] of both, concatenated) and pooled
 * text_embeds for prompts and negative prompts, and the 4-channel VAE's
 * latents with scaling_factor 0.13025 and no shift. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/diffusion.h"
#include "ctuner/fs.h"
#include "ctuner/json.h"
#include "ctuner/safetensors.h"
#include "ctuner/textenc.h"
#include "ctuner/vae.h"
#include "harness.h"

#define pdata(rel) ct_test_data_in("CT_SDXL_PIPE_DATA", "sdxl_pipe", rel)
#define gt ct_test_tensor

/* The golden's metadata key (a JSON list of strings) into out. */
static int strings(const ct_st_file *g, const char *key, char **out, int cap) {
  const char *js = ct_st_meta(g, key);
  ct_json *j = NULL;
  ct_err e;
  if (!js || ct_json_parse(js, strlen(js), &j, &e)) return 0;
  int n = 0;
  for (size_t i = 0; i < j->n && n < cap; i++) out[n++] = strdup(j->items[i].str);
  ct_json_free(j);
  return n;
}

static ct_st_file *golden(void) {
  ct_st_file *g = NULL;
  ct_err e = {0};
  return ct_st_open(pdata("golden.safetensors"), &g, &e) ? NULL : g;
}

CT_TEST(sdxl_pipe, encode_prompt) {
  ct_st_file *g = golden();
  if (!g) CT_SKIP("no tests/data/sdxl_pipe/golden.safetensors");
  ct_err e = {0};
  ct_sdxl_text *t = NULL;
  CHECKF(!ct_sdxl_text_open(pdata(""), &t, &e), "%s", e.msg);
  REQUIRE(t);
  int T, D, P;
  ct_sdxl_text_dims(t, &T, &D, &P);
  CHECK(T == 77 && D == 32 + 48 && P == 40);
  char *pr[4], *neg[4];
  const int n = strings(g, "prompts", pr, 4), nn = strings(g, "negative", neg, 4);
  REQUIRE(n == 3 && nn == 3);
  float *emb = calloc((size_t)n * T * D, sizeof *emb), *pool = calloc((size_t)n * P, sizeof *pool);
  int32_t *i1 = calloc((size_t)n * T, sizeof *i1), *i2 = calloc((size_t)n * T, sizeof *i2);
  REQUIRE(emb && pool && i1 && i2);
  const char *names[2][4] = {{"text.prompt_embeds", "text.pooled", "text.ids1", "text.ids2"},
                             {"text.neg_embeds", "text.neg_pooled", NULL, NULL}};
  for (int k = 0; k < 2; k++) {
    CHECKF(!ct_sdxl_encode_prompt(t, (const char *const *)(k ? neg : pr), n, emb, pool, i1, i2, &e),
           "%s", e.msg);
    for (int s = 0; k == 0 && s < 2; s++) {
      const ct_st_tensor *ids = ct_st_find(g, names[0][2 + s]);
      REQUIRE(ids && ids->dtype == CT_DTYPE_I32 && ids->numel == (size_t)n * T);
      CHECKF(!memcmp(s ? i2 : i1, ids->data, (size_t)n * T * sizeof(int32_t)),
             "%s differ from CLIPTokenizer's", names[0][2 + s]);
    }
    size_t ne = 0, np = 0;
    float *we = gt(g, names[k][0], &ne), *wp = gt(g, names[k][1], &np);
    REQUIRE(we && wp && ne == (size_t)n * T * D && np == (size_t)n * P);
    const double ee = ct_test_rel_err(emb, we, ne), ep = ct_test_rel_err(pool, wp, np);
    CHECKF(ee < 1e-4 && ep < 1e-4, "%s %.3g, %s %.3g", names[k][0], ee, names[k][1], ep);
    free(we);
    free(wp);
  }
  /* tokenizer_2's padding is "!" (id 0), tokenizer's <|endoftext|> */
  CHECK(i2[(size_t)2 * T - 1] == 0 && i1[(size_t)2 * T - 1] != 0);
  for (int k = 0; k < n; k++) {
    free(pr[k]);
    free(neg[k]);
  }
  free(emb);
  free(pool);
  free(i1);
  free(i2);
  ct_sdxl_text_free(t);
  ct_st_close(g);
}

/* Every hidden_states[k] of both encoders for prompt 0. */
CT_TEST(sdxl_pipe, hidden_states) {
  ct_st_file *g = golden();
  if (!g) CT_SKIP("no tests/data/sdxl_pipe/golden.safetensors");
  ct_err e = {0};
  const char *dirs[2] = {"text_encoder", "text_encoder_2"};
  for (int i = 0; i < 2; i++) {
    ct_textenc *te = NULL;
    CHECKF(!(i ? ct_textenc_open_dir_projection(pdata(dirs[i]), &te, &e)
               : ct_textenc_open_dir(pdata(dirs[i]), &te, &e)),
           "%s", e.msg);
    REQUIRE(te);
    const ct_textenc_config *c = ct_textenc_cfg(te);
    CHECK(c->act == (i ? CT_TEXTENC_ACT_GELU : CT_TEXTENC_ACT_QUICK_GELU));
    CHECK(c->projection_dim == (i ? 40 : 0));
    const ct_st_tensor *ids = ct_st_find(g, i ? "text.ids2" : "text.ids1");
    REQUIRE(ids);
    float *h = calloc((size_t)77 * c->hidden, sizeof *h);
    for (int k = 0; k <= c->layers; k++) {
      char nm[64];
      snprintf(nm, sizeof nm, "text.hidden%d_l%d", i + 1, k);
      size_t nh = 0;
      float *w = gt(g, nm, &nh);
      REQUIRE(w && nh == (size_t)77 * c->hidden);
      CHECKF(!ct_textenc_encode_hidden(te, (const int32_t *)ids->data, 1, 77, k, h, NULL, &e), "%s",
             e.msg);
      const double er = ct_test_rel_err(h, w, nh);
      CHECKF(er < 1e-4, "%s: %.3g", nm, er);
      free(w);
    }
    CHECK(ct_textenc_encode_hidden(te, (const int32_t *)ids->data, 1, 77, c->layers + 1, h, NULL,
                                   &e) == CT_ERR_RANGE);
    free(h);
    ct_textenc_free(te);
  }
  /* CLIP-L's directory opened as if it had a projection: refused by name */
  ct_textenc *te = NULL;
  CHECK(ct_textenc_open_dir_projection(pdata("text_encoder"), &te, &e) != CT_OK &&
        strstr(e.msg, "text_projection"));
  ct_st_close(g);
}

CT_TEST(sdxl_pipe, vae) {
  ct_st_file *g = golden();
  if (!g) CT_SKIP("no tests/data/sdxl_pipe/golden.safetensors");
  ct_err e = {0};
  ct_vae *v = NULL;
  CHECKF(!ct_vae_from_pretrained(pdata("vae"), &v, &e), "%s", e.msg);
  REQUIRE(v);
  const ct_vae_config *vc = ct_vae_cfg(v);
  CHECK(vc->scaling_factor == 0.13025f && vc->shift_factor == 0.0f);
  size_t nl = 0;
  float *img = gt(g, "vae.image", NULL), *lat = gt(g, "vae.latents", &nl);
  REQUIRE(img && lat && nl == 4 * 16 * 16);
  float *mean = calloc(nl, sizeof *mean);
  CHECK(!ct_vae_encode(v, 1, 32, 32, img, mean, NULL, &e));
  for (size_t i = 0; i < nl; i++) mean[i] = (mean[i] - vc->shift_factor) * vc->scaling_factor;
  const double el = ct_test_rel_err(mean, lat, nl);
  CHECKF(el < 1e-4, "vae latents %.3g", el);
  free(mean);
  free(img);
  free(lat);
  ct_vae_free(v);
  ct_st_close(g);
}

CT_TEST(sdxl_pipe, directory) {
  ct_err e = {0};
  ct_sdxl_pipe p;
  size_t nidx = 0;
  void *idx = ct_test_slurp(pdata("model_index.json"), &nidx);
  if (!idx) CT_SKIP("no tests/data/sdxl_pipe");
  free(idx);
  CHECKF(!ct_sdxl_pipe_open(pdata(""), &p, &e), "%s", e.msg);
  CHECK(p.force_zeros_for_empty_prompt == 1 && p.sched.kind == CT_SCHED_EULER &&
        p.sched.steps_offset == 1 && p.sched.timestep_spacing == CT_SPACING_LEADING);
  CHECK(p.text && p.vae && strstr(p.unet_dir, "unet"));
  ct_sdxl_pipe_close(&p);
  /* a broken copy: the encoders linked, a refiner's class and an unknown
   * component, no scheduler, a unet/ without weights */
  char root[4096], path[4200], target[4200];
  snprintf(root, sizeof root, "%s/sdxl_bad", ct_test_tmpdir());
  REQUIRE(!mkdir(root, 0755) || errno == EEXIST);
  const char *linked[] = {"text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "vae"};
  for (int i = 0; i < 5; i++) {
    snprintf(path, sizeof path, "%s/%s", root, linked[i]);
    REQUIRE(realpath(pdata(linked[i]), target));
    REQUIRE(!symlink(target, path) || errno == EEXIST);
  }
  const char *index =
      "{\"_class_name\": \"StableDiffusionXLImg2ImgPipeline\", \"unet\": [\"diffusers\", "
      "\"UNet2DConditionModel\"], \"vae\": [\"diffusers\", \"AutoencoderKL\"], \"text_encoder\": "
      "[\"transformers\", \"CLIPTextModel\"], \"text_encoder_2\": [\"transformers\", "
      "\"CLIPTextModelWithProjection\"], \"tokenizer\": [\"transformers\", \"CLIPTokenizer\"], "
      "\"tokenizer_2\": [\"transformers\", \"CLIPTokenizer\"], \"controlnet\": [\"diffusers\", "
      "\"ControlNetModel\"]}";
  snprintf(path, sizeof path, "%s/model_index.json", root);
  REQUIRE(!ct_write_file_atomic(path, index, strlen(index), &e));
  snprintf(path, sizeof path, "%s/unet", root);
  REQUIRE(!mkdir(path, 0755) || errno == EEXIST);
  snprintf(path, sizeof path, "%s/unet/config.json", root);
  REQUIRE(!ct_write_file_atomic(path, "{}", 2, &e));
  ct_status st = ct_sdxl_pipe_open(root, &p, &e);
  CHECKF(st == CT_ERR_INVALID && strstr(e.msg, "5 problems") &&
             strstr(e.msg, "StableDiffusionXLImg2ImgPipeline") && strstr(e.msg, "controlnet") &&
             strstr(e.msg, "no scheduler entry") &&
             strstr(e.msg, "scheduler_config.json: missing") &&
             strstr(e.msg, "no diffusion_pytorch_model.safetensors"),
         "%s", st ? e.msg : "accepted");
}

/* sd_xl_base_1.0.safetensors names -> diffusers / transformers names. */
CT_TEST(sdxl_pipe, single_file_names) {
  static const struct {
    const char *key;
    int part, op;
    const char *name, *name2;
  } C[] = {
      {"conditioner.embedders.0.transformer.text_model.encoder.layers.11.mlp.fc2.bias",
       CT_SDXL_SF_TEXT1, CT_SDXL_SF_COPY, "text_model.encoder.layers.11.mlp.fc2.bias", NULL},
      {"conditioner.embedders.0.transformer.text_model.embeddings.position_ids", CT_SDXL_SF_IGNORED,
       CT_SDXL_SF_COPY, "", NULL},
      {"conditioner.embedders.1.model.positional_embedding", CT_SDXL_SF_TEXT2, CT_SDXL_SF_COPY,
       "text_model.embeddings.position_embedding.weight", NULL},
      {"conditioner.embedders.1.model.text_projection", CT_SDXL_SF_TEXT2, CT_SDXL_SF_TRANSPOSE,
       "text_projection.weight", NULL},
      {"conditioner.embedders.1.model.transformer.resblocks.31.attn.in_proj_weight",
       CT_SDXL_SF_TEXT2, CT_SDXL_SF_QKV, "text_model.encoder.layers.31.self_attn.q_proj.weight",
       "text_model.encoder.layers.31.self_attn.k_proj.weight"},
      {"conditioner.embedders.1.model.transformer.resblocks.0.mlp.c_fc.bias", CT_SDXL_SF_TEXT2,
       CT_SDXL_SF_COPY, "text_model.encoder.layers.0.mlp.fc1.bias", NULL},
      {"conditioner.embedders.1.model.ln_final.weight", CT_SDXL_SF_TEXT2, CT_SDXL_SF_COPY,
       "text_model.final_layer_norm.weight", NULL},
      {"conditioner.embedders.1.model.logit_scale", CT_SDXL_SF_IGNORED, CT_SDXL_SF_COPY, "", NULL},
      {"first_stage_model.decoder.up.3.block.0.conv1.weight", CT_SDXL_SF_VAE, CT_SDXL_SF_COPY,
       "decoder.up_blocks.0.resnets.0.conv1.weight", NULL},
      {"first_stage_model.encoder.down.1.block.0.nin_shortcut.weight", CT_SDXL_SF_VAE,
       CT_SDXL_SF_COPY, "encoder.down_blocks.1.resnets.0.conv_shortcut.weight", NULL},
      {"first_stage_model.encoder.down.2.downsample.conv.weight", CT_SDXL_SF_VAE, CT_SDXL_SF_COPY,
       "encoder.down_blocks.2.downsamplers.0.conv.weight", NULL},
      {"first_stage_model.encoder.mid.attn_1.q.weight", CT_SDXL_SF_VAE, CT_SDXL_SF_CONV1X1,
       "encoder.mid_block.attentions.0.to_q.weight", NULL},
      {"first_stage_model.decoder.mid.attn_1.proj_out.bias", CT_SDXL_SF_VAE, CT_SDXL_SF_COPY,
       "decoder.mid_block.attentions.0.to_out.0.bias", NULL},
      {"first_stage_model.decoder.mid.attn_1.norm.weight", CT_SDXL_SF_VAE, CT_SDXL_SF_COPY,
       "decoder.mid_block.attentions.0.group_norm.weight", NULL},
      {"first_stage_model.decoder.mid.block_2.norm1.bias", CT_SDXL_SF_VAE, CT_SDXL_SF_COPY,
       "decoder.mid_block.resnets.1.norm1.bias", NULL},
      {"first_stage_model.encoder.norm_out.weight", CT_SDXL_SF_VAE, CT_SDXL_SF_COPY,
       "encoder.conv_norm_out.weight", NULL},
      {"first_stage_model.post_quant_conv.weight", CT_SDXL_SF_VAE, CT_SDXL_SF_COPY,
       "post_quant_conv.weight", NULL},
      {"model.diffusion_model.input_blocks.4.1.proj_in.weight", CT_SDXL_SF_UNET, CT_SDXL_SF_COPY,
       "input_blocks.4.1.proj_in.weight", NULL},
      {"first_stage_model.decoder.up.4.block.0.conv1.weight", CT_SDXL_SF_UNKNOWN, CT_SDXL_SF_COPY,
       "", NULL}, /* outside the 4 blocks */
      {"denoiser.sigmas", CT_SDXL_SF_UNKNOWN, CT_SDXL_SF_COPY, "", NULL},
  };
  char names[3][192];
  ct_sdxl_sf_op op;
  for (size_t i = 0; i < sizeof C / sizeof *C; i++) {
    const ct_sdxl_sf_part p = ct_sdxl_single_map(C[i].key, 4, names, &op);
    CHECKF(p == (ct_sdxl_sf_part)C[i].part && (p < 1 || op == (ct_sdxl_sf_op)C[i].op) &&
               !strcmp(names[0], C[i].name) && (!C[i].name2 || !strcmp(names[1], C[i].name2)),
           "%s -> part %d op %d %s", C[i].key, (int)p, (int)op, names[0]);
  }
  CHECK(ct_sdxl_single_map("first_stage_model.decoder.up.1.upsample.conv.bias", 4, names, &op) ==
            CT_SDXL_SF_VAE &&
        !strcmp(names[0], "decoder.up_blocks.2.upsamplers.0.conv.bias"));
  /* the mapped names exist in the tiny pipeline's VAE (2 blocks) and text_encoder_2 */
  ct_st_file *f = NULL;
  ct_err e = {0};
  REQUIRE(!ct_st_open(pdata("vae/diffusion_pytorch_model.safetensors"), &f, &e));
  const char *vk[] = {"first_stage_model.decoder.up.1.block.1.conv2.weight",
                      "first_stage_model.decoder.up.1.upsample.conv.weight",
                      "first_stage_model.encoder.down.0.downsample.conv.bias",
                      "first_stage_model.encoder.down.1.block.0.nin_shortcut.weight",
                      "first_stage_model.decoder.mid.attn_1.v.weight",
                      "first_stage_model.decoder.norm_out.bias"};
  for (size_t i = 0; i < sizeof vk / sizeof *vk; i++) {
    CHECK(ct_sdxl_single_map(vk[i], 2, names, &op) == CT_SDXL_SF_VAE);
    CHECKF(ct_st_find(f, names[0]) != NULL, "%s -> %s: not in the VAE", vk[i], names[0]);
  }
  ct_st_close(f);
  REQUIRE(!ct_st_open(pdata("text_encoder_2/model.safetensors"), &f, &e));
  CHECK(
      ct_sdxl_single_map("conditioner.embedders.1.model.transformer.resblocks.2.attn.in_proj_bias",
                         4, names, &op) == CT_SDXL_SF_TEXT2);
  for (int i = 0; i < 3; i++) CHECKF(ct_st_find(f, names[i]) != NULL, "%s", names[i]);
  CHECK(ct_sdxl_single_map("conditioner.embedders.1.model.text_projection", 4, names, &op) ==
            CT_SDXL_SF_TEXT2 &&
        ct_st_find(f, names[0]) != NULL);
  ct_st_close(f);
}
