/* multidatabackend.json as the config check reads it: SimpleTuner's
 * placeholders ({model_family}, {output_dir}, {id}) filled in string values,
 * every dataset's problems collected with their line and column (and the
 * ignored SimpleTuner keys as warnings instead of log lines), and the
 * image_embeds rules (cache_dir_vae says where in that dataset the latents
 * go). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/config.h"
#include "ctuner/data.h"
#include "harness.h"

static const char *TWO_ENTRIES =
    "[{\"id\": \"pics\", \"type\": \"local\", \"instance_data_dir\": \"data/{model_family}\",\n"
    "  \"cache_dir_vae\": \"{output_dir}/cache/vae/{model_family}/{id}\", \"text_embeds\": "
    "\"te\"},\n"
    " {\"id\": \"te\", \"type\": \"local\", \"dataset_type\": \"text_embeds\", \"default\": true,\n"
    "  \"cache_dir\": \"cache/text/{model_family}\"}]";

CT_TEST(config_backend, placeholders_filled_as_simpletuner) {
  ct_backend *b = NULL;
  ct_err err = {0};
  const ct_backend_vars vars = {"flux", "/runs/out", NULL, 0, NULL};
  REQUIRE(ct_backend_parse_with(TWO_ENTRIES, strlen(TWO_ENTRIES), "mdb.json", &vars, &b, NULL,
                                &err) == CT_OK);
  CHECKF(!strcmp(b->ds[0].instance_data_dir, "data/flux"), "%s", b->ds[0].instance_data_dir);
  CHECKF(!strcmp(b->ds[0].cache_dir_vae, "/runs/out/cache/vae/flux/pics"), "%s",
         b->ds[0].cache_dir_vae);
  CHECKF(!strcmp(b->ds[1].cache_dir, "cache/text/flux"), "%s", b->ds[1].cache_dir);
  ct_backend_free(b);
  /* the old entry point fills them with ctuner's defaults, never leaves "{model_family}" */
  REQUIRE(ct_backend_parse(TWO_ENTRIES, strlen(TWO_ENTRIES), "mdb.json", &b, &err) == CT_OK);
  CHECK(!strstr(b->ds[0].cache_dir_vae, "{"));
  ct_backend_free(b);
}

/* A dataset without resolution_type / minimum_image_size takes the run's, as
 * SimpleTuner's backend.get(key, args.key); the run's default is pixel_area. */
CT_TEST(config_backend, dataset_defaults_from_the_run) {
  const char *t =
      "[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"x\"},\n"
      " {\"id\": \"b\", \"type\": \"local\", \"instance_data_dir\": \"y\",\n"
      "  \"resolution_type\": \"area\", \"minimum_image_size\": 0.25}]";
  ct_backend *b = NULL;
  ct_err err = {0};
  REQUIRE(ct_backend_parse(t, strlen(t), "mdb.json", &b, &err) == CT_OK);
  CHECK(b->ds[0].resolution_type == CT_RES_PIXEL_AREA && b->ds[0].minimum_image_size == 0);
  CHECK(b->ds[1].resolution_type == CT_RES_AREA && b->ds[1].minimum_image_size == 0.25);
  ct_backend_free(b);
  const ct_backend_vars vars = {NULL, NULL, "pixel", 256, NULL};
  REQUIRE(ct_backend_parse_with(t, strlen(t), "mdb.json", &vars, &b, NULL, &err) == CT_OK);
  CHECK(b->ds[0].resolution_type == CT_RES_PIXEL && b->ds[0].minimum_image_size == 256);
  CHECK(b->ds[1].resolution_type == CT_RES_AREA && b->ds[1].minimum_image_size == 0.25);
  ct_backend_free(b);
}

