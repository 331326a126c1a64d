// gemm.cu: the CUDA backend's matrix products through cuBLASLt (kernels.h's
// ct_sgemm, ct_linear_* contracts, entry for entry; docs/cuda.md).
//
// One wrapper (mm): row-major C = alpha op(A) op(B) + beta C as the
// column-major product C^T = op(B)^T op(A)^T (gemm_map.cuh), on the backend's
// one stream, with a fixed 32 MiB workspace. Descriptor, layouts and algorithm
// are made once per (transA, transB, M, N, K, lda, ldb, ldc, dtype, epilogue,
// pointer alignments) and cached: the heuristic is asked once per shape, never
// again for it. Determinism: the preference's reduction-scheme mask is NONE (no
// split-K reduction, so no atomics; only if the heuristic then offers nothing,
// split-K reduced out of place in the workspace, still without atomics), and a
// cached algorithm is the same every call, so the same inputs give the same
// bits (cuBLASLt's promise for a fixed algorithm on one GPU model).
//
// float32 ("cuda"): CUDA_R_32F operands, CUBLAS_COMPUTE_32F (no TF32: the
// float32 contract holds). bf16 ("cuda-bf16"): A and B are cast to bf16 (round
// to nearest even, as ct_sgemm_bf16) into scratch by a small kernel, then
// CUDA_R_16BF operands, CUBLAS_COMPUTE_32F, float32 C: cpu-bf16's arithmetic up
// to the order of the sums (should the heuristic have no bf16 algorithm for a
// shape, the rounded operands are widened to float32 and multiplied there: bf16
// products are exact in float32, so the arithmetic is the same). sgemm_deterministic
// (Muon) is float32 in both rows.
//
// Linear: the forward adds the bias by the BIAS epilogue (when the heuristic
// has no algorithm with it, by a fill of the bias rows and beta = 1); the
// backward's db is a deterministic two-pass column sum in double (no atomics,
// fixed chunks of rows summed in order), "+=" as linear.c. Weight views: bf16
// and int8 are dequantised into scratch (float32 for "cuda"; bf16 for
// "cuda-bf16", where a bf16 view is used as it is) and multiplied like a
// float32 weight.
//
// Errors: every CUDA and cuBLASLt status goes to the sticky error (ct_cu_note)
// with the shape in the message.
#include <cublasLt.h>
#include <stdio.h>

#include <mutex>

#include "common.cuh"
#include "gemm_map.cuh"

namespace {

constexpr size_t kWorkspace = (size_t)32 << 20;
constexpr int kCacheMax = 1024;

enum { DT_F32 = 0, DT_BF16 = 1 };
enum { EP_NONE = 0, EP_BIAS = 1 };

struct mm_key {
  int ta, tb, M, N, K, lda, ldb, ldc, dtype, epi;
  unsigned al_a, al_b, al_c, al_bias;
  bool operator==(const mm_key &o) const {
    return !memcmp(this, &o, sizeof o);
  }
};

struct mm_plan {
  mm_key key;
  bool ok;  // an algorithm was found
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
};

std::mutex mu;
cublasLtHandle_t handle;
bool handle_failed;
void *workspace;
mm_plan *plans;
int nplans;

const char *lt_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "CUBLAS_STATUS (other)";
  }
}

// a failed cuBLASLt call into the sticky error, naming the call and the shape
bool lt_ok(cublasStatus_t s, const char *call, const mm_key &k, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  char what[320];
  snprintf(what, sizeof what,
           "%s = %s (transA %d transB %d M %d N %d K %d lda %d ldb %d ldc %d %s%s)", call,
           lt_status_name(s), k.ta, k.tb, k.M, k.N, k.K, k.lda, k.ldb, k.ldc,
           k.dtype == DT_BF16 ? "bf16" : "float32", k.epi == EP_BIAS ? " bias" : "");
  ct_cu_note(s == CUBLAS_STATUS_NOT_SUPPORTED ? cudaErrorNotSupported : cudaErrorUnknown, what,
             __FILE__, line);
  return false;
}
#define LT(call, key) lt_ok((call), #call, (key), __LINE__)

