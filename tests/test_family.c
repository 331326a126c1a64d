/* The model-family registry (ctuner/family.h, src/config/family.c,
 * src/train/family.c): FLUX.1 and SDXL rows, the key table's lists made
 * from them, model_family / model_flavour refusals by name, and the
 * trainer's rows refusing a family known but not trainable yet. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/config.h"
#include "ctuner/diffusion.h"
#include "ctuner/family.h"
#include "ctuner/mmdit.h"
#include "ctuner/train.h"
#include "harness.h"
#include "train/trainer_int.h"

/* The "|"-list of every row's field (name or flavours). */
static void joined(int flavours, char *buf, size_t n) {
  int rows;
  const ct_family *f = ct_family_registry(&rows);
  size_t l = 0;
  buf[0] = 0;
  for (int i = 0; i < rows && l < n; i++)
    l += (size_t)snprintf(buf + l, n - l, "%s%s", i ? "|" : "",
                          flavours ? f[i].flavours : f[i].name);
}

CT_TEST(family, rows) {
  char buf[512];
  joined(0, buf, sizeof buf);
  CHECKF(!strcmp(buf, CT_FAMILY_NAMES), "rows %s, CT_FAMILY_NAMES %s", buf, CT_FAMILY_NAMES);
  joined(1, buf, sizeof buf);
  CHECKF(!strcmp(buf, CT_FAMILY_FLAVOURS), "flavours %s vs %s", buf, CT_FAMILY_FLAVOURS);
  int rows;
  const ct_family *f = ct_family_registry(&rows);
  for (int i = 0; i < rows; i++) {
    CHECKF(ct_family_in_list(f[i].flavours, f[i].default_flavour), "%s", f[i].name);
    CHECKF(ct_family_component_find(&f[i], f[i].denoiser) != NULL, "%s: denoiser", f[i].name);
    CHECKF(ct_family_component_find(&f[i], "vae") && ct_family_component_find(&f[i], "scheduler"),
           "%s", f[i].name);
    CHECKF(f[i].lora_targets && f[i].lora_targets[0], "%s", f[i].name);
    CHECKF(!ct_family_not_yet(f[i].name), "%s is both a row and not yet", f[i].name);
    CHECKF(f[i].trainable || f[i].trainable_note, "%s refused without a note", f[i].name);
  }
  /* the trainer's rows are the same families, in the same order */
  const char *names[16];
  int n = ct_train_family_rows(names, 16);
  CHECK(n == rows);
  for (int i = 0; i < n && i < rows; i++) CHECKF(!strcmp(names[i], f[i].name), "%s", names[i]);
  const ct_family *flux = ct_family_find("flux"), *sdxl = ct_family_find("sdxl");
  REQUIRE(flux && sdxl);
  CHECK(!strcmp(flux->pipeline_class, "FluxPipeline") && flux->latent_channels == 16);
  CHECK(!strcmp(sdxl->pipeline_class, "StableDiffusionXLPipeline") && sdxl->latent_channels == 4);
  CHECK(sdxl->objective == CT_OBJECTIVE_DDPM && flux->objective == CT_OBJECTIVE_FLOW_MATCHING);
  CHECK(!strcmp(ct_family_component_find(sdxl, "text_encoder_2")->cls,
                "CLIPTextModelWithProjection"));
  CHECK(!strcmp(ct_family_flavour(sdxl, NULL), "base-1.0"));
  CHECK(!strcmp(ct_family_flavour(flux, "schnell"), "schnell"));
  CHECK(ct_family_in_list("a|bb|c", "bb") && !ct_family_in_list("a|bb|c", "b"));
}

static ct_status validated(const char *family, const char *flavour, ct_err *err) {
  ct_config c;
  ct_config_defaults(&c);
  ct_status st = ct_config_set(&c, "model_family", family, err);
  if (!st && flavour) st = ct_config_set(&c, "model_flavour", flavour, err);
  if (!st) st = ct_config_validate(&c, err);
  ct_config_free(&c);
  return st;
}

CT_TEST(family, config_refusals) {
  ct_err e = {0};
  CHECKF(!validated("flux", "schnell", &e), "%s", e.msg);
  CHECKF(!validated("flux", NULL, &e), "%s", e.msg);
  CHECKF(!validated("sdxl", "refiner-1.0", &e), "%s", e.msg);
  CHECK(validated("flux", "base-1.0", &e) == CT_ERR_INVALID &&
        strstr(e.msg,
               "model_flavour must be none, dev, krea, schnell or kontext (model_family flux)"));
  CHECK(validated("sdxl", "dev", &e) == CT_ERR_INVALID && strstr(e.msg, "base-1.0") &&
        strstr(e.msg, "got 'dev'"));
  CHECKF(!validated("flux", "kontext", &e), "%s", e.msg); /* FLUX.1 Kontext (docs/kontext.md) */
  CHECK(validated("flux", "fluxbooru", &e) == CT_ERR_INVALID && strstr(e.msg, "not yet in ctuner"));
  const char *later[] = {"sd3", "flux2", "chroma", "pixart_sigma", "sd1x", "wan"};
  for (size_t i = 0; i < sizeof later / sizeof later[0]; i++)
    CHECKF(validated(later[i], NULL, &e) == CT_ERR_INVALID && strstr(e.msg, "not yet in ctuner") &&
               strstr(e.msg, "\"flux\" or \"sdxl\""),
           "%s: %s", later[i], e.msg);
  CHECK(validated("nonsense", NULL, &e) == CT_ERR_INVALID && strstr(e.msg, "is not supported"));
}

