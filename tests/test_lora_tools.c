/* LoRA tools (src/model/lora_merge.c, lora_export.c; docs/lora.md) against
 * diffusers + peft (scripts/lora_tools_golden.py, tests/data/lora_tools): an
 * adapter ctuner trained on the tiny FLUX.1-dev pipeline
 * (tests/data/flux_pipe/dev) folded into the pipeline samples the images
 * FluxPipeline.load_lora_weights gives from the same latents (>= 40 dB, at
 * lora_scale 1 and 0.5; the kohya export read back through sample --lora's
 * route too); the merged transformer's v_pred equals the unmerged
 * adapter's within 1e-5 and diffusers' within 1e-4; the kohya/ComfyUI export
 * is the committed file, and read as ComfyUI reads it (W += alpha / rank up
 * down per BFL weight) gives diffusers' v_pred; the errors name the problem.
 * CT_LORA_TOOLS_DATA overrides the data directory (make interop). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/kernels.h"
#include "ctuner/lora_tools.h"
#include "ctuner/mmdit.h"
#include "ctuner/safetensors.h"
#include "ctuner/train.h"
#include "harness.h"

#define ldata(rel) ct_test_data_in("CT_LORA_TOOLS_DATA", "lora_tools", rel)
#define PIPE CT_SOURCE_DIR "/tests/data/flux_pipe/dev"
#define gt ct_test_tensor
#define rel ct_test_rel_err

static double psnr(const uint8_t *a, const float *ref, size_t n) {
  double se = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = a[i] / 255.0 - ref[i];
    se += d * d;
  }
  if (!isfinite(se)) return NAN; /* a NaN or Inf pixel: fails every >= dB check */
  return se > 0 ? 10 * log10(1.0 / (se / (double)n)) : 200;
}

static int prompts(const ct_st_file *g, char **out, int cap) {
  const char *js = ct_st_meta(g, "prompts");
  ct_json *j = NULL;
  ct_err e;
  if (!js || ct_json_parse(js, strlen(js), &j, &e)) return 0;
  int n = 0;
  for (size_t i = 0; i < j->n && n < cap; i++) out[n++] = strdup(j->items[i].str);
  ct_json_free(j);
  return n;
}

/* FluxPipeline(prompts[:2], 32x32, 4 steps, guidance 3.5, the golden's
 * latents, joint_attention_kwargs {"scale": s}) after load_lora_weights. */
static void check_sample(int *ct_failed_, const char *adapter, double scale, const char *key) {
  ct_err e = {0};
  ct_st_file *g = NULL, *lg = NULL;
  REQUIRE(!ct_st_open(PIPE "/golden.safetensors", &g, &e));
  REQUIRE(!ct_st_open(ldata("golden.safetensors"), &lg, &e));
  ct_flux_sampler *s = NULL;
  const int T = atoi(ct_st_meta(g, "max_sequence_length"));
  CHECKF(!ct_flux_sampler_open(PIPE, "dev", T, NULL, &s, &e), "%s", e.msg);
  REQUIRE(s);
  CHECKF(!ct_flux_sampler_lora(s, ldata(adapter), scale, &e), "%s", e.msg);
  char *pr[8];
  const int np = prompts(g, pr, 8);
  REQUIRE(np >= 2);
  size_t nl = 0, ni = 0;
  float *lin = gt(g, "sample.latents_in", &nl), *base = gt(g, "sample.image", NULL);
  float *img = gt(lg, key, &ni);
  REQUIRE(lin && base && img && nl == 2 * 64 * 64 && ni == 2 * 32 * 32 * 3);
  float *x = malloc(nl * sizeof *x);
  ct_flux_unpack(2, 16, 16, 16, lin, x);
  ct_image out[2];
  CHECKF(!ct_flux_sampler_run(s, (const char *const *)pr, 2, 32, 32, 4, 3.5f, x, out, &e), "%s",
         e.msg);
  for (int i = 0; i < 2; i++) {
    const size_t o = (size_t)i * 32 * 32 * 3, n = 32 * 32 * 3;
    const double db = psnr(out[i].px, img + o, n), dbase = psnr(out[i].px, base + o, n);
    CHECKF(db >= 40, "%s image %d: %.1f dB", key, i, db);
    /* the adapter changes the image: the test can fail */
    CHECKF(dbase < 35, "%s image %d: %.1f dB from the base's", key, i, dbase);
    ct_image_free(&out[i]);
  }
  for (int i = 0; i < np; i++) free(pr[i]);
  free(x), free(lin), free(base), free(img);
  ct_flux_sampler_free(s);
  ct_st_close(g);
  ct_st_close(lg);
}

