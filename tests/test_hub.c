/* Hub ids from a fake Hugging Face cache (ctuner/hub.h, docs/hub.md): the
 * cache directory from the environment as huggingface_hub picks it, the repo
 * id rule, refs/REV -> snapshots/SHA (files symlinked into blobs/, as
 * huggingface_hub writes them), a commit revision, the messages naming every
 * place looked, the file selection of a pipeline download, and the variant
 * view that a FLUX pipeline then opens. No network (tests/cli_hub.sh has the
 * download against a loopback server). */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/config.h"
#include "ctuner/fs.h"
#include "ctuner/hub.h"
#include "ctuner/train.h"
#include "harness.h"
#include "train/flux_pipe.h"

#define SHA1 "0123456789abcdef0123456789abcdef01234567"
#define SHA2 "89abcdef0123456789abcdef0123456789abcdef"

/* Saved and restored environment (each test sets its own). */
static const char *const VARS[] = {"HF_HUB_CACHE",   "HUGGINGFACE_HUB_CACHE",
                                   "HF_HOME",        "XDG_CACHE_HOME",
                                   "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"};
#define NVARS (sizeof VARS / sizeof VARS[0])
static char *saved[NVARS];
static void env_save(void) {
  for (size_t i = 0; i < NVARS; i++) {
    const char *v = getenv(VARS[i]);
    saved[i] = v ? strdup(v) : NULL;
    unsetenv(VARS[i]);
  }
}
static void env_restore(void) {
  for (size_t i = 0; i < NVARS; i++) {
    if (saved[i])
      setenv(VARS[i], saved[i], 1);
    else
      unsetenv(VARS[i]);
    free(saved[i]);
    saved[i] = NULL;
  }
}

/* ---- a fake cache: every file of a pipeline directory as a blob + symlink ---- */
static const char *g_src, *g_repo, *g_sha;
static int g_n;

static int copy_file(const char *a, const char *b) {
  FILE *in = fopen(a, "rb"), *out = in ? fopen(b, "wb") : NULL;
  char buf[65536];
  size_t n;
  int bad = !in || !out;
  while (!bad && (n = fread(buf, 1, sizeof buf, in)) > 0) bad = fwrite(buf, 1, n, out) != n;
  if (in) fclose(in);
  if (out && fclose(out)) bad = 1;
  return bad;
}

static int add_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)ftw;
  if (flag != FTW_F) return 0;
  const char *rel = path + strlen(g_src) + 1;
  if (!strcmp(rel, "golden.safetensors")) return 0; /* not part of the pipeline */
  char blob[4096], link[4096], dir[4096], target[512] = "../../";
  snprintf(blob, sizeof blob, "%s/blobs/%s%04d", g_repo, g_sha, g_n++);
  snprintf(link, sizeof link, "%s/snapshots/%s/%s", g_repo, g_sha, rel);
  snprintf(dir, sizeof dir, "%s", link);
  *strrchr(dir, '/') = 0;
  ct_err e = {0};
  if (ct_mkdir_p(dir, &e) || copy_file(path, blob)) return 1;
  for (const char *p = rel; *p; p++)
    if (*p == '/') strcat(target, "../");
  strcat(target, strrchr(blob, '/') - 5); /* "blobs/NAME" */
  return symlink(target, link);
}

/* CACHE/models--ORG--NAME with the files of src as snapshot sha (refs/ref if not NULL). */
static int fake_repo(const char *cache, const char *name, const char *src, const char *sha,
                     const char *ref) {
  static char repo[4096];
  char p[4200];
  snprintf(repo, sizeof repo, "%s/models--%s", cache, name);
  snprintf(p, sizeof p, "%s/blobs", repo);
  ct_err e = {0};
  if (ct_mkdir_p(p, &e)) return 1;
  g_src = src, g_repo = repo, g_sha = sha;
  if (nftw(src, add_one, 16, FTW_PHYS)) return 1;
  if (!ref) return 0;
  snprintf(p, sizeof p, "%s/refs", repo);
  if (ct_mkdir_p(p, &e)) return 1;
  snprintf(p, sizeof p, "%s/refs/%s", repo, ref);
  return ct_write_file_replace(p, sha, 40, &e) != CT_OK;
}