CT_TEST(family, trainer_rows) {
  ct_config c;
  ct_err e = {0};
  ct_config_defaults(&c);
  CHECKF(!ct_train_family_check(&c, &e), "%s", e.msg);
  CHECK(ct_task_pick(&c) == &ct_task_mmdit);
  ct_mmdit_config mc;
  CHECKF(!ct_train_model_config(&c, &mc, NULL, NULL, &e), "%s", e.msg);
  /* Kontext trains on image pairs (conditioning_data; docs/kontext.md) */
  REQUIRE(!ct_config_set(&c, "model_flavour", "kontext", &e));
  CHECKF(!ct_train_family_check(&c, &e), "%s", e.msg);
  REQUIRE(!ct_config_set(&c, "model_flavour", "dev", &e));
  REQUIRE(!ct_config_set(&c, "model_family", "sdxl", &e));
  CHECKF(!ct_train_family_check(&c, &e), "%s", e.msg); /* the U-net's full fine-tune */
  CHECK(ct_task_pick(&c) == &ct_task_sdxl);
  CHECK(ct_train_model_config(&c, &mc, NULL, NULL, &e) == CT_ERR_UNSUPPORTED &&
        strstr(e.msg, "memory plan"));
  ct_denoiser_open_fn open = NULL;
  CHECKF(!ct_train_family_denoiser("sdxl", &open, &e) && open == ct_sdxl_unet_denoiser, "%s",
         e.msg); /* the U-net's forward (tests/test_sdxl_sample.c runs it) */
  CHECK(ct_train_family_denoiser("flux", &open, &e) == CT_ERR_UNSUPPORTED);
  REQUIRE(!ct_config_set(&c, "model_type", "vae", &e)); /* the VAE task is family-agnostic */
  CHECK(!ct_train_family_check(&c, &e) && ct_task_pick(&c) == &ct_task_vae);
  ct_config_free(&c);
}

/* The rows' memory-plan hooks (ct_train_plan_denoiser): FLUX.1's is the MMDiT
 * `bench memory --plan --preset` computes; SDXL's the U-net of a pipeline's
 * unet/config.json, else SDXL 1.0 base's built in. */
CT_TEST(family, memory_plan_hooks) {
  ct_config c;
  ct_err e = {0};
  ct_plan_denoiser d;
  ct_config_defaults(&c);
  CHECKF(!ct_train_plan_denoiser(&c, 2, 0, 0, 0, &d, &e), "%s", e.msg);
  ct_mmdit_config mc;
  int s = 0, T = 0;
  ct_param *tab = NULL;
  size_t n = 0, numel = 0;
  REQUIRE(!ct_train_model_config(&c, &mc, &s, &T, &e) &&
          !ct_mmdit_param_table(&mc, &tab, &n, &numel, &e));
  free(tab);
  CHECK(!strcmp(d.kind, "mmdit") && d.numel == numel && d.resolution == 64 && d.tokens == T &&
        d.activations == (double)ct_mmdit_activation_plan(&mc, 0, 2, 64 / s, 64 / s, T));
  REQUIRE(!ct_config_set(&c, "model_family", "sdxl", &e));
  CHECKF(!ct_train_plan_denoiser(&c, 1, 0, 0, 0, &d, &e), "%s", e.msg);
  /* 2,567,463,684: UNet2DConditionModel of stable-diffusion-xl-base-1.0 */
  CHECK(!strcmp(d.kind, "unet") && d.psi == 2567463684u && d.numel == d.psi &&
        d.resolution == 1024 && d.latent == 128 && d.tokens == 77 && d.hidden == 1280 &&
        strstr(d.geometry, "built in"));
  CHECKF(d.activations > 16.2 * (1 << 30) && d.activations < 16.3 * (1 << 30), "%.0f",
         d.activations); /* docs/unet.md: 16.24 GiB at batch 1 */
  CHECK(ct_train_plan_denoiser(&c, 1, 0, 0, 1, &d, &e) == CT_ERR_UNSUPPORTED &&
        strstr(e.msg, "gradient checkpointing"));
  CHECK(ct_train_plan_denoiser(&c, 1, 1000, 0, 0, &d, &e) == CT_ERR_INVALID &&
        strstr(e.msg, "multiple of 32"));
  REQUIRE(!ct_config_set(&c, "model_flavour", "refiner-1.0", &e));
  CHECK(ct_train_plan_denoiser(&c, 1, 0, 0, 0, &d, &e) == CT_ERR_UNSUPPORTED &&
        strstr(e.msg, "refiner"));
  REQUIRE(!ct_config_set(&c, "pretrained_model_name_or_path", ct_test_data("sdxl_pipe"), &e));
  CHECKF(!ct_train_plan_denoiser(&c, 1, 0, 0, 0, &d, &e), "%s", e.msg);
  CHECK(d.psi == 33504 && d.codec_scale == 2 && d.resolution == 32 && d.latent == 16 &&
        strstr(d.geometry, "sdxl_pipe/unet/config.json"));
  ct_config_free(&c);
}
