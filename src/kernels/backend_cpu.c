/* The CPU compute backend: host memory and the kernels of
 * include/ctuner/kernels.h, entry for entry.
 *
 * Every op pointer is the kernel function itself (no wrapper, no copy), so
 * code that goes through this table computes exactly the bits the free
 * functions compute. Memory is ct_alloc'd host memory, counted per category;
 * copies are memcpy; ops finish before they return, so synchronize has nothing
 * to wait for.
 * Not here: the kernels (act.c, attention.c, conv.c, ...), the registry
 * (backend.c).
 */
#include <string.h>

#include "ctuner/backend.h"

static void *cpu_alloc(ct_mem_cat cat, size_t bytes) {
  return ct_alloc(cat, bytes);
}

static void cpu_free(void *p) {
  ct_free(p);
}

static void cpu_copy(void *dst, const void *src, size_t bytes) {
  if (bytes) memmove(dst, src, bytes);
}

static void cpu_synchronize(void) {}

const ct_backend_ops ct_backend_cpu = {
    .name = "cpu",
    .description = "host memory, OpenMP kernels, AVX-512/AVX2 SGEMM or OpenBLAS (float32)",
    .precision_bits = 24,

    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_in = cpu_copy,
    .copy_out = cpu_copy,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,

    .sgemm = ct_sgemm,
    .sgemm_deterministic = ct_sgemm_deterministic,
    .linear_fwd = ct_linear_fwd,
    .linear_bwd = ct_linear_bwd,
    .linear_fwd_w = ct_linear_fwd_w,
    .linear_bwd_w = ct_linear_bwd_w,

    .attention_fwd = ct_attention_fwd,
    .attention_bias_fwd = ct_attention_bias_fwd,
    .attention_bwd = ct_attention_bwd,
    .rope_table = ct_rope_table,
    .rope_fwd = ct_rope_fwd,
    .rope_bwd = ct_rope_bwd,
    .qkv_heads_fwd = ct_qkv_heads_fwd,
    .qkv_heads_bwd = ct_qkv_heads_bwd,

    .ln_mod_fwd = ct_ln_mod_fwd,
    .ln_mod_bwd = ct_ln_mod_bwd,
    .layernorm_affine_fwd = ct_layernorm_affine_fwd,
    .rmsnorm_fwd = ct_rmsnorm_fwd,
    .rmsnorm_bwd = ct_rmsnorm_bwd,
    .groupnorm_fwd = ct_groupnorm_fwd,
    .groupnorm_bwd = ct_groupnorm_bwd,

    .conv2d_col_floats = ct_conv2d_col_floats,
    .conv2d_fwd = ct_conv2d_fwd,
    .conv2d_bwd = ct_conv2d_bwd,
    .upsample2x_fwd = ct_upsample2x_fwd,
    .upsample2x_bwd = ct_upsample2x_bwd,
    .nchw_to_nlc = ct_nchw_to_nlc,
    .nlc_to_nchw = ct_nlc_to_nchw,
    .tile_blend = ct_tile_blend,
    .patchify = ct_patchify,
    .unpatchify = ct_unpatchify,

    .silu_fwd = ct_silu_fwd,
    .silu_bwd = ct_silu_bwd,
    .gelu_tanh_fwd = ct_gelu_tanh_fwd,
    .gelu_tanh_bwd = ct_gelu_tanh_bwd,
    .quick_gelu_fwd = ct_quick_gelu_fwd,
    .gelu_erf_fwd = ct_gelu_erf_fwd,
    .gate_res_fwd = ct_gate_res_fwd,
    .gate_res_bwd = ct_gate_res_bwd,
    .add_inplace = ct_add_inplace,
    .scale_inplace = ct_scale_inplace,
    .mul_inplace = ct_mul_inplace,
    .copy_2d = ct_copy_2d,
    .clamp_fwd = ct_clamp_fwd,
    .clamp_bwd = ct_clamp_bwd,
    .zero = ct_zero,
    .timestep_embedding = ct_timestep_embedding,
    .embedding_fwd = ct_embedding_fwd,
    .mse_fwd_bwd = ct_mse_fwd_bwd,

    .adam_update = ct_adam_update,
    .adagrad_update = ct_adagrad_update,
    .lion_update = ct_lion_update,
    .sgd_update = ct_sgd_update,
    .ema_update = ct_ema_update,
    .sumsq = ct_sumsq,
};
