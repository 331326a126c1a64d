/* Conditioning datasets (conditioning_data, dataset_type "conditioning",
 * conditioning_type reference_strict / reference_loose; docs/data.md): the
 * keys' rules, each image paired with the reference of the same relative
 * path, unpaired images skipped and counted, the references' latents in the
 * batch beside their targets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/config.h"
#include "ctuner/data.h"
#include "ctuner/fs.h"
#include "ctuner/image.h"
#include "harness.h"

static ct_status parse(const char *t, ct_err *err) {
  ct_backend *b = NULL;
  ct_status st = ct_backend_parse(t, strlen(t), "m.json", &b, err);
  ct_backend_free(b);
  return st;
}

CT_TEST(data_reference, backend_rules) {
  ct_err err = {0};
  char t[1024];
  const char *img = "{\"id\": \"edits\", \"type\": \"local\", \"instance_data_dir\": \"e\"%s}";
  static const struct {
    const char *img_extra, *cond, *want; /* want NULL: accepted */
  } cases[] = {
      {", \"conditioning_data\": \"refs\"",
       "\"dataset_type\": \"conditioning\", \"conditioning_type\": \"reference_strict\"", NULL},
      {", \"conditioning_data\": [\"refs\"]",
       "\"dataset_type\": \"conditioning\", \"conditioning_type\": \"reference_loose\", "
       "\"source_dataset_id\": \"edits\", \"resolution\": 8, \"caption_strategy\": \"textfile\"",
       NULL},
      {", \"conditioning_data\": \"refs\"",
       "\"dataset_type\": \"conditioning\", \"conditioning_type\": \"controlnet\"",
       "\"controlnet\": conditioning datasets of this type"},
      {", \"conditioning_data\": \"refs\"",
       "\"dataset_type\": \"conditioning\", \"conditioning_type\": \"mask\"", "\"mask\""},
      {", \"conditioning_data\": \"refs\"", "\"dataset_type\": \"conditioning\"",
       "is required on a conditioning dataset"},
      {", \"conditioning_data\": \"nope\"",
       "\"dataset_type\": \"conditioning\", \"conditioning_type\": \"reference_strict\"",
       "no enabled dataset with id \"nope\""},
      /* SimpleTuner's factory: a conditioning_type makes a conditioning dataset (its Kontext
       * example leaves dataset_type out); placement keys are warned about under strict */
      {", \"conditioning_data\": \"refs\"",
       "\"conditioning_type\": \"reference_strict\", \"minimum_image_size\": 1024, "
       "\"caption_strategy\": null",
       NULL},
      {", \"conditioning_data\": [\"refs\", \"refs\"]",
       "\"dataset_type\": \"conditioning\", \"conditioning_type\": \"reference_strict\"",
       "several per image dataset"},
      {", \"conditioning_data\": \"refs\"",
       "\"dataset_type\": \"conditioning\", \"conditioning_type\": \"reference_strict\", "
       "\"repeats\": 2",
       "key 'repeats': has no meaning on a conditioning dataset"},
      {", \"conditioning_data\": \"refs\"",
       "\"dataset_type\": \"conditioning\", \"conditioning_type\": \"reference_strict\", "
       "\"source_dataset_id\": \"other\"",
       "\"other\" is not an enabled image dataset"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char a[300];
    snprintf(a, sizeof a, img, cases[i].img_extra);
    snprintf(t, sizeof t,
             "[%s, {\"id\": \"refs\", \"type\": \"local\", \"instance_data_dir\": \"r\", %s}]", a,
             cases[i].cond);
    memset(&err, 0, sizeof err);
    ct_status st = parse(t, &err);
    if (!cases[i].want)
      CHECKF(st == CT_OK, "%zu: %s", i, err.msg);
    else
      CHECKF(st != CT_OK && strstr(err.msg, cases[i].want), "%zu: st %d: %s", i, st, err.msg);
  }
}

