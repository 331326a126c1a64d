/* Data loader tests: SimpleTuner's bucket arithmetic, multidatabackend.json
 * validation, the effective-batch check, the sampler (one bucket per step, no
 * repeats within an epoch, exact resume), and the cache files. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/config.h"
#include "ctuner/data.h"
#include "ctuner/fs.h"
#include "ctuner/image.h"
#include "data/data_int.h"
#include "data/discover.h"
#include "harness.h"

CT_TEST(data, round_and_keys) {
  CHECK(ct_round_half_even(2.5) == 2.0);
  CHECK(ct_round_half_even(3.5) == 4.0);
  CHECK(ct_round_half_even(-0.5) == 0.0 || ct_round_half_even(-0.5) == -0.0);
  CHECK(ct_round_half_even(19.6) == 20.0);
  char k[24];
  ct_bucket_key(1.0, 2, k, sizeof k);
  CHECK(!strcmp(k, "1.0"));
  ct_bucket_key(4.0 / 3.0, 2, k, sizeof k);
  CHECK(!strcmp(k, "1.33"));
  ct_bucket_key(0.75, 2, k, sizeof k);
  CHECK(!strcmp(k, "0.75"));
  ct_bucket_key(1.5, 2, k, sizeof k);
  CHECK(!strcmp(k, "1.5"));
  ct_bucket_key(1280.0 / 832.0, 2, k, sizeof k);
  CHECK(!strcmp(k, "1.54"));
}

static ct_ds_config ds_default(void) {
  ct_ds_config d;
  memset(&d, 0, sizeof d);
  d.id = "t";
  d.resolution_type = CT_RES_PIXEL;
  d.crop_aspect = CT_ASPECT_SQUARE;
  return d;
}

CT_TEST(data, bucket_arithmetic) {
  ct_err err = {0};
  ct_bucket_opts o;
  ct_img_geom g;
  /* pixel_area 1024 -> 1.048576 megapixels; a 1.5 image -> 1280 x 832 */
  ct_ds_config d = ds_default();
  d.resolution = 1024;
  d.resolution_type = CT_RES_PIXEL_AREA;
  REQUIRE(ct_bucket_opts_from(&d, 0, 64, 2, 0, &o, &err) == CT_OK);
  CHECK(o.resolution_type == CT_RES_AREA);
  CHECK_NEAR(o.resolution, 1.048576, 1e-12);
  REQUIRE(ct_bucket_place(&o, 1500, 1000, 1, &g, &err) == CT_OK);
  CHECK(g.target_w == 1280 && g.target_h == 832);
  CHECK_NEAR(g.aspect, 1.54, 1e-12);
  REQUIRE(ct_bucket_place(&o, 1000, 1000, 1, &g, &err) == CT_OK);
  CHECK(g.target_w == 1024 && g.target_h == 1024);
  /* pixel 512: short edge 512, long int(512 * ar) rounded to 64 */
  d = ds_default();
  d.resolution = 512;
  REQUIRE(ct_bucket_opts_from(&d, 0, 64, 2, 0, &o, &err) == CT_OK);
  REQUIRE(ct_bucket_place(&o, 768, 512, 1, &g, &err) == CT_OK);
  CHECK(g.target_w == 768 && g.target_h == 512);
  CHECK(g.inter_w == 768 && g.inter_h == 512 && g.crop_x == 0 &&
        g.crop_y == 0); /* no crop: resized */
  REQUIRE(ct_bucket_place(&o, 600, 800, 1, &g, &err) ==
          CT_OK); /* 0.75: 512 x int(682.67)=682 -> 704 */
  CHECK(g.target_w == 512 && g.target_h == 704);
  /* crop, square, centre: 768x512 -> 512x512 from the middle */
  d.crop = 1;
  d.crop_style = CT_CROP_CENTER;
  REQUIRE(ct_bucket_opts_from(&d, 0, 64, 2, 0, &o, &err) == CT_OK);
  REQUIRE(ct_bucket_place(&o, 1536, 1024, 1, &g, &err) == CT_OK);
  CHECK(g.target_w == 512 && g.target_h == 512);
  CHECK(g.inter_w == 768 && g.inter_h == 512);
  CHECK(g.crop_x == 128 && g.crop_y == 0);
  /* corner: bottom-right */
  d.crop_style = CT_CROP_CORNER;
  REQUIRE(ct_bucket_opts_from(&d, 0, 64, 2, 0, &o, &err) == CT_OK);
  REQUIRE(ct_bucket_place(&o, 512, 1024, 1, &g, &err) == CT_OK);
  CHECK(g.crop_x == 0 && g.crop_y == 512);
  /* random crops stay inside and depend on the image */
  d.crop_style = CT_CROP_RANDOM;
  REQUIRE(ct_bucket_opts_from(&d, 0, 64, 2, 7, &o, &err) == CT_OK);
  int differ = 0;
  for (uint64_t h = 0; h < 32; h++) {
    REQUIRE(ct_bucket_place(&o, 2000, 1000, h, &g, &err) == CT_OK);
    CHECK(g.crop_x >= 0 && g.crop_x + 512 <= g.inter_w && g.crop_y == 0);
    differ |= g.crop_x != 0;
  }
  CHECK(differ);
  /* closest of a list */
  static double aspects[] = {0.75, 1.0, 1.5};
  d.crop_aspect = CT_ASPECT_CLOSEST;
  d.crop_aspect_buckets = aspects;
  d.n_crop_aspect_buckets = 3;
  REQUIRE(ct_bucket_opts_from(&d, 0, 64, 2, 0, &o, &err) == CT_OK);
  REQUIRE(ct_bucket_place(&o, 1400, 1000, 1, &g, &err) == CT_OK);
  CHECK(g.target_w == 768 && g.target_h == 512);
  /* bad alignment and area given as pixels */
  CHECK(ct_bucket_opts_from(&d, 0, 48, 2, 0, &o, &err) == CT_ERR_INVALID);
  d = ds_default();
  d.resolution = 1024;
  d.resolution_type = CT_RES_AREA;
  CHECK(ct_bucket_opts_from(&d, 0, 64, 2, 0, &o, &err) == CT_ERR_INVALID);
  CHECK(strstr(err.msg, "pixel_area") != NULL);
}

static ct_status parse(const char *text, ct_backend **b, ct_err *err) {
  return ct_backend_parse(text, strlen(text), "mdb.json", b, err);
}

/* Each bad multidatabackend.json fails with a message holding want (and
 * never the text secret, when given). */