CT_TEST(hub, repo_ids_and_cache_dir) {
  /* validate_repo_id's rule */
  const char *good[] = {"black-forest-labs/FLUX.1-dev", "gpt2", "a_b/c.d-e"};
  const char *bad[] = {"",     "/abs/path", "a/b/c", "a--b/c", "a/..b", "-a/b",
                       "a/b.", "a b/c",     "./x",   "a/",     "~/flux"};
  for (size_t i = 0; i < 3; i++) CHECKF(ct_hub_is_repo_id(good[i]), "%s", good[i]);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECKF(!ct_hub_is_repo_id(bad[i]), "'%s'", bad[i]);
  CHECK(ct_hub_is_commit(SHA1) && !ct_hub_is_commit("main") && !ct_hub_is_commit(SHA1 "0"));
  /* constants.py's order: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME/hub,
   * XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub */
  env_save();
  const char *home = getenv("HOME");
  char out[4096], want[4200];
  const char *from = NULL;
  ct_err e = {0};
  REQUIRE(home);
  CHECK(!ct_hub_cache_dir(out, sizeof out, &from, &e));
  snprintf(want, sizeof want, "%s/.cache/huggingface/hub", home);
  CHECKF(!strcmp(out, want) && !strcmp(from, "HOME"), "%s %s", out, from);
  setenv("XDG_CACHE_HOME", "/x", 1);
  CHECK(!ct_hub_cache_dir(out, sizeof out, &from, &e));
  CHECKF(!strcmp(out, "/x/huggingface/hub") && !strcmp(from, "XDG_CACHE_HOME"), "%s", out);
  setenv("HF_HOME", "~/hf", 1);
  CHECK(!ct_hub_cache_dir(out, sizeof out, &from, &e));
  snprintf(want, sizeof want, "%s/hf/hub", home);
  CHECKF(!strcmp(out, want) && !strcmp(from, "HF_HOME"), "%s", out);
  setenv("HUGGINGFACE_HUB_CACHE", "/old", 1);
  CHECK(!ct_hub_cache_dir(out, sizeof out, &from, &e));
  CHECKF(!strcmp(out, "/old") && !strcmp(from, "HUGGINGFACE_HUB_CACHE"), "%s", out);
  setenv("HF_HUB_CACHE", "/new", 1);
  CHECK(!ct_hub_cache_dir(out, sizeof out, &from, &e));
  CHECKF(!strcmp(out, "/new") && !strcmp(from, "HF_HUB_CACHE"), "%s", out);
  /* _is_true */
  CHECK(!ct_hub_offline());
  setenv("TRANSFORMERS_OFFLINE", "yes", 1);
  CHECK(ct_hub_offline());
  setenv("HF_HUB_OFFLINE", "0", 1); /* HF_HUB_OFFLINE set wins, as `or` picks it */
  CHECK(!ct_hub_offline());
  setenv("HF_HUB_OFFLINE", "True", 1);
  CHECK(ct_hub_offline());
  env_restore();
}

CT_TEST(hub, lookup_revisions_and_messages) {
  env_save();
  char cache[512], out[4096], p[4400];
  snprintf(cache, sizeof cache, "%s/hub_lookup", ct_test_tmpdir());
  setenv("HF_HUB_CACHE", cache, 1);
  const char *dev = ct_test_data_in("CT_FLUX_PIPE_DATA", "flux_pipe", "dev");
  REQUIRE(!fake_repo(cache, "org--tiny", dev, SHA1, "main"));
  ct_err e = {0};
  ct_hub_opts o = {0};
  CHECKF(!ct_hub_lookup("org/tiny", &o, out, sizeof out, &e), "%s", e.msg);
  snprintf(p, sizeof p, "%s/models--org--tiny/snapshots/" SHA1, cache);
  CHECKF(!strcmp(out, p), "%s", out);
  o.revision = SHA1; /* a commit is a snapshot name, no refs/ needed */
  CHECKF(!ct_hub_lookup("org/tiny", &o, out, sizeof out, &e) && !strcmp(out, p), "%s", e.msg);
  /* a branch without a refs file, a missing repo, a bad refs file: each names what it looked at */
  o.revision = "v2";
  CHECK(ct_hub_lookup("org/tiny", &o, out, sizeof out, &e) == CT_ERR_NOT_FOUND);
  CHECKF(strstr(e.msg, "(revision v2)") && strstr(e.msg, "has no") &&
             strstr(e.msg, "models--org--tiny/refs/v2") && strstr(e.msg, "from HF_HUB_CACHE"),
         "%s", e.msg);
  o.revision = NULL;
  o.key = "pretrained_model_name_or_path";
  CHECK(ct_hub_lookup("org/none", &o, out, sizeof out, &e) == CT_ERR_NOT_FOUND);
  CHECKF(strstr(e.msg, "pretrained_model_name_or_path 'org/none'") &&
             strstr(e.msg, "not a local directory") && strstr(e.msg, cache) &&
             strstr(e.msg, "models--org--none"),
         "%s", e.msg);
  snprintf(p, sizeof p, "%s/models--org--tiny/refs/broken", cache);
  CHECK(!ct_write_file_replace(p, "nonsense\n", 9, &e));
  o.revision = "broken";
  CHECK(ct_hub_lookup("org/tiny", &o, out, sizeof out, &e) == CT_ERR_NOT_FOUND);
  CHECKF(strstr(e.msg, "has a bad") && strstr(e.msg, "refs/broken"), "%s", e.msg);
  o.revision = "../../x";
  CHECK(ct_hub_lookup("org/tiny", &o, out, sizeof out, &e) == CT_ERR_INVALID);
  /* offline, nothing downloaded: the lookup's message and why */
  setenv("HF_HUB_OFFLINE", "1", 1);
  o.revision = NULL;
  CHECK(ct_hub_fetch("org/none", &o, out, sizeof out, &e) == CT_ERR_NOT_FOUND);
  CHECKF(strstr(e.msg, "org/none") && strstr(e.msg, "HF_HUB_OFFLINE"), "%s", e.msg);
  CHECKF(!ct_hub_fetch("org/tiny", &o, out, sizeof out, &e), "%s", e.msg);
  env_restore();
}

