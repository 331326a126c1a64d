/* The model-family registry (ctuner/family.h, docs/models.md): the rows as
 * data. Adding a family is a row here, its trainer row in
 * src/train/family.c, and its code in a folder of its own. */
#include "ctuner/family.h"

#include <stdio.h>
#include <string.h>

/* FluxPipeline's model_index.json (diffusers 0.42.1,
 * pipelines/flux/pipeline_flux.py FluxPipeline.__init__). The order is the
 * one src/train/flux_pipe.c has always checked them in (its messages). */
static const ct_family_component FLUX_COMPONENTS[] = {
    {"transformer", "FluxTransformer2DModel"},
    {"text_encoder", "CLIPTextModel"},
    {"text_encoder_2", "T5EncoderModel"},
    /* transformers 5 has one (tokenizers-backed) class per model: a pipeline it
     * saves records T5Tokenizer; CLIPTokenizerFast is transformers 4's fast class */
    {"tokenizer", "CLIPTokenizer|CLIPTokenizerFast"},
    {"tokenizer_2", "T5TokenizerFast|T5Tokenizer"},
    {"vae", "AutoencoderKL"},
    {"scheduler", "FlowMatchEulerDiscreteScheduler"},
};

/* StableDiffusionXLPipeline's (pipelines/stable_diffusion_xl/
 * pipeline_stable_diffusion_xl.py StableDiffusionXLPipeline.__init__); the
 * scheduler entry may name any of the schedulers below (the hub's SDXL base
 * ships EulerDiscreteScheduler). */
static const ct_family_component SDXL_COMPONENTS[] = {
    {"unet", "UNet2DConditionModel"},
    {"text_encoder", "CLIPTextModel"},
    {"text_encoder_2", "CLIPTextModelWithProjection"},
    {"tokenizer", "CLIPTokenizer|CLIPTokenizerFast"},
    {"tokenizer_2", "CLIPTokenizer|CLIPTokenizerFast"},
    {"vae", "AutoencoderKL"},
    {"scheduler",
     "EulerDiscreteScheduler|DDIMScheduler|DPMSolverMultistepScheduler|"
     "DDPMScheduler"},
};

/* SimpleTuner's Flux.DEFAULT_LORA_TARGET (lora_target "mmdit" and the
 * default; src/model/lora.c holds the other lora_target sets). */
static const char *const FLUX_LORA[] = {"to_k", "to_q", "to_v", "to_out.0", "to_qkv", NULL};
/* SimpleTuner's SDXL.DEFAULT_LORA_TARGET (simpletuner/helpers/models/sdxl/model.py). */
static const char *const SDXL_LORA[] = {"to_k", "to_q", "to_v", "to_out.0", NULL};

#define N(a) ((int)(sizeof a / sizeof a[0]))

static const ct_family ROWS[] = {
    {.name = "flux",
     .title = "FLUX.1",
     .flavours = "dev|krea|schnell|kontext",
     .default_flavour = "dev", /* an unset model_flavour reads as dev (512 T5 tokens) */
     .pipeline_class = "FluxPipeline",
     .denoiser = "transformer",
     .components = FLUX_COMPONENTS,
     .ncomponents = N(FLUX_COMPONENTS),
     .text_encoders = "text_encoder|text_encoder_2",
     .objective = CT_OBJECTIVE_FLOW_MATCHING,
     .prediction_types = "flow_matching",
     .samplers = "FlowMatchEulerDiscreteScheduler",
     .lora_targets = FLUX_LORA,
     .latent_channels = 16,
     .trainable = 1,
     /* FLUX.1 Kontext [dev]: diffusers' FluxKontextPipeline (reference tokens, ids (1, r, c)) */
     .reference_flavours = "kontext",
     .reference_pipeline_class = "FluxKontextPipeline"},
    {.name = "sdxl",
     .title = "SDXL",
     .flavours = "base-1.0|refiner-1.0|base-0.9|refiner-0.9",
     .default_flavour = "base-1.0", /* SimpleTuner's SDXL.DEFAULT_MODEL_FLAVOUR */
     .pipeline_class = "StableDiffusionXLPipeline",
     .denoiser = "unet",
     .components = SDXL_COMPONENTS,
     .ncomponents = N(SDXL_COMPONENTS),
     .text_encoders = "text_encoder|text_encoder_2",
     .objective = CT_OBJECTIVE_DDPM,
     .prediction_types = "epsilon|v_prediction",
     .samplers = "EulerDiscreteScheduler|DDIMScheduler|DPMSolverMultistepScheduler",
     .lora_targets = SDXL_LORA,
     .latent_channels = 4,
     .trainable = 1,
     .trainable_note = "model_type full or lora (the U-net, peft LoRA on it); ZeRO-2/3, bf16, "
                       "gradient checkpointing and LyCORIS not yet"},
};