CT_TEST(lora_tools, sample_as_load_lora_weights) {
  check_sample(ct_failed_, "pytorch_lora_weights.safetensors", 1.0, "image.scale1");
  check_sample(ct_failed_, "pytorch_lora_weights.safetensors", 0.5, "image.scale0.5");
  /* the same adapter in kohya's keys (the committed export), read back by
   * sample --lora's route (ct_lora_merge_any) */
  check_sample(ct_failed_, "comfyui.safetensors", 1.0, "image.scale1");
}

/* The flux_pipe golden's training step through m: packed v_pred (1 x 64 x 64). */
static float *v_pred(int *ct_failed_, ct_mmdit *m) {
  ct_err e = {0};
  ct_st_file *g = NULL;
  if (ct_st_open(PIPE "/golden.safetensors", &g, &e)) {
    CHECKF(0, "%s", e.msg);
    return NULL;
  }
  const int T = atoi(ct_st_meta(g, "max_sequence_length"));
  size_t nx = 0;
  float *xt = gt(g, "train.xt", &nx), *pe = gt(g, "text.prompt_embeds", NULL);
  float *pooled = gt(g, "text.pooled", NULL), *sigma = gt(g, "train.sigma", NULL);
  float *guid = gt(g, "train.guidance", NULL);
  float *x = malloc(nx * sizeof *x), *out = malloc(nx * sizeof *out), *pk = malloc(nx * 4);
  ct_flux_unpack(1, 16, 16, 16, xt, x);
  ct_mmdit_batch in = {.B = 1,
                       .H = 16,
                       .W = 16,
                       .T = T,
                       .x = x,
                       .t = sigma,
                       .txt = pe,
                       .y = pooled,
                       .guidance = guid};
  if (ct_mmdit_forward(m, &in, out, &e)) {
    CHECKF(0, "%s", e.msg);
    free(pk), pk = NULL;
  } else {
    ct_flux_pack(1, 16, 16, 16, out, pk);
  }
  free(xt), free(pe), free(pooled), free(sigma), free(guid), free(x), free(out);
  ct_st_close(g);
  return pk;
}

static float *golden(const char *key) {
  ct_st_file *g = NULL;
  ct_err e;
  if (ct_st_open(ldata("golden.safetensors"), &g, &e)) return NULL;
  float *t = gt(g, key, NULL);
  ct_st_close(g);
  return t;
}

