/* Validation during training: every validation prompt (validation_prompt
 * and user_prompt_library) sampled with the live weights and/or the EMA, the
 * images written with prompt sidecars and one grid per step (rows: prompt x
 * variant, columns: images per prompt). Rank 0 only, on the full model. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctuner/alloc.h"
#include "ctuner/hash.h"
#include "ctuner/json.h"
#include "ctuner/log.h"
#include "ctuner/rng.h"
#include "ctuner/vae.h"
#include "train/flux_pipe.h"
#include "train/textcond.h"
#include "trainer_int.h"

static void vprompts_free(vprompts *v) {
  for (int i = 0; i < v->n; i++) free(v->short_[i]), free(v->text[i]);
  v->n = 0;
}

static ct_status load_prompts(const ct_config *cfg, vprompts *v, ct_err *err) {
  memset(v, 0, sizeof *v);
  if (cfg->validation_prompt) {
    v->short_[v->n] = strdup("validation");
    v->text[v->n++] = strdup(cfg->validation_prompt);
  }
  if (!cfg->user_prompt_library) return CT_OK;
  char *text;
  size_t n;
  ct_status st = ct_read_file(cfg->user_prompt_library, 1 << 20, &text, &n, err);
  if (st) {
    ct_err_prefix(err, "user_prompt_library: ");
    return st;
  }
  ct_json *j = NULL;
  st = ct_json_parse(text, n, &j, err);
  free(text);
  if (st) {
    ct_err_prefix(err, "%s: ", cfg->user_prompt_library);
    return st;
  }
  if (j->type != CT_JSON_OBJECT)
    st = ct_errf(err, CT_ERR_FORMAT, "%s: expected a JSON object {shortname: prompt}",
                 cfg->user_prompt_library);
  for (size_t i = 0; i < j->n && !st; i++) {
    const ct_json *x = &j->items[i];
    if (x->type != CT_JSON_STRING) {
      st = ct_errf(err, CT_ERR_FORMAT, "%s: prompt '%s' must be a string", cfg->user_prompt_library,
                   j->keys[i]);
      break;
    }
    if (v->n == 64) {
      st = ct_errf(err, CT_ERR_RANGE, "%s: more than 64 prompts", cfg->user_prompt_library);
      break;
    }
    v->short_[v->n] = strdup(j->keys[i]);
    v->text[v->n++] = strdup(x->str);
  }
  ct_json_free(j);
  return st;
}

/* "WxH,WxH" or "N" -> first size (the grid is per size; we use the first). */
static ct_status parse_vres(const ct_config *cfg, int def, int *w, int *h, ct_err *err) {
  *w = *h = def;
  if (!cfg->validation_resolution) return CT_OK;
  int a = 0, b = 0;
  char x;
  if (sscanf(cfg->validation_resolution, "%d%c%d", &a, &x, &b) == 3 && x == 'x') {
    *w = a, *h = b;
  } else if (sscanf(cfg->validation_resolution, "%d", &a) == 1) {
    *w = *h = a;
  } else {
    return ct_errf(err, CT_ERR_INVALID,
                   "validation_resolution '%s': expected WxH or a side in pixels",
                   cfg->validation_resolution);
  }
  if (*w <= 0 || *h <= 0 || *w > 4096 || *h > 4096)
    return ct_errf(err, CT_ERR_INVALID, "validation_resolution '%s' is out of range",
                   cfg->validation_resolution);
  return CT_OK;
}

static ct_status write_sidecar(const char *png, const char *prompt, ct_err *err) {
  char p[4700];
  if (ct_pathf(p, sizeof p, "%s", png)) return ct_errf(err, CT_ERR_RANGE, "path too long: %s", png);
  char *dot = strrchr(p, '.');
  if (dot) strcpy(dot, ".txt");
  return ct_write_file_atomic(p, prompt, strlen(prompt), err);
}

