/* Adapter files in the layouts other tools write (src/model/lora_any.c,
 * docs/lora.md "Adapter files ctuner reads"), folded into the m3 transformer
 * (tests/data/lora/m3) by ct_lora_merge_file, against:
 *  - tests/data/lora_files (scripts/lora_files_golden.py, diffusers 0.42.1):
 *    kohya (every BFL Linear: dense and block-diagonal fused qkv, linear1,
 *    linear2, modulations, final_layer, embedders; alphas and none; bf16
 *    tensors), ComfyUI (diffusion_model.<BFL>.lora_down, through diffusers'
 *    own converter), BFL names with lora_A/B, LyCORIS on BFL names (LoHa,
 *    LoKr whole / split / both split, LoCon): the output within 1e-5 of the
 *    golden's (relative to its largest), and away from the base's;
 *  - tests/data/lycoris (scripts/lycoris_golden.py, LyCORIS 4.1.3): LyCORIS's
 *    own files (lycoris_<module>: LoCon, LoHa, LoKr in five configs) merged at
 *    the config's multiplier give create_lycoris_from_weights's output;
 *  - the errors name the tensor or module.
 * CT_LORA_FILES_DATA overrides the data directory (make interop). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/lora_tools.h"
#include "ctuner/mmdit.h"
#include "ctuner/safetensors.h"
#include "harness.h"

#define fdata(rel) ct_test_data_in("CT_LORA_FILES_DATA", "lora_files", rel)
#define ldata(rel) ct_test_data_in("CT_LORA_DATA", "lora", rel)
#define ydata(rel) ct_test_data_in("CT_LYCORIS_DATA", "lycoris", rel)
#define REQUIRE_V(cond, v)                                                         \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "  %s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
      *ct_failed_ = 1;                                                             \
      return v;                                                                    \
    }                                                                              \
  } while (0)

/* m3's output (packed, as diffusers returns it) on its golden inputs; NULL on error. */
static float *m3_out(ct_mmdit *m, size_t *n) {
  ct_err e;
  ct_st_file *in = NULL;
  if (ct_st_open(ldata("m3/inputs.safetensors"), &in, &e)) return NULL;
  const ct_st_tensor *hs = ct_st_find(in, "hidden_states"),
                     *eh = ct_st_find(in, "encoder_hidden_states");
  const int B = hs ? (int)hs->shape[0] : 0, C = ct_mmdit_cfg(m)->in_channels, H = 4, W = 4;
  const int L = hs ? (int)hs->shape[1] : 0; /* read before ct_st_close */
  *n = (size_t)B * C * H * W;
  float *packed = ct_test_tensor(in, "hidden_states", NULL), *x = malloc(*n * 4),
        *v = malloc(*n * 4), *out = malloc(*n * 4);
  ct_mmdit_batch b = {B,
                      H,
                      W,
                      eh ? (int)eh->shape[1] : 0,
                      x,
                      ct_test_tensor(in, "timestep", NULL),
                      ct_test_tensor(in, "encoder_hidden_states", NULL),
                      ct_test_tensor(in, "pooled_projections", NULL),
                      ct_test_tensor(in, "guidance", NULL)};
  ct_st_close(in);
  int ok = hs && eh && packed && x && v && out && b.t && b.txt && b.y && b.guidance &&
           L == H / 2 * W / 2;
  if (ok) {
    ct_flux_unpack(B, C, H, W, packed, x);
    ok = !ct_mmdit_forward(m, &b, v, &e) || !fprintf(stderr, "  %s\n", e.msg);
  }
  if (ok) ct_flux_pack(B, C, H, W, v, out);
  free(packed), free(x), free(v);
  free((void *)b.t), free((void *)b.txt), free((void *)b.y), free((void *)b.guidance);
  if (!ok) free(out), out = NULL;
  return out;
}

