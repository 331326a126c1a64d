/* Paths of the web server kept under its root: every name a request carries
 * is a single component of a small alphabet, and every open walks from the
 * root's descriptor one component at a time with O_NOFOLLOW, so "..",
 * absolute paths, encoded slashes (libmicrohttpd decodes %2F into '/', which
 * then splits components and is checked like any other) and symbolic links
 * (inside root or pointing out) never reach a file outside it. Writes go
 * through a temporary name and a rename in the same directory. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve/serve_int.h"

int srv_name_ok(const char *name) {
  size_t n = name ? strlen(name) : 0;
  if (n == 0 || n > 128 || name[0] == '.') return 0;
  for (size_t i = 0; i < n; i++) {
    char ch = name[i];
    int good = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
               ch == '.' || ch == '_' || ch == '-';
    if (!good) return 0;
  }
  return 1;
}

int srv_open_run(const ct_serve *s, const char *name) {
  if (!srv_name_ok(name)) {
    errno = EACCES;
    return -1;
  }
  return openat(s->rootfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

int srv_open_rel(int dirfd, const char *rel, int flags) {
  char buf[1024];
  int fd = -1, cur = dirfd;
  if (!rel || strlen(rel) >= sizeof buf || rel[0] == '/') {
    errno = EACCES;
    return -1;
  }
  strcpy(buf, rel);
  errno = ENOENT;
  char *save = NULL, *part = strtok_r(buf, "/", &save);
  while (part) {
    char *next = strtok_r(NULL, "/", &save);
    if (!srv_name_ok(part)) {
      errno = EACCES;
      fd = -1;
      break;
    }
    int f = next ? O_RDONLY | O_DIRECTORY : flags;
    fd = openat(cur, part, f | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (cur != dirfd) close(cur);
    cur = dirfd;
    if (fd < 0) break;
    if (next) {
      cur = fd;
      fd = -1;
    }
    part = next;
  }
  if (cur != dirfd) close(cur); /* rel ended with '/' */
  return fd;
}

int srv_read_fd(int fd, off_t off, size_t max, char **out, size_t *n) {
  char *b = malloc(max + 1);
  size_t got = 0;
  *out = NULL;
  *n = 0;
  if (!b) return -1;
  while (got < max) {
    ssize_t k = pread(fd, b + got, max - got, off + (off_t)got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      free(b);
      return -1;
    }
    if (k == 0) break;
    got += (size_t)k;
  }
  b[got] = 0;
  *out = b;
  *n = got;
  return 0;
}

int srv_write_at(int dirfd, const char *name, const char *data, size_t n) {
  char tmp[160];
  int rc = -1;
  if (!srv_name_ok(name)) {
    errno = EACCES;
    return -1;
  }
  static unsigned long seq; /* two connections writing one name: two temporaries */
  snprintf(tmp, sizeof tmp, ".%s.tmp%ld.%lu", name, (long)getpid(),
           __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED));
  int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  size_t put = 0;
  while (put < n) {
    ssize_t k = write(fd, data + put, n - put);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) break;
    put += (size_t)k;
  }
  if (close(fd) == 0 && put == n && renameat(dirfd, tmp, dirfd, name) == 0) rc = 0;
  if (rc) unlinkat(dirfd, tmp, 0);
  return rc;
}
