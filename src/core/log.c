/* log.c: leveled logging to stderr or a user sink.
 *
 * The level is an atomic int so it can be read from any thread without a lock.
 * The sink (function + user pointer) is swapped under a mutex and read as a
 * pair. A message is formatted into a local buffer first and handed to the
 * sink in one call (the default sink does one fputs), so lines from different
 * threads do not interleave. Messages longer than the buffer are truncated.
 * Never writes to stdout.
 */
#include "ctuner/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define LOG_BUF 4096

static atomic_int g_level = CT_LOG_INFO;
static pthread_mutex_t g_sink_mu = PTHREAD_MUTEX_INITIALIZER;
static ct_log_sink g_sink = NULL;
static void *g_sink_user = NULL;

static const char *level_tag(ct_log_level level) {
  switch (level) {
    case CT_LOG_DEBUG:
      return "DEBUG";
    case CT_LOG_INFO:
      return "INFO";
    case CT_LOG_WARN:
      return "WARN";
    case CT_LOG_ERROR:
      return "ERROR";
    default:
      return "LOG";
  }
}

static void default_sink(ct_log_level level, const char *msg, void *user) {
  char line[LOG_BUF + 32];
  (void)user;
  snprintf(line, sizeof line, "[ctuner] %s %s\n", level_tag(level), msg);
  fputs(line, stderr);
}

void ct_log_set_level(ct_log_level level) {
  if (level < CT_LOG_DEBUG) level = CT_LOG_DEBUG;
  if (level > CT_LOG_OFF) level = CT_LOG_OFF;
  atomic_store(&g_level, (int)level);
}

ct_log_level ct_log_get_level(void) {
  return (ct_log_level)atomic_load(&g_level);
}

int ct_log_level_parse(const char *s) {
  static const char *names[] = {"debug", "info", "warn", "error", "off"};
  int r = -1;
  if (!s) return -1;
  for (int i = 0; i < 5; i++) {
    if (!strcmp(s, names[i])) {
      r = i;
      break;
    }
  }
  return r;
}

void ct_log_set_sink(ct_log_sink sink, void *user) {
  pthread_mutex_lock(&g_sink_mu);
  g_sink = sink;
  g_sink_user = sink ? user : NULL;
  pthread_mutex_unlock(&g_sink_mu);
}

void ct_log(ct_log_level level, const char *fmt, ...) {
  char buf[LOG_BUF];
  ct_log_sink sink;
  void *user;
  if (level >= CT_LOG_OFF || (int)level < atomic_load(&g_level)) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) snprintf(buf, sizeof buf, "(log message could not be formatted)");
  pthread_mutex_lock(&g_sink_mu);
  sink = g_sink;
  user = g_sink_user;
  pthread_mutex_unlock(&g_sink_mu);
  if (!sink) sink = default_sink;
  sink(level, buf, user);
}