/* The file merged at mult into m3: its output vs ref (packed, n floats). */
static double merged_err(const char *file, double mult, const float *ref, size_t nref,
                         ct_lora_file_info *fi, int *ct_failed_) {
  ct_err e = {0};
  ct_mmdit *m = NULL;
  REQUIRE_V(!ct_mmdit_open_diffusers(ldata("m3/transformer"), 0, &m, &e), INFINITY);
  ct_status st =
      fi ? ct_lora_merge_any(m, file, mult, fi, &e) : ct_lora_merge_file(m, file, mult, &e);
  CHECKF(!st, "%s: %s", file, e.msg);
  size_t n = 0;
  float *o = st ? NULL : m3_out(m, &n);
  ct_mmdit_free(m);
  const double er = o && n == nref ? ct_test_rel_err(o, ref, n) : INFINITY;
  free(o);
  return er;
}

CT_TEST(lora_files, layouts_vs_diffusers_rules) {
  static const char *const CASES[] = {"kohya", "comfyui", "bfl", "lycoris_bfl"};
  for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
    char rel[200];
    ct_err e;
    snprintf(rel, sizeof rel, "%s/golden.safetensors", CASES[c]);
    ct_st_file *g = NULL;
    REQUIRE(!ct_st_open(fdata(rel), &g, &e));
    size_t n = 0, nb = 0;
    float *ref = ct_test_tensor(g, "out", &n), *base = ct_test_tensor(g, "base_out", &nb);
    ct_st_close(g);
    REQUIRE(ref && base && n == nb);
    snprintf(rel, sizeof rel, "%s/adapter.safetensors", CASES[c]);
    ct_lora_file_info fi;
    const double er = merged_err(fdata(rel), 1.0, ref, n, &fi, ct_failed_);
    const double moved = ct_test_rel_err(base, ref, n);
    CHECKF(er <= 1e-5, "%s: output differs from the golden by %.3g", CASES[c], er);
    CHECKF(moved > 1e-2, "%s: the golden barely moves the output (%.3g)", CASES[c], moved);
    CHECKF(fi.modules > 0 && fi.skipped_text_encoder == 0, "%s: %d modules", CASES[c], fi.modules);
    fprintf(stderr,
            "  %-12s %3d modules (BFL-named %d; LoRA %d, LoHa %d, LoKr %d): %.2g (moved %.2g)\n",
            CASES[c], fi.modules, fi.bfl_named, fi.lora, fi.loha, fi.lokr, er, moved);
    /* through ct_lora_merge_file (sample --lora's route) too */
    CHECKF(merged_err(fdata(rel), 1.0, ref, n, NULL, ct_failed_) <= 1e-5, "%s via merge_file",
           CASES[c]);
    free(ref), free(base);
  }
}

/* LyCORIS's own files (tests/data/lycoris) at the config's multiplier. */
CT_TEST(lora_files, lycoris_files_vs_lycoris) {
  static const char *const CONFIGS[] = {"locon", "loha", "lokr", "lokr_full", "lokr_both"};
  for (size_t c = 0; c < sizeof CONFIGS / sizeof CONFIGS[0]; c++) {
    char rel[200];
    ct_err e;
    snprintf(rel, sizeof rel, "%s/config.json", CONFIGS[c]);
    ct_json *j = NULL;
    size_t len = 0;
    char *txt = ct_test_slurp(ydata(rel), &len);
    REQUIRE(txt && !ct_json_parse(txt, len, &j, &e));
    const ct_json *mu = ct_json_get(j, "multiplier");
    const double mult = mu && mu->type == CT_JSON_NUMBER ? mu->num : 1;
    ct_json_free(j), free(txt);
    snprintf(rel, sizeof rel, "%s/golden.safetensors", CONFIGS[c]);
    ct_st_file *g = NULL;
    REQUIRE(!ct_st_open(ydata(rel), &g, &e));
    size_t n = 0;
    float *ref = ct_test_tensor(g, "out", &n);
    ct_st_close(g);
    REQUIRE(ref);
    snprintf(rel, sizeof rel, "%s/pytorch_lora_weights.safetensors", CONFIGS[c]);
    ct_lora_file_info fi;
    const double er = merged_err(ydata(rel), mult, ref, n, &fi, ct_failed_);
    CHECKF(er <= 1e-5, "%s: merged output differs from create_lycoris_from_weights's by %.3g",
           CONFIGS[c], er);
    fprintf(stderr, "  %-10s x%g %3d modules (LoCon %d, LoHa %d, LoKr %d): %.2g\n", CONFIGS[c],
            mult, fi.modules, fi.lora, fi.loha, fi.lokr, er);
    /* a wrong multiplier fails: the test can fail */
    CHECK(merged_err(ydata(rel), mult * 1.01, ref, n, NULL, ct_failed_) > 1e-4);
    free(ref);
  }
}