bool ensure_handle(const mm_key &k) {
  if (handle) return true;
  if (handle_failed) {  // every product skipped says so, not only the first
    lt_ok(CUBLAS_STATUS_NOT_INITIALIZED, "cuBLASLt (no handle: an earlier failure)", k, __LINE__);
    return false;
  }
  if (!LT(cublasLtCreate(&handle), k)) {
    handle_failed = true;
    return false;
  }
  workspace = ct_cu_alloc(CT_MEM_OTHER, kWorkspace);
  if (!workspace) {
    ct_cu_note(cudaErrorMemoryAllocation, "cuBLASLt workspace (32 MiB)", __FILE__, __LINE__);
    cublasLtDestroy(handle);
    handle = NULL;
    handle_failed = true;
    return false;
  }
  return true;
}

// The plan for key k, made (descriptor, layouts, heuristic) on first use; NULL on failure.
mm_plan *get_plan(const mm_key &k) {
  for (int i = 0; i < nplans; i++)
    if (plans[i].key == k) return &plans[i];
  if (!plans) {
    plans = (mm_plan *)calloc(kCacheMax, sizeof *plans);
    if (!plans) return NULL;
  }
  if (nplans == kCacheMax) {  // a run has far fewer shapes; forget the oldest half
    for (int i = 0; i < kCacheMax / 2; i++) {
      mm_plan &p = plans[i];
      if (p.la) cublasLtMatrixLayoutDestroy(p.la);
      if (p.lb) cublasLtMatrixLayoutDestroy(p.lb);
      if (p.lc) cublasLtMatrixLayoutDestroy(p.lc);
      if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    }
    memmove(plans, plans + kCacheMax / 2, sizeof *plans * (kCacheMax / 2));
    memset(plans + kCacheMax / 2, 0, sizeof *plans * (kCacheMax / 2));
    nplans = kCacheMax / 2;
  }
  mm_plan &p = plans[nplans];
  memset(&p, 0, sizeof p);
  p.key = k;
  cu_mm_map m = cu_rowmajor_map(k.ta, k.tb, k.M, k.N, k.K, k.lda, k.ldb, k.ldc);
  cudaDataType_t in_t = k.dtype == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasOperation_t opa = m.op_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opb = m.op_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  bool ok =
      LT(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), k) &&
      LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
         k) &&
      LT(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), k);
  if (ok && k.epi == EP_BIAS) {  // not having the epilogue is no error: the caller adds the bias
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    cudaDataType_t bt = CUDA_R_32F;
    ok = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                        sizeof bt) == CUBLAS_STATUS_SUCCESS;
  }
  ok = ok && LT(cublasLtMatrixLayoutCreate(&p.la, in_t, m.a_rows, m.a_cols, m.lda), k) &&
       LT(cublasLtMatrixLayoutCreate(&p.lb, in_t, m.b_rows, m.b_cols, m.ldb), k) &&
       LT(cublasLtMatrixLayoutCreate(&p.lc, CUDA_R_32F, m.c_rows, m.c_cols, m.ldc), k);
  cublasLtMatmulPreference_t pref = NULL;
  if (ok) {
    uint64_t ws = kWorkspace;
    uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE;
    // the first operand of the column-major product is the caller's B, the second its A
    uint32_t aa = k.al_b, ab = k.al_a, ac = k.al_c;
    ok = LT(cublasLtMatmulPreferenceCreate(&pref), k) &&
         LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof ws),
            k) &&
         LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                 &red, sizeof red),
            k) &&
         LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                 &aa, sizeof aa),
            k) &&
         LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                 &ab, sizeof ab),
            k) &&
         LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                 &ac, sizeof ac),
            k) &&
         LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                 &ac, sizeof ac),
            k);
  }
  if (ok) {
    cublasLtMatmulHeuristicResult_t res;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    int n = 0;
    // no split-K reduction first; should the heuristic offer nothing then, split-K reduced out
    // of place in the workspace (a separate reduction kernel: still no atomics), then any
    for (uint32_t mask : {(uint32_t)CUBLASLT_REDUCTION_SCHEME_NONE,
                          (uint32_t)(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                                     CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE),
                          (uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK}) {
      memset(&res, 0, sizeof res);
      n = 0;
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                               &mask, sizeof mask);
      if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &res,
                                           &n);
      if (s == CUBLAS_STATUS_SUCCESS && n > 0 && res.state == CUBLAS_STATUS_SUCCESS) break;
      n = 0;
    }
    // no algorithm is not an error for a bias epilogue: the caller falls back without it
    if (n > 0) {
      p.algo = res.algo;
      p.ok = true;
    } else if (k.epi != EP_BIAS && k.dtype != DT_BF16) {  // bf16: mm widens instead
      lt_ok(s != CUBLAS_STATUS_SUCCESS ? s : CUBLAS_STATUS_NOT_SUPPORTED,
            "cublasLtMatmulAlgoGetHeuristic (no algorithm)", k, __LINE__);
    }
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  nplans++;
  return &p;
}

