/* Sampler tests (src/data/sampler.h), on plain data with no dataset: resuming
 * from the state JSON continues the uninterrupted run's selections (mid-epoch
 * and across epoch boundaries), ranks split every step disjointly into the
 * global selection, an epoch takes every entry once, the on-disk format is
 * pinned, and bad state text fails with a message naming the problem. */
#include <stdlib.h>
#include <string.h>

#include "data/sampler.h"
#include "harness.h"

/* Two sets: "a" (buckets of 7, 5 and 9 images, repeats 1) and "b" (one of 6,
 * repeats 0, half as likely): steps of E = 4 leave tails in some buckets. */
static const ct_sampler_bucket a_b[3] = {{"1.0", 7}, {"1.5", 5}, {"0.67", 9}};
static const ct_sampler_bucket b_b[1] = {{"1.0", 6}};
static const ct_sampler_set two_sets[2] = {{"a", 1.0, 1, a_b, 3}, {"b", 0.5, 0, b_b, 1}};

#define MAXB 16
#define MAXSTEPS 200

/* One drawn step and every micro-batch of one rank. */
typedef struct rec {
  ct_sampler_step st;
  size_t img[4][MAXB];
  uint64_t ids[4][MAXB];
} rec;

static void record(ct_sampler *s, int rank, rec *r, ct_err *err, int *ok) {
  *ok = ct_sampler_next(s, &r->st, err) == CT_OK;
  for (int m = 0; *ok && m < s->accum; m++)
    ct_sampler_select(s, &r->st, m, rank, r->img[m], r->ids[m]);
}

static int same_rec(const ct_sampler *s, const rec *x, const rec *y) {
  const ct_sampler_step *a = &x->st, *b = &y->st;
  if (a->set != b->set || a->bucket != b->bucket || a->flat != b->flat || a->epoch != b->epoch ||
      a->new_epoch != b->new_epoch || a->base != b->base || a->first_id != b->first_id)
    return 0;
  for (int m = 0; m < s->accum; m++)
    if (memcmp(x->img[m], y->img[m], s->B * sizeof(size_t)) ||
        memcmp(x->ids[m], y->ids[m], s->B * sizeof(uint64_t)))
      return 0;
  return 1;
}

CT_TEST(sampler, resume_continues_the_same_selections) {
  ct_err err = {0};
  ct_sampler ref;
  REQUIRE(ct_sampler_init(&ref, two_sets, 2, 11, 2, 1, 2, &err) == CT_OK);
  /* steps per epoch: a: (14/4=3) + (10/4=2) + (18/4=4), b: 6/4=1 -> 10 */
  static rec want[MAXSTEPS];
  char *state[MAXSTEPS + 1] = {0};
  state[0] = ct_sampler_state_json(&ref, &ref.pos);
  int boundaries = 0;
  for (int t = 0; t < 45; t++) {
    int ok = 0;
    record(&ref, 0, &want[t], &err, &ok);
    REQUIRE(ok);
    boundaries += want[t].st.new_epoch;
    state[t + 1] = ct_sampler_state_json(&ref, &ref.pos);
    REQUIRE(state[t + 1] != NULL);
  }
  CHECKF(boundaries == 4 && want[44].st.epoch == 4, "%d new epochs, last epoch %ld", boundaries,
         want[44].st.epoch);
  CHECK(!want[0].st.new_epoch && want[10].st.new_epoch && want[10].st.epoch == 1);
  /* restore after every step count (mid-epoch, the last step of an epoch,
   * the first of the next): the next 12 steps are the uninterrupted ones */
  for (int n = 0; n + 12 <= 45; n++) {
    ct_sampler s;
    int changed = -1;
    REQUIRE(ct_sampler_init(&s, two_sets, 2, 11, 2, 1, 2, &err) == CT_OK);
    CHECKF(ct_sampler_state_restore(&s, state[n], &changed, &err) == CT_OK, "%s", err.msg);
    CHECK(changed == 0);
    char *again = ct_sampler_state_json(&s, &s.pos);
    CHECKF(again && !strcmp(again, state[n]), "state after %d steps does not round-trip", n);
    free(again);
    for (int t = n; t < n + 12; t++) {
      rec got;
      int ok = 0;
      record(&s, 0, &got, &err, &ok);
      REQUIRE(ok);
      CHECKF(same_rec(&s, &got, &want[t]), "resumed after %d steps: step %d differs", n, t);
    }
    ct_sampler_free(&s);
  }
  /* a different seed is a different order (the test can fail) */
  ct_sampler o;
  REQUIRE(ct_sampler_init(&o, two_sets, 2, 12, 2, 1, 2, &err) == CT_OK);
  int differ = 0;
  for (int t = 0; t < 10; t++) {
    rec got;
    int ok = 0;
    record(&o, 0, &got, &err, &ok);
    differ += ok && !same_rec(&o, &got, &want[t]);
  }
  CHECK(differ > 0);
  ct_sampler_free(&o);
  for (int t = 0; t <= 45; t++) free(state[t]);
  ct_sampler_free(&ref);
}