/* A small file of the given tensors (f32, shapes [r0, r1]; r1 0: a scalar). */
static void write_file(const char *path, int n, const char *const *names, const int (*shape)[2]) {
  ct_st_writer *w = NULL;
  ct_err e;
  if (ct_st_writer_new(&w)) return;
  float buf[4096];
  for (int i = 0; i < 4096; i++) buf[i] = 0.01f * (float)(i % 7);
  for (int i = 0; i < n; i++) {
    const int64_t s[2] = {shape[i][0], shape[i][1]};
    ct_st_writer_add_f32(w, names[i], shape[i][1] ? 2 : 0, s, buf, CT_DTYPE_F32, &e);
  }
  ct_st_writer_write(w, path, &e);
  ct_st_writer_free(w);
}

static void expect_error(const char *what, int n, const char *const *names, const int (*shape)[2],
                         const char *want, int *ct_failed_) {
  char path[4200];
  ct_err e = {0};
  snprintf(path, sizeof path, "%s/bad.safetensors", ct_test_tmpdir());
  write_file(path, n, names, shape);
  ct_mmdit *m = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(ldata("m3/transformer"), 0, &m, &e));
  const ct_status st = ct_lora_merge_file(m, path, 1.0, &e);
  CHECKF(st && strstr(e.msg, want), "%s: %s", what, st ? e.msg : "accepted");
  ct_mmdit_free(m);
}

CT_TEST(lora_files, errors_name_the_tensor) {
  /* m3: d 16, mlp 64; double_blocks.0.img_attn.qkv is [48, 16] */
  const char *dora[] = {"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight",
                        "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight",
                        "lora_unet_double_blocks_0_img_attn_qkv.dora_scale"};
  const int s3[][2] = {{2, 16}, {48, 2}, {48, 1}};
  expect_error("DoRA", 3, dora, s3, "dora_scale", ct_failed_);
  const char *other[] = {"lora_unet_double_blocks_7_img_attn_qkv.lora_down.weight",
                         "lora_unet_double_blocks_7_img_attn_qkv.lora_up.weight"};
  expect_error("a block m3 lacks", 2, other, s3, "double_blocks_7", ct_failed_);
  const int wide[][2] = {{2, 32}, {96, 2}}; /* another width */
  const char *qkv[] = {dora[0], dora[1]};
  expect_error("another width", 2, qkv, wide, "another model", ct_failed_);
  const char *up_only[] = {dora[1]};
  expect_error("up without down", 1, up_only, s3 + 1, "lacks its lora_down", ct_failed_);
  const char *tucker[] = {"lycoris_proj_out.hada_w1_a", "lycoris_proj_out.hada_t1"};
  expect_error("a Tucker core", 2, tucker, s3, "Tucker", ct_failed_);
  const char *odd[] = {"lora_unet_img_in.lora_down.weight", "lora_unet_img_in.weird"};
  expect_error("an unknown key", 2, odd, s3, "lora_unet_img_in.weird", ct_failed_);
  const char *te[] = {"lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight"};
  expect_error("text encoder only", 1, te, s3, "only text-encoder", ct_failed_);
  const char *mixed[] = {"lycoris_proj_out.hada_w1_a", "lycoris_proj_out.lokr_w1"};
  expect_error("two algorithms", 2, mixed, s3, "several algorithms", ct_failed_);
}