typedef struct {
  const char *json, *want;
} bad_case;
static void check_bad(const bad_case *bad, size_t n, const char *secret, int *ct_failed_) {
  for (size_t i = 0; i < n; i++) {
    ct_err e = {0};
    ct_backend *x = NULL;
    CHECKF(parse(bad[i].json, &x, &e) != CT_OK, "case %zu accepted", i);
    CHECKF(strstr(e.msg, bad[i].want) != NULL, "case %zu: got '%s', want '%s'", i, e.msg,
           bad[i].want);
    if (secret)
      CHECKF(strstr(e.msg, secret) == NULL, "case %zu: a secret in the message: '%s'", i, e.msg);
    CHECK(x == NULL);
  }
}

CT_TEST(data, backend_json) {
  ct_err err = {0};
  ct_backend *b = NULL;
  setenv("CT_TEST_DATA_DIR", "/data/x", 1);
  REQUIRE(parse("[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": "
                "\"{env:CT_TEST_DATA_DIR}/imgs\", "
                "\"crop\": true, \"crop_aspect\": \"random\", \"crop_aspect_buckets\": "
                "[{\"aspect\": 1.0, "
                "\"weight\": 0.25}, {\"aspect\": 1.5, \"weight\": 0.75}], \"repeats\": 3, "
                "\"resolution\": 512, "
                "\"resolution_type\": \"pixel\", \"crop_style\": \"centre\", \"caption_strategy\": "
                "\"textfile\"},"
                " {\"id\": \"te\", \"type\": \"local\", \"dataset_type\": \"text_embeds\", "
                "\"default\": true, "
                "\"cache_dir\": \"/tmp/te\"}]",
                &b, &err) == CT_OK);
  REQUIRE(b->n == 2);
  CHECK(!strcmp(b->ds[0].instance_data_dir, "/data/x/imgs"));
  CHECK(b->ds[0].crop && b->ds[0].crop_aspect == CT_ASPECT_RANDOM &&
        b->ds[0].n_crop_aspect_buckets == 2);
  CHECK(b->ds[0].crop_style == CT_CROP_CENTER && b->ds[0].repeats == 3 && b->ds[0].repeats_set);
  CHECK(b->ds[0].caption_strategy == CT_CAP_TEXTFILE);
  CHECK(b->ds[1].kind == CT_DS_TEXT_EMBEDS);
  ct_backend_free(b);
  bad_case bad[] = {
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"/x\", \"crop_styl\": "
       "\"random\"}]",
       "dataset 'a': unknown key 'crop_styl'; did you mean 'crop_style'?"},
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"/x\", \"repeats\": "
       "\"many\"}]",
       "dataset 'a': key 'repeats': expected a number"},
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"/x\", \"caption_strategy\": "
       "\"instanceprompt\"}]",
       "dataset 'a': key 'instance_prompt': is required"},
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"/x\"}, {\"id\": \"a\", "
       "\"type\": \"local\", "
       "\"instance_data_dir\": \"/y\"}]",
       "ids must be unique"},
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"/x\", \"crop_aspect\": "
       "\"closest\"}]",
       "needs a list of crop_aspect_buckets"},
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"/x\", "
       "\"crop_aspect_buckets\": [{\"aspect\": "
       "1.0, \"weight\": 0.5}]}]",
       "the weights sum to 0.5"},
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"/x\", \"resolution_type\": "
       "\"pixels\"}]",
       "\"pixels\" is not one of: pixel, area, pixel_area"},
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"/x\", \"text_embeds\": "
       "\"nope\"}]",
       "no enabled text_embeds dataset with id \"nope\""},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"instance_data_dir\": \"/x\"}]",
       "dataset 'a': key 'aws_bucket_name': is required with \"type\": \"aws\""},
      {"[{\"id\": \"a\", \"type\": \"s3\", \"instance_data_dir\": \"/x\"}]",
       "use \"local\" or \"aws\""},
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"{env:CT_TEST_UNSET_VAR}\"}]",
       "CT_TEST_UNSET_VAR"},
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"/x\", \"metadata_backend\": "
       "\"parquet\"}]",
       "needs a \"parquet\" block"},
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"/x\", \"parquet\": "
       "{\"pth\": \"m.parquet\"}}]",
       "unknown key 'pth'; did you mean 'path'?"},
      {"[{\"type\": \"local\"}]", "entry 0: key 'id'"},
      {"{\"id\": \"a\"}", "expected a JSON array"},
      {"[{\"id\": \"t\", \"type\": \"local\", \"dataset_type\": \"text_embeds\", \"cache_dir\": "
       "\"/c\"}]",
       "no enabled image dataset"},
  };
  check_bad(bad, sizeof bad / sizeof *bad, NULL, ct_failed_);
}

/* type "aws": SimpleTuner's aws_* keys, ctuner's three, their errors, and
 * secrets kept out of every message. */
