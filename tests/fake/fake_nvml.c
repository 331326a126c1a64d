/* fake_nvml.c: a stand-in for libnvidia-ml.so.1 for the health tests. It
 * implements the NVML functions ctuner's monitor calls, with the values of
 * a state file (CTUNER_FAKE_NVML_STATE) that tests rewrite mid-run; the file
 * is read again on every call. Lines:
 *   count N
 *   fail_init 1
 *   gpu I KEY VALUE      KEY: name uuid temp shutdown ecc_sbe ecc_dbe
 *                        throttle (0x.. or decimal) mem_used mem_total
 * A missing state file means one healthy GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_UNKNOWN 999
#define MAXG 16

typedef struct gpu {
  char name[96], uuid[96];
  unsigned temp, shutdown;
  long long sbe, dbe; /* -1: ECC not supported */
  unsigned long long throttle, mem_used, mem_total;
} gpu;

typedef struct state {
  int count, fail_init;
  gpu g[MAXG];
} state;

typedef struct nvml_memory {
  unsigned long long total, free, used;
} nvml_memory;

static int g_inited;

static void load(state *s) {
  memset(s, 0, sizeof *s);
  s->count = 1;
  for (int i = 0; i < MAXG; i++) {
    snprintf(s->g[i].name, sizeof s->g[i].name, "Fake GPU %d", i);
    snprintf(s->g[i].uuid, sizeof s->g[i].uuid, "GPU-fake-0000-%04d", i);
    s->g[i].temp = 50;
    s->g[i].shutdown = 95;
    s->g[i].mem_total = 80ULL << 30;
    s->g[i].mem_used = 10ULL << 30;
  }
  const char *p = getenv("CTUNER_FAKE_NVML_STATE");
  FILE *f = p ? fopen(p, "r") : NULL;
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    int i;
    char key[64], val[256];
    if (sscanf(line, "count %d", &i) == 1)
      s->count = i < 0 ? 0 : i > MAXG ? MAXG : i;
    else if (sscanf(line, "fail_init %d", &i) == 1)
      s->fail_init = i;
    else if (sscanf(line, "gpu %d %63s %255s", &i, key, val) == 3 && i >= 0 && i < MAXG) {
      gpu *g = &s->g[i];
      if (!strcmp(key, "name"))
        snprintf(g->name, sizeof g->name, "%s", val);
      else if (!strcmp(key, "uuid"))
        snprintf(g->uuid, sizeof g->uuid, "%s", val);
      else if (!strcmp(key, "temp"))
        g->temp = (unsigned)strtoul(val, NULL, 0);
      else if (!strcmp(key, "shutdown"))
        g->shutdown = (unsigned)strtoul(val, NULL, 0);
      else if (!strcmp(key, "ecc_sbe"))
        g->sbe = strtoll(val, NULL, 0);
      else if (!strcmp(key, "ecc_dbe"))
        g->dbe = strtoll(val, NULL, 0);
      else if (!strcmp(key, "throttle"))
        g->throttle = strtoull(val, NULL, 0);
      else if (!strcmp(key, "mem_used"))
        g->mem_used = strtoull(val, NULL, 0);
      else if (!strcmp(key, "mem_total"))
        g->mem_total = strtoull(val, NULL, 0);
    }
  }
  fclose(f);
}

/* Devices are the index + 1, as opaque pointers. */
static int dev_index(void *d, state *s) {
  long i = (long)(size_t)d - 1;
  load(s);
  return g_inited && i >= 0 && i < s->count ? (int)i : -1;
}

int nvmlInit_v2(void) {
  state s;
  load(&s);
  if (s.fail_init) return NVML_ERROR_UNKNOWN;
  g_inited = 1;
  return NVML_SUCCESS;
}
int nvmlShutdown(void) {
  g_inited = 0;
  return NVML_SUCCESS;
}
const char *nvmlErrorString(int r) {
  switch (r) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    default:
      return "Unknown Error";
  }
}
int nvmlDeviceGetCount_v2(unsigned *count) {
  state s;
  load(&s);
  if (!g_inited) return NVML_ERROR_UNINITIALIZED;
  *count = (unsigned)s.count;
  return NVML_SUCCESS;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) {
  state s;
  load(&s);
  if (!g_inited) return NVML_ERROR_UNINITIALIZED;
  if ((int)i >= s.count) return NVML_ERROR_INVALID_ARGUMENT;
  *d = (void *)(size_t)(i + 1);
  return NVML_SUCCESS;
}
int nvmlDeviceGetUUID(void *d, char *out, unsigned n) {
  state s;
  int i = dev_index(d, &s);
  if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
  snprintf(out, n, "%s", s.g[i].uuid);
  return NVML_SUCCESS;
}
int nvmlDeviceGetName(void *d, char *out, unsigned n) {
  state s;
  int i = dev_index(d, &s);
  if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
  snprintf(out, n, "%s", s.g[i].name);
  return NVML_SUCCESS;
}
int nvmlDeviceGetTemperature(void *d, int sensor, unsigned *t) {
  state s;
  int i = dev_index(d, &s);
  if (i < 0 || sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
  *t = s.g[i].temp;
  return NVML_SUCCESS;
}
int nvmlDeviceGetTemperatureThreshold(void *d, int which, unsigned *t) {
  state s;
  int i = dev_index(d, &s);
  if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
  if (which != 0) return NVML_ERROR_NOT_SUPPORTED; /* only SHUTDOWN */
  *t = s.g[i].shutdown;
  return NVML_SUCCESS;
}
int nvmlDeviceGetTotalEccErrors(void *d, int type, int counter, unsigned long long *c) {
  state s;
  int i = dev_index(d, &s);
  if (i < 0 || counter != 0) return NVML_ERROR_INVALID_ARGUMENT;
  long long v = type == 0 ? s.g[i].sbe : s.g[i].dbe;
  if (v < 0) return NVML_ERROR_NOT_SUPPORTED;
  *c = (unsigned long long)v;
  return NVML_SUCCESS;
}
int nvmlDeviceGetCurrentClocksThrottleReasons(void *d, unsigned long long *r) {
  state s;
  int i = dev_index(d, &s);
  if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
  *r = s.g[i].throttle;
  return NVML_SUCCESS;
}
int nvmlDeviceGetMemoryInfo(void *d, nvml_memory *m) {
  state s;
  int i = dev_index(d, &s);
  if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
  m->total = s.g[i].mem_total;
  m->used = s.g[i].mem_used;
  m->free = m->total - m->used;
  return NVML_SUCCESS;
}