/* A peft file (diffusers' save_lora_weights) that also holds text-encoder
 * adapters takes this route: the text-encoder tensors are skipped (counted),
 * the metadata's lora_alpha still scales the transformer's (= the peft route). */
CT_TEST(lora_files, peft_with_text_encoder_tensors) {
  const char *src = CT_SOURCE_DIR "/tests/data/lora_tools/pytorch_lora_weights.safetensors";
  const char *pipe_tr = CT_SOURCE_DIR "/tests/data/flux_pipe/dev/transformer";
  char path[4200];
  snprintf(path, sizeof path, "%s/with_te.safetensors", ct_test_tmpdir());
  ct_err e = {0};
  ct_st_file *f = NULL;
  ct_st_writer *w = NULL;
  REQUIRE(!ct_st_open(src, &f, &e) && !ct_st_writer_new(&w));
  const char *meta = ct_st_meta(f, "lora_adapter_metadata");
  REQUIRE(meta && strstr(meta, "lora_alpha"));
  float **keep = calloc(f->ntensors, sizeof *keep); /* the writer reads them at write time */
  REQUIRE(keep);
  for (size_t i = 0; i < f->ntensors; i++) {
    const ct_st_tensor *t = &f->tensors[i];
    keep[i] = malloc(t->numel * sizeof **keep);
    REQUIRE(keep[i] && !ct_st_to_f32(t, keep[i], t->numel, &e));
    REQUIRE(!ct_st_writer_add_f32(w, t->name, t->ndim, t->shape, keep[i], CT_DTYPE_F32, &e));
  }
  const int64_t ts[2] = {2, 8};
  float te[16] = {1};
  REQUIRE(!ct_st_writer_add_f32(
      w, "text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight", 2, ts, te,
      CT_DTYPE_F32, &e));
  REQUIRE(!ct_st_writer_meta(w, "lora_adapter_metadata", meta, &e));
  REQUIRE(!ct_st_writer_write(w, path, &e));
  ct_st_writer_free(w);
  for (size_t i = 0; i < f->ntensors; i++) free(keep[i]);
  free(keep);
  ct_st_close(f);
  CHECK(!ct_lora_file_is_peft(path) && ct_lora_file_is_peft(src));
  ct_mmdit *a = NULL, *b = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(pipe_tr, 0, &a, &e) &&
          !ct_mmdit_open_diffusers(pipe_tr, 0, &b, &e));
  CHECKF(!ct_lora_merge_file(a, src, 0.7, &e), "%s", e.msg);
  ct_lora_file_info fi;
  CHECKF(!ct_lora_merge_any(b, path, 0.7, &fi, &e), "%s", e.msg);
  CHECKF(fi.skipped_text_encoder == 1 && fi.modules > 0, "%d skipped, %d modules",
         fi.skipped_text_encoder, fi.modules);
  size_t np = 0;
  const ct_param *tab = ct_mmdit_table(a, &np);
  double er = 0;
  for (size_t i = 0; i < np; i++) {
    size_t n = (size_t)tab[i].shape[0] * (size_t)(tab[i].ndim > 1 ? tab[i].shape[1] : 1);
    er = ct_test_max(er, ct_test_rel_err(ct_mmdit_params(b) + tab[i].offset,
                                         ct_mmdit_params(a) + tab[i].offset, n));
  }
  CHECKF(er < 1e-6, "the peft file with text-encoder tensors merges %.3g off the peft route's", er);
  ct_mmdit_free(a), ct_mmdit_free(b);
}