CT_TEST(data, backend_aws) {
  ct_err err = {0};
  ct_backend *b = NULL;
  setenv("CT_TEST_S3_SECRET", "sEcReT-from-env-123", 1);
  REQUIRE(parse("[{\"id\": \"p\", \"type\": \"aws\", \"aws_bucket_name\": \"bkt\", "
                "\"aws_region_name\": \"us-east-1\", "
                "\"aws_endpoint_url\": \"http://127.0.0.1:9000\", \"aws_access_key_id\": \"AK\", "
                "\"aws_secret_access_key\": \"{env:CT_TEST_S3_SECRET}\", \"aws_data_prefix\": "
                "\"/data/set1/\", "
                "\"instance_data_dir\": \"./images/\", \"aws_addressing_style\": \"path\", "
                "\"aws_max_retries\": 3, "
                "\"aws_request_timeout\": 2.5, \"aws_max_pool_connections\": 16, "
                "\"cache_dir_vae\": \"cache/vae\"},"
                " {\"id\": \"te\", \"type\": \"aws\", \"dataset_type\": \"text_embeds\", "
                "\"aws_bucket_name\": \"bkt\"},"
                " {\"id\": \"l\", \"type\": \"local\", \"instance_data_dir\": \"/x\"}]",
                &b, &err) == CT_OK);
  REQUIRE(b->n == 3);
  const ct_ds_config *d = &b->ds[0];
  CHECK(d->is_aws && !strcmp(d->s3.bucket, "bkt") && !strcmp(d->s3.region, "us-east-1"));
  CHECK(!strcmp(d->s3.endpoint, "http://127.0.0.1:9000") && !strcmp(d->s3.access_key, "AK"));
  CHECK(!strcmp(d->s3.secret_key, "sEcReT-from-env-123") && d->s3.session_token == NULL);
  CHECK(!strcmp(d->s3.prefix, "data/set1") && !strcmp(ct_ds_image_dir(d), "images"));
  CHECK(!strcmp(d->cache_dir_vae, "cache/vae"));
  CHECK(d->s3.addressing == CT_S3_ADDR_PATH && d->s3.max_retries == 3 &&
        d->s3.request_timeout == 2.5);
  CHECK(d->s3.max_pool_connections == 16);
  /* defaults; a cache dataset needs no cache_dir on S3 */
  CHECK(b->ds[1].is_aws && b->ds[1].kind == CT_DS_TEXT_EMBEDS && !strcmp(b->ds[1].s3.prefix, ""));
  CHECK(b->ds[1].s3.max_pool_connections == 128 && b->ds[1].s3.max_retries == 6);
  CHECK(b->ds[1].s3.request_timeout == 60 && b->ds[1].s3.addressing == CT_S3_ADDR_AUTO);
  CHECK(!b->ds[2].is_aws && !strcmp(ct_ds_image_dir(&b->ds[2]), ""));
  ct_backend_free(b);
  /* an image dataset without instance_data_dir: the images are at the prefix */
  REQUIRE(parse("[{\"id\": \"p\", \"type\": \"aws\", \"aws_bucket_name\": \"bkt\"}]", &b, &err) ==
          CT_OK);
  CHECK(!strcmp(ct_ds_image_dir(&b->ds[0]), ""));
  ct_backend_free(b);
  bad_case bad[] = {
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_secret_access_key\": \"sEcReT-inline-456\"}]",
       "dataset 'a': key 'aws_bucket_name': is required"},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_bucket_name\": \"b\", \"aws_addressing_style\": "
       "\"vhost\", "
       "\"aws_secret_access_key\": \"sEcReT-inline-456\"}]",
       "key 'aws_addressing_style': \"vhost\" is not one of: auto, path, virtual"},
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"/x\", \"aws_bucket_name\": "
       "\"b\"}]",
       "dataset 'a': key 'aws_bucket_name': S3 settings need \"type\": \"aws\""},
      {"[{\"id\": \"a\", \"type\": \"local\", \"instance_data_dir\": \"/x\", "
       "\"aws_secret_access_key\": "
       "\"sEcReT-inline-456\"}]",
       "key 'aws_secret_access_key': S3 settings need \"type\": \"aws\""},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_bucket_name\": \"b\", "
       "\"aws_max_pool_connections\": 0}]",
       "key 'aws_max_pool_connections': 0 is out of range [1, 1024]"},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_bucket_name\": \"b\", "
       "\"aws_max_pool_connections\": 2000}]",
       "key 'aws_max_pool_connections': 2000 is out of range"},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_bucket_name\": \"b\", "
       "\"aws_max_pool_connections\": 1.5}]",
       "key 'aws_max_pool_connections': expected an integer"},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_bucket_name\": \"b\", \"aws_max_retries\": 21}]",
       "key 'aws_max_retries': 21 is out of range [0, 20]"},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_bucket_name\": \"b\", \"aws_request_timeout\": "
       "0}]",
       "key 'aws_request_timeout': must be more than 0 seconds"},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_bucket_name\": \"b\", \"aws_endpoint_url\": "
       "\"127.0.0.1:9000\"}]",
       "key 'aws_endpoint_url': \"127.0.0.1:9000\" must start with http:// or https://"},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_bucket_name\": \"b\", \"aws_data_prefix\": "
       "\"a/../b\"}]",
       "key 'aws_data_prefix': \"a/../b\" is not a usable S3 key prefix"},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_bucket_name\": \"b\", \"aws_secret_access_key\": "
       "\"sEcReT-{env:CT_TEST_UNSET_S3}\"}]",
       "key 'aws_secret_access_key': the environment variable CT_TEST_UNSET_S3 is not set"},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_bucket_name\": \"b\", \"aws_session_token\": "
       "\"sEcReT-{env:oops\"}]",
       "key 'aws_session_token': holds a bad {env:VAR} reference"},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_bucket_name\": \"b\", \"aws_secret_access_key\": "
       "7}]",
       "key 'aws_secret_access_key': expected a string"},
      {"[{\"id\": \"a\", \"type\": \"aws\", \"aws_bucket_name\": \"b\", \"aws_secret_acces_key\": "
       "\"sEcReT-x\"}]",
       "unknown key 'aws_secret_acces_key'; did you mean 'aws_secret_access_key'?"},
  };
  check_bad(bad, sizeof bad / sizeof *bad, "sEcReT", ct_failed_);
  /* the storage of a local dataset is its directory; an S3 one's errors never show the secret */
  REQUIRE(
      parse("[{\"id\": \"l\", \"type\": \"local\", \"instance_data_dir\": \"/tmp/ct-aws-test\"},"
            " {\"id\": \"s\", \"type\": \"aws\", \"aws_bucket_name\": \"bkt\", "
            "\"aws_access_key_id\": \"AK\", "
            "\"aws_secret_access_key\": \"sEcReT-open-789\", \"aws_endpoint_url\": "
            "\"http://127.0.0.1:1\", "
            "\"aws_max_retries\": 0, \"aws_request_timeout\": 1}]",
            &b, &err) == CT_OK);
  ct_storage *st = NULL;
  REQUIRE(ct_ds_open_storage(&b->ds[0], &st, &err) == CT_OK);
  CHECK(!ct_storage_is_remote(st) && !strcmp(ct_storage_describe(st), "/tmp/ct-aws-test"));
  ct_storage_free(st);
  st = NULL;
  ct_err e = {0};
  ct_status os = ct_ds_open_storage(&b->ds[1], &st, &e);
  if (os ==
      CT_OK) { /* the S3 backend is built: a request to a closed port fails, naming no secret */
    CHECK(ct_storage_is_remote(st));
    CHECK(strstr(ct_storage_describe(st), "sEcReT") == NULL);
    uint64_t sz;
    CHECK(ct_storage_head(st, "x", &sz, &e) != CT_OK);
    ct_storage_free(st);
  }
  CHECKF(strstr(e.msg, "sEcReT") == NULL, "a secret in the message: '%s'", e.msg);
  ct_backend_free(b);
}