/* A config naming the id opens as a FLUX pipeline through the cache's symlinks. */
CT_TEST(hub, config_resolves_and_pipeline_opens) {
  env_save();
  char cache[512], snap[4400];
  snprintf(cache, sizeof cache, "%s/hub_cfg", ct_test_tmpdir());
  setenv("HF_HUB_CACHE", cache, 1);
  setenv("HF_HUB_OFFLINE", "1", 1);
  const char *dev = ct_test_data_in("CT_FLUX_PIPE_DATA", "flux_pipe", "dev");
  REQUIRE(!fake_repo(cache, "org--tiny", dev, SHA1, "main"));
  ct_config c;
  ct_config_defaults(&c);
  ct_err e = {0};
  REQUIRE(!ct_config_set(&c, "pretrained_model_name_or_path", "org/tiny", &e));
  CHECKF(!ct_train_resolve_hub(&c, 1, &e), "%s", e.msg);
  snprintf(snap, sizeof snap, "%s/models--org--tiny/snapshots/" SHA1, cache);
  CHECKF(!strcmp(c.pretrained_model_name_or_path, snap), "%s", c.pretrained_model_name_or_path);
  ct_flux_pipe fp;
  CHECKF(!ct_flux_pipe_open(&c, 0, &fp, &e), "%s", e.msg);
  ct_config_free(&c);
  /* a local directory is kept as it is; a name that is neither says so */
  ct_config_defaults(&c);
  REQUIRE(!ct_config_set(&c, "pretrained_model_name_or_path", dev, &e));
  CHECK(!ct_train_resolve_hub(&c, 1, &e) && !strcmp(c.pretrained_model_name_or_path, dev));
  REQUIRE(!ct_config_set(&c, "pretrained_model_name_or_path", "/no/such/dir", &e));
  CHECK(ct_train_resolve_hub(&c, 1, &e) == CT_ERR_NOT_FOUND);
  CHECKF(
      strstr(e.msg, "'/no/such/dir': no such file or directory") && strstr(e.msg, "not a hub id"),
      "%s", e.msg);
  ct_config_free(&c);
  env_restore();
}

/* The files a pipeline download takes (DiffusionPipeline.download +
 * variant_compatible_siblings), for a FLUX.1-dev-like listing. */
CT_TEST(hub, wanted_files) {
  const char *f[] = {
      "flux1-dev.safetensors",                                          /* 0: not a component */
      "model_index.json",                                               /* 1 */
      "README.md",                                                      /* 2 */
      "transformer/config.json",                                        /* 3 */
      "transformer/diffusion_pytorch_model-00001-of-00002.safetensors", /* 4 */
      "transformer/diffusion_pytorch_model.safetensors.index.json",     /* 5 */
      "transformer/diffusion_pytorch_model.fp16-00001-of-00002.safetensors", /* 6 */
      "transformer/diffusion_pytorch_model.safetensors.index.fp16.json",     /* 7 */
      "vae/diffusion_pytorch_model.safetensors",                             /* 8 */
      "vae/diffusion_pytorch_model.fp16.safetensors",                        /* 9 */
      "text_encoder/model.safetensors",                                      /* 10: no fp16 of it */
      "text_encoder/pytorch_model.bin",                                      /* 11 */
      "tokenizer_2/spiece.model",                                            /* 12 */
      "extra/x.json", /* 13: not in the index */
  };
  const char *comp[] = {"transformer", "vae", "text_encoder", "tokenizer_2"};
  const int plain[] = {0, 1, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0, 1, 0};
  const int fp16[] = {0, 1, 0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 1, 0};
  const size_t n = sizeof f / sizeof f[0];
  int keep[14];
  ct_hub_wanted(f, n, comp, 4, NULL, NULL, keep);
  for (size_t i = 0; i < n; i++) CHECKF(keep[i] == plain[i], "no variant: %s %d", f[i], keep[i]);
  ct_hub_wanted(f, n, comp, 4, NULL, "fp16", keep);
  for (size_t i = 0; i < n; i++) CHECKF(keep[i] == fp16[i], "fp16: %s %d", f[i], keep[i]);
  ct_hub_wanted(f, n, NULL, 0, "vae", NULL, keep); /* a subfolder: its files only */
  for (size_t i = 0; i < n; i++) CHECKF(keep[i] == (i == 8), "vae: %s %d", f[i], keep[i]);
}

