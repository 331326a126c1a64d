// runtime.cu: the CUDA backend's device, stream, memory and errors
// (cuda_rt.h, docs/cuda.md).
//
// Device: the local rank's (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
// SLURM_LOCALID or LOCAL_RANK, modulo the visible devices; CUDA_VISIBLE_DEVICES
// is the runtime's own). Memory: cudaMalloc, each block's category and size kept
// in a host table so that ct_cu_free can count it off (ct_mem_device_sub).
// Copies: on the one stream, in issue order; copy_out waits. Errors: the first
// one is kept with where it happened until ct_cu_take_error reads it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include "common.cuh"

extern "C" {
#include "ctuner/alloc.h"
}

namespace {

std::once_flag init_once;
int init_rc = -1;
char init_why[256], init_desc[512];
cudaStream_t stream;
// the process's device, made current on whichever host thread issues work (the current
// device is per thread: another thread than init's would work on device 0)
int device_id;
thread_local bool bound;

std::mutex err_mu;
bool err_set;
char err_msg[512];

struct block {
  void *p;
  size_t bytes;
  ct_mem_cat cat;
};
std::mutex mem_mu;
block *blocks;
size_t nblocks, capblocks;

void *scratch_p[4];
size_t scratch_n[4];

int local_rank(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                        "LOCAL_RANK"};
  for (const char *v : vars) {
    const char *s = getenv(v);
    if (s && *s) return atoi(s);
  }
  return 0;
}

void do_init(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    snprintf(init_why, sizeof init_why, "no CUDA device: %s",
             e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    cudaGetLastError();
    return;
  }
  int lr = local_rank(), dev = lr % n;
  device_id = dev;
  cudaDeviceProp prop;
  if ((e = cudaSetDevice(dev)) != cudaSuccess ||
      (e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess ||
      (e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess) {
    snprintf(init_why, sizeof init_why, "CUDA device %d: %s", dev, cudaGetErrorString(e));
    cudaGetLastError();
    return;
  }
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  snprintf(init_desc, sizeof init_desc,
           "%.200s, sm_%d%d, %.1f GiB, device %d of %d (local rank %d), CUDA runtime %d.%d, driver "
           "%d.%d",
           prop.name, prop.major, prop.minor,
           (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), dev, n, lr, rt / 1000,
           rt % 1000 / 10, drv / 1000, drv % 1000 / 10);
  init_rc = 0;
}

}  // namespace

cudaStream_t ct_cu_stream(void) {
  if (!bound) {
    bound = true;
    if (init_rc == 0) cudaSetDevice(device_id);
  }
  return stream;
}

void ct_cu_note(cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess) return;
  std::lock_guard<std::mutex> g(err_mu);
  if (err_set) return;
  err_set = true;
  const char *base = strrchr(file, '/');
  snprintf(err_msg, sizeof err_msg, "CUDA error in %s (%s:%d): %s (%s)", what,
           base ? base + 1 : file, line, cudaGetErrorString(e), cudaGetErrorName(e));
}

void *ct_cu_scratch(int slot, size_t bytes) {
  if (slot < 0 || slot >= 4) return NULL;
  if (bytes > scratch_n[slot]) {
    if (scratch_p[slot]) {
      CU_CHECK(cudaStreamSynchronize(stream));  // a kernel issued before may still read it
      CU_CHECK(cudaFree(scratch_p[slot]));
      ct_mem_device_sub(CT_MEM_OTHER, scratch_n[slot]);
    }
    scratch_p[slot] = NULL;
    scratch_n[slot] = 0;
    size_t want =
        bytes + bytes / 4;  // some room, so that growing by a little does not reallocate each time
    if (cudaMalloc(&scratch_p[slot], want) != cudaSuccess) {
      cudaGetLastError();
      CU_CHECK(cudaMalloc(&scratch_p[slot], bytes));
      want = bytes;
    }
    if (scratch_p[slot]) {
      scratch_n[slot] = want;
      ct_mem_device_add(CT_MEM_OTHER, want);
    }
  }
  return scratch_p[slot];
}

extern "C" int ct_cu_init(char *why, size_t why_cap, char *desc, size_t desc_cap) {
  std::call_once(init_once, do_init);
  if (why && why_cap) snprintf(why, why_cap, "%s", init_why);
  if (desc && desc_cap) snprintf(desc, desc_cap, "%s", init_desc);
  return init_rc;
}

extern "C" void *ct_cu_alloc(ct_mem_cat cat, size_t bytes) {
  void *p = NULL;
  if (!bytes) return NULL;
  ct_cu_stream(); /* this thread on the device */
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    // out of memory is the caller's to report (NULL); anything else (a context lost to an earlier
    // fault) is the sticky error, so that the caller's "out of memory" is not the whole story
    if (e != cudaErrorMemoryAllocation) ct_cu_note(e, "cudaMalloc", __FILE__, __LINE__);
    return NULL;
  }
  std::lock_guard<std::mutex> g(mem_mu);
  if (nblocks == capblocks) {
    size_t cap = capblocks ? 2 * capblocks : 256;
    block *nb = (block *)realloc(blocks, cap * sizeof *nb);
    if (!nb) {
      cudaFree(p);
      return NULL;
    }
    blocks = nb;
    capblocks = cap;
  }
  blocks[nblocks++] = block{p, bytes, cat};
  ct_mem_device_add(cat, bytes);
  return p;
}

extern "C" void ct_cu_free(void *p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> g(mem_mu);
    for (size_t i = nblocks; i-- > 0;)
      if (blocks[i].p == p) {
        ct_mem_device_sub(blocks[i].cat, blocks[i].bytes);
        blocks[i] = blocks[--nblocks];
        break;
      }
  }
  // cudaFree waits for the device, so no op issued before still reads p
  CU_CHECK(cudaFree(p));
}

extern "C" void ct_cu_copy_in(void *dst, const void *host_src, size_t bytes) {
  // from pageable host memory the call returns once the bytes are staged, so the caller may reuse
  // host_src at once
  if (bytes)
    CU_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, ct_cu_stream()));
}

extern "C" void ct_cu_copy_out(void *host_dst, const void *src, size_t bytes) {
  if (bytes)
    CU_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, ct_cu_stream()));
  CU_CHECK(cudaStreamSynchronize(ct_cu_stream()));
}

extern "C" void ct_cu_copy(void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src)
    CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ct_cu_stream()));
}

extern "C" void ct_cu_synchronize(void) {
  CU_CHECK(cudaStreamSynchronize(ct_cu_stream()));
}

extern "C" int ct_cu_take_error(char *msg, size_t cap) {
  // a fault of an op issued earlier surfaces at the next synchronising call; ask the stream too
  // (cudaErrorNotReady: still running, no news)
  const cudaError_t q = cudaStreamQuery(ct_cu_stream());
  if (q != cudaErrorNotReady) ct_cu_note(q, "an earlier op on the stream", __FILE__, __LINE__);
  ct_cu_note(cudaGetLastError(), "an earlier op", __FILE__, __LINE__);
  std::lock_guard<std::mutex> g(err_mu);
  if (!err_set) return 0;
  if (msg && cap) snprintf(msg, cap, "%s", err_msg);
  err_set = false;
  return 1;
}