bool mm_widened(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                const uint16_t *B, int ldb, float beta, float *C, int ldc);

// C = alpha op(A) op(B) + beta C (+ bias per column of row-major C with a bias) on dtype
// operands (float32, or bf16 bits) and float32 C; M, N, K >= 1. Returns false when
// there is no algorithm for a bias epilogue (nothing issued; the caller adds the bias
// itself), or on a recorded error.
bool mm(int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda, const void *B,
        int ldb, float beta, float *C, int ldc, int dtype, const float *bias) {
  size_t es = dtype == DT_BF16 ? 2 : 4;
  mm_key k;
  memset(&k, 0, sizeof k);
  k.ta = ta != 0;
  k.tb = tb != 0;
  k.M = M;
  k.N = N;
  k.K = K;
  k.lda = lda;
  k.ldb = ldb;
  k.ldc = ldc;
  k.dtype = dtype;
  // the bias epilogue only on a 16-byte aligned bias (no preference names its alignment)
  if (bias && ((uintptr_t)bias & 15u)) return false;
  k.epi = bias ? EP_BIAS : EP_NONE;
  k.al_a = cu_align_of(A, (size_t)lda * es);
  k.al_b = cu_align_of(B, (size_t)ldb * es);
  k.al_c = cu_align_of(C, (size_t)ldc * 4);
  k.al_bias = bias ? cu_align_of(bias, 0) : 0;
  {
    std::lock_guard<std::mutex> g(mu);
    if (!ensure_handle(k)) return false;
    mm_plan *p = get_plan(k);
    if (!p || !p->ok) {
      // bf16 operands without an algorithm (a 2-byte aligned shape): the same arithmetic on the
      // operands widened to float32 (exact), below, outside the lock
      if (!(p && !bias && dtype == DT_BF16)) {
        // a product without a plan is an error every time (a later call must not skip it
        // silently); a bias epilogue without one is the caller's to do otherwise
        if (!bias)
          lt_ok(p ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_ALLOC_FAILED,
                "cuBLASLt plan (no algorithm for this shape)", k, __LINE__);
        return false;
      }
    } else {
      if (bias && cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                 sizeof bias) != CUBLAS_STATUS_SUCCESS) {
        p->ok = false;
        return false;
      }
      const void *first = B, *second = A;  // the column-major product's operands (gemm_map.cuh)
      cublasStatus_t s =
          cublasLtMatmul(handle, p->desc, &alpha, first, p->la, second, p->lb, &beta, C, p->lc, C,
                         p->lc, &p->algo, workspace, kWorkspace, ct_cu_stream());
      if (s != CUBLAS_STATUS_SUCCESS && bias) {  // the epilogue after all: never again
        p->ok = false;
        return false;
      }
      return lt_ok(s, "cublasLtMatmul", k, __LINE__);
    }
  }
  return mm_widened(ta, tb, M, N, K, alpha, (const uint16_t *)A, lda, (const uint16_t *)B, ldb,
                    beta, C, ldc);
}

// ---- scratch (this file's own: grow-only, synchronised before it regrows) ----
void *scr_p[5];
size_t scr_n[5];

