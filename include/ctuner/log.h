/* Leveled logging to stderr (or a user sink). Library code never prints to stdout. */
#ifndef CTUNER_LOG_H
#define CTUNER_LOG_H

typedef enum ct_log_level {
  CT_LOG_DEBUG = 0,
  CT_LOG_INFO = 1,
  CT_LOG_WARN = 2,
  CT_LOG_ERROR = 3,
  CT_LOG_OFF = 4
} ct_log_level;

typedef void (*ct_log_sink)(ct_log_level level, const char *msg, void *user);

void ct_log_set_level(ct_log_level level);
ct_log_level ct_log_get_level(void);
/* Parse "debug|info|warn|error|off"; returns -1 if unknown. */
int ct_log_level_parse(const char *s);
/* NULL sink restores the default (stderr, "[ctuner] LEVEL message"). */
void ct_log_set_sink(ct_log_sink sink, void *user);
void ct_log(ct_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define CT_DEBUG(...) ct_log(CT_LOG_DEBUG, __VA_ARGS__)
#define CT_INFO(...) ct_log(CT_LOG_INFO, __VA_ARGS__)
#define CT_WARN(...) ct_log(CT_LOG_WARN, __VA_ARGS__)
#define CT_ERROR(...) ct_log(CT_LOG_ERROR, __VA_ARGS__)

#endif
