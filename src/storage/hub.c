/* hub.c: Hugging Face cache lookup, the pipeline's file selection and the
 * variant view (ctuner/hub.h). The rules are huggingface_hub's and
 * diffusers', cited where each is followed; the download is hub_fetch.c. */
#include "ctuner/hub.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctuner/fs.h"
#include "storage/hub_int.h"

int ct_hub_is_repo_id(const char *s) {
  /* huggingface_hub utils/_validators.py validate_repo_id: REPO_ID_REGEX
   * ^(\b[\w\-.]+\b/)?\b[\w\-.]+\b$, "--" and ".." refused, at most 96 chars */
  size_t n = s ? strlen(s) : 0;
  if (!n || n > 96 || strstr(s, "--") || strstr(s, "..")) return 0;
  int slashes = 0;
  for (size_t i = 0; i < n; i++) {
    const char c = s[i];
    if (c == '/') {
      if (++slashes > 1 || i == 0 || i + 1 == n) return 0;
      continue;
    }
    if (!isalnum((unsigned char)c) && c != '_' && c != '-' && c != '.') return 0;
    /* \b: each part starts and ends with a word character */
    const int edge = i == 0 || i + 1 == n || s[i - 1] == '/' || s[i + 1] == '/';
    if (edge && (c == '-' || c == '.')) return 0;
  }
  return 1;
}

int ct_hub_is_commit(const char *s) {
  /* huggingface_hub constants/utils: REGEX_COMMIT_HASH = ^[0-9a-f]{40}$ */
  if (!s || strlen(s) != 40) return 0;
  for (int i = 0; i < 40; i++)
    if (!isdigit((unsigned char)s[i]) && !(s[i] >= 'a' && s[i] <= 'f')) return 0;
  return 1;
}

static const char *env(const char *k) {
  const char *v = getenv(k);
  return v && *v ? v : NULL;
}

/* "~" and "~/..." as os.path.expanduser reads them. */
static int expand(char *out, size_t n, const char *p) {
  const char *home = env("HOME");
  if (p[0] == '~' && (p[1] == '/' || !p[1]) && home) return ct_pathf(out, n, "%s%s", home, p + 1);
  return ct_pathf(out, n, "%s", p);
}

int ct_hub_home(char *out, size_t n, const char **from) {
  /* constants.py: HF_HOME = expanduser(getenv("HF_HOME",
   * join(getenv("XDG_CACHE_HOME", "~/.cache"), "huggingface"))). An empty
   * variable counts as unset here (Python would take "" as a relative path). */
  char tmp[CT_HUB_PATH];
  if (env("HF_HOME")) {
    *from = "HF_HOME";
    return expand(out, n, env("HF_HOME"));
  }
  if (env("XDG_CACHE_HOME")) {
    *from = "XDG_CACHE_HOME";
    return ct_pathf(tmp, sizeof tmp, "%s/huggingface", env("XDG_CACHE_HOME")) ||
           expand(out, n, tmp);
  }
  *from = "HOME";
  return expand(out, n, "~/.cache/huggingface");
}

ct_status ct_hub_cache_dir(char *out, size_t n, const char **from, ct_err *err) {
  /* constants.py: HF_HUB_CACHE = expanduser(getenv("HF_HUB_CACHE",
   * getenv("HUGGINGFACE_HUB_CACHE", join(HF_HOME, "hub")))) */
  const char *f = NULL;
  int bad;
  if (env("HF_HUB_CACHE")) {
    f = "HF_HUB_CACHE";
    bad = expand(out, n, env("HF_HUB_CACHE"));
  } else if (env("HUGGINGFACE_HUB_CACHE")) {
    f = "HUGGINGFACE_HUB_CACHE";
    bad = expand(out, n, env("HUGGINGFACE_HUB_CACHE"));
  } else {
    char home[CT_HUB_PATH];
    bad = ct_hub_home(home, sizeof home, &f) || ct_pathf(out, n, "%s/hub", home);
  }
  if (!bad && out[0] == '~')
    return ct_errf(err, CT_ERR_INVALID, "the Hugging Face cache %s (%s): HOME is not set", out, f);
  if (bad) return ct_errf(err, CT_ERR_RANGE, "the Hugging Face cache path (%s) is too long", f);
  if (from) *from = f;
  return CT_OK;
}