CT_TEST(data, cache_files) {
  ct_err err = {0};
  float v[24], back[24];
  for (int i = 0; i < 24; i++) v[i] = (float)i * 0.25f - 1.0f;
  ct_cache_tensor t = {"latent", 3, {2, 3, 4, 0}, v};
  const char *meta[4] = {"codec", "pixel:1", "target_size", "8x12"};
  const ct_cache_comp comps[3] = {CT_CACHE_RAW, CT_CACHE_GZIP, CT_CACHE_ZSTD};
  const unsigned char magic[3][2] = {{0, 0}, {0x1f, 0x8b}, {0x28, 0xb5}};
  for (int c = 0; c < 3; c++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/cache-%d.st", ct_test_tmpdir(), c);
    REQUIRE(ct_cache_write(path, comps[c], &t, 1, meta, 2, &err) == CT_OK);
    char *raw = NULL;
    size_t n = 0;
    REQUIRE(ct_read_file(path, 1 << 20, &raw, &n, &err) == CT_OK);
    if (c) CHECK((unsigned char)raw[0] == magic[c][0] && (unsigned char)raw[1] == magic[c][1]);
    float *outs[1] = {back};
    memset(back, 0, sizeof back);
    CHECK(ct_cache_read(path, &t, outs, 1, meta, 2, &err) == CT_OK);
    CHECK(!memcmp(v, back, sizeof v));
    /* a different target size is a mismatch, not a silent reuse */
    const char *other[4] = {"codec", "pixel:1", "target_size", "16x12"};
    CHECK(ct_cache_read(path, &t, outs, 1, other, 2, &err) == CT_ERR_FORMAT);
    /* a flipped byte in the data (the last one): a mismatch, even uncompressed */
    raw[n - 1] ^= 0x40;
    REQUIRE(ct_write_file_atomic(path, raw, n, &err) == CT_OK);
    CHECK(ct_cache_read(path, &t, outs, 1, meta, 2, &err) == CT_ERR_FORMAT);
    raw[n - 1] ^= 0x40;
    /* truncated: an error, never a crash */
    REQUIRE(ct_write_file_atomic(path, raw, n / 2, &err) == CT_OK);
    CHECK(ct_cache_read(path, &t, outs, 1, meta, 2, &err) == CT_ERR_FORMAT);
    free(raw);
  }
  char missing[1024];
  snprintf(missing, sizeof missing, "%s/nope.st", ct_test_tmpdir());
  float *outs[1] = {back};
  CHECK(ct_cache_read(missing, &t, outs, 1, meta, 2, &err) == CT_ERR_NOT_FOUND);
  char hex[65];
  ct_sha256_hex("abc", 3, hex);
  CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
  char md5[33];
  ct_md5_hex("", 0, md5);
  CHECK(!strcmp(md5, "d41d8cd98f00b204e9800998ecf8427e"));
}

/* A small dataset on disk: n images per size in sizes[], captions "c<i>". */
static void write_images(const char *dir, const int (*sizes)[2], int nsizes, int per) {
  ct_err err = {0};
  ct_mkdir_p(dir, &err);
  int k = 0;
  for (int s = 0; s < nsizes; s++)
    for (int i = 0; i < per; i++, k++) {
      ct_image img = {0};
      if (ct_image_alloc(sizes[s][0], sizes[s][1], &img, &err)) return;
      for (int p = 0; p < img.w * img.h * 3; p++) img.px[p] = (uint8_t)(p * 7 + k * 13);
      char path[2100];
      snprintf(path, sizeof path, "%s/img%04d.png", dir, k);
      ct_image_save_png(path, &img, &err);
      ct_image_free(&img);
      snprintf(path, sizeof path, "%s/img%04d.txt", dir, k);
      FILE *f = fopen(path, "w");
      if (f) {
        fprintf(f, "c%d\n", k);
        fclose(f);
      }
    }
}

static const char *write_backend(const char *name, const char *body) {
  static char path[1024];
  snprintf(path, sizeof path, "%s/%s", ct_test_tmpdir(), name);
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(body, f);
    fclose(f);
  }
  return path;
}

static void cfg_for(ct_config *cfg, long batch, long accum) {
  ct_config_defaults(cfg);
  cfg->resolution = 16;
  cfg->aspect_bucket_alignment = 8;
  cfg->train_batch_size = batch;
  cfg->gradient_accumulation_steps = accum;
  cfg->seed = 3;
  cfg->caption_dropout_probability = 0;
  free(cfg->output_dir);
  char od[1024];
  snprintf(od, sizeof od, "%s/out", ct_test_tmpdir());
  cfg->output_dir = strdup(od);
  /* the bucket counts below are pixel's (shorter edge); the run's default is
   * SimpleTuner's pixel_area */
  free(cfg->resolution_type);
  cfg->resolution_type = strdup("pixel");
}

