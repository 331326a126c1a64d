/* rng.c: Philox4x32-10 counter-based RNG and parallel fills.
 *
 * Mapping of (seed, stream, index) onto Philox's 128-bit counter and 64-bit key:
 *   key     = (seed low 32 bits, seed high 32 bits)
 *   counter = (index low, index high, stream low, stream high)
 * so every element's value is a pure function of those numbers and a parallel
 * fill may split the index range in any way (results are bitwise identical for
 * any thread count). Uniforms take the top 24 bits of word 0; normals use
 * Box-Muller on words 0 and 1 (cosine branch only), computed in double and
 * rounded to float. Words 2 and 3 are unused by the float helpers.
 * Not a cryptographic generator.
 */
#include "ctuner/rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void philox_round(uint32_t c[4], const uint32_t k[2]) {
  uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
  uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
  uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
  uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
  uint32_t n0 = hi1 ^ c[1] ^ k[0];
  uint32_t n2 = hi0 ^ c[3] ^ k[1];
  c[0] = n0;
  c[1] = lo1;
  c[2] = n2;
  c[3] = lo0;
}

void ct_philox4x32_raw(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
  uint32_t k[2] = {key[0], key[1]};
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k[0] += PHILOX_W0;
      k[1] += PHILOX_W1;
    }
    philox_round(c, k);
  }
  for (int i = 0; i < 4; i++) out[i] = c[i];
}

void ct_philox4x32(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
  const uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream,
                           (uint32_t)(stream >> 32)};
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  ct_philox4x32_raw(ctr, key, out);
}

float ct_rng_uniform(uint64_t seed, uint64_t stream, uint64_t i) {
  uint32_t w[4];
  ct_philox4x32(seed, stream, i, w);
  return (float)(w[0] >> 8) * 0x1p-24f;
}

float ct_rng_normal(uint64_t seed, uint64_t stream, uint64_t i) {
  uint32_t w[4];
  ct_philox4x32(seed, stream, i, w);
  double u1 = ((double)(w[0] >> 8) + 1.0) * 0x1p-24; /* (0, 1]: log is finite */
  double u2 = (double)(w[1] >> 8) * 0x1p-24;         /* [0, 1) */
  double r = sqrt(-2.0 * log(u1));
  return (float)(r * cos(6.283185307179586476925286766559 * u2));
}

#define PAR_MIN 4096

void ct_rng_fill_normal(float *out, size_t n, uint64_t seed, uint64_t stream, uint64_t offset,
                        float mean, float std) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) out[i] = mean + std * ct_rng_normal(seed, stream, offset + i);
}

void ct_rng_fill_uniform(float *out, size_t n, uint64_t seed, uint64_t stream, uint64_t offset,
                         float lo, float hi) {
  float span = hi - lo;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
  for (size_t i = 0; i < n; i++) out[i] = lo + span * ct_rng_uniform(seed, stream, offset + i);
}