int ct_hub_offline(void) {
  /* constants.py: HF_HUB_OFFLINE = _is_true(HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE),
   * _is_true: value.upper() in {"1", "ON", "YES", "TRUE"} */
  const char *v = env("HF_HUB_OFFLINE");
  if (!v) v = env("TRANSFORMERS_OFFLINE");
  if (!v) return 0;
  static const char *const T[] = {"1", "ON", "YES", "TRUE"};
  for (size_t i = 0; i < 4; i++)
    if (!strcasecmp(v, T[i])) return 1;
  return 0;
}

int ct_hub_repo_dir(const char *cache, const char *id, char *out, size_t n) {
  /* file_download.py repo_folder_name: "models--" + id with "/" as "--" */
  char name[256];
  size_t k = 0;
  for (const char *p = id; *p && k + 3 < sizeof name; p++) {
    if (*p == '/') {
      name[k++] = '-';
      name[k++] = '-';
    } else {
      name[k++] = *p;
    }
  }
  name[k] = 0;
  return ct_pathf(out, n, "%s/models--%s", cache, name);
}

/* A revision as a refs/ path: a branch, tag or refs/pr/N; no "..", no leading '/'. */
int ct_hub_revision_ok(const char *r) {
  if (!r || !*r || r[0] == '/' || strlen(r) > 255 || strstr(r, "..")) return 0;
  for (const char *p = r; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == '\\') return 0;
  return 1;
}

/* refs/REV's commit: the file's first line, a 40-hex sha. */
static int read_ref(const char *path, char sha[41]) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[128] = "";
  const int ok = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  line[strcspn(line, "\r\n \t")] = 0;
  if (!ok || !ct_hub_is_commit(line)) return -2;
  memcpy(sha, line, 41);
  return 0;
}

static int is_dir(const char *p) {
  struct stat sb;
  return !stat(p, &sb) && S_ISDIR(sb.st_mode);
}

ct_status ct_hub_lookup(const char *id, const ct_hub_opts *o, char *out, size_t n, ct_err *err) {
  const char *rev = o && o->revision ? o->revision : "main";
  const char *key = o && o->key ? o->key : "model";
  char cache[CT_HUB_PATH], repo[CT_HUB_PATH], ref[CT_HUB_PATH + 300], snap[CT_HUB_PATH + 64];
  const char *from = NULL;
  ct_status st = ct_hub_cache_dir(cache, sizeof cache, &from, err);
  if (st) return st;
  if (!ct_hub_revision_ok(rev))
    return ct_errf(err, CT_ERR_INVALID, "%s '%s': revision '%s' is not a branch, tag or commit",
                   key, id, rev);
  if (ct_hub_repo_dir(cache, id, repo, sizeof repo))
    return ct_errf(err, CT_ERR_RANGE, "%s '%s': the cache path is too long", key, id);
  char cwd[CT_HUB_PATH] = "";
  if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, ".");
  /* what was looked at, in order, for the message */
  char where[3 * CT_HUB_PATH];
  int w = snprintf(where, sizeof where,
                   "not a local directory (%s/%s), and the Hugging Face cache %s (from %s) ", cwd,
                   id, cache, from);
  if (!is_dir(repo)) {
    snprintf(where + w, sizeof where - (size_t)w, "has no %s", repo);
    return ct_errf(err, CT_ERR_NOT_FOUND, "%s '%s' (revision %s): %s", key, id, rev, where);
  }
  char sha[41];
  if (ct_hub_is_commit(rev)) { /* file_download.py: a commit hash is a snapshot name */
    memcpy(sha, rev, 41);
  } else {
    ct_pathf(ref, sizeof ref, "%s/refs/%s", repo, rev);
    const int r = read_ref(ref, sha);
    if (r) {
      snprintf(where + w, sizeof where - (size_t)w, "%s %s", r == -1 ? "has no" : "has a bad", ref);
      return ct_errf(err, CT_ERR_NOT_FOUND, "%s '%s' (revision %s): %s", key, id, rev, where);
    }
  }
  ct_pathf(snap, sizeof snap, "%s/snapshots/%s", repo, sha);
  if (!is_dir(snap)) {
    snprintf(where + w, sizeof where - (size_t)w, "has no %s", snap);
    return ct_errf(err, CT_ERR_NOT_FOUND, "%s '%s' (revision %s): %s", key, id, rev, where);
  }
  if (ct_pathf(out, n, "%s", snap))
    return ct_errf(err, CT_ERR_RANGE, "%s '%s': the snapshot path is too long", key, id);
  return CT_OK;
}