CT_TEST(config_backend, every_dataset_problem_at_once) {
  const char *t =
      "[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"x\",\n"
      "  \"vae_cache_clear_each_epoch\": true, \"repeat\": 2, \"crops\": true},\n"
      " {\"id\": \"b\", \"type\": \"huggingface\", \"dataset_name\": \"u/d\"},\n"
      " {\"id\": \"c\", \"type\": \"local\", \"instance_data_dir\": \"y\",\n"
      "  \"conditioning_type\": \"controlnet\"},\n"
      " {\"id\": \"d\", \"type\": \"local\", \"instance_data_dir\": \"z\",\n"
      "  \"resolution_type\": \"megapixel\"}]";
  ct_backend *b = NULL;
  ct_err err = {0};
  ct_config_problems probs = {0};
  CHECK(ct_backend_parse_with(t, strlen(t), "m.json", NULL, &b, &probs, &err) != CT_OK);
  CHECK(b == NULL);
  const char *want[][2] = {
      {"m.json:2:33", "vae_cache_clear_each_epoch"}, /* a warning, not a log line */
      {"m.json:2:49", "unknown key 'repeat'"},
      {"m.json:2:61", "unknown key 'crops'"},
      {"m.json:3:22", "\"huggingface\" is not supported"},
      {"m.json:5:24", "conditioning datasets"},
      {"m.json:7:22", "megapixel"},
  };
  char w[700];
  CHECKF(probs.n == 6 && probs.errors == 5, "%zu problems, %zu errors", probs.n, probs.errors);
  for (size_t i = 0; i < probs.n && i < 6; i++)
    CHECKF(strstr(ct_config_problem_where(&probs.v[i], w, sizeof w), want[i][0]) &&
               strstr(probs.v[i].msg, want[i][1]),
           "%zu: %s: %s", i, w, probs.v[i].msg);
  CHECK(probs.v[0].warning == 1);
  /* err still holds the first error, for callers that stop at one */
  CHECKF(strstr(err.msg, "repeat"), "%s", err.msg);
  ct_config_problems_free(&probs);
}

CT_TEST(config_backend, image_embeds_rules) {
  /* an image dataset naming an image_embeds dataset needs cache_dir_vae: where in it */
  const char *t =
      "[{\"id\": \"pics\", \"type\": \"local\", \"instance_data_dir\": \"x\",\n"
      "  \"image_embeds\": \"lat\"},\n"
      " {\"id\": \"lat\", \"type\": \"local\", \"dataset_type\": \"image_embeds\",\n"
      "  \"cache_dir\": \"c\"}]";
  ct_backend *b = NULL;
  ct_err err = {0};
  CHECK(ct_backend_parse(t, strlen(t), "m.json", &b, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "cache_dir_vae") && strstr(err.msg, "image_embeds"), "%s", err.msg);
  /* with it: accepted; a local image dataset keeps the path, an S3 embeds dataset makes it a key */
  t = "[{\"id\": \"pics\", \"type\": \"local\", \"instance_data_dir\": \"x\",\n"
      "  \"image_embeds\": \"lat\", \"cache_dir_vae\": \"/vae/{id}/\"},\n"
      " {\"id\": \"lat\", \"type\": \"aws\", \"dataset_type\": \"image_embeds\",\n"
      "  \"aws_bucket_name\": \"b\", \"aws_endpoint_url\": \"http://127.0.0.1:1\",\n"
      "  \"aws_access_key_id\": \"k\", \"aws_secret_access_key\": \"s\"}]";
  CHECKF(ct_backend_parse(t, strlen(t), "m.json", &b, &err) == CT_OK, "%s", err.msg);
  if (b) CHECKF(!strcmp(b->ds[0].cache_dir_vae, "vae/pics"), "%s", b->ds[0].cache_dir_vae);
  ct_backend_free(b);
  /* an S3 image dataset with its latents in a local image_embeds dataset: refused by name */
  t = "[{\"id\": \"pics\", \"type\": \"aws\", \"aws_bucket_name\": \"b\",\n"
      "  \"aws_endpoint_url\": \"http://127.0.0.1:1\", \"aws_access_key_id\": \"k\",\n"
      "  \"aws_secret_access_key\": \"s\", \"image_embeds\": \"lat\", \"cache_dir_vae\": \"v\"},\n"
      " {\"id\": \"lat\", \"type\": \"local\", \"dataset_type\": \"image_embeds\", \"cache_dir\": "
      "\"c\"}]";
  CHECK(ct_backend_parse(t, strlen(t), "m.json", &b, &err) == CT_ERR_INVALID);
  CHECKF(strstr(err.msg, "not supported") && strstr(err.msg, "image_embeds"), "%s", err.msg);
}

/* Keys that change the data when set: refused then (with why), a warning
 * when off or moot (re-encoding each epoch without random crops changes
 * nothing); before, all were ignored with a warning. */