void *scratch(int i, size_t bytes) {
  if (bytes <= scr_n[i]) return scr_p[i];
  if (scr_p[i]) {
    CU_CHECK(cudaStreamSynchronize(ct_cu_stream()));  // a product issued before may still read it
    ct_cu_free(scr_p[i]);
  }
  scr_n[i] = 0;
  scr_p[i] = ct_cu_alloc(CT_MEM_OTHER, bytes + bytes / 4);
  if (!scr_p[i]) {
    char what[96];
    snprintf(what, sizeof what, "matrix product scratch (%zu bytes)", bytes);
    ct_cu_note(cudaErrorMemoryAllocation, what, __FILE__, __LINE__);
    return NULL;
  }
  scr_n[i] = bytes + bytes / 4;
  return scr_p[i];
}
enum { SCR_A = 0, SCR_B = 1, SCR_COLSUM = 2, SCR_WA = 3, SCR_WB = 4 };

// ---- kernels ----------------------------------------------------------------
// dst (rows x cols, leading dim ldd) = bf16(src (rows x cols, leading dim ld))
__global__ void cast_bf16_kernel(int rows, int cols, const float *src, size_t ld, uint16_t *dst,
                                 size_t ldd) {
  size_t n = (size_t)rows * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / (size_t)cols, c = i - r * (size_t)cols;
    dst[r * ldd + c] = cu_bf16_bits(src[r * ld + c]);
  }
}

// dst (rows x cols, rows ldd apart) = the view (rows x cols, dense) dequantised: float32
// (to_bf16 0) or bf16 bits
__global__ void dequant_kernel(int rows, int cols, int dtype, const void *data, const float *scales,
                               int to_bf16, void *dst, size_t ldd) {
  size_t n = (size_t)rows * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / (size_t)cols, o = r * ldd + (i - r * (size_t)cols);
    float v = cu_wview_elem(dtype, data, scales, i, r);
    if (to_bf16)
      ((uint16_t *)dst)[o] = cu_bf16_bits(v);
    else
      ((float *)dst)[o] = v;
  }
}

// dst (rows x cols, rows ldd apart) = src's bf16 bits (rows ld apart) widened to float32
__global__ void widen_kernel(int rows, int cols, const uint16_t *src, size_t ld, float *dst,
                             size_t ldd) {
  size_t n = (size_t)rows * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / (size_t)cols, c = i - r * (size_t)cols;
    dst[r * ldd + c] = cu_bf16_to_f32(src[r * ld + c]);
  }
}

// C (M x N) = beta * C, beta == 0 writing zeros without reading C
__global__ void scale_c_kernel(int M, int N, float beta, float *C, size_t ldc) {
  size_t n = (size_t)M * N;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / (size_t)N, c = i - r * (size_t)N;
    float *p = C + r * ldc + c;
    *p = beta == 0.0f ? 0.0f : beta * *p;
  }
}

// y's rows (N x M) = b, or 0 without b
__global__ void bias_rows_kernel(int N, int M, const float *b, float *y, size_t ldy) {
  size_t n = (size_t)N * M;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / (size_t)M, c = i - r * (size_t)M;
    y[r * ldy + c] = b ? b[c] : 0.0f;
  }
}

constexpr int kColChunk = 256;  // rows per partial sum of the bias gradient

// part[chunk][c] = sum of rows [chunk * kColChunk, ...) of column c, in order, in double
__global__ void colsum_part_kernel(int N, int M, const float *dy, size_t lddy, double *part) {
  int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
  if (c >= M) return;
  int r0 = chunk * kColChunk, r1 = min(N, r0 + kColChunk);
  double acc = 0.0;
  for (int r = r0; r < r1; r++) acc += (double)dy[(size_t)r * lddy + c];
  part[(size_t)chunk * M + c] = acc;
}

// db[c] += sum over chunks in order (linear.c: (float)((double)db + sum))
__global__ void colsum_fin_kernel(int M, int nchunk, const double *part, float *db) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= M) return;
  double acc = 0.0;
  for (int k = 0; k < nchunk; k++) acc += part[(size_t)k * M + c];
  db[c] = (float)((double)db[c] + acc);
}

unsigned blocks_for(size_t n) {
  return ct_cu_blocks(n, 256);
}

