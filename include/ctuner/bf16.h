/* bf16 <-> float32, inline: the bf16 storage paths convert every parameter
 * and gradient each step (round to nearest even; NaN stays a quiet NaN). */
#ifndef CTUNER_BF16_H
#define CTUNER_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t ct_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float ct_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#endif
