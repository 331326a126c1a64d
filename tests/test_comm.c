/* The communicator. Under ctest this runs on one process (the single-process
 * communicator); tests/cli_dist.sh also runs it under mpirun with 2 and 3
 * ranks, where every collective is checked against the sums computed locally
 * in rank order (bit-exact: the reductions promise that order). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctuner/comm.h"
#include "ctuner/safetensors.h"
#include "harness.h"

/* Exactly representable terms, so no FMA contraction can change a value; the
 * sums are then exact too, which makes the expected result unambiguous. */
static float val(int rank, size_t i) {
  return (float)(rank + 1) * 0.5f + (float)(i % 1013) * 0.25f;
}

CT_TEST(comm, collectives) {
  ct_err err = {0};
  ct_comm *c = NULL;
  REQUIRE(ct_comm_init(0, &c, &err) == CT_OK);
  const int R = ct_comm_rank(c), N = ct_comm_size(c);
  CHECK(R >= 0 && R < N);
  CHECK(ct_comm_local_rank(c) >= 0 && ct_comm_local_rank(c) < ct_comm_local_size(c));
  CHECK(ct_comm_shard_len(100, 3) == 48 && ct_comm_shard_len(0, 2) == 0 &&
        ct_comm_shard_len(16, 1) == 16);

  /* all-reduce: odd length, and one larger than a chunk per shard (4M floats). */
  const size_t lens[] = {1, 1000003, (size_t)9 << 20};
  for (int k = 0; k < 3; k++) {
    const size_t n = lens[k];
    float *x = malloc(n * sizeof *x);
    REQUIRE(x);
    for (size_t i = 0; i < n; i++) x[i] = val(R, i);
    REQUIRE(ct_comm_allreduce_f32(c, x, n, &err) == CT_OK);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
      float want = val(0, i);
      for (int p = 1; p < N; p++) want += val(p, i);
      bad += memcmp(&want, &x[i], sizeof want) != 0;
    }
    CHECKF(bad == 0, "n %zu: %zu elements differ from the rank-order sum", n, bad);
    free(x);
  }

  /* reduce-scatter + all-gather of a shard larger than a chunk. */
  const size_t shard = ((size_t)4 << 20) + 48;
  float *send = malloc((size_t)N * shard * sizeof *send), *mine = malloc(shard * sizeof *mine);
  float *all = malloc((size_t)N * shard * sizeof *all);
  REQUIRE(send && mine && all);
  for (size_t i = 0; i < (size_t)N * shard; i++) send[i] = val(R, i);
  REQUIRE(ct_comm_reduce_scatter_f32(c, send, (size_t)N * shard, mine, shard, &err) == CT_OK);
  size_t bad = 0;
  for (size_t i = 0; i < shard; i++) {
    size_t gi = (size_t)R * shard + i;
    float want = val(0, gi);
    for (int p = 1; p < N; p++) want += val(p, gi);
    bad += want != mine[i];
  }
  CHECKF(bad == 0, "reduce-scatter: %zu elements wrong", bad);
  for (size_t i = 0; i < shard; i++) mine[i] = (float)R + (float)(i % 7);
  REQUIRE(ct_comm_allgather_f32(c, mine, all, shard, (size_t)N * shard, &err) == CT_OK);
  bad = 0;
  for (int p = 0; p < N; p++)
    for (size_t i = 0; i < shard; i++)
      bad += all[(size_t)p * shard + i] != (float)p + (float)(i % 7);
  CHECKF(bad == 0, "all-gather: %zu elements wrong", bad);
  /* in place: this rank's shard already sits in the output */
  for (size_t i = 0; i < 1000; i++) all[(size_t)R * 1000 + i] = (float)R * 2 + 1;
  REQUIRE(ct_comm_allgather_f32(c, all + (size_t)R * 1000, all, 1000, (size_t)N * 1000, &err) ==
          CT_OK);
  bad = 0;
  for (int p = 0; p < N; p++)
    for (size_t i = 0; i < 1000; i++) bad += all[(size_t)p * 1000 + i] != (float)p * 2 + 1;
  CHECKF(bad == 0, "in-place all-gather: %zu elements wrong", bad);
  free(send);
  free(mine);
  free(all);

  /* ragged: n = N * shard - 37 valid floats; the tail past n reads as zeros
   * and is never written */
  {
    const size_t sh = 1000, n = (size_t)N * sh - 37;
    float *in = malloc(n * sizeof *in), *part = malloc(sh * sizeof *part),
          *out = malloc((n + 1) * sizeof *out);
    REQUIRE(in && part && out);
    for (size_t i = 0; i < n; i++) in[i] = val(R, i);
    const size_t m = ct_comm_shard_valid(n, sh, R);
    CHECK(m == (R == N - 1 ? sh - 37 : sh));
    part[sh - 1] = -5;
    REQUIRE(ct_comm_reduce_scatter_f32(c, in, n, part, sh, &err) == CT_OK);
    size_t badr = 0;
    for (size_t i = 0; i < m; i++) {
      size_t gi = (size_t)R * sh + i;
      float want = val(0, gi);
      for (int p = 1; p < N; p++) want += val(p, gi);
      badr += want != part[i];
    }
    CHECKF(badr == 0, "ragged reduce-scatter: %zu wrong", badr);
    if (m < sh) CHECKF(part[sh - 1] == -5, "reduce-scatter wrote past its valid %zu floats", m);
    /* in place, into this rank's own slot of the input */
    float *inp = malloc(n * sizeof *inp);
    REQUIRE(inp);
    for (size_t i = 0; i < n; i++) inp[i] = val(R, i);
    REQUIRE(ct_comm_reduce_scatter_f32(c, inp, n, inp + (size_t)R * sh, sh, &err) == CT_OK);
    CHECK(!memcmp(inp + (size_t)R * sh, part, m * sizeof(float)));
    /* in-place all-gather completes it */
    REQUIRE(ct_comm_allgather_f32(c, inp + (size_t)R * sh, inp, sh, n, &err) == CT_OK);
    badr = 0;
    for (size_t i = 0; i < n; i++) {
      float want = val(0, i);
      for (int p = 1; p < N; p++) want += val(p, i);
      badr += want != inp[i];
    }
    CHECKF(badr == 0, "in-place ragged all-gather: %zu wrong", badr);
    /* gather to the last rank only: the same values there */
    float *g = R == N - 1 ? malloc(n * sizeof *g) : NULL;
    REQUIRE(R != N - 1 || g);
    REQUIRE(ct_comm_gather_f32(c, part, g, sh, n, N - 1, &err) == CT_OK);
    if (g) {
      CHECK(!memcmp(g, inp, n * sizeof(float)));
      free(g);
    }
    free(inp);
    out[n] = -7;
    REQUIRE(ct_comm_allgather_f32(c, part, out, sh, n, &err) == CT_OK);
    badr = 0;
    for (size_t i = 0; i < n; i++) {
      float want = val(0, i);
      for (int p = 1; p < N; p++) want += val(p, i);
      badr += want != out[i];
    }
    CHECKF(badr == 0 && out[n] == -7, "ragged all-gather: %zu wrong, guard %g", badr, out[n]);
    free(in);
    free(part);
    free(out);
  }
  /* non-blocking range collectives: buckets in backward order (from the end
   * of the buffer), crossing shard borders or not, two in flight at a time;
   * the reductions accumulate onto what the shard already holds */
  {
    const size_t n = 10007, sh = ct_comm_shard_len(n, N);
    const size_t cuts[] = {n, 9000, 8999, 5003, 5002, 1234, 17, 0};
    const int nb = (int)(sizeof cuts / sizeof *cuts) - 1;
    float *full = malloc(n * sizeof *full), *acc = malloc(sh * sizeof *acc),
          *got = malloc(n * sizeof *got);
    REQUIRE(full && acc && got);
    for (size_t i = 0; i < n; i++) full[i] = val(R, i);
    for (size_t i = 0; i < sh; i++) acc[i] = 1.0f;
    ct_comm_req *q[8] = {0};
    for (int k = 0; k < nb; k++) {
      const size_t a = cuts[k + 1], b = cuts[k];
      REQUIRE(ct_comm_ireduce_scatter(c, full + a, a, b, sh, acc, &q[k], &err) == CT_OK);
      int done = 0;
      REQUIRE(ct_comm_test(c, q[k], &done, &err) == CT_OK);
      if (k >= 1) REQUIRE(ct_comm_wait(c, q[k - 1], &err) == CT_OK);
    }
    REQUIRE(ct_comm_wait(c, q[nb - 1], &err) == CT_OK);
    size_t badr = 0, m = ct_comm_shard_valid(n, sh, R);
    for (size_t i = 0; i < m; i++) {
      size_t gi = (size_t)R * sh + i;
      float want = val(0, gi);
      for (int p = 1; p < N; p++) want += val(p, gi);
      badr += 1.0f + want != acc[i];
    }
    for (size_t i = m; i < sh; i++) badr += acc[i] != 1.0f;
    CHECKF(badr == 0, "bucketed reduce-scatter: %zu wrong", badr);
    /* gather the same ranges back from every rank's shard */
    for (size_t i = 0; i < m; i++) acc[i] = (float)((size_t)R * sh + i);
    memset(got, 0, n * sizeof *got);
    for (int k = 0; k < nb; k++) {
      const size_t a = cuts[k + 1], b = cuts[k];
      REQUIRE(ct_comm_iallgather(c, acc, a, b, sh, got + a, &q[k], &err) == CT_OK);
    }
    for (int k = 0; k < nb; k++) REQUIRE(ct_comm_wait(c, q[k], &err) == CT_OK);
    badr = 0;
    for (size_t i = 0; i < n; i++) badr += got[i] != (float)i;
    CHECKF(badr == 0, "range all-gather: %zu wrong", badr);
    CHECK(ct_comm_wait(c, NULL, &err) == CT_OK);
    free(full);
    free(acc);
    free(got);
  }
  /* bf16: whole-buffer all-reduce and an accumulating range reduce-scatter;
   * small integers, so every bf16 sum is exact */
  {
    const size_t n = 10007, sh = ct_comm_shard_len(n, N);
    uint16_t *b = malloc(n * sizeof *b), *acc = malloc(sh * sizeof *acc);
    REQUIRE(b && acc);
    for (size_t i = 0; i < n; i++) b[i] = ct_f32_to_bf16((float)(R + 1) + (float)(i % 7) * 2);
    REQUIRE(ct_comm_allreduce_bf16(c, b, n, &err) == CT_OK);
    size_t badb = 0;
    for (size_t i = 0; i < n; i++) {
      float want = 0;
      for (int p = 0; p < N; p++) want += (float)(p + 1) + (float)(i % 7) * 2;
      badb += ct_bf16_to_f32(b[i]) != want;
    }
    CHECKF(badb == 0, "bf16 all-reduce: %zu wrong", badb);
    for (size_t i = 0; i < n; i++) b[i] = ct_f32_to_bf16((float)(R + 1));
    for (size_t i = 0; i < sh; i++) acc[i] = ct_f32_to_bf16(3.0f);
    ct_comm_req *q = NULL;
    REQUIRE(ct_comm_ireduce_scatter_t(c, CT_COMM_BF16, CT_COMM_ACCUMULATE, b + 100, 100, 9000, sh,
                                      acc, &q, &err) == CT_OK);
    REQUIRE(ct_comm_wait(c, q, &err) == CT_OK);
    badb = 0;
    for (size_t i = 0; i < sh; i++) {
      size_t gi = (size_t)R * sh + i;
      float want = 3.0f + (gi >= 100 && gi < 9000 ? (float)(N * (N + 1) / 2) : 0.0f);
      badb += ct_bf16_to_f32(acc[i]) != want;
    }
    CHECKF(badb == 0, "bf16 accumulating range reduce-scatter: %zu wrong", badb);
    free(b);
    free(acc);
  }
  /* raw bytes (a frozen storage sharded by byte ranges, zero.c): a range
   * all-gather at odd byte offsets equals the bytes; a reduce-scatter of
   * bytes is refused */
  {
    const size_t n = 4099, sh = 4 * ct_comm_shard_len((n + 3) / 4, N);
    unsigned char *bmine = malloc(sh), *bgot = calloc(n, 1);
    REQUIRE(bmine && bgot);
    for (size_t i = 0; i < sh; i++) bmine[i] = (unsigned char)(((size_t)R * sh + i) * 131u + 7u);
    ct_comm_req *q = NULL;
    REQUIRE(ct_comm_iallgather_t(c, CT_COMM_U8, bmine, 13, n - 5, sh, bgot + 13, &q, &err) ==
            CT_OK);
    REQUIRE(ct_comm_wait(c, q, &err) == CT_OK);
    size_t badu = 0;
    for (size_t i = 0; i < n; i++)
      badu += bgot[i] != (i >= 13 && i < n - 5 ? (unsigned char)(i * 131u + 7u) : 0);
    CHECKF(badu == 0, "byte range all-gather: %zu wrong", badu);
    CHECK(ct_comm_ireduce_scatter_t(c, CT_COMM_U8, 0, bgot, 0, n, sh, bmine, &q, &err) ==
          CT_ERR_INVALID);
    free(bmine);
    free(bgot);
  }
  double d[2] = {R + 0.25, 1.0};
  REQUIRE(ct_comm_allreduce_f64(c, d, 2, &err) == CT_OK);
  CHECK_NEAR(d[0], N * (N - 1) / 2.0 + 0.25 * N, 0);
  CHECK_NEAR(d[1], (double)N, 0);
  char msg[32] = "";
  if (R == 0) strcpy(msg, "from rank 0");
  REQUIRE(ct_comm_broadcast(c, msg, sizeof msg, 0, &err) == CT_OK);
  CHECK(!strcmp(msg, "from rank 0"));
  CHECK(ct_comm_barrier(c, &err) == CT_OK);

  /* The watchdog (docs/distributed.md, "Watchdog"): a rank late by less than
   * distributed_timeout is waited for, in a blocking collective and in a
   * range operation's wait; results unchanged. (tests/cli_watchdog.sh stops
   * a rank for longer.) The timeout is 10 s for a rank 0.8 s late: on a loaded
   * 2-core machine running 3 ASan ranks, 3 s left too little for scheduling. */
  ct_comm_set_timeout(c, 10.0);
  ct_comm_set_step(c, 7);
  const int late = N > 1 && R == N - 1;
  if (late) usleep(800 * 1000);
  double e[2] = {R + 0.5, 2.0};
  CHECKF(ct_comm_allreduce_f64(c, e, 2, &err) == CT_OK, "late rank: %s", err.msg);
  CHECK_NEAR(e[0], N * (N - 1) / 2.0 + 0.5 * N, 0);
  CHECK_NEAR(e[1], 2.0 * N, 0);
  {
    const size_t n = 1000, sh = ct_comm_shard_len(n, N);
    float *wmine = malloc(sh * sizeof *wmine), *wall = malloc((size_t)N * sh * sizeof *wall);
    REQUIRE(wmine && wall);
    for (size_t i = 0; i < sh; i++) wmine[i] = (float)(R * 10000 + (int)i);
    if (late) usleep(800 * 1000);
    ct_comm_req *q = NULL;
    REQUIRE(ct_comm_iallgather(c, wmine, 0, n, sh, wall, &q, &err) == CT_OK);
    CHECKF(ct_comm_wait(c, q, &err) == CT_OK, "late rank, range all-gather: %s", err.msg);
    size_t badg = 0;
    for (size_t i = 0; i < n; i++)
      badg += wall[i] != (float)((int)(i / sh) * 10000 + (int)(i % sh));
    CHECKF(badg == 0, "range all-gather after a late rank: %zu wrong", badg);
    free(wmine);
    free(wall);
  }
  CHECK(ct_comm_barrier(c, &err) == CT_OK);
  ct_comm_set_timeout(c, CT_COMM_TIMEOUT_DEFAULT);
  ct_comm_free(c);
}
