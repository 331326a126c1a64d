/* The CPU compute backend: host memory and the kernels of
 * include/ctuner/kernels.h, entry for entry.
 *
 * Every op pointer is the kernel function itself (no wrapper, no copy), so
 * code that goes through this table computes exactly the bits the free
 * functions compute. Memory is ct_alloc'd host memory, counted per category;
 * copies are memcpy; ops finish before they return, so synchronize has nothing
 * to wait for.
 * "cpu-bf16" is the same backend with the matrix products of --mixed_precision
 * bf16 (ct_compute, docs/gemm.md): sgemm, linear and conv2d by ct_sgemm_bf16
 * (operands rounded to bf16, float32 sums); every other op, and its memory,
 * are the CPU backend's. It is built from ct_backend_cpu on first use, so it
 * has every op the CPU backend has.
 * Not here: the kernels (act.c, attention.c, conv.c, ...), the registry
 * (backend.c).
 */
#include <string.h>
#include <threads.h>

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
    .compute = CT_COMPUTE_F32,
    .host_memory = 1,

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
    .attention_cross_fwd = ct_attention_cross_fwd,
    .attention_cross_bwd = ct_attention_cross_bwd,
    .attention_mask_fwd = ct_attention_mask_fwd,
    .attention_mask_bwd = ct_attention_mask_bwd,
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
    .gelu_erf_bwd = ct_gelu_erf_bwd,
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

    .bf16_widen = ct_bf16_widen,
    .bf16_narrow = ct_bf16_narrow,
    .bf16_narrow_acc = ct_bf16_narrow_acc,
    .dropout_fwd = ct_dropout_fwd,
    .dropout_bwd = ct_dropout_bwd,
};

static ct_backend_ops cpu_bf16;
static once_flag cpu_bf16_once = ONCE_FLAG_INIT;

static void cpu_bf16_init(void) {
  cpu_bf16 = ct_backend_cpu;
  cpu_bf16.name = "cpu-bf16";
  cpu_bf16.description =
      "the cpu backend with bf16 matrix products (AVX512-BF16 or rounded copies), float32 "
      "sums and every other op float32";
  cpu_bf16.precision_bits = 8;
  cpu_bf16.compute = CT_COMPUTE_BF16;
  cpu_bf16.sgemm = ct_sgemm_bf16;
  cpu_bf16.linear_fwd = ct_linear_fwd_bf16;
  cpu_bf16.linear_bwd = ct_linear_bwd_bf16;
  cpu_bf16.conv2d_fwd = ct_conv2d_fwd_bf16;
  cpu_bf16.conv2d_bwd = ct_conv2d_bwd_bf16;
  cpu_bf16.attention_fwd = ct_attention_fwd_bf16; /* every product bf16, softmax float32 */
  cpu_bf16.attention_bwd = ct_attention_bwd_bf16;
}

const ct_backend_ops *ct_backend_cpu_bf16(void) {
  call_once(&cpu_bf16_once, cpu_bf16_init);
  return &cpu_bf16;
}