/* n images of w x h named p<i>.png (pixels a function of i and salt), with captions. */
static void write_set(const char *dir, int from, int n, int w, int h, int salt, int captions) {
  ct_err err = {0};
  ct_mkdir_p(dir, &err);
  for (int k = from; k < from + n; k++) {
    ct_image img = {0};
    if (ct_image_alloc(w, h, &img, &err)) return;
    for (int p = 0; p < w * h * 3; p++) img.px[p] = (uint8_t)(p * 5 + k * 11 + salt);
    char path[2100];
    snprintf(path, sizeof path, "%s/p%02d.png", dir, k);
    ct_image_save_png(path, &img, &err);
    ct_image_free(&img);
    if (!captions) continue;
    snprintf(path, sizeof path, "%s/p%02d.txt", dir, k);
    ct_write_file_atomic(path, "an edit", 7, &err);
  }
}

static void cfg_for(ct_config *cfg, const char *sub) {
  ct_config_defaults(cfg);
  cfg->resolution = 16;
  cfg->aspect_bucket_alignment = 8;
  cfg->train_batch_size = 2;
  cfg->seed = 5;
  cfg->caption_dropout_probability = 0;
  free(cfg->output_dir);
  char od[1024];
  snprintf(od, sizeof od, "%s/%s", ct_test_tmpdir(), sub);
  cfg->output_dir = strdup(od);
  free(cfg->resolution_type);
  cfg->resolution_type = strdup("pixel");
}

static const char *write_backend(const char *name, const char *body) {
  static char path[1024];
  snprintf(path, sizeof path, "%s/%s", ct_test_tmpdir(), name);
  ct_err err = {0};
  ct_write_file_atomic(path, body, strlen(body), &err);
  return path;
}

/* reference_strict: 6 targets 16x16; references for 4 of them (copies), one
 * of another size (resized to its target's placement, as SimpleTuner's
 * prepare_like), one missing (skipped and counted); the copies' references
 * are the targets' own latents (same size, same crop, same pixels). */
CT_TEST(data_reference, strict_pairs_in_the_batch) {
  char e[1024], r[1024], body[4096];
  snprintf(e, sizeof e, "%s/strict/edits", ct_test_tmpdir());
  snprintf(r, sizeof r, "%s/strict/refs", ct_test_tmpdir());
  write_set(e, 0, 6, 16, 16, 0, 1);
  write_set(r, 0, 4, 16, 16, 0, 0); /* p00..p03: copies of the targets */
  write_set(r, 4, 1, 24, 16, 0, 0); /* p04: another size, other pixels */
  write_set(r, 9, 1, 16, 16, 0, 0); /* p09: nothing names it */
  snprintf(body, sizeof body,
           "[{\"id\": \"edits\", \"type\": \"local\", \"instance_data_dir\": \"%s\", "
           "\"caption_strategy\": \"textfile\", \"conditioning_data\": \"refs\"},"
           " {\"id\": \"refs\", \"type\": \"local\", \"instance_data_dir\": \"%s\", "
           "\"dataset_type\": \"conditioning\", \"conditioning_type\": \"reference_strict\"}]",
           e, r);
  const char *be = write_backend("strict.json", body);
  ct_config cfg;
  cfg_for(&cfg, "strict/out");
  cfg.train_batch_size = 1; /* an epoch: each image once */
  ct_data_opts o = {.cfg = &cfg, .codec_scale = 1, .size_multiple = 2, .prefetch = 2};
  ct_dataset *ds = NULL;
  ct_err err = {0};
  /* a trainer that takes no references refuses the pairs by name */
  o.reference_why = "model_family sdxl";
  CHECK(ct_dataset_open(be, &o, &ds, &err) == CT_ERR_UNSUPPORTED);
  CHECKF(strstr(err.msg, "conditioning_data \"refs\": model_family sdxl takes no reference"), "%s",
         err.msg);
  o.reference = 1;
  {
    ct_status rs_ = ct_dataset_open(be, &o, &ds, &err);
    CHECKF(rs_ == CT_OK, "%s", err.msg);
    REQUIRE(rs_ == CT_OK);
  }
  ct_data_stats st;
  ct_dataset_stats(ds, &st);
  CHECKF(st.kept == 5 && st.unpaired == 1, "kept %zu, unpaired %zu", st.kept, st.unpaired);
  int same = 0;
  for (int k = 0; k < 5; k++) {
    ct_batch *b = NULL;
    {
      ct_status rs_ = ct_dataset_next(ds, &b, &err);
      CHECKF(rs_ == CT_OK, "%s", err.msg);
      REQUIRE(rs_ == CT_OK);
    }
    CHECK(b->ref && b->rh == b->h && b->rw == b->w);
    const size_t n = (size_t)b->B * b->C * b->h * b->w;
    same += b->ref && !memcmp(b->ref, b->x0, n * sizeof(float));
  }
  CHECKF(same == 4, "%d of 5 references equal their targets", same);
  ct_dataset_free(ds);
  /* the references' cache: {output_dir}/cache/vae/refs */
  char p[1100];
  snprintf(p, sizeof p, "%s/strict/out/cache/vae/refs", ct_test_tmpdir());
  CHECK(ct_is_dir(p));
  /* a reference run needs conditioning_data on every image dataset */
  snprintf(body, sizeof body,
           "[{\"id\": \"edits\", \"type\": \"local\", \"instance_data_dir\": \"%s\", "
           "\"caption_strategy\": \"textfile\"}]",
           e);
  be = write_backend("plain.json", body);
  CHECK(ct_dataset_open(be, &o, &ds, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "dataset 'edits' has no conditioning_data"), "%s", err.msg);
  ct_config_free(&cfg);
}