static ct_status tc_encode(void *ctx, const char *const *prompts, int n, float *txt, float *y,
                           ct_err *err) {
  return ct_textcond_encode(ctx, prompts, n, txt, y, err);
}

/* The MMDiT's images of n prompts (ct_vsample_fn): flow-matching Euler
 * steps, the FLUX.1 pipeline's scheduler when there is one. */
static ct_status mmdit_sample(trainer *tr, const char *const *prompts, int n, ct_image *out,
                              ct_err *err) {
  const ct_config *cfg = tr->cfg;
  ct_sample_opts so = {tr->vw,
                       tr->vh,
                       (int)cfg->validation_num_inference_steps,
                       (float)cfg->validation_guidance,
                       (float)cfg->flow_shift,
                       (uint64_t)cfg->validation_seed,
                       cfg->flow_schedule_auto_shift,
                       NULL,
                       cfg->validation_negative_prompt};
  if (tr->fp) /* FluxPipeline's scheduler: its sigmas, dynamic shift (mu) included */
    so.sched = &tr->fp->sched;
  return ct_sample_images_with(tr->m, tc_encode, tr->tc, tr->g.T, &tr->codec, prompts, n, 0, &so,
                               out, err);
}

ct_status ct_validate(trainer *tr, long step, int *nimages, ct_err *err) {
  return ct_validate_with(tr, step, mmdit_sample, nimages, err);
}

/* Sample every validation prompt (live weights and/or EMA) through sample,
 * write the images with prompt sidecars, and one grid (rows: prompt x
 * variant, columns: idx). */