CT_TEST(config_backend, options_refused_when_set) {
  static const struct {
    const char *extra;
    int error;
  } cases[] = {
      {"\"vae_cache_clear_each_epoch\": true, \"crop\": true", 1},
      {"\"vae_cache_clear_each_epoch\": true, \"crop\": true, \"crop_style\": \"center\"", 0},
      {"\"vae_cache_clear_each_epoch\": true", 0},
      {"\"vae_cache_clear_each_epoch\": false, \"crop\": true", 0},
      {"\"prepend_instance_prompt\": true, \"instance_prompt\": \"x\"", 1},
      {"\"prepend_instance_prompt\": false", 0},
      {"\"only_instance_prompt\": true", 1},
      {"\"caption_filter_list\": \"filters.txt\"", 1},
      {"\"caption_filter_list\": \"\"", 0},
      {"\"conditioning_data\": \"canny\"", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char t[512];
    snprintf(t, sizeof t,
             "[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"x\", %s}]",
             cases[i].extra);
    ct_backend *b = NULL;
    ct_err err = {0};
    ct_config_problems probs = {0};
    ct_status st = ct_backend_parse_with(t, strlen(t), "m.json", NULL, &b, &probs, &err);
    CHECKF((st != CT_OK) == cases[i].error && probs.errors == (size_t)cases[i].error &&
               probs.n == 1 && probs.v[0].warning == !cases[i].error,
           "%s: st %d, %zu problems, %zu errors: %s", cases[i].extra, st, probs.n, probs.errors,
           probs.n ? probs.v[0].msg : "");
    ct_backend_free(b);
    ct_config_problems_free(&probs);
  }
}

/* issue 32: only_instance_prompt on a dataset already captioned by
 * instance_prompt changes nothing and is accepted without a word (SimpleTuner's
 * factory turns captions off for either); elsewhere it stays refused. */
CT_TEST(config_backend, only_instance_prompt_on_instanceprompt) {
  static const struct {
    const char *extra;
    int error;
  } cases[] = {
      {"\"caption_strategy\": \"instanceprompt\", \"instance_prompt\": \"sks dog\", "
       "\"only_instance_prompt\": true",
       0},
      {"\"caption_strategy\": \"textfile\", \"only_instance_prompt\": true", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char t[512];
    snprintf(t, sizeof t,
             "[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"x\", %s}]",
             cases[i].extra);
    ct_backend *b = NULL;
    ct_err err = {0};
    ct_config_problems probs = {0};
    ct_status st = ct_backend_parse_with(t, strlen(t), "m.json", NULL, &b, &probs, &err);
    CHECKF((st != CT_OK) == cases[i].error && probs.n == (size_t)cases[i].error, "%s: %d: %s",
           cases[i].extra, st, probs.n ? probs.v[0].msg : "");
    if (!cases[i].error)
      CHECK(b && b->n == 1 && b->ds[0].caption_strategy == CT_CAP_INSTANCEPROMPT &&
            !strcmp(b->ds[0].instance_prompt, "sks dog"));
    ct_backend_free(b);
    ct_config_problems_free(&probs);
  }
}

/* is_regularisation_data (either spelling) is read onto the dataset; under
 * model_type full it has no effect (as in SimpleTuner) and one warning says so. */
CT_TEST(config_backend, regularisation_data) {
  static const struct {
    const char *extra, *model_type;
    int flag, warnings;
  } cases[] = {
      {"\"is_regularisation_data\": true", "lora", 1, 0},
      {"\"is_regularization_data\": true", "lora", 1, 0},
      {"\"is_regularisation_data\": false", "lora", 0, 0},
      {"\"is_regularisation_data\": true", "full", 1, 1},
      {"\"is_regularisation_data\": true", NULL, 1, 0},
      {"\"caption_strategy\": \"filename\"", "lora", 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char t[512];
    snprintf(t, sizeof t,
             "[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"x\", %s}]",
             cases[i].extra);
    const ct_backend_vars vars = {"flux", "/o", NULL, 0, cases[i].model_type};
    ct_backend *b = NULL;
    ct_err err = {0};
    ct_config_problems probs = {0};
    ct_status st = ct_backend_parse_with(t, strlen(t), "m.json", &vars, &b, &probs, &err);
    CHECKF(st == CT_OK && b && b->ds[0].is_regularisation_data == cases[i].flag &&
               probs.n == (size_t)cases[i].warnings && probs.errors == 0,
           "%s (%s): st %d, %zu problems: %s", cases[i].extra,
           cases[i].model_type ? cases[i].model_type : "-", st, probs.n,
           probs.n ? probs.v[0].msg : "");
    if (cases[i].warnings && probs.n)
      CHECKF(strstr(probs.v[0].msg, "no effect with model_type full"), "%s", probs.v[0].msg);
    ct_backend_free(b);
    ct_config_problems_free(&probs);
  }
}