/* reference_loose: the references placed by their own dataset's keys
 * (resolution 8): 8x8 references beside 16x16 targets, and 16x8 ones (2:1)
 * in their own bucket. */
CT_TEST(data_reference, loose_own_size) {
  char e[1024], r[1024], body[4096];
  snprintf(e, sizeof e, "%s/loose/edits", ct_test_tmpdir());
  snprintf(r, sizeof r, "%s/loose/refs", ct_test_tmpdir());
  write_set(e, 0, 4, 16, 16, 0, 1);
  write_set(r, 0, 2, 16, 16, 7, 0);
  write_set(r, 2, 2, 32, 16, 7, 0);
  snprintf(body, sizeof body,
           "[{\"id\": \"edits\", \"type\": \"local\", \"instance_data_dir\": \"%s\", "
           "\"caption_strategy\": \"textfile\", \"conditioning_data\": \"refs\"},"
           " {\"id\": \"refs\", \"type\": \"local\", \"instance_data_dir\": \"%s\", "
           "\"dataset_type\": \"conditioning\", \"conditioning_type\": \"reference_loose\", "
           "\"resolution\": 8}]",
           e, r);
  const char *be = write_backend("loose.json", body);
  ct_config cfg;
  cfg_for(&cfg, "loose/out");
  ct_data_opts o = {.cfg = &cfg, .codec_scale = 1, .size_multiple = 2, .reference = 1};
  ct_dataset *ds = NULL;
  ct_err err = {0};
  {
    ct_status rs_ = ct_dataset_open(be, &o, &ds, &err);
    CHECKF(rs_ == CT_OK, "%s", err.msg);
    REQUIRE(rs_ == CT_OK);
  }
  ct_data_stats st;
  ct_dataset_stats(ds, &st);
  CHECKF(st.kept == 4 && st.unpaired == 0 && st.buckets == 2, "kept %zu unpaired %zu buckets %zu",
         st.kept, st.unpaired, st.buckets);
  int seen8 = 0, seen16 = 0;
  for (int k = 0; k < 4; k++) {
    ct_batch *b = NULL;
    {
      ct_status rs_ = ct_dataset_next(ds, &b, &err);
      CHECKF(rs_ == CT_OK, "%s", err.msg);
      REQUIRE(rs_ == CT_OK);
    }
    CHECK(b->ref && b->h == 16 && b->w == 16 && b->rh == 8);
    seen8 += b->rw == 8, seen16 += b->rw == 16;
  }
  CHECKF(seen8 && seen16, "%d %d", seen8, seen16);
  ct_dataset_free(ds);
  /* SimpleTuner's bucket index keeps the images' own keys: one "1.0" of 4 */
  char p[1100], *idx = NULL;
  size_t n = 0;
  snprintf(p, sizeof p, "%s/aspect_ratio_bucket_indices_edits.json", e);
  CHECK(ct_read_file(p, 1 << 20, &idx, &n, &err) == CT_OK);
  const char *k = idx ? strstr(idx, "\"1.0\": [") : NULL;
  int commas = 0;
  for (const char *q = k; q && *q && *q != ']'; q++) commas += *q == ',';
  CHECKF(k && !strchr(idx, '|') && commas == 3, "%s", idx ? idx : "(none)");
  free(idx);
  ct_config_free(&cfg);
}
