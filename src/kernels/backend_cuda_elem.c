/* The CUDA backend's element-wise, normalisation, position, layout, loss and
 * optimizer ops (src/kernels/cuda/, one .cu per family; entry points in
 * cuda_elem.h): the table fields they fill, the residency ops (bf16 storage,
 * LoRA dropout: keep as the CPU's resident.c computes it from the float p) too.
 * Not filled here: the products, attention and conv2d (backend_cuda_gemm.c). */
#ifdef CT_CUDA
#include "cuda_elem.h"
#include "cuda_rt.h"

void ct_cuda_fill_elem(ct_backend_ops *t) {
#define SET(f) t->f = ct_cu_##f
  SET(rope_table);
  SET(rope_fwd);
  SET(rope_bwd);
  SET(qkv_heads_fwd);
  SET(qkv_heads_bwd);
  SET(ln_mod_fwd);
  SET(ln_mod_bwd);
  SET(layernorm_affine_fwd);
  SET(rmsnorm_fwd);
  SET(rmsnorm_bwd);
  SET(groupnorm_fwd);
  SET(groupnorm_bwd);
  SET(upsample2x_fwd);
  SET(upsample2x_bwd);
  SET(nchw_to_nlc);
  SET(nlc_to_nchw);
  SET(tile_blend);
  SET(patchify);
  SET(unpatchify);
  SET(silu_fwd);
  SET(silu_bwd);
  SET(gelu_tanh_fwd);
  SET(gelu_tanh_bwd);
  SET(quick_gelu_fwd);
  SET(gelu_erf_fwd);
  SET(gate_res_fwd);
  SET(gate_res_bwd);
  SET(add_inplace);
  SET(scale_inplace);
  SET(mul_inplace);
  SET(copy_2d);
  SET(zero);
  SET(clamp_fwd);
  SET(clamp_bwd);
  SET(timestep_embedding);
  SET(embedding_fwd);
  SET(mse_fwd_bwd);
  SET(adam_update);
  SET(adagrad_update);
  SET(lion_update);
  SET(sgd_update);
  SET(ema_update);
  SET(sumsq);
  SET(bf16_widen);
  SET(bf16_narrow);
  SET(bf16_narrow_acc);
  SET(dropout_fwd);
  SET(dropout_bwd);
#undef SET
}
#else
typedef int ct_backend_cuda_elem_not_built; /* CT_CUDA off */
#endif