CT_TEST(data, sampler_buckets_epochs_resume) {
  static const int sizes[3][2] = {{16, 16}, {24, 16}, {16, 24}};
  char dir[1024], body[4096];
  snprintf(dir, sizeof dir, "%s/imgs", ct_test_tmpdir());
  write_images(dir, sizes, 3, 10); /* 30 images: buckets 1.0, 1.5, 0.67 of 10 each */
  snprintf(
      body, sizeof body,
      "[{\"id\": \"s\", \"type\": \"local\", \"instance_data_dir\": \"%s\", \"caption_strategy\": "
      "\"textfile\", \"repeats\": 1}]",
      dir);
  const char *be = write_backend("sampler.json", body);
  ct_config cfg;
  cfg_for(&cfg, 2, 2); /* E = 4: each bucket 20 entries -> 5 steps; 15 steps per epoch */
  ct_err err = {0};
  for (int prefetch = 0; prefetch <= 3; prefetch += 3) {
    ct_data_opts o = {.cfg = &cfg,
                      .comm = NULL,
                      .codec_scale = 1,
                      .size_multiple = 2,
                      .text = NULL,
                      .prefetch = prefetch};
    ct_dataset *ds = NULL;
    REQUIRE(ct_dataset_open(be, &o, &ds, &err) == CT_OK);
    ct_data_stats st;
    ct_dataset_stats(ds, &st);
    CHECK(st.kept == 30 && st.buckets == 3 && st.samples == 60);
    CHECK(ct_dataset_steps_per_epoch(ds) == 15);
    /* two epochs: every step one shape; every caption exactly twice per epoch (repeats 1) */
    char *mid = NULL;
    int counts[2][30];
    memset(counts, 0, sizeof counts);
    uint64_t next_id = 0;
    for (int step = 0; step < 30; step++) {
      int h = -1, w = -1;
      for (int m = 0; m < 2; m++) {
        ct_batch *b = NULL;
        REQUIRE(ct_dataset_next(ds, &b, &err) == CT_OK);
        if (m == 0) h = b->h, w = b->w;
        CHECK(b->h == h && b->w == w && b->B == 2);
        for (int i = 0; i < 2; i++) {
          CHECK(b->ids[i] == next_id);
          next_id++;
          int k = atoi(b->caps[i] + 1);
          REQUIRE(k >= 0 && k < 30);
          counts[step / 15][k]++;
          /* the latent matches the bucket: an image of this shape */
          int ih = k < 10 ? 16 : k < 20 ? 16 : 24, iw = k < 10 ? 16 : k < 20 ? 24 : 16;
          CHECK(ih == b->h && iw == b->w);
        }
      }
      CHECK(ct_dataset_epoch(ds) == step / 15);
      if (step == 19) mid = ct_dataset_state_json(ds);
    }
    for (int e = 0; e < 2; e++)
      for (int k = 0; k < 30; k++)
        CHECKF(counts[e][k] == 2, "epoch %d image %d seen %d times", e, k, counts[e][k]);
    /* continue from step 20 in a fresh dataset: the same batches as the original continued */
    ct_batch *b = NULL;
    uint64_t oid[8];
    for (int m = 0; m < 4; m++) { /* the original run continued into epoch 3 */
      REQUIRE(ct_dataset_next(ds, &b, &err) == CT_OK);
      for (int i = 0; i < 2; i++) oid[2 * m + i] = b->ids[i];
    }
    ct_dataset_free(ds);
    /* restore the position after step 19 and replay steps 20..29 */
    ct_dataset *ds2 = NULL;
    REQUIRE(ct_dataset_open(be, &o, &ds2, &err) == CT_OK);
    REQUIRE(mid != NULL);
    REQUIRE(ct_dataset_state_restore(ds2, mid, &err) == CT_OK);
    CHECK(ct_dataset_samples_seen(ds2) == 80);
    for (int step = 20; step < 30; step++)
      for (int m = 0; m < 2; m++) {
        REQUIRE(ct_dataset_next(ds2, &b, &err) == CT_OK);
        CHECK(b->ids[0] == (uint64_t)(step * 4 + m * 2));
      }
    for (int m = 0; m < 4; m++) {
      REQUIRE(ct_dataset_next(ds2, &b, &err) == CT_OK);
      for (int i = 0; i < 2; i++) CHECK(b->ids[i] == oid[2 * m + i]);
    }
    free(mid);
    ct_dataset_free(ds2);
  }
  ct_config_free(&cfg);
}