ct_status ct_validate_with(trainer *tr, long step, ct_vsample_fn sample, int *nimages,
                           ct_err *err) {
  const ct_config *cfg = tr->cfg;
  *nimages = 0;
  if (tr->vp.n == 0 || cfg->disable_validation) return CT_OK;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/validation_images", cfg->output_dir);
  ct_status st = ct_mkdir_p(dir, err);
  if (st) return st;
  int variants[2], nv = 0; /* 0 live, 1 ema */
  if (!tr->ema || strcmp(cfg->ema_validation, "ema_only")) variants[nv++] = 0;
  if (tr->ema && strcmp(cfg->ema_validation, "none")) variants[nv++] = 1;
  const int per = (int)cfg->num_validation_images, n = tr->vp.n * per;
  const char **prompts = malloc((size_t)n * sizeof *prompts);
  ct_image *imgs = calloc((size_t)n * nv, sizeof *imgs);
  float *live = NULL;
  if (!prompts || !imgs) {
    free(prompts);
    free(imgs);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  for (int p = 0; p < tr->vp.n; p++)
    for (int i = 0; i < per; i++) prompts[p * per + i] = tr->vp.text[p];
  /* the trained model's weights (the MMDiT's, or model_type lora's adapters) */
  const size_t nw = ct_model_numel(tr->model);
  float *const w = ct_model_params(tr->model);
  const ct_backend_ops *be = ct_trainer_be(tr); /* the weights' and EMA's memory */
  for (int k = 0; k < nv && !st; k++) {
    if (variants[k] == 1) { /* swap the EMA weights in, and back afterwards */
      live = be->alloc(CT_MEM_BUFFERS, nw * sizeof(float));
      if (!live) {
        st = ct_errf(err, CT_ERR_NOMEM, "out of memory");
        break;
      }
      be->copy(live, w, nw * sizeof(float));
      be->copy(w, tr->ema, nw * sizeof(float));
    }
    /* Same noise for every prompt's idx-th image, so rows are comparable. */
    for (int q = 0; q < n && !st; q += per) {
      st = sample(tr, prompts + q, per, imgs + (size_t)k * n + q, err);
    }
    if (live) {
      be->copy(w, live, nw * sizeof(float));
      be->free(live);
      live = NULL;
    }
  }
  for (int k = 0; k < nv && !st; k++)
    for (int q = 0; q < n && !st; q++) {
      char path[4600];
      int p = q / per, i = q % per;
      snprintf(path, sizeof path, "%s/step_%ld_%s%s_%d_%dx%d.png", dir, step, tr->vp.short_[p],
               variants[k] ? "-ema" : "", i, tr->vw, tr->vh);
      st = ct_image_save_png(path, &imgs[(size_t)k * n + q], err);
      if (!st) st = write_sidecar(path, tr->vp.text[p], err);
      if (!st) (*nimages)++;
    }
  if (!st) { /* grid */
    const int pad = 2, cols = per, rows = tr->vp.n * nv;
    ct_image grid = {0};
    st = ct_image_alloc(cols * (tr->vw + pad) + pad, rows * (tr->vh + pad) + pad, &grid, err);
    if (!st) {
      memset(grid.px, 255, (size_t)grid.w * grid.h * 3);
      for (int k = 0; k < nv; k++)
        for (int q = 0; q < n; q++) {
          const ct_image *im = &imgs[(size_t)k * n + q];
          int r = (q / per) * nv + k, c = q % per;
          for (int yy = 0; yy < im->h; yy++)
            memcpy(grid.px + (((size_t)(r * (tr->vh + pad) + pad + yy)) * grid.w +
                              c * (tr->vw + pad) + pad) *
                                 3,
                   im->px + (size_t)yy * im->w * 3, (size_t)im->w * 3);
        }
      char path[4600];
      snprintf(path, sizeof path, "%s/step_%ld_grid.png", dir, step);
      st = ct_image_save_png(path, &grid, err);
      ct_image_free(&grid);
    }
  }
  for (size_t i = 0; i < (size_t)n * nv; i++) ct_image_free(&imgs[i]);
  free(imgs);
  free(prompts);
  return st;
}

/* SimpleTuner's validation keys that change nothing here: one warning each
 * (rank 0), saying why. */
static void warn_validation_keys(trainer *tr) {
  const ct_config *c = tr->cfg;
  if (tr->rank != 0 || tr->vkeys_warned++) return;
  if (c->validation_negative_prompt && tr->fp)
    CT_WARN(
        "validation_negative_prompt has no effect: FLUX.1 validation makes no CFG pass (the "
        "guidance is the transformer's input, as FluxPipeline's guidance_scale)");
  if (c->validation_guidance_rescale != 0 && tr->task != &ct_task_sdxl) /* SDXL applies it */
    CT_WARN(
        "validation_guidance_rescale %g has no effect: SimpleTuner applies it to SD 1.x/2.x/XL "
        "pipelines only; FLUX.1 is flow-matching",
        c->validation_guidance_rescale);
  const char *vns = c->validation_noise_scheduler;
  if (vns && strcmp(vns, "flow_matching") && strcmp(vns, "euler") && tr->task != &ct_task_sdxl)
    CT_WARN(
        "validation_noise_scheduler %s has no effect: ctuner samples FLUX.1 with flow-matching "
        "Euler steps; other samplers are not implemented",
        vns);
  if (c->given[CT_KEY_validation_disable_unconditional] && !c->validation_disable_unconditional)
    CT_WARN(
        "validation_disable_unconditional false: ctuner does not sample SimpleTuner's extra "
        "empty-prompt validation images");
  if (c->evaluation_type && !strcmp(c->evaluation_type, "clip"))
    CT_WARN(
        "evaluation_type clip has no effect: SimpleTuner's CLIP score needs a CLIP image model, "
        "which ctuner does not run; validation images are written unscored");
}

ct_status ct_validation_init(trainer *tr, ct_err *err) {
  warn_validation_keys(tr);
  vprompts_free(
      &tr->vp); /* the Flux task reads them early, to encode them before the encoders go */
  ct_status st = load_prompts(tr->cfg, &tr->vp, err);
  return st ? st : parse_vres(tr->cfg, tr->g.resolution, &tr->vw, &tr->vh, err);
}

void ct_validation_free(trainer *tr) {
  vprompts_free(&tr->vp);
}