CT_TEST(lora_tools, merge_equals_base_plus_adapter) {
  ct_err e = {0};
  ct_mmdit *base = NULL, *merged = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(PIPE "/transformer", 0, &base, &e));
  REQUIRE(!ct_mmdit_open_diffusers(PIPE "/transformer", 0, &merged, &e));
  ct_lora *l = NULL;
  CHECKF(!ct_lora_open_file(ct_mmdit_cfg(base), ldata("pytorch_lora_weights.safetensors"), &l, &e),
         "%s", e.msg);
  REQUIRE(l);
  CHECK(ct_lora_options(l)->rank == 2 && ct_lora_options(l)->alpha == 3.0);
  const float *vbase = v_pred(ct_failed_, base); /* before the adapter is attached */
  ct_mmdit_set_lora(base, l);                    /* unmerged: the adapter's own forward */
  float *va = v_pred(ct_failed_, base);
  CHECKF(!ct_lora_merge(merged, l, 1.0, &e), "%s", e.msg);
  float *vm = v_pred(ct_failed_, merged), *vd = golden("v_pred");
  REQUIRE(vbase && va && vm && vd);
  const size_t n = 64 * 64;
  const double em = rel(vm, va, n), ed = rel(vm, vd, n), eb = rel(vbase, vd, n);
  CHECKF(em < 1e-5, "merged vs base + adapter %.3g", em);
  CHECKF(ed < 1e-4, "merged vs diffusers %.3g", ed);
  CHECKF(eb > 1e-2, "the adapter changes v_pred (%.3g)", eb);
  /* lora_scale 0 is the base; 0.5 twice is 1 */
  ct_mmdit *half = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(PIPE "/transformer", 0, &half, &e));
  CHECK(!ct_lora_merge(half, l, 0.5, &e) && !ct_lora_merge(half, l, 0.5, &e));
  float *vh = v_pred(ct_failed_, half);
  REQUIRE(vh);
  CHECKF(rel(vh, vm, n) < 1e-5, "0.5 + 0.5 vs 1: %.3g", rel(vh, vm, n));
  ct_mmdit_set_lora(base, NULL);
  free((void *)vbase), free(va), free(vm), free(vd), free(vh);
  ct_lora_free(l);
  ct_mmdit_free(base), ct_mmdit_free(merged), ct_mmdit_free(half);
}

/* The kohya file read as ComfyUI reads it: W_bfl += alpha / rank * up @ down. */
static ct_status apply_kohya(ct_mmdit *m, const char *path, ct_err *e) {
  ct_st_file *f = NULL;
  ct_status st = ct_st_open(path, &f, e);
  if (st) return st;
  size_t np;
  const ct_param *tab = ct_mmdit_table(m, &np);
  float *w = ct_mmdit_params(m);
  int used = 0;
  for (size_t i = 0; i < np && !st; i++) {
    char key[200], k2[240];
    snprintf(key, sizeof key, "lora_unet_%.*s", (int)(strlen(tab[i].name) - 7), tab[i].name);
    if (strcmp(tab[i].name + strlen(tab[i].name) - 7, ".weight")) continue;
    for (char *p = key + 10; *p; p++)
      if (*p == '.') *p = '_';
    snprintf(k2, sizeof k2, "%s.lora_down.weight", key);
    const ct_st_tensor *d = ct_st_find(f, k2);
    if (!d) continue;
    snprintf(k2, sizeof k2, "%s.lora_up.weight", key);
    const ct_st_tensor *u = ct_st_find(f, k2);
    snprintf(k2, sizeof k2, "%s.alpha", key);
    const ct_st_tensor *a = ct_st_find(f, k2);
    if (!u || !a || a->numel != 1 || d->shape[1] != tab[i].shape[1] ||
        u->shape[0] != tab[i].shape[0] || u->shape[1] != d->shape[0]) {
      st = ct_errf(e, CT_ERR_SHAPE, "%s: up/alpha missing or shapes wrong", key);
      break;
    }
    float *D = malloc(d->numel * 4), *U = malloc(u->numel * 4), al;
    st = ct_st_to_f32(d, D, d->numel, e);
    if (!st) st = ct_st_to_f32(u, U, u->numel, e);
    if (!st) st = ct_st_to_f32(a, &al, 1, e);
    const int r = (int)d->shape[0];
    if (!st)
      ct_sgemm(0, 0, (int)tab[i].shape[0], (int)tab[i].shape[1], r, al / (float)r, U, r, D,
               (int)tab[i].shape[1], 1.0f, w + tab[i].offset, (int)tab[i].shape[1]);
    free(D), free(U);
    used += 3;
  }
  if (!st && (size_t)used != f->ntensors)
    st = ct_errf(e, CT_ERR_FORMAT, "%s: %zu tensors, %d name weights of the model", path,
                 f->ntensors, used);
  ct_st_close(f);
  return st;
}