CT_TEST(data, effective_batch_message_and_oversubscription) {
  static const int sizes[2][2] = {{16, 16}, {24, 16}};
  char dir[1024], body[4096];
  snprintf(dir, sizeof dir, "%s/small", ct_test_tmpdir());
  write_images(dir, sizes, 2, 5); /* 5 + 5 images */
  ct_config cfg;
  cfg_for(&cfg, 4, 2); /* E = 8 */
  ct_err err = {0};
  ct_data_opts o = {
      .cfg = &cfg, .comm = NULL, .codec_scale = 1, .size_multiple = 2, .text = NULL, .prefetch = 0};
  ct_dataset *ds = NULL;
  snprintf(body, sizeof body,
           "[{\"id\": \"tiny\", \"type\": \"local\", \"instance_data_dir\": \"%s\", "
           "\"caption_strategy\": "
           "\"textfile\"}]",
           dir);
  const char *be = write_backend("small.json", body);
  CHECK(ct_dataset_open(be, &o, &ds, &err) == CT_ERR_INVALID);
  const char *want[] = {
      "Dataset 'tiny' cannot fill the effective batch size",
      "Total samples: 10 image(s) in 2 bucket(s); repeats: 0",
      "= effective batch 8",
      "Bucket 1.0: 5 samples x (0+1) = 5 samples; need at least 8; minimum repeats: 1",
      "Bucket 1.5: 5 samples",
      "Set --allow_dataset_oversubscription=true"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    CHECKF(strstr(err.msg, want[i]), "missing '%s' in:\n%s", want[i], err.msg);
  cfg.allow_dataset_oversubscription = 1;
  REQUIRE(ct_dataset_open(be, &o, &ds, &err) == CT_OK);
  CHECK(ct_dataset_count(ds) == 20);
  CHECK(ct_dataset_steps_per_epoch(ds) == 2);
  ct_dataset_free(ds);
  /* repeats set by hand: oversubscription leaves it and the message says so */
  snprintf(body, sizeof body,
           "[{\"id\": \"hand\", \"type\": \"local\", \"instance_data_dir\": \"%s\", "
           "\"caption_strategy\": "
           "\"textfile\", \"repeats\": 1}]",
           dir);
  be = write_backend("hand.json", body);
  cfg.gradient_accumulation_steps = 4; /* E = 16 > 5 x 2 */
  CHECK(ct_dataset_open(be, &o, &ds, &err) == CT_ERR_INVALID);
  cfg.gradient_accumulation_steps = 2;
  CHECK(strstr(err.msg, "repeats is set by hand (1) on dataset 'hand'") != NULL);
  /* pruning: one bucket big enough, the other is dropped */
  static const int sizes2[2][2] = {{16, 16}, {24, 16}};
  char dir2[1024];
  snprintf(dir2, sizeof dir2, "%s/uneven", ct_test_tmpdir());
  write_images(dir2, sizes2, 1, 8); /* 8 square */
  cfg.allow_dataset_oversubscription = 0;
  snprintf(
      body, sizeof body,
      "[{\"id\": \"u\", \"type\": \"local\", \"instance_data_dir\": \"%s\", \"caption_strategy\": "
      "\"textfile\"},"
      " {\"id\": \"v\", \"type\": \"local\", \"instance_data_dir\": \"%s\", \"caption_strategy\": "
      "\"textfile\", \"repeats\": 2}]",
      dir2, dir);
  be = write_backend("prune.json", body);
  REQUIRE(ct_dataset_open(be, &o, &ds, &err) == CT_OK); /* v: 5 x 3 = 15 per bucket >= 8 */
  ct_data_stats st;
  ct_dataset_stats(ds, &st);
  CHECK(st.buckets == 3 && st.buckets_pruned == 0);
  ct_dataset_free(ds);
  ct_config_free(&cfg);
}

CT_TEST(data, bad_images_counted) {
  static const int sizes[1][2] = {{16, 16}};
  char dir[1024], body[4096], p[1100];
  snprintf(dir, sizeof dir, "%s/bad", ct_test_tmpdir());
  write_images(dir, sizes, 1, 6);
  ct_err err = {0};
  /* an empty file, garbage with a .png name, a truncated PNG, an image without caption */
  snprintf(p, sizeof p, "%s/empty.png", dir);
  ct_write_file_atomic(p, "", 0, &err);
  snprintf(p, sizeof p, "%s/empty.txt", dir);
  ct_write_file_atomic(p, "x", 1, &err);
  snprintf(p, sizeof p, "%s/garbage.png", dir);
  ct_write_file_atomic(p, "not an image at all", 19, &err);
  snprintf(p, sizeof p, "%s/garbage.txt", dir);
  ct_write_file_atomic(p, "x", 1, &err);
  char *png = NULL;
  size_t n = 0;
  snprintf(p, sizeof p, "%s/img0000.png", dir);
  REQUIRE(ct_read_file(p, 1 << 20, &png, &n, &err) == CT_OK);
  snprintf(p, sizeof p, "%s/trunc.png", dir);
  ct_write_file_atomic(p, png, n - 20, &err); /* header fine, pixels cut */
  snprintf(p, sizeof p, "%s/trunc.txt", dir);
  ct_write_file_atomic(p, "t", 1, &err);
  snprintf(p, sizeof p, "%s/nocap.png", dir);
  ct_write_file_atomic(p, png, n, &err);
  free(png);
  snprintf(
      body, sizeof body,
      "[{\"id\": \"b\", \"type\": \"local\", \"instance_data_dir\": \"%s\", \"caption_strategy\": "
      "\"textfile\"}]",
      dir);
  const char *be = write_backend("bad.json", body);
  ct_config cfg;
  cfg_for(&cfg, 2, 1);
  ct_data_opts o = {
      .cfg = &cfg, .comm = NULL, .codec_scale = 1, .size_multiple = 2, .text = NULL, .prefetch = 2};
  ct_dataset *ds = NULL;
  REQUIRE(ct_dataset_open(be, &o, &ds, &err) == CT_OK);
  ct_data_stats st;
  ct_dataset_stats(ds, &st);
  CHECK(st.total_processed == 10);
  CHECKF(st.unreadable == 3, "unreadable %zu",
         st.unreadable); /* empty, garbage (headers), trunc (decode) */
  CHECK(st.no_caption == 1);
  CHECK(st.kept == 6);
  ct_batch *b = NULL;
  CHECK(ct_dataset_next(ds, &b, &err) == CT_OK);
  ct_dataset_free(ds);
  /* the index files SimpleTuner writes */
  snprintf(p, sizeof p, "%s/aspect_ratio_bucket_indices_b.json", dir);
  struct stat sb;
  CHECK(stat(p, &sb) == 0);
  snprintf(p, sizeof p, "%s/aspect_ratio_bucket_metadata_b.json", dir);
  CHECK(stat(p, &sb) == 0);
  ct_config_free(&cfg);
}

/* A stand-in text encoder: values are a function of the caption, and calls are counted. */
typedef struct stub_enc {
  int calls, captions;
} stub_enc;

static float stub_val(const char *cap, int k) {
  unsigned h = 2166136261u;
  for (const char *p = cap; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
  return (float)((h + (unsigned)k * 2654435761u) % 1000u) / 1000.0f;
}

static ct_status stub_encode(void *ctx, const char *const *caps, int n, float *seq, float *pooled,
                             ct_err *err) {
  stub_enc *s = ctx;
  (void)err;
  s->calls++;
  s->captions += n;
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < 4 * 3; k++) seq[i * 12 + k] = stub_val(caps[i], k);
    for (int k = 0; k < 5; k++) pooled[i * 5 + k] = stub_val(caps[i], 100 + k);
  }
  return CT_OK;
}

CT_TEST(data, text_cache) {
  static const int sizes[2][2] = {{16, 16}, {24, 16}};
  char dir[1024], body[4096];
  snprintf(dir, sizeof dir, "%s/text", ct_test_tmpdir());
  write_images(dir, sizes, 2, 6);
  char tdir[1024];
  snprintf(tdir, sizeof tdir, "%s/textcache", ct_test_tmpdir());
  snprintf(body, sizeof body,
           "[{\"id\": \"i\", \"type\": \"local\", \"instance_data_dir\": \"%s\", "
           "\"caption_strategy\": \"textfile\", "
           "\"text_embeds\": \"te\"}, {\"id\": \"te\", \"type\": \"local\", \"dataset_type\": "
           "\"text_embeds\", "
           "\"cache_dir\": \"%s\", \"write_batch_size\": 5}]",
           dir, tdir);
  const char *be = write_backend("text.json", body);
  ct_config cfg;
  cfg_for(&cfg, 2, 1);
  cfg.caption_dropout_probability = 0.3;
  cfg.compress_disk_cache = 1;
  free(cfg.disk_cache_compression);
  cfg.disk_cache_compression = strdup("zstd");
  stub_enc se = {0, 0};
  ct_text_encoder_fn te = {
      .ctx = &se, .T = 4, .d = 3, .dp = 5, .tag = "stub1", .encode = stub_encode};
  ct_data_opts o = {
      .cfg = &cfg, .comm = NULL, .codec_scale = 1, .size_multiple = 2, .text = &te, .prefetch = 2};
  ct_err err = {0};
  ct_dataset *ds = NULL;
  REQUIRE(ct_dataset_open(be, &o, &ds, &err) == CT_OK);
  CHECK(se.captions == 13); /* 12 captions + the empty one, in batches of 5 */
  CHECK(se.calls == 3);
  int empty = 0;
  for (int step = 0; step < 12; step++) {
    ct_batch *b = NULL;
    REQUIRE(ct_dataset_next(ds, &b, &err) == CT_OK);
    REQUIRE(b->txt && b->pooled);
    for (int i = 0; i < b->B; i++) {
      empty += !b->caps[i][0];
      for (int k = 0; k < 12; k++) CHECK(b->txt[i * 12 + k] == stub_val(b->caps[i], k));
      for (int k = 0; k < 5; k++) CHECK(b->pooled[i * 5 + k] == stub_val(b->caps[i], 100 + k));
    }
  }
  CHECK(empty > 0); /* dropout reads the empty caption's entry */
  CHECK(se.captions == 13);
  ct_dataset_free(ds);
  /* a second run encodes nothing; a corrupt entry is rebuilt with the right values */
  char p[1200];
  snprintf(p, sizeof p, "%s/img0000.txt", dir);
  char md5[33];
  ct_md5_hex("c0", 2, md5);
  snprintf(p, sizeof p, "%s/%s-stub1.st", tdir, md5);
  REQUIRE(ct_write_file_atomic(p, "\x28\xb5\x2f\xfd garbage", 12, &err) == CT_OK);
  se.calls = se.captions = 0;
  REQUIRE(ct_dataset_open(be, &o, &ds, &err) == CT_OK);
  CHECK(se.calls == 1 && se.captions == 5); /* only the corrupt entry's group of write_batch_size */
  for (int step = 0; step < 12; step++) {
    ct_batch *b = NULL;
    REQUIRE(ct_dataset_next(ds, &b, &err) == CT_OK);
    for (int i = 0; i < b->B; i++)
      for (int k = 0; k < 12; k++) CHECK(b->txt[i * 12 + k] == stub_val(b->caps[i], k));
  }
  ct_dataset_free(ds);
  /* another encoder (tag) never reads these entries */
  snprintf(te.tag, sizeof te.tag, "stub2");
  se.calls = se.captions = 0;
  REQUIRE(ct_dataset_open(be, &o, &ds, &err) == CT_OK);
  CHECK(se.captions == 13);
  ct_dataset_free(ds);
  ct_config_free(&cfg);
}

