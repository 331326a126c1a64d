/* The model-family registry (docs/models.md): one row per SimpleTuner
 * model_family ctuner has, saying as data what the family is made of — the
 * diffusers pipeline class and components its directory holds (model_index.json
 * `_class_name`s), which component is the denoiser, its text encoders, its
 * noise objective and prediction types, the schedulers it samples with, its
 * flavours and its default LoRA target names. The trainer's side of a row
 * (the task, the memory plan, the denoiser's code) is src/train/family.c,
 * keyed by the same name. Owned by the config module, which validates
 * model_family and model_flavour against it; families SimpleTuner has and
 * ctuner does not are refused by name. Pure data, no allocation. */
#ifndef CTUNER_FAMILY_H
#define CTUNER_FAMILY_H

#include "ctuner/status.h"

/* A component of the pipeline directory: model_index.json's key (its
 * subfolder) and the diffusers/transformers class ctuner reads there. */
typedef struct ct_family_component {
  const char *name, *cls;
} ct_family_component;

typedef enum ct_family_objective {
  CT_OBJECTIVE_FLOW_MATCHING, /* x_t = (1-t) x0 + t eps, target eps - x0 (FLUX.1) */
  CT_OBJECTIVE_DDPM,          /* DDPMScheduler's add_noise; epsilon or v_prediction (SDXL) */
} ct_family_objective;

typedef struct ct_family {
  const char *name;            /* model_family */
  const char *title;           /* for messages: "FLUX.1" */
  const char *flavours;        /* model_flavour values, "a|b|c" */
  const char *default_flavour; /* SimpleTuner's DEFAULT_MODEL_FLAVOUR */
  const char *pipeline_class;  /* model_index.json _class_name */
  const char *denoiser;        /* the trained component: "transformer", "unet" */
  const ct_family_component *components;
  int ncomponents;           /* every entry model_index.json must name */
  const char *text_encoders; /* components, in encode_prompt's order, "a|b" */
  ct_family_objective objective;
  const char *prediction_types;    /* "flow_matching", "epsilon|v_prediction" */
  const char *samplers;            /* scheduler classes offered for sampling, "A|B" */
  const char *const *lora_targets; /* SimpleTuner's default peft targets, NULL-terminated */
  int latent_channels;
  /* 1: ctuner trains it; 0: the family is known and its parts are here, but
   * a run is refused (trainable_note says what is missing). */
  int trainable;
  const char *trainable_note;
  /* Flavours whose denoiser also takes a reference image's tokens (FLUX.1
   * Kontext, docs/kontext.md: `ctuner sample --image`), "a|b" or NULL; the
   * pipeline class such a model_index.json names; non-NULL
   * reference_train_note: a training run of such a flavour is refused with it. */
  const char *reference_flavours;
  const char *reference_pipeline_class;
  const char *reference_train_note;
} ct_family;

/* Every row's name, and every row's flavours, as "|"-lists (the key
 * table's choices; tests/test_family.c checks them against the rows). */
#define CT_FAMILY_NAMES "flux|sdxl"
#define CT_FAMILY_FLAVOURS "dev|krea|schnell|kontext|base-1.0|refiner-1.0|base-0.9|refiner-0.9"

/* Rows in registry order; n families. */
const ct_family *ct_family_registry(int *n);
/* The row of model_family name, or NULL. */
const ct_family *ct_family_find(const char *name);
/* One of SimpleTuner's model_family names ctuner has no row for (1/0). */
int ct_family_not_yet(const char *name);
/* The component called name in f's pipeline directory, or NULL. */
const ct_family_component *ct_family_component_find(const ct_family *f, const char *name);
/* model_family name: CT_OK for a row; otherwise an error naming it ("not yet
 * in ctuner" for SimpleTuner's other families, unknown otherwise) and listing
 * the families ctuner has. */
ct_status ct_family_check(const char *name, ct_err *err);
/* model_flavour flavour (NULL: unset, the family's default) against family
 * name's flavours. */
ct_status ct_family_check_flavour(const char *name, const char *flavour, ct_err *err);
/* The flavour a run uses: flavour, or the family's default when NULL. */
const char *ct_family_flavour(const ct_family *f, const char *flavour);
/* 1 when the "|"-list list holds word. */
int ct_family_in_list(const char *list, const char *word);

#endif