// bf16 operands (stored as the caller's A and B) widened into float32 scratch, then the float32
// product: bf16 products are exact in float32, so this is the bf16 row's arithmetic
bool mm_widened(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                const uint16_t *B, int ldb, float beta, float *C, int ldc) {
  int ar, ac, br, bc;
  cu_stored_a(ta, M, K, &ar, &ac);
  cu_stored_b(tb, N, K, &br, &bc);
  int la = (ac + 3) / 4 * 4, lb = (bc + 3) / 4 * 4;
  float *a = (float *)scratch(SCR_WA, (size_t)ar * la * sizeof(float));
  float *b = (float *)scratch(SCR_WB, (size_t)br * lb * sizeof(float));
  if (!a || !b) return true;  // recorded
  widen_kernel<<<blocks_for((size_t)ar * ac), 256, 0, ct_cu_stream()>>>(ar, ac, A, (size_t)lda, a,
                                                                        (size_t)la);
  CU_LAUNCHED("widen_kernel");
  widen_kernel<<<blocks_for((size_t)br * bc), 256, 0, ct_cu_stream()>>>(br, bc, B, (size_t)ldb, b,
                                                                        (size_t)lb);
  CU_LAUNCHED("widen_kernel");
  return mm(ta, tb, M, N, K, alpha, a, la, b, lb, beta, C, ldc, DT_F32, NULL);
}

// C = beta C for the degenerate products (K 0 or alpha 0), as gemm.c
void scale_c(int M, int N, float beta, float *C, int ldc) {
  if (beta == 1.0f) return;
  scale_c_kernel<<<blocks_for((size_t)M * N), 256, 0, ct_cu_stream()>>>(M, N, beta, C, ldc);
  CU_LAUNCHED("scale_c_kernel");
}

// a stored float32 operand (rows x cols, ld) as bf16 in scratch slot, rows *ld16 apart (cols
// rounded up to 8: 16-byte aligned rows); NULL on failure
const uint16_t *to_bf16(int slot, int rows, int cols, const float *src, int ld, int *ld16) {
  *ld16 = (cols + 7) / 8 * 8;
  uint16_t *d = (uint16_t *)scratch(slot, (size_t)rows * *ld16 * sizeof(uint16_t));
  if (!d) return NULL;
  cast_bf16_kernel<<<blocks_for((size_t)rows * cols), 256, 0, ct_cu_stream()>>>(
      rows, cols, src, (size_t)ld, d, (size_t)*ld16);
  CU_LAUNCHED("cast_bf16_kernel");
  return d;
}

// the product of the rows: float32, or (bf16) both operands cast first. A bias goes by the
// epilogue; false when none had an algorithm (the bias is then not added).
bool gemm_any(int bf16, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc, const float *bias) {
  if (!bf16) return mm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, DT_F32, bias);
  int ar, ac, br, bc;
  cu_stored_a(ta, M, K, &ar, &ac);
  cu_stored_b(tb, N, K, &br, &bc);
  int la, lb;
  const uint16_t *a16 = to_bf16(SCR_A, ar, ac, A, lda, &la);
  const uint16_t *b16 = to_bf16(SCR_B, br, bc, B, ldb, &lb);
  if (!a16 || !b16) return true;  // recorded
  return mm(ta, tb, M, N, K, alpha, a16, la, b16, lb, beta, C, ldc, DT_BF16, bias);
}