CT_TEST(sampler, epoch_takes_each_entry_once) {
  /* E = 4 divides every bucket's entries: an epoch is every image (repeats + 1) times */
  static const ct_sampler_bucket bk[3] = {{"1.0", 6}, {"1.33", 4}, {"0.75", 10}};
  const ct_sampler_set set = {"s", 1.0, 1, bk, 3};
  ct_err err = {0};
  ct_sampler s;
  REQUIRE(ct_sampler_init(&s, &set, 1, 3, 2, 1, 2, &err) == CT_OK);
  const int per_epoch = (12 + 8 + 20) / 4;
  for (int e = 0; e < 3; e++) {
    int seen[3][10];
    memset(seen, 0, sizeof seen);
    for (int t = 0; t < per_epoch; t++) {
      rec r;
      int ok = 0;
      record(&s, 0, &r, &err, &ok);
      REQUIRE(ok);
      CHECK(r.st.epoch == e && r.st.new_epoch == (t == 0 && e > 0));
      CHECK(r.st.first_id == (uint64_t)(e * per_epoch + t) * 4);
      for (int m = 0; m < 2; m++)
        for (int i = 0; i < 2; i++) {
          REQUIRE(r.img[m][i] < bk[r.st.bucket].n);
          seen[r.st.bucket][r.img[m][i]]++;
          CHECK(r.ids[m][i] == r.st.first_id + (uint64_t)(m * 2 + i));
        }
    }
    for (int b = 0; b < 3; b++)
      for (size_t i = 0; i < bk[b].n; i++)
        CHECKF(seen[b][i] == 2, "epoch %d bucket %d image %zu taken %d times", e, b, i, seen[b][i]);
    CHECK(s.pos.epoch == e && s.pos.step == per_epoch);
  }
  ct_sampler_free(&s);
}

CT_TEST(sampler, ranks_split_the_global_selection) {
  /* 3 ranks x batch 2 x accumulation 2 = E 12, against one rank of batch 6 */
  static const ct_sampler_bucket bk[2] = {{"1.0", 13}, {"1.5", 25}};
  const ct_sampler_set sets[2] = {{"x", 2.0, 2, bk, 1}, {"y", 1.0, 1, bk + 1, 1}};
  ct_err err = {0};
  ct_sampler g, r[3];
  REQUIRE(ct_sampler_init(&g, sets, 2, 7, 6, 1, 2, &err) == CT_OK);
  for (int k = 0; k < 3; k++) REQUIRE(ct_sampler_init(&r[k], sets, 2, 7, 2, 3, 2, &err) == CT_OK);
  for (int t = 0; t < 30; t++) {
    rec G, R[3];
    int ok = 0;
    record(&g, 0, &G, &err, &ok);
    REQUIRE(ok);
    for (int k = 0; k < 3; k++) {
      record(&r[k], k, &R[k], &err, &ok);
      REQUIRE(ok);
      CHECK(R[k].st.flat == G.st.flat && R[k].st.base == G.st.base &&
            R[k].st.first_id == G.st.first_id && R[k].st.epoch == G.st.epoch);
    }
    /* micro-batch m: rank k's samples are the global micro-batch's [2k, 2k+2) */
    unsigned char hit[12] = {0};
    for (int m = 0; m < 2; m++)
      for (int k = 0; k < 3; k++)
        for (int i = 0; i < 2; i++) {
          CHECK(R[k].img[m][i] == G.img[m][2 * k + i]);
          CHECK(R[k].ids[m][i] == G.ids[m][2 * k + i]);
          uint64_t off = R[k].ids[m][i] - G.st.first_id;
          REQUIRE(off < 12);
          hit[off]++;
        }
    for (int i = 0; i < 12; i++) CHECKF(hit[i] == 1, "step %d: id %d taken %d times", t, i, hit[i]);
  }
  ct_sampler_free(&g);
  for (int k = 0; k < 3; k++) ct_sampler_free(&r[k]);
}