/* SimpleTuner's other model_family names (a folder each under simpletuner/helpers/models,
 * ModelRegistry.register): known, refused as not yet in ctuner. */
static const char *const NOT_YET[] = {
    "sd1x",    "sd2x",    "sd3",     "deepfloyd",    "pixart_sigma", "kolors",       "auraflow",
    "sana",    "hidream", "lumina2", "ltxvideo",     "wan",          "cosmos2image", "qwen_image",
    "omnigen", "chroma",  "flux2",   "hunyuanvideo", "legacy"};

/* SimpleTuner flavours of families ctuner has, not offered here yet. */
static const struct {
  const char *family, *flavour;
} FLAVOUR_NOT_YET[] = {{"flux", "fluxbooru"}, {"flux", "libreflux"}};

const ct_family *ct_family_registry(int *n) {
  *n = N(ROWS);
  return ROWS;
}

const ct_family *ct_family_find(const char *name) {
  for (int i = 0; name && i < N(ROWS); i++)
    if (!strcmp(ROWS[i].name, name)) return &ROWS[i];
  return NULL;
}

int ct_family_not_yet(const char *name) {
  for (int i = 0; name && i < N(NOT_YET); i++)
    if (!strcmp(NOT_YET[i], name)) return 1;
  return 0;
}

int ct_family_in_list(const char *list, const char *word) {
  const size_t n = strlen(word);
  for (const char *p = list; p && *p;) {
    const char *e = strchr(p, '|');
    const size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == n && !strncmp(p, word, n)) return 1;
    p = e ? e + 1 : NULL;
  }
  return 0;
}

const ct_family_component *ct_family_component_find(const ct_family *f, const char *name) {
  for (int i = 0; f && name && i < f->ncomponents; i++)
    if (!strcmp(f->components[i].name, name)) return &f->components[i];
  return NULL;
}

static void list_families(char *buf, size_t n) {
  size_t l = 0;
  buf[0] = 0;
  for (int i = 0; i < N(ROWS) && l < n; i++)
    l += (size_t)snprintf(buf + l, n - l, "%s\"%s\"",
                          !i                ? ""
                          : i + 1 < N(ROWS) ? ", "
                                            : " or ",
                          ROWS[i].name);
}

ct_status ct_family_check(const char *name, ct_err *err) {
  if (ct_family_find(name)) return CT_OK;
  char have[128];
  list_families(have, sizeof have);
  if (ct_family_not_yet(name))
    return ct_errf(err, CT_ERR_INVALID,
                   "model_family '%s' is one of SimpleTuner's families, not yet in ctuner; ctuner "
                   "has %s (docs/models.md)",
                   name, have);
  return ct_errf(err, CT_ERR_INVALID, "model_family '%s' is not supported; use %s",
                 name ? name : "", have);
}

/* "a|b|c" as "a, b or c", as the key table's own lists read. */
static void say_flavours(const char *list, char *says, size_t n) {
  size_t l = 0;
  for (const char *p = list; *p && l + 5 < n; p++) {
    if (*p != '|') {
      says[l++] = *p;
      continue;
    }
    l += (size_t)snprintf(says + l, n - l, "%s", strchr(p + 1, '|') ? ", " : " or ");
  }
  says[l < n ? l : n - 1] = 0;
}

ct_status ct_family_check_flavour(const char *name, const char *flavour, ct_err *err) {
  const ct_family *f = ct_family_find(name);
  if (!f || !flavour) return CT_OK; /* model_family's own rule says why */
  if (ct_family_in_list(f->flavours, flavour)) return CT_OK;
  char says[160];
  say_flavours(f->flavours, says, sizeof says);
  for (int i = 0; i < N(FLAVOUR_NOT_YET); i++)
    if (!strcmp(FLAVOUR_NOT_YET[i].family, f->name) && !strcmp(FLAVOUR_NOT_YET[i].flavour, flavour))
      return ct_errf(err, CT_ERR_INVALID,
                     "model_flavour '%s' is one of SimpleTuner's %s flavours, not yet in ctuner; "
                     "use none, %s",
                     flavour, f->title, says);
  return ct_errf(err, CT_ERR_INVALID, "model_flavour must be none, %s (model_family %s), got '%s'",
                 says, f->name, flavour);
}

const char *ct_family_flavour(const ct_family *f, const char *flavour) {
  return flavour ? flavour : f ? f->default_flavour : NULL;
}
