/* FLUX.1 Kontext's sizes as diffusers' FluxKontextPipeline.__call__ sets them
 * (pipelines/flux/pipeline_flux_kontext.py: max_area, _auto_resize,
 * PREFERRED_KONTEXT_RESOLUTIONS). docs/kontext.md. */
#include <math.h>
#include <stdlib.h>

#include "ctuner/train.h"

/* (width, height) pairs, as the pipeline's list */
static const int PREFERRED[][2] = {{672, 1568}, {688, 1504}, {720, 1456}, {752, 1392},  {800, 1328},
                                   {832, 1248}, {880, 1184}, {944, 1104}, {1024, 1024}, {1104, 944},
                                   {1184, 880}, {1248, 832}, {1328, 800}, {1392, 752},  {1456, 720},
                                   {1504, 688}, {1568, 672}};

int ct_kontext_sizes(long max_area, int multiple, int auto_resize, int *w, int *h, int *rw,
                     int *rh) {
  /* the output: round() of Python is half to even, as nearbyint's default mode */
  const double ar = (double)*w / (double)*h;
  *w = (int)nearbyint(sqrt((double)max_area * ar)) / multiple * multiple;
  *h = (int)nearbyint(sqrt((double)max_area / ar)) / multiple * multiple;
  if (!rw || !rh || *rw <= 0 || *rh <= 0) return 0;
  int nw = *rw, nh = *rh;
  if (auto_resize) { /* min over (|ar - w/h|, w, h) */
    const double rar = (double)*rw / (double)*rh;
    int best = 0;
    for (int i = 1; i < (int)(sizeof PREFERRED / sizeof PREFERRED[0]); i++) {
      double a = fabs(rar - (double)PREFERRED[i][0] / PREFERRED[i][1]);
      double b = fabs(rar - (double)PREFERRED[best][0] / PREFERRED[best][1]);
      if (a < b || (a == b && (PREFERRED[i][0] < PREFERRED[best][0] ||
                               (PREFERRED[i][0] == PREFERRED[best][0] &&
                                PREFERRED[i][1] < PREFERRED[best][1]))))
        best = i;
    }
    nw = PREFERRED[best][0], nh = PREFERRED[best][1];
  }
  nw = nw / multiple * multiple, nh = nh / multiple * multiple;
  const int resized = nw != *rw || nh != *rh;
  *rw = nw, *rh = nh;
  return resized;
}