CT_TEST(sampler, state_json_format) {
  ct_err err = {0};
  ct_sampler s;
  REQUIRE(ct_sampler_init(&s, two_sets, 2, 1, 1, 2, 2, &err) == CT_OK);
  char *j = ct_sampler_state_json(&s, &s.pos);
  REQUIRE(j != NULL);
  /* the checkpoint format (sampler_state.json): checkpoints of earlier runs must still load */
  CHECKF(!strcmp(j,
                 "{\"version\": 1, \"epoch\": 0, \"step_in_epoch\": 0, \"samples_seen\": 0, "
                 "\"datasets\": {\"a\": {\"repeats\": 1, \"consumed\": {\"1.0\": 0, \"1.5\": 0, "
                 "\"0.67\": 0}}, \"b\": {\"repeats\": 0, \"consumed\": {\"1.0\": 0}}}}"),
         "%s", j);
  free(j);
  const char *saved =
      "{\"version\": 1, \"epoch\": 3, \"step_in_epoch\": 2, \"samples_seen\": 132, \"datasets\": "
      "{\"a\": {\"repeats\": 1, \"consumed\": {\"1.0\": 4, \"1.5\": 0, \"0.67\": 8}}, "
      "\"b\": {\"repeats\": 0, \"consumed\": {\"1.0\": 0}}}}";
  int changed = -1;
  REQUIRE(ct_sampler_state_restore(&s, saved, &changed, &err) == CT_OK);
  CHECK(changed == 0 && s.pos.epoch == 3 && s.pos.step == 2 && s.pos.seen == 132);
  CHECK(s.pos.consumed[0] == 4 && s.pos.consumed[1] == 0 && s.pos.consumed[2] == 8);
  j = ct_sampler_state_json(&s, &s.pos);
  CHECK(j && !strcmp(j, saved));
  free(j);
  /* the datasets changed: a bucket gone, a count beyond a bucket, a set missing */
  const char *other =
      "{\"version\": 1, \"epoch\": 1, \"step_in_epoch\": 0, \"samples_seen\": 40, \"datasets\": "
      "{\"a\": {\"repeats\": 1, \"consumed\": {\"1.0\": 4, \"1.5\": 99}}, \"gone\": {}}}";
  REQUIRE(ct_sampler_state_restore(&s, other, &changed, &err) == CT_OK);
  CHECK(changed == 1 && s.pos.epoch == 1 && s.pos.seen == 40);
  CHECK(s.pos.consumed[0] == 4 && s.pos.consumed[1] == 0 && s.pos.consumed[2] == 0 &&
        s.pos.consumed[3] == 0);
  ct_sampler_free(&s);
}

