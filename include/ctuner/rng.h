/* Counter-based RNG (Philox4x32-10).
 *
 * The value at (seed, stream, index) is a pure function of those three numbers,
 * so results never depend on the thread count or the order of generation:
 * a parallel fill splits the index range freely.
 */
#ifndef CTUNER_RNG_H
#define CTUNER_RNG_H

#include <stddef.h>
#include <stdint.h>

/* Four 32-bit random words for counter `index` in (seed, stream). */
void ct_philox4x32(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]);
/* The Philox4x32-10 block function on explicit words. ct_philox4x32 calls it with
 * ctr = (index lo, index hi, stream lo, stream hi), key = (seed lo, seed hi). */
void ct_philox4x32_raw(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Uniform in [0,1) for element i (24-bit resolution, never 1.0). */
float ct_rng_uniform(uint64_t seed, uint64_t stream, uint64_t i);
/* Standard normal for element i (Box-Muller on the counter's words). */
float ct_rng_normal(uint64_t seed, uint64_t stream, uint64_t i);

/* out[i] = mean + std * N(0,1) at index (offset + i); OpenMP-parallel, thread-count independent. */
void ct_rng_fill_normal(float *out, size_t n, uint64_t seed, uint64_t stream, uint64_t offset,
                        float mean, float std);
/* out[i] = lo + (hi-lo) * U[0,1) at index (offset + i). */
void ct_rng_fill_uniform(float *out, size_t n, uint64_t seed, uint64_t stream, uint64_t offset,
                         float lo, float hi);

/* Streams the data loader draws from, keyed by the global sample id. */
#define CT_STREAM_DROPOUT 0x44524f5000000000ull /* caption dropout */
#define CT_STREAM_CAPTION 0x4341505400000000ull /* caption line choice */

#endif
