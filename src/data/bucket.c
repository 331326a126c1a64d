/* bucket.c: SimpleTuner's aspect-bucket arithmetic (docs/data.md,
 * "Buckets"), as pure functions of an image's size and the dataset's keys.
 *
 *   pixel:  the short edge is `resolution`, the long edge int(res x ar); both
 *           rounded to the alignment A (at least A).
 *   area:   edge = sqrt(megapixels x 1e6) rounded to A; W = round(edge sqrt(ar) / A) A,
 *           H = round(edge / sqrt(ar) / A) A, at least A. pixel_area converts
 *           to area first (megapixels = edge^2 / 1e6).
 *   ar:     crop false -> the image's own; crop true -> crop_aspect: square 1.0,
 *           preserve own, closest the nearest of crop_aspect_buckets, random a
 *           weighted draw keyed by the image.
 * With crop, the image is resized to cover the target (intermediary size) and
 * cropped at crop_style: random (keyed by the image), center, or corner (the
 * bottom-right corner, as SimpleTuner's CornerCropping). Without crop it is
 * resized to the target (aspect changes by the rounding only).
 * Rounding is Python's round (half to even), so sizes match SimpleTuner's.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctuner/config.h"
#include "ctuner/data.h"
#include "ctuner/rng.h"

#define STREAM_CROP 0x43524f50ull /* "CROP" */
#define STREAM_ASPECT 0x41535043ull

double ct_round_half_even(double x) {
  double r = floor(x + 0.5);
  if (r - x == 0.5 && fmod(r, 2.0) != 0) r -= 1.0; /* exactly halfway: to even */
  return r;
}

static int to_multiple(double x, int a) {
  int r = (int)ct_round_half_even(x / a) * a;
  return r < a ? a : r;
}

void ct_bucket_key(double aspect, int rounding, char *out, size_t n) {
  char buf[64];
  double p = pow(10.0, rounding);
  double r = ct_round_half_even(aspect * p) / p;
  snprintf(buf, sizeof buf, "%.*f", rounding > 0 ? rounding : 1, r);
  /* Python prints the shortest form with at least one decimal: 1.0, 1.5, 1.33 */
  char *dot = strchr(buf, '.');
  if (dot) {
    char *e = buf + strlen(buf) - 1;
    while (e > dot + 1 && *e == '0') *e-- = '\0';
  }
  snprintf(out, n, "%s", buf);
}

ct_status ct_bucket_opts_from(const ct_ds_config *d, double run_resolution, int alignment,
                              int rounding, uint64_t seed, ct_bucket_opts *o, ct_err *err) {
  memset(o, 0, sizeof *o);
  if (alignment != 8 && alignment != 16 && alignment != 24 && alignment != 32 && alignment != 64)
    return ct_errf(err, CT_ERR_INVALID, "aspect_bucket_alignment %d must be 8, 16, 24, 32 or 64",
                   alignment);
  if (rounding < 0 || rounding > 6)
    return ct_errf(err, CT_ERR_INVALID, "aspect_bucket_rounding %d must be between 0 and 6",
                   rounding);
  double res = d->resolution > 0 ? d->resolution : run_resolution;
  o->resolution_type = d->resolution_type;
  if (d->resolution_type == CT_RES_PIXEL_AREA) { /* edge in pixels -> megapixels */
    res = res * res / 1e6;
    o->resolution_type = CT_RES_AREA;
  } else if (d->resolution_type == CT_RES_AREA && d->resolution <= 0) {
    res = run_resolution * run_resolution / 1e6; /* the run's resolution is an edge */
  }
  if (!(res > 0))
    return ct_errf(err, CT_ERR_INVALID,
                   "dataset '%s': resolution is not set (neither in the dataset nor --resolution)",
                   d->id);
  if (o->resolution_type == CT_RES_AREA && res > 64)
    return ct_errf(
        err, CT_ERR_INVALID,
        "dataset '%s': resolution %g with resolution_type \"area\" is in megapixels; did you mean "
        "resolution_type \"pixel_area\" (an edge in pixels)?",
        d->id, res);
  o->resolution = res;
  o->alignment = alignment;
  o->rounding = rounding;
  o->crop = d->crop;
  o->crop_style = d->crop_style;
  o->crop_aspect = d->crop_aspect;
  o->aspects = d->crop_aspect_buckets;
  o->weights = d->crop_aspect_weights;
  o->naspects = d->n_crop_aspect_buckets;
  o->maximum_image_size = d->maximum_image_size;
  o->target_downsample_size = d->target_downsample_size;
  if (d->resolution_type == CT_RES_PIXEL_AREA) { /* given as edges: compare in megapixels */
    o->maximum_image_size = o->maximum_image_size * o->maximum_image_size / 1e6;
    o->target_downsample_size = o->target_downsample_size * o->target_downsample_size / 1e6;
  }
  o->seed = seed;
  return CT_OK;
}

