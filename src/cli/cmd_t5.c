/* `ctuner model text`: tokenize and encode captions with a FLUX pipeline's T5
 * (text_encoder_2 + tokenizer_2) and print the tokens and the embedding's
 * statistics, one JSON line per caption. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "ctuner/parallel.h"
#include "ctuner/t5.h"

void ct_cmd_model_text_help(FILE *f) {
  fprintf(
      f,
      "usage: ctuner model text --pretrained DIR [--caption TEXT ...] [--max_sequence_length N]\n"
      "                       [--tokens_only]\n"
      "       (or --text_encoder DIR --tokenizer DIR instead of --pretrained)\n"
      "\n"
      "Loads DIR/tokenizer_2 (tokenizer.json, else spiece.model) and DIR/text_encoder_2\n"
      "(config.json, model.safetensors or shards with model.safetensors.index.json) of a\n"
      "diffusers FLUX pipeline, tokenizes each caption as FluxPipeline does\n"
      "(padding to --max_sequence_length, default 512 as FLUX.1-dev; schnell uses 256)\n"
      "and runs the T5 encoder. Prints one JSON line per caption: the ids up to and\n"
      "including </s>, their pieces, and the embedding's shape, mean, std, min, max and\n"
      "first values. --tokens_only skips the encoder. docs/text_encoder.md, \"T5\".\n");
}

static void print_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      printf("\\%c", c);
    else if (c < 0x20)
      printf("\\u%04x", c);
    else
      putchar(c);
  }
  putchar('"');
}

static int encode_one(const ct_spm *s, ct_t5 *t, const char *cap, int T, float *seq) {
  ct_err err = {0};
  int32_t *ids = malloc((size_t)T * sizeof *ids);
  int n = 0, rc = 0;
  if (!ids || ct_spm_encode(s, cap, T, ids, &n, &err)) {
    fprintf(stderr, "ctuner model text: %s\n", ids ? err.msg : "out of memory");
    free(ids);
    return 1;
  }
  printf("{\"caption\": ");
  print_str(cap);
  printf(", \"tokens\": %d, \"ids\": [", n);
  for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
  printf("], \"pieces\": [");
  for (int i = 0; i < n; i++) {
    printf("%s", i ? ", " : "");
    print_str(ct_spm_piece(s, ids[i]) ? ct_spm_piece(s, ids[i]) : "?");
  }
  printf("]");
  if (t) {
    double t0 = ct_time_now();
    if (ct_t5_encode(t, ids, 1, T, seq, &err)) {
      fprintf(stderr, "\nctuner model text: %s\n", err.msg);
      rc = 1;
    } else {
      size_t m = (size_t)T * ct_t5_cfg(t)->d_model;
      double sum = 0, sq = 0, mn = seq[0], mx = seq[0];
      for (size_t i = 0; i < m; i++) {
        sum += seq[i], sq += (double)seq[i] * seq[i];
        mn = fmin(mn, seq[i]), mx = fmax(mx, seq[i]);
      }
      double mean = sum / (double)m;
      printf(
          ", \"shape\": [1, %d, %d], \"mean\": %.6g, \"std\": %.6g, \"min\": %.6g, \"max\": "
          "%.6g, \"first\": [%.6g, %.6g, %.6g, %.6g], \"seconds\": %.3f",
          T, ct_t5_cfg(t)->d_model, mean, sqrt(fmax(0.0, sq / (double)m - mean * mean)), mn, mx,
          seq[0], seq[1 % m], seq[2 % m], seq[3 % m], ct_time_now() - t0);
    }
  }
  printf("}\n");
  free(ids);
  return rc;
}

int ct_cmd_model_text(int argc, char **argv) {
  const char *pre = NULL, *enc = NULL, *tok = NULL, *v, *caps[64];
  int ncap = 0, tokens_only = 0, rc = 0;
  long T = 512;
  for (int i = 2; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_model_text_help(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--tokens_only")) {
      tokens_only = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "pretrained", &pre)) ||
               (r = ct_cli_opt(argc, argv, &i, "text_encoder", &enc)) ||
               (r = ct_cli_opt(argc, argv, &i, "tokenizer", &tok))) {
      if (r < 0) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "caption", &v))) {
      if (r < 0) return 2;
      if (ncap == 64) {
        fprintf(stderr, "ctuner model text: at most 64 --caption\n");
        return 2;
      }
      caps[ncap++] = v;
    } else if ((r = ct_cli_opt(argc, argv, &i, "max_sequence_length", &v))) {
      if (r < 0 || ct_cli_int("max_sequence_length", v, 1, 1 << 16, &T)) return 2;
    } else {
      fprintf(stderr, "ctuner model text: unknown option '%s'\n", argv[i]);
      ct_cmd_model_text_help(stderr);
      return 2;
    }
  }
  char encd[4096], tokd[4096];
  if (pre) {
    snprintf(encd, sizeof encd, "%s/text_encoder_2", pre);
    snprintf(tokd, sizeof tokd, "%s/tokenizer_2", pre);
    if (!enc) enc = encd;
    if (!tok) tok = tokd;
  }
  if (!tok || (!enc && !tokens_only)) {
    fprintf(stderr,
            "ctuner model text: --pretrained DIR (or --tokenizer and --text_encoder) is "
            "required\n");
    ct_cmd_model_text_help(stderr);
    return 2;
  }
  if (!ncap) caps[ncap++] = "a photo of a cat";
  ct_err err = {0};
  ct_spm *s = NULL;
  ct_t5 *t = NULL;
  float *seq = NULL;
  if (ct_spm_load_dir(tok, &s, &err)) {
    fprintf(stderr, "ctuner model text: %s\n", err.msg);
    return 1;
  }
  if (!tokens_only) {
    if (ct_t5_load(enc, &t, &err)) {
      fprintf(stderr, "ctuner model text: %s\n", err.msg);
      rc = 1;
      goto out;
    }
    if (ct_spm_vocab_size(s) > ct_t5_cfg(t)->vocab) {
      fprintf(stderr,
              "ctuner model text: the tokenizer has %d ids, the encoder's vocab_size is %d\n",
              ct_spm_vocab_size(s), ct_t5_cfg(t)->vocab);
      rc = 1;
      goto out;
    }
    seq = malloc((size_t)T * ct_t5_cfg(t)->d_model * sizeof(float));
    if (!seq) {
      fprintf(stderr, "ctuner model text: out of memory\n");
      rc = 1;
      goto out;
    }
  }
  for (int i = 0; i < ncap && !rc; i++) rc = encode_one(s, t, caps[i], (int)T, seq);
out:
  free(seq);
  ct_t5_free(t);
  ct_spm_free(s);
  return rc;
}
