/* fs.c: the file-system helpers of ctuner/fs.h (atomic writes, bounded reads,
 * mkdir -p, rm -rf). Atomic writes use a temporary name unique per process
 * and thread, so concurrent writers of the same path never share one. */
#include "ctuner/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

ct_status ct_fsync_dir(const char *path, ct_err *err) {
  int fd = open(path, O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return ct_errf(err, CT_ERR_IO, "%s: cannot open directory: %s", path, strerror(errno));
  int r = fsync(fd);
  close(fd);
  if (r != 0 && errno != EINVAL)
    return ct_errf(err, CT_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
  return CT_OK;
}

static ct_status write_replace(const char *path, const void *data, size_t n, int durable,
                               ct_err *err) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d.%lx", path, (int)getpid(),
           (unsigned long)(uintptr_t)pthread_self());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return ct_errf(err, CT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
  const char *p = data;
  size_t left = n;
  while (left) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      close(fd);
      unlink(tmp);
      return ct_errf(err, CT_ERR_IO, "%s: write failed: %s", tmp, strerror(e));
    }
    p += w, left -= (size_t)w;
  }
  if (durable && fsync(fd) != 0) {
    int e = errno;
    close(fd);
    unlink(tmp);
    return ct_errf(err, CT_ERR_IO, "%s: fsync failed: %s", tmp, strerror(e));
  }
  close(fd);
  if (rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return ct_errf(err, CT_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(e));
  }
  if (!durable) return CT_OK;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) {
    *slash = 0;
    return ct_fsync_dir(dir[0] ? dir : "/", err);
  }
  return ct_fsync_dir(".", err);
}

ct_status ct_write_file_atomic(const char *path, const void *data, size_t n, ct_err *err) {
  return write_replace(path, data, n, 1, err);
}

ct_status ct_write_file_replace(const char *path, const void *data, size_t n, ct_err *err) {
  return write_replace(path, data, n, 0, err);
}

int ct_is_dir(const char *path) {
  struct stat sb;
  return path && !stat(path, &sb) && S_ISDIR(sb.st_mode);
}

ct_status ct_read_file(const char *path, size_t max, char **data, size_t *n, ct_err *err) {
  if (ct_is_dir(path)) /* fopen opens one and fread reads nothing: say what it is */
    return ct_errf(err, CT_ERR_INVALID, "%s: is a directory, not a file", path);
  FILE *f = fopen(path, "rb");
  if (!f)
    return ct_errf(err, errno == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO, "%s: cannot open: %s", path,
                   strerror(errno));
  /* the buffer fits the file (not max): reads of small files stay cheap */
  struct stat sb;
  size_t cap = fstat(fileno(f), &sb) == 0 && sb.st_size >= 0 ? (size_t)sb.st_size : 4096;
  if (cap > max) cap = max;
  char *buf = malloc(cap + 2);
  size_t r = 0;
  while (buf) {
    r += fread(buf + r, 1, cap + 1 - r, f);
    if (r <= cap || cap >= max + 1) break; /* EOF, or more than max */
    size_t nc =
        cap * 2 + 4096 > max + 1 ? max + 1 : cap * 2 + 4096; /* the file grew while we read it */
    char *nb = realloc(buf, nc + 2);
    if (!nb) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = nb, cap = nc;
  }
  fclose(f);
  if (!buf) return ct_errf(err, CT_ERR_NOMEM, "out of memory reading %s", path);
  if (r > max) {
    free(buf);
    return ct_errf(err, CT_ERR_RANGE, "%s: larger than %zu bytes", path, max);
  }
  buf[r] = 0;
  *data = buf;
  *n = r;
  return CT_OK;
}

ct_status ct_mkdir_p(const char *path, ct_err *err) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
      return ct_errf(err, CT_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
    *p = '/';
  }
  if (mkdir(buf, 0755) != 0 && errno != EEXIST)
    return ct_errf(err, CT_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
  struct stat sb;
  if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return ct_errf(err, CT_ERR_IO, "%s exists and is not a directory", buf);
  return CT_OK;
}

ct_status ct_rm_rf(const char *path, ct_err *err) {
  struct stat sb;
  if (lstat(path, &sb) != 0)
    return errno == ENOENT ? CT_OK : ct_errf(err, CT_ERR_IO, "%s: %s", path, strerror(errno));
  if (S_ISDIR(sb.st_mode)) {
    DIR *d = opendir(path);
    if (!d) return ct_errf(err, CT_ERR_IO, "%s: %s", path, strerror(errno));
    struct dirent *e;
    ct_status st = CT_OK;
    while ((e = readdir(d)) && !st) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char sub[4096];
      snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
      st = ct_rm_rf(sub, err);
    }
    closedir(d);
    if (st) return st;
    if (rmdir(path) != 0)
      return ct_errf(err, CT_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    return CT_OK;
  }
  if (unlink(path) != 0)
    return ct_errf(err, CT_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
  return CT_OK;
}

int ct_pathf(char *buf, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = vsnprintf(buf, n, fmt, ap);
  va_end(ap);
  return r < 0 || (size_t)r >= n ? -1 : 0;
}