CT_TEST(lora_tools, export_comfyui) {
  ct_err e = {0};
  ct_mmdit *m = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(PIPE "/transformer", 0, &m, &e));
  ct_lora *l = NULL;
  REQUIRE(!ct_lora_open_file(ct_mmdit_cfg(m), ldata("pytorch_lora_weights.safetensors"), &l, &e));
  char out[4200];
  snprintf(out, sizeof out, "%s/comfyui.safetensors", ct_test_tmpdir());
  CHECKF(!ct_lora_export_kohya(ct_mmdit_cfg(m), l, 1.0, out, CT_DTYPE_F32, &e), "%s", e.msg);
  /* the committed export (diffusers read it) is what ctuner writes */
  ct_st_file *a = NULL, *b = NULL;
  REQUIRE(!ct_st_open(out, &a, &e) && !ct_st_open(ldata("comfyui.safetensors"), &b, &e));
  CHECKF(a->ntensors == b->ntensors, "%zu tensors vs %zu", a->ntensors, b->ntensors);
  int same = 1;
  for (size_t i = 0; i < b->ntensors; i++) {
    const ct_st_tensor *t = ct_st_find(a, b->tensors[i].name);
    same &= t && t->numel == b->tensors[i].numel && t->ndim == b->tensors[i].ndim &&
            !memcmp(t->data, b->tensors[i].data, t->numel * 4);
  }
  CHECK(same);
  const ct_st_tensor *qkv = ct_st_find(a, "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight");
  CHECK(qkv && qkv->shape[0] == 96 && qkv->shape[1] == 6); /* 3 x 32 rows, 3 adapters x rank 2 */
  ct_st_close(a), ct_st_close(b);
  /* read as ComfyUI reads it, it is diffusers' adapter */
  CHECKF(!apply_kohya(m, out, &e), "%s", e.msg);
  float *vk = v_pred(ct_failed_, m), *vd = golden("v_pred");
  REQUIRE(vk && vd);
  const double ek = rel(vk, vd, 64 * 64);
  CHECKF(ek < 1e-4, "kohya as ComfyUI reads it vs diffusers %.3g", ek);
  free(vk), free(vd);
  ct_lora_free(l);
  ct_mmdit_free(m);
}

CT_TEST(lora_tools, errors_name_the_problem) {
  ct_err e = {0};
  ct_mmdit *m = NULL;
  REQUIRE(!ct_mmdit_open_diffusers(PIPE "/transformer", 0, &m, &e));
  ct_lora *l = NULL;
  /* an adapter for another model (tests/data/lora's m3: other widths) */
  const char *other = CT_SOURCE_DIR "/tests/data/lora/all/pytorch_lora_weights.safetensors";
  CHECK(ct_lora_open_file(ct_mmdit_cfg(m), other, &l, &e) && !l);
  CHECKF(strstr(e.msg, other) && strstr(e.msg, "wrongly shaped"), "%s", e.msg);
  /* modules this transformer lacks (tiny names single block 20) */
  const char *tiny = CT_SOURCE_DIR "/tests/data/lora/tiny/pytorch_lora_weights.safetensors";
  CHECK(ct_lora_open_file(ct_mmdit_cfg(m), tiny, &l, &e) && !l);
  CHECKF(strstr(e.msg, "single_transformer_blocks.20.proj_out") || strstr(e.msg, "match no"), "%s",
         e.msg);
  /* a kohya file given where peft names are read */
  CHECK(ct_lora_open_file(ct_mmdit_cfg(m), ldata("comfyui.safetensors"), &l, &e) && !l);
  CHECKF(strstr(e.msg, "kohya"), "%s", e.msg);
  /* a scale that is not a number */
  CHECK(ct_lora_merge_file(m, ldata("pytorch_lora_weights.safetensors"), NAN, &e));
  CHECKF(strstr(e.msg, "lora_scale"), "%s", e.msg);
  CHECK(ct_lora_merge_file(m, "/nonexistent/adapter.safetensors", 1.0, &e));
  CHECKF(strstr(e.msg, "/nonexistent/adapter.safetensors"), "%s", e.msg);
  ct_mmdit_free(m);
}