/* Target size for aspect ratio ar. */
static void target_for(const ct_bucket_opts *o, double ar, int *W, int *H) {
  const int A = o->alignment;
  if (o->resolution_type == CT_RES_AREA) {
    int edge = to_multiple((double)(long)sqrt(o->resolution * 1e6), A);
    *W = to_multiple(edge * sqrt(ar), A);
    *H = to_multiple(edge / sqrt(ar), A);
  } else {
    double res = o->resolution;
    if (ar >= 1.0) {
      *H = to_multiple(res, A);
      *W = to_multiple((double)(long)(res * ar), A);
    } else {
      *W = to_multiple(res, A);
      *H = to_multiple((double)(long)(res / ar), A);
    }
  }
}

static double chosen_aspect(const ct_bucket_opts *o, double own, uint64_t key_hash) {
  if (!o->crop) return own;
  switch (o->crop_aspect) {
    case CT_ASPECT_SQUARE:
      return 1.0;
    case CT_ASPECT_PRESERVE:
      return own;
    case CT_ASPECT_CLOSEST: {
      double best = o->aspects[0];
      for (int i = 1; i < o->naspects; i++)
        if (fabs(o->aspects[i] - own) < fabs(best - own)) best = o->aspects[i];
      return best;
    }
    case CT_ASPECT_RANDOM: {
      double tot = 0, u = ct_rng_uniform(o->seed, STREAM_ASPECT, key_hash);
      for (int i = 0; i < o->naspects; i++) tot += o->weights[i];
      double acc = 0;
      for (int i = 0; i < o->naspects; i++) {
        acc += o->weights[i] / tot;
        if (u < acc) return o->aspects[i];
      }
      return o->aspects[o->naspects - 1];
    }
  }
  return own;
}

/* Intermediary size and crop for a given target. */
static void fit(const ct_bucket_opts *o, int w, int h, uint64_t key_hash, ct_img_geom *g) {
  const int W = g->target_w, H = g->target_h;
  if (!o->crop) {
    g->inter_w = W, g->inter_h = H, g->crop_x = g->crop_y = 0;
    return;
  }
  double sw = (double)w, sh = (double)h;
  /* an image above maximum_image_size is first brought down to target_downsample_size */
  if (o->maximum_image_size > 0) {
    int over = o->resolution_type == CT_RES_AREA ? sw * sh / 1e6 > o->maximum_image_size
                                                 : (sw < sh ? sw : sh) > o->maximum_image_size;
    if (over && o->target_downsample_size > 0) {
      double f = o->resolution_type == CT_RES_AREA
                     ? sqrt(o->target_downsample_size * 1e6 / (sw * sh))
                     : o->target_downsample_size / (sw < sh ? sw : sh);
      sw *= f, sh *= f;
    }
  }
  double s = fmax((double)W / sw, (double)H / sh);
  int iw = (int)ct_round_half_even(sw * s), ih = (int)ct_round_half_even(sh * s);
  if (iw < W) iw = W;
  if (ih < H) ih = H;
  g->inter_w = iw, g->inter_h = ih;
  switch (o->crop_style) {
    case CT_CROP_CENTER:
      g->crop_x = (iw - W) / 2, g->crop_y = (ih - H) / 2;
      break;
    case CT_CROP_CORNER:
      g->crop_x = iw - W, g->crop_y = ih - H;
      break;
    case CT_CROP_RANDOM: {
      uint32_t r[4];
      ct_philox4x32(o->seed, STREAM_CROP, key_hash, r);
      g->crop_x = (int)(r[0] % (uint32_t)(iw - W + 1));
      g->crop_y = (int)(r[1] % (uint32_t)(ih - H + 1));
      break;
    }
  }
}

ct_status ct_bucket_place(const ct_bucket_opts *o, int w, int h, uint64_t key_hash, ct_img_geom *g,
                          ct_err *err) {
  memset(g, 0, sizeof *g);
  if (w <= 0 || h <= 0) return ct_errf(err, CT_ERR_INVALID, "image size %dx%d is empty", w, h);
  g->orig_w = w, g->orig_h = h;
  double ar = chosen_aspect(o, (double)w / (double)h, key_hash);
  target_for(o, ar, &g->target_w, &g->target_h);
  double p = pow(10.0, o->rounding);
  g->aspect = ct_round_half_even((double)g->target_w / g->target_h * p) / p;
  fit(o, w, h, key_hash, g);
  return CT_OK;
}

/* Re-fit an image to a given target (all images of a bucket share its size). */
void ct_bucket_refit(const ct_bucket_opts *o, int target_w, int target_h, uint64_t key_hash,
                     ct_img_geom *g);
void ct_bucket_refit(const ct_bucket_opts *o, int target_w, int target_h, uint64_t key_hash,
                     ct_img_geom *g) {
  g->target_w = target_w, g->target_h = target_h;
  fit(o, g->orig_w, g->orig_h, key_hash, g);
}
