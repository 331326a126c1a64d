/* CLIP BPE tokenizer: ids equal to Hugging Face's tokenizers.js on the cases of
 * tests/data/bpe/cases.json (scripts/bpe_golden.sh), padding and truncation,
 * the demo tokenizer keeps every synthetic caption word whole, and every bad
 * file gives an error naming it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctuner/json.h"
#include "ctuner/synth.h"
#include "ctuner/textenc.h"
#include "harness.h"

static char pathbuf[2][4096];

static ct_bpe *load_test_bpe(ct_err *err) {
  snprintf(pathbuf[0], sizeof pathbuf[0], "%s", ct_test_data("bpe/vocab.json"));
  snprintf(pathbuf[1], sizeof pathbuf[1], "%s", ct_test_data("bpe/merges.txt"));
  ct_bpe *b = NULL;
  return ct_bpe_load(pathbuf[0], pathbuf[1], &b, err) == CT_OK ? b : NULL;
}

CT_TEST(bpe, matches_hf_tokenizers_js) {
  ct_err err = {0};
  ct_bpe *b = load_test_bpe(&err);
  REQUIRE(b);
  CHECK(ct_bpe_vocab_size(b) == 2014 && ct_bpe_bos(b) == 2012 && ct_bpe_eos(b) == 2013);
  size_t n;
  char *text = ct_test_slurp(ct_test_data("bpe/cases.json"), &n);
  REQUIRE(text);
  ct_json *j = NULL;
  REQUIRE(ct_json_parse(text, n, &j, &err) == CT_OK);
  const ct_json *cases = ct_json_get(j, "cases");
  REQUIRE(cases && cases->type == CT_JSON_ARRAY && cases->n >= 20);
  int bad = 0;
  for (size_t c = 0; c < cases->n; c++) {
    const ct_json *t = ct_json_get(&cases->items[c], "text"),
                  *ids = ct_json_get(&cases->items[c], "ids");
    REQUIRE(t && ids && ids->n >= 2);
    int want = (int)ids->n - 2;
    int32_t got[1024];
    int m = ct_bpe_tokens(b, t->str, got, 1024);
    int ok = m == want;
    for (int i = 0; ok && i < m; i++) ok = got[i] == (int32_t)ids->items[i + 1].i64;
    if (!ok) {
      bad++;
      fprintf(stderr, "  case %zu \"%.60s\": %d ids, want %d\n", c, t->str, m, want);
    }
    /* encode with T = 77: BOS, ids, EOS, EOS padding, or truncated to 75 + EOS */
    int32_t enc[77];
    int k = ct_bpe_encode(b, t->str, 77, enc);
    int keep = want < 75 ? want : 75;
    CHECK(k == keep + 2 && enc[0] == 2012 && enc[keep + 1] == 2013);
    for (int i = 0; i < keep; i++) CHECK(enc[i + 1] == (int32_t)ids->items[i + 1].i64);
    for (int i = keep + 2; i < 77; i++) CHECK(enc[i] == 2013);
  }
  CHECKF(bad == 0, "%d of %zu cases differ from tokenizers.js", bad, cases->n);
  fprintf(stderr, "  %zu cases equal to tokenizers.js\n", cases->n - (size_t)bad);
  ct_json_free(j);
  free(text);
  ct_bpe_free(b);
}

CT_TEST(bpe, demo_tokenizer_keeps_caption_words_whole) {
  char v[4096], m[4096];
  snprintf(v, sizeof v, "%s/../../examples/demo/tokenizer/vocab.json", ct_test_data(""));
  snprintf(m, sizeof m, "%s/../../examples/demo/tokenizer/merges.txt", ct_test_data(""));
  ct_bpe *b = NULL;
  ct_err err = {0};
  REQUIRE(ct_bpe_load(v, m, &b, &err) == CT_OK);
  int longest = 0;
  for (int held = 0; held < 2; held++)
    for (int i = 0; i < 3000; i++) {
      ct_synth_spec s;
      char cap[256];
      ct_synth_draw(5, (uint64_t)i, held, &s);
      ct_synth_caption(&s, cap, sizeof cap);
      int words = 1;
      for (const char *p = cap; *p; p++) words += *p == ' ';
      int32_t ids[64];
      int n = ct_bpe_tokens(b, cap, ids, 64);
      CHECKF(n == words, "\"%s\": %d tokens for %d words", cap, n, words);
      if (n > longest) longest = n;
      if (n != words) break;
    }
  fprintf(stderr, "  longest synthetic caption: %d tokens (+ BOS, EOS)\n", longest);
  CHECK(longest <= 14);
  ct_bpe_free(b);
}

