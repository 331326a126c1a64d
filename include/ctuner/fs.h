/* Small file-system helpers shared by checkpoints, caches and the data
 * loader: atomic writes (temporary file, fsync, rename, directory fsync),
 * bounded whole-file reads, mkdir -p, rm -rf, and checked path formatting.
 * Errors name the path and the system's reason. */
#ifndef CTUNER_FS_H
#define CTUNER_FS_H

#include <stddef.h>

#include "ctuner/status.h"

/* PATH.tmp.<pid>.<thread> is written, fsynced, renamed over path; the directory fsynced. */
ct_status ct_write_file_atomic(const char *path, const void *data, size_t n, ct_err *err);
/* The same without the fsyncs: atomic against a crash of the process (the
 * path holds the old or the new bytes), not against power loss (the new
 * name may come with short data). For cache entries, which readers validate
 * and rebuild; about 3x cheaper per small file on this machine. */
ct_status ct_write_file_replace(const char *path, const void *data, size_t n, ct_err *err);
/* Whole file (NUL-terminated, malloc'd); CT_ERR_RANGE if larger than max,
 * CT_ERR_NOT_FOUND if missing, CT_ERR_INVALID ("is a directory, not a
 * file") for a directory. */
ct_status ct_read_file(const char *path, size_t max, char **data, size_t *n, ct_err *err);
/* 1 if path names a directory (following links). */
int ct_is_dir(const char *path);
ct_status ct_mkdir_p(const char *path, ct_err *err);
ct_status ct_rm_rf(const char *path, ct_err *err);
ct_status ct_fsync_dir(const char *path, ct_err *err);
/* snprintf into a path buffer; 0 if it fit, -1 if truncated (callers fail
 * with a clear error instead of using a cut path). */
int ct_pathf(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