CT_TEST(sampler, state_json_rejects_bad_text) {
  ct_err err = {0};
  ct_sampler s;
  REQUIRE(ct_sampler_init(&s, two_sets, 2, 5, 2, 1, 1, &err) == CT_OK);
  ct_sampler_step st;
  for (int t = 0; t < 3; t++) REQUIRE(ct_sampler_next(&s, &st, &err) == CT_OK);
  char *good = ct_sampler_state_json(&s, &s.pos);
  REQUIRE(good != NULL);
  static const struct {
    const char *text, *says;
  } bad[] = {
      {"hello", "sampler state: "},
      {"", "sampler state: "},
      {"[1, 2]", "not a JSON object"},
      {"{\"epoch\": 0, \"step_in_epoch\": 0, \"samples_seen\": 0, \"datasets\": {}}",
       "\"version\""},
      {"{\"version\": 2, \"epoch\": 0, \"step_in_epoch\": 0, \"samples_seen\": 0, \"datasets\": "
       "{}}",
       "version 2"},
      {"{\"version\": \"1\", \"epoch\": 0, \"step_in_epoch\": 0, \"samples_seen\": 0}",
       "\"version\" is not an integer"},
      {"{\"version\": 1, \"step_in_epoch\": 0, \"samples_seen\": 0, \"datasets\": {}}",
       "\"epoch\""},
      {"{\"version\": 1, \"epoch\": -1, \"step_in_epoch\": 0, \"samples_seen\": 0, \"datasets\": "
       "{}}",
       "\"epoch\" is negative"},
      {"{\"version\": 1, \"epoch\": 0, \"step_in_epoch\": 1.5, \"samples_seen\": 0, \"datasets\": "
       "{}}",
       "\"step_in_epoch\" is not an integer"},
      {"{\"version\": 1, \"epoch\": 0, \"step_in_epoch\": 0, \"datasets\": {}}",
       "\"samples_seen\""},
      {"{\"version\": 1, \"epoch\": 0, \"step_in_epoch\": 0, \"samples_seen\": 0}",
       "\"datasets\" is missing"},
      {"{\"version\": 1, \"epoch\": 0, \"step_in_epoch\": 0, \"samples_seen\": 0, \"datasets\": 3}",
       "\"datasets\" is not an object"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    int changed = 0;
    memset(&err, 0, sizeof err);
    CHECKF(ct_sampler_state_restore(&s, bad[k].text, &changed, &err) == CT_ERR_FORMAT, "%s",
           bad[k].text);
    CHECKF(strstr(err.msg, bad[k].says) != NULL, "'%s' said '%s'", bad[k].text, err.msg);
  }
  /* every truncation of a good state fails too */
  const size_t n = strlen(good);
  for (size_t cut = 0; cut < n; cut++) {
    char *t = strndup(good, cut);
    int changed = 0;
    REQUIRE(t != NULL);
    CHECKF(ct_sampler_state_restore(&s, t, &changed, &err) == CT_ERR_FORMAT, "cut at %zu", cut);
    CHECK(strncmp(err.msg, "sampler state: ", 15) == 0);
    free(t);
  }
  int changed = 0;
  CHECK(ct_sampler_state_restore(&s, NULL, &changed, &err) == CT_ERR_FORMAT);
  /* none of that moved the position */
  char *after = ct_sampler_state_json(&s, &s.pos);
  CHECK(after && !strcmp(after, good));
  free(after);
  free(good);
  ct_sampler_free(&s);
}

CT_TEST(sampler, init_and_next_name_the_problem) {
  ct_err err = {0};
  ct_sampler s;
  static const ct_sampler_bucket bk[1] = {{"1.0", 3}};
  const ct_sampler_set dup[2] = {{"a", 1, 0, bk, 1}, {"a", 1, 0, bk, 1}};
  CHECK(ct_sampler_init(&s, dup, 2, 1, 1, 1, 1, &err) == CT_ERR_INVALID && strstr(err.msg, "'a'"));
  ct_sampler_free(&s);
  const ct_sampler_set zero = {"z", 0, 0, bk, 1};
  CHECK(ct_sampler_init(&s, &zero, 1, 1, 1, 1, 1, &err) == CT_ERR_INVALID &&
        strstr(err.msg, "probability"));
  ct_sampler_free(&s);
  const ct_sampler_set neg = {"n", 1, -1, bk, 1};
  CHECK(ct_sampler_init(&s, &neg, 1, 1, 1, 1, 1, &err) == CT_ERR_INVALID &&
        strstr(err.msg, "repeats"));
  ct_sampler_free(&s);
  const ct_sampler_set one = {"o", 1, 0, bk, 1};
  CHECK(ct_sampler_init(&s, &one, 1, 1, 0, 1, 1, &err) == CT_ERR_INVALID);
  ct_sampler_free(&s);
  /* 3 images cannot fill a step of E = 4: next says so (it never aborts) */
  REQUIRE(ct_sampler_init(&s, &one, 1, 1, 2, 2, 1, &err) == CT_OK);
  ct_sampler_step st;
  CHECK(ct_sampler_next(&s, &st, &err) == CT_ERR_INVALID && strstr(err.msg, "4 entries"));
  ct_sampler_free(&s);
}