/* variant fp16: the vae's .fp16 file and the transformer's fp16 shards with
 * their index.fp16.json are what the pipeline opens; the plain vae file is
 * garbage here, so opening it would fail. */
CT_TEST(hub, variant_view) {
  env_save();
  char cache[512], src[600], cmd[2400], views[600];
  const char *t = ct_test_tmpdir();
  snprintf(cache, sizeof cache, "%s/hub_var", t);
  snprintf(src, sizeof src, "%s/var_src", t);
  snprintf(views, sizeof views, "%s/views", t);
  const char *dev = ct_test_data_in("CT_FLUX_PIPE_DATA", "flux_pipe", "dev");
  snprintf(
      cmd, sizeof cmd,
      "set -e; rm -rf '%s'; cp -rL '%s' '%s'; cd '%s'; rm golden.safetensors;"
      "mv vae/diffusion_pytorch_model.safetensors vae/diffusion_pytorch_model.fp16.safetensors;"
      "echo garbage > vae/diffusion_pytorch_model.safetensors; cd transformer;"
      "for k in 1 2; do mv diffusion_pytorch_model-0000$k-of-00002.safetensors "
      "diffusion_pytorch_model.fp16-0000$k-of-00002.safetensors; done;"
      "sed 's/diffusion_pytorch_model-0000/diffusion_pytorch_model.fp16-0000/' "
      "diffusion_pytorch_model.safetensors.index.json > "
      "diffusion_pytorch_model.safetensors.index.fp16.json;"
      "rm diffusion_pytorch_model.safetensors.index.json",
      src, dev, src, src);
  REQUIRE(system(cmd) == 0);
  setenv("HF_HUB_CACHE", cache, 1);
  setenv("HF_HUB_OFFLINE", "1", 1);
  setenv("XDG_CACHE_HOME", views, 1); /* where the views go */
  REQUIRE(!fake_repo(cache, "org--var", src, SHA2, "main"));
  ct_config c;
  ct_err e = {0};
  ct_flux_pipe fp;
  const char *const where[] = {"org/var", src}; /* a hub id and a local directory alike */
  for (int k = 0; k < 2; k++) {
    ct_config_defaults(&c);
    REQUIRE(!ct_config_set(&c, "pretrained_model_name_or_path", where[k], &e));
    CHECK(ct_flux_pipe_open(&c, 0, &fp, &e) != CT_OK); /* plain: no transformer there */
    REQUIRE(!ct_config_set(&c, "variant", "fp16", &e));
    CHECKF(!ct_train_resolve_hub(&c, 0, &e), "%s: %s", where[k], e.msg);
    CHECKF(strstr(c.pretrained_model_name_or_path, views) &&
               strstr(c.pretrained_model_name_or_path, ".fp16"),
           "%s", c.pretrained_model_name_or_path);
    CHECKF(!ct_flux_pipe_open(&c, 0, &fp, &e), "%s: %s", where[k], e.msg);
    char p[4400], real[4096] = "";
    snprintf(p, sizeof p, "%s/vae/diffusion_pytorch_model.safetensors",
             c.pretrained_model_name_or_path);
    CHECKF(realpath(p, real) && strstr(real, k ? "fp16.safetensors" : "models--org--var/blobs/"),
           "%s -> %s", p, real);
    struct stat sb;
    CHECKF(!stat(p, &sb) && sb.st_size > 1000, "%s: the fp16 weights", p);
    /* a variant the repo does not have: refused, as diffusers refuses it */
    REQUIRE(!ct_config_set(&c, "pretrained_model_name_or_path", where[k], &e));
    REQUIRE(!ct_config_set(&c, "variant", "bf16", &e));
    CHECK(ct_train_resolve_hub(&c, 0, &e) == CT_ERR_NOT_FOUND);
    CHECKF(strstr(e.msg, "variant 'bf16'") && strstr(e.msg, "no weight file of it"), "%s", e.msg);
    ct_config_free(&c);
  }
  env_restore();
}