/* ---- the files a pipeline load fetches ---- */

static int ends(const char *s, const char *suf) {
  const size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

/* Weight formats ctuner does not read (diffusers' download ignores *.bin and
 * *.msgpack when safetensors exist, and onnx/pb outside onnx pipelines). */
static int foreign_weights(const char *f) {
  static const char *const X[] = {".bin", ".msgpack", ".onnx", ".onnx_data", ".pb",
                                  ".h5",  ".ckpt",    ".pt",   ".pth",       ".ot"};
  for (size_t i = 0; i < sizeof X / sizeof X[0]; i++)
    if (ends(f, X[i]) && !ends(f, ".index.json")) return 1;
  return 0;
}

int ct_hub_weight_kind(const char *base, const char *variant, char *plain, size_t n) {
  /* pipeline_loading_utils.py variant_compatible_siblings: weight names are
   * PREFIX(.VARIANT|.VARIANT-NNNNN-of-NNNNN|-NNNNN-of-NNNNN).safetensors and
   * indexes PREFIX.safetensors.index(.VARIANT).json, PREFIX one of
   * diffusion_pytorch_model, model, pytorch_model, flax_model. Returns 0 for
   * a file that is no weight, 1 for a non-variant weight, 2 for a variant one
   * (plain: its non-variant name; shards keep theirs, named by the index). */
  static const char *const P[] = {"diffusion_pytorch_model", "model", "pytorch_model",
                                  "flax_model"};
  for (size_t i = 0; i < 4; i++) {
    const size_t pl = strlen(P[i]);
    if (strncmp(base, P[i], pl) || (base[pl] != '.' && base[pl] != '-')) continue;
    const char *r = base + pl; /* ".safetensors", ".fp16.safetensors", "-00001-of-..." */
    if (!strcmp(r, ".safetensors") || !strcmp(r, ".safetensors.index.json")) return 1;
    if (r[0] == '-') return ends(r, ".safetensors") ? 1 : 0; /* a non-variant shard */
    if (!variant) continue;
    const size_t vl = strlen(variant);
    char idx[160];
    snprintf(idx, sizeof idx, ".safetensors.index.%s.json", variant);
    if (!strcmp(r, idx)) {
      snprintf(plain, n, "%s.safetensors.index.json", P[i]);
      return 2;
    }
    if (strncmp(r + 1, variant, vl)) continue;
    const char *t = r + 1 + vl;
    if (!strcmp(t, ".safetensors")) {
      snprintf(plain, n, "%s.safetensors", P[i]);
      return 2;
    }
    if (t[0] == '-' && ends(t, ".safetensors")) { /* a variant shard keeps its name */
      snprintf(plain, n, "%s", base);
      return 2;
    }
  }
  return 0;
}

static const char *base_of(const char *f) {
  const char *s = strrchr(f, '/');
  return s ? s + 1 : f;
}

/* Is f a variant-looking weight of some variant (X.fp16.safetensors)? Then
 * without a variant it is not fetched (non_variant_file_re does not match). */
static int other_variant(const char *base) {
  static const char *const P[] = {"diffusion_pytorch_model.", "model.", "pytorch_model.",
                                  "flax_model."};
  for (size_t i = 0; i < 4; i++)
    if (!strncmp(base, P[i], strlen(P[i])) && ends(base, ".safetensors") &&
        strcmp(base + strlen(P[i]), "safetensors"))
      return 1;
  return 0;
}

void ct_hub_wanted(const char *const *files, size_t nfiles, const char *const *components,
                   size_t ncomp, const char *subfolder, const char *variant, int *keep) {
  const size_t sl = subfolder ? strlen(subfolder) : 0;
  for (size_t i = 0; i < nfiles; i++) {
    const char *f = files[i];
    int k = 1;
    if (sl) {
      k = !strncmp(f, subfolder, sl) && f[sl] == '/';
    } else if (components) { /* pipeline_utils.py download: model_index.json and the component
                                folders */
      k = !strcmp(f, "model_index.json");
      for (size_t c = 0; c < ncomp && !k; c++) {
        const size_t cl = strlen(components[c]);
        k = !strncmp(f, components[c], cl) && f[cl] == '/';
      }
    }
    if (k && foreign_weights(f)) k = 0;
    keep[i] = k;
  }
  /* the variant rule, per folder: a non-variant weight goes when the variant
   * has no counterpart of it (convert_to_variant) */
  for (size_t i = 0; i < nfiles; i++) {
    if (!keep[i]) continue;
    const char *b = base_of(files[i]);
    char plain[256];
    const int kind = ct_hub_weight_kind(b, variant, plain, sizeof plain);
    if (kind == 2) continue;
    if (kind == 0) {
      if (other_variant(b) || (!variant && ends(b, ".json") && strstr(b, ".safetensors.index.") &&
                               !ends(b, ".safetensors.index.json")))
        keep[i] = 0; /* another variant's weights or index */
      continue;
    }
    if (!variant) continue;
    /* a non-variant weight: dropped if the same folder has any file of the variant
     * with the same prefix (shards and index together, as diffusers' sets) */
    const size_t dl = (size_t)(b - files[i]);
    const char *dash = strchr(b, '-'), *dot = strchr(b, '.');
    const size_t pl = (size_t)((dash && dash < dot ? dash : dot) - b);
    for (size_t j = 0; j < nfiles; j++) {
      const char *bj = base_of(files[j]);
      if ((size_t)(bj - files[j]) != dl || strncmp(files[j], files[i], dl)) continue;
      char pj[256];
      if (!strncmp(bj, b, pl) && bj[pl] == '.' &&
          ct_hub_weight_kind(bj, variant, pj, sizeof pj) == 2) {
        keep[i] = 0;
        break;
      }
    }
  }
}

/* ---- the variant view ---- */

/* Link (or re-link) dst -> src. */
static int link_to(const char *src, const char *dst) {
  char cur[CT_HUB_PATH];
  const ssize_t l = readlink(dst, cur, sizeof cur - 1);
  if (l >= 0) {
    cur[l] = 0;
    if (!strcmp(cur, src)) return 0;
    unlink(dst);
  }
  return symlink(src, dst);
}

/* One folder of the view: every entry of src linked into dst, variant
 * weights under their plain names, the plain weights they replace left
 * out. Returns the number of variant files, or -1. */
static int view_folder(const char *src, const char *dst, const char *variant, ct_err *err) {
  char **names = NULL;
  size_t nn = 0;
  if (hub_list_dir(src, &names, &nn)) {
    ct_errf(err, CT_ERR_IO, "%s: cannot list", src);
    return -1;
  }
  int *keep = calloc(nn + 1, sizeof *keep);
  int nv = 0, bad = keep == NULL || ct_mkdir_p(dst, err) != CT_OK;
  if (!bad) ct_hub_wanted((const char *const *)names, nn, NULL, 0, NULL, variant, keep);
  for (size_t i = 0; i < nn && !bad; i++) {
    char s[CT_HUB_PATH + 256], d[CT_HUB_PATH + 256], plain[256];
    ct_pathf(s, sizeof s, "%s/%s", src, names[i]);
    const int kind = ct_hub_weight_kind(names[i], variant, plain, sizeof plain);
    if (kind == 2) nv++;
    if (!keep[i] && kind != 0) continue; /* a plain weight the variant replaces */
    if (kind == 2) {
      ct_pathf(d, sizeof d, "%s/%s", dst, plain);
    } else if (is_dir(s)) {
      ct_pathf(d, sizeof d, "%s/%s", dst, names[i]);
      const int sub = view_folder(s, d, variant, err);
      if (sub < 0) bad = 1;
      nv += sub > 0 ? sub : 0;
      continue;
    } else {
      ct_pathf(d, sizeof d, "%s/%s", dst, names[i]);
    }
    char abs[PATH_MAX];
    if (!realpath(s, abs) || link_to(abs, d)) {
      ct_errf(err, CT_ERR_IO, "%s: cannot link to %s: %s", d, s, strerror(errno));
      bad = 1;
    }
  }
  for (size_t i = 0; i < nn; i++) free(names[i]);
  free(names);
  free(keep);
  return bad ? -1 : nv;
}

ct_status ct_hub_variant_dir(const char *dir, const char *variant, const char *cache_root,
                             char *out, size_t n, ct_err *err) {
  if (!variant || !*variant) return ct_pathf(out, n, "%s", dir) ? CT_ERR_RANGE : CT_OK;
  for (const char *p = variant; *p; p++)
    if (!isalnum((unsigned char)*p) && *p != '_')
      return ct_errf(err, CT_ERR_INVALID, "variant '%s': letters, digits and '_' only", variant);
  char abs[PATH_MAX], view[CT_HUB_PATH];
  if (!realpath(dir, abs)) return ct_errf(err, CT_ERR_NOT_FOUND, "%s: %s", dir, strerror(errno));
  /* the view's name: the directory's path, '/' as '%' */
  char flat[PATH_MAX];
  size_t k = 0;
  for (const char *p = abs; *p && k + 1 < sizeof flat; p++) flat[k++] = *p == '/' ? '%' : *p;
  flat[k] = 0;
  if (ct_pathf(view, sizeof view, "%s/%s.%s", cache_root, flat, variant))
    return ct_errf(err, CT_ERR_RANGE, "%s: the variant view's path is too long", dir);
  const int nv = view_folder(abs, view, variant, err);
  if (nv < 0) return CT_ERR_IO;
  if (nv == 0) /* pipeline_utils.py download: no file of the variant at all is an error */
    return ct_errf(err, CT_ERR_NOT_FOUND,
                   "variant '%s': %s has no weight file of it (e.g. "
                   "transformer/diffusion_pytorch_model.%s.safetensors); remove variant to load "
                   "the plain weights",
                   variant, dir, variant);
  if (ct_pathf(out, n, "%s", view)) return ct_errf(err, CT_ERR_RANGE, "path too long");
  return CT_OK;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int hub_list_dir(const char *dir, char ***names, size_t *n) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  char **v = NULL;
  size_t k = 0, cap = 0;
  struct dirent *e;
  int bad = 0;
  while (!bad && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (k == cap) {
      cap = cap ? 2 * cap : 16;
      char **nv = realloc(v, cap * sizeof *v);
      if (!nv) {
        bad = 1;
        break;
      }
      v = nv;
    }
    if (!(v[k] = strdup(e->d_name)))
      bad = 1;
    else
      k++;
  }
  closedir(d);
  if (bad) {
    for (size_t i = 0; i < k; i++) free(v[i]);
    free(v);
    return -1;
  }
  if (k) qsort(v, k, sizeof *v, cmp_str);
  *names = v;
  *n = k;
  return 0;
}