static void write_file(const char *path, const char *s) {
  FILE *f = fopen(path, "w");
  fputs(s, f);
  fclose(f);
}

CT_TEST(bpe, bad_files_name_the_problem) {
  const char *d = ct_test_tmpdir();
  char v[4096], m[4096];
  snprintf(v, sizeof v, "%s/bpe_vocab.json", d);
  snprintf(m, sizeof m, "%s/bpe_merges.txt", d);
  struct {
    const char *vocab, *merges, *want;
  } cases[] = {
      {"{\"a\": 0, \"<|startoftext|>\": 1, \"<|endoftext|>\": 2}", "#version: 0.2\na a</w>\n",
       NULL},
      {"{\"a\": 0, \"<|startoftext|>\": 1}", "", "<|endoftext|>"},
      {"{\"a\": 0, \"<|startoftext|>\": 1, \"<|endoftext|>\": 2", "", "bpe_vocab.json"},
      {"[1, 2]", "", "JSON object"},
      {"{\"a\": \"x\", \"<|startoftext|>\": 1, \"<|endoftext|>\": 2}", "", "\"a\""},
      {"{\"a\": -1, \"<|startoftext|>\": 1, \"<|endoftext|>\": 2}", "", "integer"},
      {"{\"a\": 0, \"<|startoftext|>\": 1, \"<|endoftext|>\": 2}", "a a\nabc\n",
       "bpe_merges.txt:2"},
      {"{\"a\": 0, \"<|startoftext|>\": 1, \"<|endoftext|>\": 2}", "a b c\n", "bpe_merges.txt:1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    write_file(v, cases[i].vocab);
    write_file(m, cases[i].merges);
    ct_bpe *b = NULL;
    ct_err err = {0};
    ct_status st = ct_bpe_load(v, m, &b, &err);
    if (!cases[i].want) {
      CHECK(st == CT_OK && b);
      if (b) {
        int32_t ids[8];
        /* "aa" merges to "aa</w>", not in the vocabulary: unknown -> <|endoftext|> */
        CHECK(ct_bpe_tokens(b, "aa", ids, 8) == 1 && ids[0] == 2);
        CHECK(ct_bpe_tokens(b, "a", ids, 8) == 1 && ids[0] == 2); /* "a</w>" is not in it either */
        CHECK(ct_bpe_tokens(b, "ab", ids, 8) == 2 && ids[0] == 0 && ids[1] == 2);
      }
    } else {
      CHECKF(st != CT_OK && !b && strstr(err.msg, cases[i].want), "case %zu: %s", i, err.msg);
    }
    ct_bpe_free(b);
  }
  ct_bpe *b = NULL;
  ct_err err = {0};
  CHECK(ct_bpe_load("/nonexistent/vocab.json", m, &b, &err) != CT_OK &&
        strstr(err.msg, "/nonexistent/vocab.json"));
}

CT_TEST(bpe, encoder_uses_its_tokenizer) {
  ct_err err = {0};
  ct_bpe *b = load_test_bpe(&err);
  REQUIRE(b);
  ct_textenc_config c;
  ct_textenc_config_default(32, &c);
  ct_textenc *te = NULL;
  REQUIRE(ct_textenc_new(&c, 1, &te, &err) == CT_OK);
  /* vocab 259 cannot hold 2014 ids: refused (and b is freed) */
  CHECK(ct_textenc_set_bpe(te, b, &err) != CT_OK && strstr(err.msg, "vocab"));
  ct_textenc_free(te);
  b = load_test_bpe(&err);
  REQUIRE(b);
  c.vocab = ct_bpe_vocab_size(b);
  c.eos_id = ct_bpe_eos(b);
  REQUIRE(ct_textenc_new(&c, 1, &te, &err) == CT_OK);
  REQUIRE(ct_textenc_set_bpe(te, b, &err) == CT_OK);
  int32_t a[16], r[16];
  int n = ct_textenc_tokenize(te, "hello world", 16, a);
  ct_bpe_encode(ct_textenc_bpe(te), "hello world", 16, r);
  CHECK(n >= 3 && !memcmp(a, r, sizeof a));
  /* pooled output is the row at the first <|endoftext|> */
  float seq[16 * 32], pooled[32];
  REQUIRE(ct_textenc_encode(te, a, 1, 16, seq, pooled, &err) == CT_OK);
  CHECK(!memcmp(pooled, seq + (size_t)(n - 1) * 32, sizeof pooled));
  ct_textenc_free(te);
}
