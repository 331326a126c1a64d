/* `ctuner hub download|path ID`: a Hugging Face Hub id into (or out of) the
 * user's Hugging Face cache, as `ctuner train` reads pretrained_model_name_or_path
 * (ctuner/hub.h, docs/hub.md); and the hub part of `ctuner config check`. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "ctuner/config.h"
#include "ctuner/hub.h"

void ct_cmd_hub_help(FILE *f) {
  fprintf(f,
          "usage: ctuner hub download ID [--revision R] [--variant V] [--subfolder S]\n"
          "       ctuner hub path ID [--revision R]\n"
          "\n"
          "download: fetches what a diffusers pipeline load needs of the hub repo ID\n"
          "(\"black-forest-labs/FLUX.1-dev\"): with model_index.json, its component folders\n"
          "only; safetensors only; the variant's weight files (--variant fp16) where they\n"
          "exist — into the Hugging Face cache as huggingface_hub lays it out\n"
          "(HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub:\n"
          "models--ORG--NAME/{blobs,snapshots,refs}). Files already there are kept, a\n"
          "partial one is resumed. Prints the snapshot directory. path: the snapshot\n"
          "directory in the cache, nothing downloaded (exit 1, naming every place looked,\n"
          "when missing).\n"
          "\n"
          "Environment: HF_ENDPOINT (default https://huggingface.co), HF_TOKEN (else\n"
          "HF_TOKEN_PATH, default HF_HOME/token) for private and gated repos,\n"
          "HF_HUB_OFFLINE=1 (no network: the cache only), HF_HUB_ETAG_TIMEOUT and\n"
          "HF_HUB_DOWNLOAD_TIMEOUT (seconds, default 10). `ctuner train` does the same\n"
          "for a hub id in pretrained_model_name_or_path (docs/hub.md).\n");
}

int ct_cmd_hub(int argc, char **argv) {
  const char *sub = argc > 1 ? argv[1] : "";
  const int dl = !strcmp(sub, "download");
  if (!dl && strcmp(sub, "path")) {
    ct_cmd_hub_help(stderr);
    return 2;
  }
  const char *id = NULL, *rev = NULL, *variant = NULL, *subfolder = NULL;
  for (int i = 2; i < argc; i++) {
    const char *v;
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_hub_help(stdout);
      return 0;
    }
    if ((r = ct_cli_opt(argc, argv, &i, "revision", &v))) {
      if (r < 0) return 2;
      rev = v;
    } else if ((r = ct_cli_opt(argc, argv, &i, "variant", &v))) {
      if (r < 0) return 2;
      variant = v;
    } else if ((r = ct_cli_opt(argc, argv, &i, "subfolder", &v))) {
      if (r < 0) return 2;
      subfolder = v;
    } else if (argv[i][0] == '-' || id) {
      fprintf(stderr, "ctuner hub %s: unexpected argument '%s'\n", sub, argv[i]);
      return 2;
    } else {
      id = argv[i];
    }
  }
  if (!id) {
    fprintf(stderr, "ctuner hub %s: ID is required (ctuner hub --help)\n", sub);
    return 2;
  }
  const ct_hub_opts o = {rev, variant, subfolder, 0, "hub id", 0, NULL};
  char dir[CT_HUB_PATH];
  ct_err err = {0};
  ct_status st = dl ? ct_hub_fetch(id, &o, dir, sizeof dir, &err)
                    : ct_hub_lookup(id, &o, dir, sizeof dir, &err);
  if (st) {
    fprintf(stderr, "ctuner hub %s: %s\n", sub, err.msg);
    return 1;
  }
  printf("%s\n", dir);
  return 0;
}

/* config check: each model key that is a hub id, looked up in the cache (no
 * download), on a "hub:" line of its own: the snapshot, or what train will
 * do. Never a problem: what a machine's cache holds must not change a
 * config's verdict (the realcfg expectations are the same everywhere). */
void ct_cli_hub_check(const ct_config *cfg) {
  const char *const K[][2] = {
      {"pretrained_model_name_or_path", cfg->pretrained_model_name_or_path},
      {"pretrained_transformer_model_name_or_path", cfg->pretrained_transformer_model_name_or_path},
      {"pretrained_vae_model_name_or_path", cfg->pretrained_vae_model_name_or_path}};
  for (size_t i = 0; i < sizeof K / sizeof K[0]; i++) {
    struct stat sb;
    if (!K[i][1] || !stat(K[i][1], &sb) || !ct_hub_is_repo_id(K[i][1])) continue;
    const ct_hub_opts o = {cfg->revision, cfg->variant, NULL, 0, K[i][0], 1, NULL};
    char dir[CT_HUB_PATH];
    ct_err e = {0};
    if (!ct_hub_lookup(K[i][1], &o, dir, sizeof dir, &e))
      printf("hub: %s %s: %s\n", K[i][0], K[i][1], dir);
    else if (ct_hub_offline())
      printf("hub: %s; HF_HUB_OFFLINE is set, so train will stop here\n", e.msg);
    else
      printf("hub: %s; ctuner train downloads it (or now: ctuner hub download %s)\n", e.msg,
             K[i][1]);
  }
}
