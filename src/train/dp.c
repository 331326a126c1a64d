/* The parallel strategy of a config: one ct_dp_ops table per data-parallel
 * mode (docs/distributed.md). The 1-bit optimizers communicate themselves;
 * ZeRO-2/3 and bf16 storage work through the model's segment hooks; ZeRO-1
 * in float32 reduce-scatters the full gradient; otherwise plain all-reduce. */
#include <string.h>

#include "trainer_int.h"

const ct_dp_ops *ct_dp_pick(const ct_config *cfg) {
  const ct_optim_info *oi = ct_optim_lookup(cfg->optimizer, NULL);
  if (oi && (oi->flags & CT_OPTIM_ONEBIT)) return &ct_dp_onebit;
  if (cfg->zero_stage >= 2 || !strcmp(cfg->mixed_precision, "bf16")) return &ct_dp_zero;
  if (cfg->zero_stage == 1) return &ct_dp_zero1;
  return &ct_dp_plain;
}
