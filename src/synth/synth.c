/* synth.c: the synthetic dataset of coloured shapes — palette, captions and
 * their parser, antialiased rendering, deterministic spec drawing with a
 * held-out set of combinations, and writing a captioned dataset to disk.
 *
 * A spec is drawn with Philox from (seed, i) alone, so image i of a dataset is
 * the same whatever the count or thread count. The held-out set is a fixed
 * ~10% of the shape x colour x position combinations, chosen by a Philox hash
 * under a constant key: training draws never produce them, evaluation draws
 * produce only them. Rendering supersamples 4x4 per pixel and blends the
 * foreground over the background by coverage. Geometry is in pixels of the
 * target image (a circle is round at any aspect ratio); sizes are fractions of
 * min(w, h). The judge lives in judge.c; docs/synth.md has the design.
 */
#include "ctuner/synth.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctuner/rng.h"
#include "synth/synth_int.h"

static const char *const SHAPES[] = {"circle", "square", "triangle"};
static const char *const SIZES[] = {"small", "medium", "large"};
static const double SIZE_FRAC[] = {0.30, 0.45, 0.60};
static const char *const POS[] = {"top left", "top",         "top right", "left",        "center",
                                  "right",    "bottom left", "bottom",    "bottom right"};
static const char *const POS_PHRASE[] = {
    "at the top left",    "at the top",    "at the top right",
    "at the left",        "in the center", "at the right",
    "at the bottom left", "at the bottom", "at the bottom right"};

typedef struct {
  const char *name;
  uint8_t rgb[3];
} color;
/* Foreground colours first (saturated, pairwise >= 80 apart in RGB), then backgrounds. */
static const color COLORS[] = {
    {"red", {230, 25, 25}},     {"green", {30, 180, 40}},    {"blue", {30, 60, 230}},
    {"yellow", {245, 220, 30}}, {"magenta", {220, 40, 200}}, {"cyan", {30, 210, 220}},
    {"orange", {250, 140, 20}}, {"purple", {120, 40, 170}},  {"white", {255, 255, 255}},
    {"black", {0, 0, 0}},       {"grey", {128, 128, 128}},
};
#define NCOLORS ((int)(sizeof COLORS / sizeof *COLORS))
#define NFG 8
#define NSHAPES 3
#define NPOS 9
#define NCOMBO (NSHAPES * NFG * NPOS)

/* Philox streams: one per use, so draws never overlap. */
#define STREAM_SPEC 0x53594e54ull    /* spec of image i */
#define STREAM_FILE 0x46494c45ull    /* size and format of dataset image i */
#define HELD_KEY 0x68656c646f7574ull /* fixed: the held-out set never changes */
#define HELD_PER_SHAPE 7

int ct_synth_nshapes(void) {
  return NSHAPES;
}
int ct_synth_ncolors(void) {
  return NCOLORS;
}
int ct_synth_nfg(void) {
  return NFG;
}
int ct_synth_nsizes(void) {
  return 3;
}
const char *ct_synth_shape_name(int i) {
  return i >= 0 && i < NSHAPES ? SHAPES[i] : "?";
}
const char *ct_synth_color_name(int i) {
  return i >= 0 && i < NCOLORS ? COLORS[i].name : "?";
}
const char *ct_synth_size_name(int i) {
  return i >= 0 && i < 3 ? SIZES[i] : "?";
}
const char *ct_synth_position_name(int i) {
  return i >= 0 && i < NPOS ? POS[i] : "?";
}
void ct_synth_color_rgb(int i, uint8_t rgb[3]) {
  if (i < 0 || i >= NCOLORS) i = 0;
  memcpy(rgb, COLORS[i].rgb, 3);
}

static int spec_valid(const ct_synth_spec *s) {
  return s && s->shape >= 0 && s->shape < NSHAPES && s->color >= 0 && s->color < NFG &&
         s->size >= 0 && s->size < 3 && s->pos >= 0 && s->pos < NPOS && s->bg >= NFG &&
         s->bg < NCOLORS;
}

void ct_synth_caption(const ct_synth_spec *s, char *buf, int n) {
  if (!buf || n <= 0) return;
  if (!spec_valid(s)) {
    snprintf(buf, (size_t)n, "an invalid spec");
    return;
  }
  snprintf(buf, (size_t)n, "a %s %s %s %s on a %s background", SIZES[s->size],
           COLORS[s->color].name, SHAPES[s->shape], POS_PHRASE[s->pos], COLORS[s->bg].name);
}

/* Word k of the lowercased caption into w (letters only); returns the number of words. */
static int split_words(const char *s, char words[][16], int max) {
  int n = 0;
  while (*s && n < max) {
    while (*s && !isalpha((unsigned char)*s)) s++;
    if (!*s) break;
    int k = 0;
    while (isalpha((unsigned char)*s)) {
      if (k < 15) words[n][k++] = (char)tolower((unsigned char)*s);
      s++;
    }
    words[n][k] = '\0';
    n++;
  }
  return n;
}