/* Keys of a file list, or -1 if it is missing or not an object. */
static long list_keys(const char *outdir, const char *kind, const char *id, ct_keyset *ks) {
  char p[1200];
  snprintf(p, sizeof p, "%s/all_%s_files_%s.json", outdir, kind, id);
  memset(ks, 0, sizeof *ks);
  return ct_keyset_load(p, ks) ? (long)ks->n : -1;
}

CT_TEST(data, file_lists) {
  static const int sizes[1][2] = {{16, 16}};
  char dir[1024], tdir[1024], body[4096];
  snprintf(dir, sizeof dir, "%s/lists", ct_test_tmpdir());
  snprintf(tdir, sizeof tdir, "%s/lists_text", ct_test_tmpdir());
  write_images(dir, sizes, 1, 6);
  ct_config cfg;
  cfg_for(&cfg, 2, 1);
  free(cfg.output_dir);
  char od[1100];
  snprintf(od, sizeof od, "%s/lists_out", ct_test_tmpdir());
  cfg.output_dir = strdup(od);
  ct_err err = {0};
  /* a stale list from an earlier run is replaced when preserve is off */
  REQUIRE(ct_mkdir_p(od, &err) == CT_OK);
  char p[1300];
  snprintf(p, sizeof p, "%s/all_image_files_l.json", od);
  REQUIRE(ct_write_file_atomic(p, "{\"/elsewhere/x.png\": false}", 27, &err) == CT_OK);
  for (int preserve = 0; preserve < 2; preserve++) {
    snprintf(body, sizeof body,
             "[{\"id\": \"l\", \"type\": \"local\", \"instance_data_dir\": \"%s\", "
             "\"caption_strategy\": "
             "\"textfile\", \"text_embeds\": \"te\", \"preserve_data_backend_cache\": %s}, "
             "{\"id\": \"te\", "
             "\"type\": \"local\", \"dataset_type\": \"text_embeds\", \"cache_dir\": \"%s\", "
             "\"write_batch_size\": 4}]",
             dir, preserve ? "true" : "false", tdir);
    const char *be = write_backend(preserve ? "lists1.json" : "lists0.json", body);
    stub_enc se = {0, 0};
    ct_text_encoder_fn te = {
        .ctx = &se, .T = 4, .d = 3, .dp = 5, .tag = "stub1", .encode = stub_encode};
    ct_data_opts o = {.cfg = &cfg,
                      .comm = NULL,
                      .codec_scale = 1,
                      .size_multiple = 2,
                      .text = &te,
                      .prefetch = 1};
    ct_dataset *ds = NULL;
    REQUIRE(ct_dataset_open(be, &o, &ds, &err) == CT_OK);
    ct_data_stats st;
    ct_dataset_stats(ds, &st);
    if (!preserve) {
      CHECK(st.kept == 6);
      CHECK(se.captions == 7); /* 6 captions and "" */
      ct_keyset ks;
      CHECK(list_keys(od, "image", "l", &ks) == 6);
      for (size_t i = 0; i < ks.n; i++) {
        char want[1200];
        snprintf(want, sizeof want, "%s/img%04zu.png", dir, i);
        CHECK(!strcmp(ct_keyset_key(&ks, i), want));
        CHECK(ct_keyset_find(&ks, want)->type == CT_JSON_BOOL);
      }
      ct_keyset_free(&ks);
      CHECK(list_keys(od, "vae_cache", "l", &ks) == 6);
      struct stat sb;
      for (size_t i = 0; i < ks.n; i++) CHECK(stat(ct_keyset_key(&ks, i), &sb) == 0);
      ct_keyset_free(&ks);
      CHECK(list_keys(od, "text_cache", "te", &ks) == 7);
      for (size_t i = 0; i < ks.n; i++) CHECK(stat(ct_keyset_key(&ks, i), &sb) == 0);
      ct_keyset_free(&ks);
    } else {
      /* the preserved list, not the directory: the 7th image is not seen; the
       * corrupt (listed) text entry is not read back before training */
      CHECK(st.kept == 6);
      CHECK(se.calls == 0);
    }
    /* every batch has the right embeddings, the corrupt entry included */
    for (int step = 0; step < 6; step++) {
      ct_batch *b = NULL;
      REQUIRE(ct_dataset_next(ds, &b, &err) == CT_OK);
      for (int i = 0; i < b->B; i++)
        for (int k = 0; k < 12; k++) CHECK(b->txt[i * 12 + k] == stub_val(b->caps[i], k));
    }
    if (preserve)
      CHECK(se.calls == 1 && se.captions == 1); /* the corrupt entry, rebuilt by its batch */
    ct_dataset_free(ds);
    if (!preserve) { /* a new image and a corrupt text cache entry before the preserved run */
      static const int one[1][2] = {{16, 16}};
      char more[1100];
      snprintf(more, sizeof more, "%s/more", dir);
      write_images(more, one, 1, 1);
      char md5[33];
      ct_md5_hex("c0", 2, md5);
      snprintf(p, sizeof p, "%s/%s-stub1.st", tdir, md5);
      REQUIRE(ct_write_file_atomic(p, "garbage", 7, &err) == CT_OK);
    }
  }
  /* preserve off again: the walk finds 7 images; every entry is valid (the new
   * image's caption "c0" has one) */
  snprintf(
      body, sizeof body,
      "[{\"id\": \"l\", \"type\": \"local\", \"instance_data_dir\": \"%s\", \"caption_strategy\": "
      "\"textfile\", \"text_embeds\": \"te\"}, {\"id\": \"te\", \"type\": \"local\", "
      "\"dataset_type\": "
      "\"text_embeds\", \"cache_dir\": \"%s\", \"write_batch_size\": 4}]",
      dir, tdir);
  const char *be = write_backend("lists2.json", body);
  stub_enc se = {0, 0};
  ct_text_encoder_fn te = {
      .ctx = &se, .T = 4, .d = 3, .dp = 5, .tag = "stub1", .encode = stub_encode};
  ct_data_opts o = {
      .cfg = &cfg, .comm = NULL, .codec_scale = 1, .size_multiple = 2, .text = &te, .prefetch = 1};
  ct_dataset *ds = NULL;
  REQUIRE(ct_dataset_open(be, &o, &ds, &err) == CT_OK);
  ct_data_stats st;
  ct_dataset_stats(ds, &st);
  CHECK(st.kept == 7);
  CHECK(se.calls == 0);
  ct_keyset ks;
  CHECK(list_keys(od, "image", "l", &ks) == 7);
  ct_keyset_free(&ks);
  ct_dataset_free(ds);
  ct_config_free(&cfg);
}

