/* synth_int.h: synth helpers shared between synth.c, judge.c and tests. */
#ifndef CTUNER_SYNTH_INT_H
#define CTUNER_SYNTH_INT_H

#include <stdint.h>

#include "ctuner/synth.h"

/* Centre and half-size (pixels) of the spec's shape in a w x h image. */
void ct_synth_geometry(const ct_synth_spec *s, int w, int h, double *cx, double *cy, double *r);
/* Side of the shape as a fraction of min(w, h), by size index (0.30, 0.45, 0.60). */
double ct_synth_size_frac(int size);
/* 1 if the spec's (shape, colour, position) is in the held-out set. */
int ct_synth_is_held_out(const ct_synth_spec *s);

/* What the judge measured (for tests and --verbose). */
typedef struct ct_synth_features {
  uint8_t bg[3], fg[3]; /* estimated background and median foreground colour */
  double area;          /* soft foreground area in pixels */
  double bw, bh;        /* sqrt(12 var): the size of a rectangle with the same spread */
  double fill;          /* area / (bw * bh): square 1, disc 0.955 */
  double m22;           /* E[x^2 y^2] / (var x var y): square 1, disc 2/3 */
  double skew;          /* vertical skewness (y down): 0, or -0.57 for the triangle */
  double side;          /* side (diameter) from the area and the shape seen, pixels */
  double cx, cy;        /* centre of the shape's box (centroid, triangle corrected), pixels */
} ct_synth_features;
ct_status ct_synth_judge_ex(const ct_image *img, const ct_synth_spec *want, ct_synth_verdict *v,
                            ct_synth_features *f, ct_err *err);

#endif
