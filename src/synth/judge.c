/* judge.c: says which colour and shape an image of the synthetic dataset shows.
 *
 * Method (docs/synth.md): the background is the per-channel median of the
 * border pixels; a pixel's distance from it (smoothed 3x3) above a threshold
 * marks foreground, and the largest 8-connected foreground component is the
 * shape. Its colour is the median of its core pixels (the most distant
 * quarter of the range), matched to the nearest foreground palette colour.
 * Each pixel within 2 of the component gets a soft coverage (its projection on
 * the background->foreground line, not clamped at 0 so that noise averages
 * out), which makes the statistics sub-pixel and tolerant of antialiasing,
 * blur and noise. The shape comes from two normalised moments of the coverage
 * that are invariant to stretching either axis (aspect-ratio squashing):
 * the vertical skewness (0 for circle and square, -0.57 for the upward
 * triangle, y pointing down) and E[x^2 y^2] / (var x * var y) (1 for a square
 * whose coordinates are independent, 2/3 for a disc). Sums, unlike extents or
 * maxima, are not biased by pixel noise.
 * The background is the nearest background palette colour to the border
 * median. The size is the side sqrt(area / k) of the shape seen (k = pi/4,
 * 1, 1/2 for disc, square, triangle; the soft area is unchanged by blur),
 * as a fraction of min(w, h), nearest of the generator's 0.30/0.45/0.60 on a
 * log scale. The position compares the shape's centre (the centroid; the
 * triangle's lies S/6 below its box centre) with the generator's three
 * candidate centres per axis for that side (synth.c ct_synth_geometry).
 * Not here: rotated shapes, several shapes; size and position assume the
 * image has the aspect ratio it was drawn at (not squashed).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "synth/synth_int.h"

#define MIN_CONTRAST 48.0 /* below this nothing stands out from the background */
#define MIN_PIXELS 3

/* The lower median (element n/2 in sorted order), by histogram. */
static uint8_t median_u8(const uint8_t *v, size_t n) {
  size_t hist[256] = {0}, acc = 0;
  for (size_t i = 0; i < n; i++) hist[v[i]]++;
  for (int k = 0; k < 256; k++) {
    acc += hist[k];
    if (acc > n / 2) return (uint8_t)k;
  }
  return 255;
}

static double dist3(const uint8_t *a, const uint8_t *b) {
  double r = (double)a[0] - b[0], g = (double)a[1] - b[1], bl = (double)a[2] - b[2];
  return sqrt(r * r + g * g + bl * bl);
}

/* Background: the median of the border pixels, per channel (bord: scratch). */
static void border_background(const ct_image *img, uint8_t *bord, uint8_t bg[3]) {
  const int w = img->w, h = img->h;
  for (int c = 0; c < 3; c++) {
    size_t k = 0;
    for (int x = 0; x < w; x++) {
      bord[k++] = img->px[(size_t)x * 3 + c];
      bord[k++] = img->px[((size_t)(h - 1) * w + x) * 3 + c];
    }
    for (int y = 1; y < h - 1; y++) {
      bord[k++] = img->px[((size_t)y * w) * 3 + c];
      bord[k++] = img->px[((size_t)y * w + w - 1) * 3 + c];
    }
    bg[c] = median_u8(bord, k);
  }
}

/* Distance from the background (d), smoothed 3x3 against pixel noise (ds);
 * returns the largest smoothed distance. */
static float smoothed_distance(const ct_image *img, const uint8_t bg[3], float *d, float *ds) {
  const int w = img->w, h = img->h;
  const size_t n = (size_t)w * h;
  for (size_t i = 0; i < n; i++) d[i] = (float)dist3(img->px + 3 * i, bg);
  float maxd = 0;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      float s = 0;
      int cnt = 0;
      for (int dy = -1; dy <= 1; dy++)
        for (int dx = -1; dx <= 1; dx++) {
          int xx = x + dx, yy = y + dy;
          if (xx < 0 || yy < 0 || xx >= w || yy >= h) continue;
          s += d[(size_t)yy * w + xx];
          cnt++;
        }
      ds[(size_t)y * w + x] = s / cnt;
      if (s / cnt > maxd) maxd = s / cnt;
    }
  return maxd;
}

/* Labels the 8-connected components of ds > thr into lab (zeroed; stack:
 * scratch of w*h); returns the largest one's label and its size in *bestn. */