static int find_word(const char *w, const char *const *names, int lo, int hi) {
  for (int i = lo; i < hi; i++)
    if (!strcmp(w, names[i])) return i;
  return -1;
}

ct_status ct_synth_parse(const char *caption, ct_synth_spec *s, ct_err *err) {
  char words[64][16];
  const char *cnames[NCOLORS];
  if (!caption || !s) return ct_errf(err, CT_ERR_INVALID, "ct_synth_parse: NULL argument");
  for (int i = 0; i < NCOLORS; i++) cnames[i] = COLORS[i].name;
  int nw = split_words(caption, words, 64);
  int shape = -1, col = -1, size = -1, bg = -1, row = -1, cl = -1, center = 0;
  for (int i = 0; i < nw; i++) {
    const char *w = words[i];
    int k;
    if (shape < 0 && (k = find_word(w, SHAPES, 0, NSHAPES)) >= 0)
      shape = k;
    else if (size < 0 && (k = find_word(w, SIZES, 0, 3)) >= 0)
      size = k;
    else if (!strcmp(w, "background") && i > 0 && bg < 0 &&
             (k = find_word(words[i - 1], cnames, NFG, NCOLORS)) >= 0)
      bg = k;
    else if (col < 0 && (k = find_word(w, cnames, 0, NFG)) >= 0)
      col = k;
    else if (!strcmp(w, "top"))
      row = 0;
    else if (!strcmp(w, "bottom"))
      row = 2;
    else if (!strcmp(w, "left"))
      cl = 0;
    else if (!strcmp(w, "right"))
      cl = 2;
    else if (!strcmp(w, "center") || !strcmp(w, "centre") || !strcmp(w, "middle"))
      center = 1;
  }
  const char *missing =
      shape < 0  ? "a shape (circle, square, triangle)"
      : col < 0  ? "a foreground colour (red, green, blue, yellow, magenta, cyan, orange, purple)"
      : size < 0 ? "a size (small, medium, large)"
      : bg < 0   ? "a background ('on a white|black|grey background')"
      : (row < 0 && cl < 0 && !center) ? "a position (top left ... center ... bottom right)"
                                       : NULL;
  if (missing) return ct_errf(err, CT_ERR_FORMAT, "caption \"%.200s\" lacks %s", caption, missing);
  s->shape = shape;
  s->color = col;
  s->size = size;
  s->bg = bg;
  s->pos = (row < 0 ? 1 : row) * 3 + (cl < 0 ? 1 : cl);
  return CT_OK;
}

/* ---- rendering ---- */

/* Coverage test of point (x, y) in pixel units. */
static int inside(int shape, double x, double y, double cx, double cy, double r) {
  double dx = x - cx, dy = y - cy;
  switch (shape) {
    case 0:
      return dx * dx + dy * dy <= r * r;
    case 1:
      return dx >= -r && dx <= r && dy >= -r && dy <= r;
    default: /* apex up, base at the bottom; half-width grows from 0 to r over height 2r */
      return dy <= r && dy >= -r && (dx < 0 ? -dx : dx) <= (dy + r) / 2;
  }
}

double ct_synth_size_frac(int size) {
  return size >= 0 && size < 3 ? SIZE_FRAC[size] : 0;
}

void ct_synth_geometry(const ct_synth_spec *s, int w, int h, double *cx, double *cy, double *r) {
  double m = w < h ? w : h;
  double side = SIZE_FRAC[s->size] * m, margin = 0.06 * m;
  int row = s->pos / 3, col = s->pos % 3;
  *cx = margin + side / 2 + col * (w - 2 * margin - side) / 2;
  *cy = margin + side / 2 + row * (h - 2 * margin - side) / 2;
  *r = side / 2;
}

ct_status ct_synth_render(const ct_synth_spec *s, int w, int h, ct_image *out, ct_err *err) {
  ct_status st;
  if (!spec_valid(s)) return ct_errf(err, CT_ERR_INVALID, "ct_synth_render: invalid spec");
  if ((st = ct_image_alloc(w, h, out, err))) return st;
  double cx, cy, r;
  ct_synth_geometry(s, w, h, &cx, &cy, &r);
  const uint8_t *fg = COLORS[s->color].rgb, *bg = COLORS[s->bg].rgb;
  enum { SS = 4 };
  for (int y = 0; y < h; y++) {
    for (int x = 0; x < w; x++) {
      int cov = 0;
      if (x + 1 >= cx - r && x <= cx + r && y + 1 >= cy - r && y <= cy + r) {
        for (int j = 0; j < SS; j++)
          for (int i = 0; i < SS; i++)
            cov += inside(s->shape, x + (i + 0.5) / SS, y + (j + 0.5) / SS, cx, cy, r);
      }
      uint8_t *p = out->px + ((size_t)y * w + x) * 3;
      for (int c = 0; c < 3; c++)
        p[c] = (uint8_t)((fg[c] * cov + bg[c] * (SS * SS - cov) + SS * SS / 2) / (SS * SS));
    }
  }
  return CT_OK;
}