/* The generic storage path of discovery (what S3 datasets take: a listing,
 * get_many of header ranges and captions, a re-fetch when a header goes past
 * 64 KiB) finds exactly what the local fast path finds. */
CT_TEST(data, discovery_generic_path) {
  static const int sizes[2][2] = {{16, 16}, {24, 16}};
  char dir[1024], p[1200];
  ct_err err = {0};
  snprintf(dir, sizeof dir, "%s/generic", ct_test_tmpdir());
  write_images(dir, sizes, 2, 6);
  snprintf(p, sizeof p, "%s/garbage.png", dir);
  ct_write_file_atomic(p, "not an image at all", 19, &err);
  snprintf(p, sizeof p, "%s/garbage.txt", dir);
  ct_write_file_atomic(p, "x", 1, &err);
  snprintf(p, sizeof p, "%s/.hidden/h.png", dir);
  ct_write_file_atomic(p, "x", 1, &err); /* the write fails: no directory; fine either way */
  /* a JPEG whose frame header sits past 128 KiB of APP2 segments */
  ct_image img = {0};
  REQUIRE(ct_image_alloc(40, 24, &img, &err) == CT_OK);
  memset(img.px, 90, (size_t)40 * 24 * 3);
  snprintf(p, sizeof p, "%s/small.jpg", ct_test_tmpdir());
  REQUIRE(ct_image_save_jpeg(p, &img, 90, &err) == CT_OK);
  ct_image_free(&img);
  char *jpg = NULL;
  size_t n = 0;
  REQUIRE(ct_read_file(p, 1 << 20, &jpg, &n, &err) == CT_OK);
  const size_t seg = 65535 + 2, big = n + 2 * seg;
  unsigned char *b = malloc(big);
  REQUIRE(b != NULL);
  memcpy(b, jpg, 2);
  for (int k = 0; k < 2; k++) {
    unsigned char *s = b + 2 + (size_t)k * seg;
    s[0] = 0xff, s[1] = 0xe2, s[2] = 0xff, s[3] = 0xff;
    memset(s + 4, 'x', seg - 4);
  }
  memcpy(b + 2 + 2 * seg, jpg + 2, n - 2);
  free(jpg);
  snprintf(p, sizeof p, "%s/sub/bigapp.jpg", dir);
  char sub[1100];
  snprintf(sub, sizeof sub, "%s/sub", dir);
  REQUIRE(ct_mkdir_p(sub, &err) == CT_OK);
  REQUIRE(ct_write_file_atomic(p, b, big, &err) == CT_OK);
  free(b);
  snprintf(p, sizeof p, "%s/sub/bigapp.txt", dir);
  ct_write_file_atomic(p, "a big header\n", 13, &err);
  ct_ds_config c = ds_default();
  c.id = "g";
  c.type = "local";
  c.instance_data_dir = dir;
  c.caption_strategy = CT_CAP_TEXTFILE;
  ct_storage *sto = NULL;
  REQUIRE(ct_ds_open_storage(&c, &sto, &err) == CT_OK);
  ct_disc fast, gen;
  REQUIRE(ct_discover(&c, sto, "", dir, NULL, NULL, &fast, &err) == CT_OK);
  ct_disc_force_generic = 1;
  ct_status gs = ct_discover(&c, sto, "", dir, NULL, NULL, &gen, &err);
  ct_disc_force_generic = 0;
  REQUIRE(gs == CT_OK);
  CHECKF(fast.n == gen.n && fast.n == 14, "fast %zu, generic %zu items", fast.n, gen.n);
  size_t found_big = 0, bad = 0;
  for (size_t i = 0; i < fast.n && i < gen.n; i++) {
    CHECK(!strcmp(fast.it[i].rel, gen.it[i].rel));
    CHECKF(fast.it[i].w == gen.it[i].w && fast.it[i].h == gen.it[i].h &&
               fast.it[i].why == gen.it[i].why,
           "%s: fast %dx%d why %d, generic %dx%d why %d", fast.it[i].rel, fast.it[i].w,
           fast.it[i].h, fast.it[i].why, gen.it[i].w, gen.it[i].h, gen.it[i].why);
    CHECK(!strcmp(fast.it[i].caption ? fast.it[i].caption : "",
                  gen.it[i].caption ? gen.it[i].caption : ""));
    if (!strcmp(gen.it[i].rel, "sub/bigapp.jpg"))
      found_big = gen.it[i].w == 40 && gen.it[i].h == 24;
    bad += gen.it[i].why != CT_DISC_OK;
  }
  CHECK(found_big == 1);
  CHECK(bad == 1); /* garbage.png */
  ct_disc_free(&fast);
  ct_disc_free(&gen);
  ct_storage_free(sto);
}