static int largest_component(const float *ds, float thr, int w, int h, int *lab, int *stack,
                             int *bestn) {
  const size_t n = (size_t)w * h;
  int best = 0, nl = 0;
  *bestn = 0;
  for (size_t i0 = 0; i0 < n; i0++) {
    if (lab[i0] || ds[i0] <= thr) continue;
    int l = ++nl, sp = 0, cnt = 0;
    lab[i0] = l;
    stack[sp++] = (int)i0;
    while (sp) {
      int i = stack[--sp], x = i % w, y = i / w;
      cnt++;
      for (int dy = -1; dy <= 1; dy++)
        for (int dx = -1; dx <= 1; dx++) {
          int xx = x + dx, yy = y + dy;
          if (xx < 0 || yy < 0 || xx >= w || yy >= h) continue;
          int j = yy * w + xx;
          if (!lab[j] && ds[j] > thr) {
            lab[j] = l;
            stack[sp++] = j;
          }
        }
    }
    if (cnt > *bestn) *bestn = cnt, best = l;
  }
  return best;
}

/* Nearest background palette colour to rgb. */
static int nearest_bg(const uint8_t rgb[3]) {
  int best = -1;
  double bestd = 1e30;
  for (int k = ct_synth_nfg(); k < ct_synth_ncolors(); k++) {
    uint8_t c[3];
    ct_synth_color_rgb(k, c);
    double dd = dist3(rgb, c);
    if (dd < bestd) bestd = dd, best = k;
  }
  return best;
}

/* Size class and position (row*3 + col) of a shape of the given kind whose
 * coverage has mass m0 and centroid (mx, my) (pixel centres at +0.5), in a
 * w x h image drawn by ct_synth_render; fills f->side, cx, cy. */
static void size_position(int shape, double m0, double mx, double my, int w, int h,
                          ct_synth_features *f, int *size, int *pos) {
  static const double AREA_K[3] = {0.78539816339744831, 1.0, 0.5}; /* area / side^2 */
  const double mn = w < h ? w : h;
  const double side = sqrt(m0 / AREA_K[shape]), frac = side / mn;
  f->side = side;
  f->cx = mx + 0.5;
  f->cy = my + 0.5 - (shape == 2 ? side / 6 : 0); /* triangle: centroid 2/3 down from apex */
  *size = 0;
  for (int k = 1; k < 3; k++) /* boundaries at geometric means of neighbouring sizes */
    if (frac > sqrt(ct_synth_size_frac(k - 1) * ct_synth_size_frac(k))) *size = k;
  /* Candidate centres of the generator's grid for this side (ct_synth_geometry). */
  const double margin = 0.06 * mn;
  int rc[2];
  for (int axis = 0; axis < 2; axis++) {
    const double len = axis ? h : w, c = axis ? f->cy : f->cx;
    double bestd = 1e30;
    for (int k = 0; k < 3; k++) {
      double ck = margin + side / 2 + k * (len - 2 * margin - side) / 2;
      if (fabs(c - ck) < bestd) bestd = fabs(c - ck), rc[axis] = k;
    }
  }
  *pos = rc[1] * 3 + rc[0];
}