/* ---- drawing specs ---- */

/* held[c] = 1 for the held-out combinations: for each shape, the HELD_PER_SHAPE
 * of its colour x position combinations with the smallest Philox hash under a
 * constant key (7 of 72 per shape: 21 of 216, 9.7%). */
static void held_set(uint8_t held[NCOMBO]) {
  enum { PER = NFG * NPOS };
  uint32_t hv[PER];
  for (int sh = 0; sh < NSHAPES; sh++) {
    for (int k = 0; k < PER; k++) {
      uint32_t o[4];
      ct_philox4x32(HELD_KEY, 0, (uint64_t)(sh * PER + k), o);
      hv[k] = o[0];
    }
    for (int k = 0; k < PER; k++) {
      int rank = 0;
      for (int j = 0; j < PER; j++) rank += hv[j] < hv[k] || (hv[j] == hv[k] && j < k);
      held[sh * PER + k] = rank < HELD_PER_SHAPE;
    }
  }
}

int ct_synth_is_held_out(const ct_synth_spec *s) {
  uint8_t held[NCOMBO];
  held_set(held);
  return held[(s->shape * NFG + s->color) * NPOS + s->pos];
}

void ct_synth_draw(uint64_t seed, uint64_t i, int held_out, ct_synth_spec *s) {
  uint32_t o[4];
  int list[NCOMBO], n = 0;
  uint8_t held[NCOMBO];
  held_set(held);
  for (int c = 0; c < NCOMBO; c++)
    if (held[c] == (held_out != 0)) list[n++] = c;
  CT_ASSERT(n > 0);
  ct_philox4x32(seed, STREAM_SPEC, i, o);
  int combo = list[o[0] % (uint32_t)n];
  s->shape = combo / (NFG * NPOS);
  s->color = combo / NPOS % NFG;
  s->pos = combo % NPOS;
  s->size = (int)(o[1] % 3u);
  s->bg = NFG + (int)(o[2] % (uint32_t)(NCOLORS - NFG));
}

/* ---- dataset ---- */

static const int DS_SIZES[][2] = {{32, 32}, {48, 32}, {32, 48}, {64, 64},
                                  {64, 48}, {48, 64}, {96, 64}, {64, 96}};

static ct_status mkdirs(const char *dir, ct_err *err) {
  char buf[4096];
  size_t n = strlen(dir);
  if (n == 0 || n >= sizeof buf) return ct_errf(err, CT_ERR_INVALID, "bad directory name");
  memcpy(buf, dir, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    char c = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
      return ct_errf(err, CT_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
    buf[i] = c;
  }
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return ct_errf(err, CT_ERR_IO, "%s: not a directory", dir);
  return CT_OK;
}

void ct_synth_file_plan(uint64_t seed, uint64_t i, int *w, int *h, int *jpeg) {
  uint32_t o[4];
  ct_philox4x32(seed, STREAM_FILE, i, o);
  int k = (int)(o[0] % (uint32_t)(sizeof DS_SIZES / sizeof *DS_SIZES));
  *w = DS_SIZES[k][0];
  *h = DS_SIZES[k][1];
  *jpeg = o[1] % 5u == 0; /* 20% */
}

ct_status ct_synth_write_dataset(const char *dir, int count, uint64_t seed, int fw, int fh,
                                 ct_err *err) {
  ct_status st = CT_OK;
  ct_image img = {0};
  if (!dir || count < 0 || fw < 0 || fh < 0 || (fw == 0) != (fh == 0))
    return ct_errf(err, CT_ERR_INVALID, "ct_synth_write_dataset: bad argument");
  if ((st = mkdirs(dir, err))) return st;
  size_t dl = strlen(dir);
  char *path = malloc(dl + 32);
  if (!path) return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  for (int i = 0; i < count && !st; i++) {
    ct_synth_spec s;
    int w, h, jpeg;
    char cap[160];
    ct_synth_draw(seed, (uint64_t)i, 0, &s);
    ct_synth_file_plan(seed, (uint64_t)i, &w, &h, &jpeg);
    if (fw) w = fw, h = fh;
    ct_synth_caption(&s, cap, sizeof cap);
    if ((st = ct_synth_render(&s, w, h, &img, err))) break;
    snprintf(path, dl + 32, "%s/%06d.%s", dir, i, jpeg ? "jpg" : "png");
    st = jpeg ? ct_image_save_jpeg(path, &img, 95, err) : ct_image_save_png(path, &img, err);
    ct_image_free(&img);
    if (st) break;
    snprintf(path, dl + 32, "%s/%06d.txt", dir, i);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "%s\n", cap) < 0 || fclose(f) != 0) {
      st = ct_errf(err, CT_ERR_IO, "%s: cannot write caption: %s", path, strerror(errno));
      f = NULL;
    }
  }
  free(path);
  return st;
}
