/* nvml.c: the NVML functions the health monitor calls, loaded with dlopen so
 * ctuner neither links nor needs the NVIDIA driver. Function types follow
 * nvml.h (nvmlReturn_t is an int, nvmlDevice_t an opaque pointer). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "health/health_int.h"

typedef void *nvml_dev;

struct ct_nvml {
  void *so;
  int (*init)(void);
  int (*shutdown)(void);
  const char *(*error_string)(int);
  int (*count)(unsigned *);
  int (*by_index)(unsigned, nvml_dev *);
  int (*by_uuid)(const char *, nvml_dev *);
  int (*uuid)(nvml_dev, char *, unsigned);
  int (*name)(nvml_dev, char *, unsigned);
  int (*temperature)(nvml_dev, int, unsigned *);
  int (*threshold)(nvml_dev, int, unsigned *);
  int (*ecc)(nvml_dev, int, int, unsigned long long *);
  int (*throttle)(nvml_dev, unsigned long long *);
  int (*memory)(nvml_dev, ct_nvml_memory *);
};

enum { NVML_SUCCESS = 0, NVML_TEMPERATURE_GPU = 0, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0 };
enum {
  NVML_MEMORY_ERROR_TYPE_CORRECTED = 0,
  NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1,
  NVML_VOLATILE_ECC = 0
};

static const char *nvml_err(const ct_nvml *n, int r) {
  const char *s = n->error_string ? n->error_string(r) : NULL;
  return s ? s : "unknown NVML error";
}

ct_status ct_nvml_open(const char *lib, ct_nvml **out, ct_err *err) {
  *out = NULL;
  void *so = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!so) return ct_errf(err, CT_ERR_NOT_FOUND, "cannot load %s: %s", lib, dlerror());
  ct_nvml *n = calloc(1, sizeof *n);
  if (!n) {
    dlclose(so);
    return ct_errf(err, CT_ERR_NOMEM, "out of memory");
  }
  n->so = so;
#define SYM(field, name) *(void **)(&n->field) = dlsym(so, name)
  SYM(init, "nvmlInit_v2");
  SYM(shutdown, "nvmlShutdown");
  SYM(error_string, "nvmlErrorString");
  SYM(count, "nvmlDeviceGetCount_v2");
  SYM(by_index, "nvmlDeviceGetHandleByIndex_v2");
  SYM(by_uuid, "nvmlDeviceGetHandleByUUID");
  SYM(uuid, "nvmlDeviceGetUUID");
  SYM(name, "nvmlDeviceGetName");
  SYM(temperature, "nvmlDeviceGetTemperature");
  SYM(threshold, "nvmlDeviceGetTemperatureThreshold");
  SYM(ecc, "nvmlDeviceGetTotalEccErrors");
  SYM(throttle, "nvmlDeviceGetCurrentClocksThrottleReasons");
  SYM(memory, "nvmlDeviceGetMemoryInfo");
#undef SYM
  const char *missing = !n->init       ? "nvmlInit_v2"
                        : !n->count    ? "nvmlDeviceGetCount_v2"
                        : !n->by_index ? "nvmlDeviceGetHandleByIndex_v2"
                                       : NULL;
  if (missing) {
    ct_nvml_close(n);
    return ct_errf(err, CT_ERR_UNSUPPORTED, "%s has no %s: not an NVML library", lib, missing);
  }
  int r = n->init();
  if (r != NVML_SUCCESS) {
    ct_errf(err, CT_ERR_IO, "%s: nvmlInit failed: %s", lib, nvml_err(n, r));
    n->shutdown = NULL;
    ct_nvml_close(n);
    return err ? err->status : CT_ERR_IO;
  }
  *out = n;
  return CT_OK;
}

void ct_nvml_close(ct_nvml *n) {
  if (!n) return;
  if (n->shutdown) n->shutdown();
  if (n->so) dlclose(n->so);
  free(n);
}

ct_status ct_nvml_count(ct_nvml *n, int *count, ct_err *err) {
  unsigned c = 0;
  int r = n->count(&c);
  if (r != NVML_SUCCESS) return ct_errf(err, CT_ERR_IO, "nvmlDeviceGetCount: %s", nvml_err(n, r));
  *count = (int)c;
  return CT_OK;
}

/* CUDA_VISIBLE_DEVICES entries are indices or UUIDs ("GPU-..."): the index
 * of an entry in NVML's order, or -1. */
int ct_nvml_resolve(ct_nvml *n, const char *entry) {
  char *end;
  long v = strtol(entry, &end, 10);
  int count = 0;
  ct_err e = {0};
  if (ct_nvml_count(n, &count, &e)) return -1;
  if (end != entry && !*end) return v >= 0 && v < count ? (int)v : -1;
  if (!n->uuid) return -1;
  for (int i = 0; i < count; i++) {
    nvml_dev d;
    char u[96];
    if (n->by_index((unsigned)i, &d) == NVML_SUCCESS && n->uuid(d, u, sizeof u) == NVML_SUCCESS &&
        !strncmp(u, entry, strlen(entry)))
      return i;
  }
  return -1;
}

ct_status ct_nvml_read(ct_nvml *n, int index, ct_gpu_reading *g, ct_err *err) {
  memset(g, 0, sizeof *g);
  g->index = index;
  g->temperature = g->shutdown_temperature = -1;
  g->ecc_single = g->ecc_double = -1;
  g->memory_used_percent = -1;
  nvml_dev d;
  int r = n->by_index((unsigned)index, &d);
  if (r != NVML_SUCCESS)
    return ct_errf(err, CT_ERR_IO, "GPU %d: nvmlDeviceGetHandleByIndex: %s", index, nvml_err(n, r));
  snprintf(g->name, sizeof g->name, "GPU %d", index);
  if (n->name && n->name(d, g->name, sizeof g->name) != NVML_SUCCESS)
    snprintf(g->name, sizeof g->name, "GPU %d", index);
  g->name[sizeof g->name - 1] = 0;
  if (n->uuid && n->uuid(d, g->uuid, sizeof g->uuid) != NVML_SUCCESS) g->uuid[0] = 0;
  g->uuid[sizeof g->uuid - 1] = 0;
  unsigned t;
  if (n->temperature && n->temperature(d, NVML_TEMPERATURE_GPU, &t) == NVML_SUCCESS)
    g->temperature = (int)t;
  if (n->threshold && n->threshold(d, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, &t) == NVML_SUCCESS)
    g->shutdown_temperature = (int)t;
  unsigned long long c;
  /* ECC counters are unsupported on GPUs without ECC: -1, never a fault */
  if (n->ecc && n->ecc(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, &c) == NVML_SUCCESS)
    g->ecc_single = (long long)c;
  if (n->ecc &&
      n->ecc(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &c) == NVML_SUCCESS)
    g->ecc_double = (long long)c;
  if (n->throttle && n->throttle(d, &c) == NVML_SUCCESS) g->throttle = c;
  ct_nvml_memory m;
  if (n->memory && n->memory(d, &m) == NVML_SUCCESS && m.total)
    g->memory_used_percent = 100.0 * (double)m.used / (double)m.total;
  return CT_OK;
}