ct_status ct_synth_judge_ex(const ct_image *img, const ct_synth_spec *want, ct_synth_verdict *v,
                            ct_synth_features *f, ct_err *err) {
  ct_status st = CT_OK;
  ct_synth_features ft;
  memset(&ft, 0, sizeof ft);
  if (!img || !img->px || !v || img->w < 3 || img->h < 3)
    return ct_errf(err, CT_ERR_INVALID, "ct_synth_judge: NULL argument or image smaller than 3x3");
  memset(v, 0, sizeof *v);
  v->color_found = v->shape_found = v->size_found = v->pos_found = v->bg_found = -1;
  int w = img->w, h = img->h;
  size_t n = (size_t)w * h, nb = 2 * (size_t)(w + h) - 4;
  uint8_t *bord = malloc(nb * 3 > n ? nb * 3 : n);
  float *d = malloc(sizeof(float) * n), *ds = malloc(sizeof(float) * n);
  float *cov = calloc(n, sizeof(float));
  int *lab = calloc(n, sizeof(int)), *stack = malloc(sizeof(int) * n);
  uint8_t *core = malloc(n * 3);
  if (!bord || !d || !ds || !cov || !lab || !stack || !core) {
    st = ct_errf(err, CT_ERR_NOMEM, "out of memory judging a %dx%d image", w, h);
    goto out;
  }
  border_background(img, bord, ft.bg);
  v->bg_found = nearest_bg(ft.bg);
  const float maxd = smoothed_distance(img, ft.bg, d, ds);
  if (maxd < MIN_CONTRAST) goto verdict;
  float thr = 0.5f * maxd;
  if (thr < 0.6f * MIN_CONTRAST) thr = 0.6f * MIN_CONTRAST;
  int bestn = 0, best = largest_component(ds, thr, w, h, lab, stack, &bestn);
  if (bestn < MIN_PIXELS) goto verdict;
  /* Foreground colour: median of the component's core (raw distance in the top quarter). */
  float cmax = 0;
  for (size_t i = 0; i < n; i++)
    if (lab[i] == best && d[i] > cmax) cmax = d[i];
  size_t nc = 0;
  for (size_t i = 0; i < n; i++)
    if (lab[i] == best && d[i] >= 0.75f * cmax) memcpy(core + 3 * nc++, img->px + 3 * i, 3);
  for (int c = 0; c < 3; c++) {
    for (size_t k = 0; k < nc; k++) bord[k] = core[3 * k + c];
    ft.fg[c] = median_u8(bord, nc);
  }
  double bestd = 1e30;
  for (int k = 0; k < ct_synth_nfg(); k++) {
    uint8_t rgb[3];
    ct_synth_color_rgb(k, rgb);
    double dd = dist3(ft.fg, rgb);
    if (dd < bestd) bestd = dd, v->color_found = k;
  }
  /* Soft coverage within 2 pixels of the component. */
  double ax = (double)ft.fg[0] - ft.bg[0], ay = (double)ft.fg[1] - ft.bg[1],
         az = (double)ft.fg[2] - ft.bg[2];
  double a2 = ax * ax + ay * ay + az * az;
  if (a2 < 1) goto verdict;
  /* Pixels within 2 of the component (separable dilation into stack[] as flags). */
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      int hit = 0;
      for (int dx = -2; dx <= 2 && !hit; dx++)
        hit = x + dx >= 0 && x + dx < w && lab[(size_t)y * w + x + dx] == best;
      stack[(size_t)y * w + x] = hit;
    }
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      int near = 0;
      for (int dy = -2; dy <= 2 && !near; dy++)
        near = y + dy >= 0 && y + dy < h && stack[(size_t)(y + dy) * w + x];
      if (!near) continue;
      const uint8_t *p = img->px + ((size_t)y * w + x) * 3;
      double c = (((double)p[0] - ft.bg[0]) * ax + ((double)p[1] - ft.bg[1]) * ay +
                  ((double)p[2] - ft.bg[2]) * az) /
                 a2;
      /* Unclamped (within bounds) so that pixel noise averages out in the moments. */
      if (c < -0.5) c = -0.5;
      if (c > 1.5) c = 1.5;
      cov[(size_t)y * w + x] = (float)c;
    }
  /* Moments of the coverage: mass, centroid, central moments. */
  double m0 = 0, mx = 0, my = 0;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      double c = cov[(size_t)y * w + x];
      m0 += c;
      mx += c * x;
      my += c * y;
    }
  if (m0 < MIN_PIXELS) goto verdict;
  mx /= m0;
  my /= m0;
  double sxx = 0, syy = 0, sx2y2 = 0, sy3 = 0;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      double c = cov[(size_t)y * w + x];
      if (c == 0) continue;
      double dx = x - mx, dy = y - my;
      sxx += c * dx * dx;
      syy += c * dy * dy;
      sx2y2 += c * dx * dx * dy * dy;
      sy3 += c * dy * dy * dy;
    }
  sxx /= m0;
  syy /= m0;
  if (sxx <= 0.05 || syy <= 0.05) goto verdict;
  ft.area = m0;
  ft.bw = sqrt(12 * sxx); /* the width of a rectangle with this spread */
  ft.bh = sqrt(12 * syy);
  ft.fill = m0 / (ft.bw * ft.bh);
  ft.m22 = sx2y2 / m0 / (sxx * syy);
  ft.skew = sy3 / m0 / (syy * sqrt(syy));
  /* Both statistics are unchanged by stretching either axis. */
  if (ft.skew < -0.23)
    v->shape_found = 2; /* mass toward the bottom: the upward triangle (-0.57) */
  else if (ft.m22 > 0.87)
    v->shape_found = 1; /* x and y independent: square (1), disc (2/3) */
  else
    v->shape_found = 0;
  size_position(v->shape_found, m0, mx, my, w, h, &ft, &v->size_found, &v->pos_found);
verdict:
  if (want) {
    v->color_ok = v->color_found >= 0 && v->color_found == want->color;
    v->shape_ok = v->shape_found >= 0 && v->shape_found == want->shape;
    v->size_ok = v->size_found >= 0 && v->size_found == want->size;
    v->pos_ok = v->pos_found >= 0 && v->pos_found == want->pos;
    v->bg_ok = v->bg_found >= 0 && v->bg_found == want->bg;
    v->all_ok = v->color_ok && v->shape_ok && v->size_ok && v->pos_ok && v->bg_ok;
  }
  if (f) *f = ft;
out:
  free(bord);
  free(d);
  free(ds);
  free(cov);
  free(lab);
  free(stack);
  free(core);
  return st;
}

ct_status ct_synth_judge(const ct_image *img, const ct_synth_spec *want, ct_synth_verdict *v,
                         ct_err *err) {
  return ct_synth_judge_ex(img, want, v, NULL, err);
}