void sgemm_any(int bf16, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  gemm_any(bf16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

// db += column sums of dy (N x M)
void colsum_acc(int N, int M, const float *dy, int lddy, float *db) {
  int nchunk = (N + kColChunk - 1) / kColChunk;
  double *part = (double *)scratch(SCR_COLSUM, (size_t)nchunk * M * sizeof(double));
  if (!part) return;
  dim3 g1((unsigned)((M + 127) / 128), (unsigned)nchunk);
  colsum_part_kernel<<<g1, 128, 0, ct_cu_stream()>>>(N, M, dy, (size_t)lddy, part);
  CU_LAUNCHED("colsum_part_kernel");
  colsum_fin_kernel<<<(unsigned)((M + 127) / 128), 128, 0, ct_cu_stream()>>>(M, nchunk, part, db);
  CU_LAUNCHED("colsum_fin_kernel");
}

void bias_rows(int N, int M, const float *b, float *y, int ldy) {
  bias_rows_kernel<<<blocks_for((size_t)N * M), 256, 0, ct_cu_stream()>>>(N, M, b, y, (size_t)ldy);
  CU_LAUNCHED("bias_rows_kernel");
}

// y = x w^T + b with w (rows ldw apart) float32 (wdt DT_F32) or bf16 bits (wdt DT_BF16, x then
// cast)
void lin_fwd(int bf16, int N, int K, int M, const float *x, int ldx, const void *w, int ldw,
             int wdt, const float *b, float *y, int ldy) {
  if (N <= 0 || M <= 0) return;
  if (K <= 0) {
    bias_rows(N, M, b, y, ldy);
    return;
  }
  bool done;
  if (wdt == DT_BF16) {
    int lx;
    const uint16_t *x16 = to_bf16(SCR_A, N, K, x, ldx, &lx);
    if (!x16) return;
    done = mm(0, 1, N, M, K, 1.0f, x16, lx, w, ldw, 0.0f, y, ldy, DT_BF16, b);
    if (!done && b) {
      bias_rows(N, M, b, y, ldy);
      mm(0, 1, N, M, K, 1.0f, x16, lx, w, ldw, 1.0f, y, ldy, DT_BF16, NULL);
    }
    return;
  }
  done = gemm_any(bf16, 0, 1, N, M, K, 1.0f, x, ldx, (const float *)w, ldw, 0.0f, y, ldy, b);
  if (!done && b) {  // no algorithm with the bias epilogue: rows of b, then beta = 1
    bias_rows(N, M, b, y, ldy);
    gemm_any(bf16, 0, 1, N, M, K, 1.0f, x, ldx, (const float *)w, ldw, 1.0f, y, ldy, NULL);
  }
}

// dx = beta_dx dx + dy w (w float32 or bf16 bits), dw += dy^T x, db += colsum dy
void lin_bwd(int bf16, int N, int K, int M, const float *x, int ldx, const void *w, int ldw,
             int wdt, const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
             float *db) {
  if (N <= 0 || M <= 0) return;
  if (dx && K > 0) {
    if (wdt == DT_BF16) {
      int ld16;
      const uint16_t *dy16 = to_bf16(SCR_A, N, M, dy, lddy, &ld16);
      if (dy16) mm(0, 0, N, K, M, 1.0f, dy16, ld16, w, ldw, beta_dx, dx, lddx, DT_BF16, NULL);
    } else {
      gemm_any(bf16, 0, 0, N, K, M, 1.0f, dy, lddy, (const float *)w, ldw, beta_dx, dx, lddx, NULL);
    }
  }
  if (dw && K > 0) gemm_any(bf16, 1, 0, M, K, N, 1.0f, dy, lddy, x, ldx, 1.0f, dw, K, NULL);
  if (db) colsum_acc(N, M, dy, lddy, db);
}

// A view as something lin_fwd/bwd multiply, rows *ldw apart: float32 data as it is, a bf16 view
// as it is in the bf16 row (when its rows are 16-byte aligned), else dequantised into scratch
// slot SCR_B (float32, or bf16 in the bf16 row) with rows padded to 16 bytes.
const void *view_weight(int bf16, int M, int K, const ct_wview *w, int *wdt, int *ldw) {
  *ldw = K;
  if (w->dtype == CT_WDT_F32) {
    *wdt = DT_F32;
    return w->data;
  }
  if (bf16 && w->dtype == CT_WDT_BF16 && !((uintptr_t)w->data & 15u) && K % 8 == 0) {
    *wdt = DT_BF16;
    return w->data;
  }
  size_t es = bf16 ? 2 : 4;
  *ldw = bf16 ? (K + 7) / 8 * 8 : (K + 3) / 4 * 4;
  void *d = scratch(SCR_B, (size_t)M * *ldw * es);
  if (!d) return NULL;
  dequant_kernel<<<blocks_for((size_t)M * K), 256, 0, ct_cu_stream()>>>(
      M, K, (int)w->dtype, w->data, w->scales, bf16, d, (size_t)*ldw);
  CU_LAUNCHED("dequant_kernel");
  *wdt = bf16 ? DT_BF16 : DT_F32;
  return d;
}

}  // namespace

// ---- entry points: kernels.h's signatures ------------------------------------
extern "C" void ct_cu_sgemm(int transA, int transB, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, int ldb, float beta, float *C,
                            int ldc) {
  sgemm_any(0, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

extern "C" void ct_cu_sgemm_bf16(int transA, int transB, int M, int N, int K, float alpha,
                                 const float *A, int lda, const float *B, int ldb, float beta,
                                 float *C, int ldc) {
  sgemm_any(1, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// a cached algorithm without split-K reduction: already bitwise repeatable
extern "C" void ct_cu_sgemm_deterministic(int transA, int transB, int M, int N, int K, float alpha,
                                          const float *A, int lda, const float *B, int ldb,
                                          float beta, float *C, int ldc) {
  sgemm_any(0, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

extern "C" void ct_cu_linear_fwd(int N, int K, int M, const float *x, int ldx, const float *w,
                                 const float *b, float *y, int ldy) {
  lin_fwd(0, N, K, M, x, ldx, w, K, DT_F32, b, y, ldy);
}

extern "C" void ct_cu_linear_fwd_bf16(int N, int K, int M, const float *x, int ldx, const float *w,
                                      const float *b, float *y, int ldy) {
  lin_fwd(1, N, K, M, x, ldx, w, K, DT_F32, b, y, ldy);
}

extern "C" void ct_cu_linear_bwd(int N, int K, int M, const float *x, int ldx, const float *w,
                                 const float *dy, int lddy, float *dx, int lddx, float beta_dx,
                                 float *dw, float *db) {
  lin_bwd(0, N, K, M, x, ldx, w, K, DT_F32, dy, lddy, dx, lddx, beta_dx, dw, db);
}

extern "C" void ct_cu_linear_bwd_bf16(int N, int K, int M, const float *x, int ldx, const float *w,
                                      const float *dy, int lddy, float *dx, int lddx, float beta_dx,
                                      float *dw, float *db) {
  lin_bwd(1, N, K, M, x, ldx, w, K, DT_F32, dy, lddy, dx, lddx, beta_dx, dw, db);
}

static void lin_fwd_w(int bf16, int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                      const float *b, float *y, int ldy) {
  if (N <= 0 || M <= 0) return;
  int wdt = DT_F32, ldw = K;
  const void *wp = K > 0 ? view_weight(bf16, M, K, w, &wdt, &ldw) : NULL;
  if (K > 0 && !wp) return;
  lin_fwd(bf16, N, K, M, x, ldx, wp, ldw, wdt, b, y, ldy);
}

static void lin_bwd_w(int bf16, int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                      const float *dy, int lddy, float *dx, int lddx, float beta_dx, float *dw,
                      float *db) {
  if (N <= 0 || M <= 0) return;
  if (w->dtype != CT_WDT_F32) dw = NULL;  // a bf16 / int8 weight is frozen: no dw
  int wdt = DT_F32, ldw = K;
  const void *wp = NULL;
  if (dx && K > 0) {
    wp = view_weight(bf16, M, K, w, &wdt, &ldw);
    if (!wp) return;
  } else if (w->dtype == CT_WDT_F32) {
    wp = w->data;
  }
  lin_bwd(bf16, N, K, M, x, ldx, wp, ldw, wdt, dy, lddy, dx, lddx, beta_dx, dw, db);
}

extern "C" void ct_cu_linear_fwd_w(int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                                   const float *b, float *y, int ldy) {
  lin_fwd_w(0, N, K, M, x, ldx, w, b, y, ldy);
}

extern "C" void ct_cu_linear_fwd_w_bf16(int N, int K, int M, const float *x, int ldx,
                                        const ct_wview *w, const float *b, float *y, int ldy) {
  lin_fwd_w(1, N, K, M, x, ldx, w, b, y, ldy);
}

extern "C" void ct_cu_linear_bwd_w(int N, int K, int M, const float *x, int ldx, const ct_wview *w,
                                   const float *dy, int lddy, float *dx, int lddx, float beta_dx,
                                   float *dw, float *db) {
  lin_bwd_w(0, N, K, M, x, ldx, w, dy, lddy, dx, lddx, beta_dx, dw, db);
}

extern "C" void ct_cu_linear_bwd_w_bf16(int N, int K, int M, const float *x, int ldx,
                                        const ct_wview *w, const float *dy, int lddy, float *dx,
                                        int lddx, float beta_dx, float *dw, float *db) {
  lin_bwd_w(1, N, K, M, x, ldx, w, dy, lddy, dx, lddx, beta_dx, dw, db);
}
