/* Paths of the web server kept under its root: every name a request carries
 * is a single component of a small alphabet, and every open walks from the
 * root's descriptor one component at a time with O_NOFOLLOW, so "..",
 * absolute paths, encoded slashes (libmicrohttpd decodes %2F into '/', which
 * then splits components and is checked like any other) and symbolic links
 * (inside root or pointing out) never reach a file outside it. Writes go
 * through a temporary name and a rename in the same directory.
 *
 * What a run the server starts will open is checked here too, before the
 * start: srv_find_link walks a tree (a run directory, a checkpoint, a dataset
 * under root) for symbolic links, and srv_path_inside says whether a path a
 * config names stays inside root with no link on its way. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serve/serve_int.h"

int srv_name_okn(const char *name, size_t n) {
  if (!name || n == 0 || n > 128 || name[0] == '.') return 0;
  for (size_t i = 0; i < n; i++) { /* a NUL inside (JSON's \u0000) is refused like any byte */
    char ch = name[i];
    int good = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
               ch == '.' || ch == '_' || ch == '-';
    if (!good) return 0;
  }
  return 1;
}

int srv_name_ok(const char *name) {
  return name && srv_name_okn(name, strlen(name));
}

int srv_json_nul(const ct_json *v) {
  if (v && v->type == CT_JSON_STRING) return strlen(v->str) != v->len;
  for (size_t i = 0; v && (v->type == CT_JSON_ARRAY || v->type == CT_JSON_OBJECT) && i < v->n; i++)
    if (srv_json_nul(&v->items[i])) return 1;
  return 0;
}

const char *srv_json_name(const ct_json *v) {
  return v && v->type == CT_JSON_STRING && srv_name_okn(v->str, v->len) ? v->str : NULL;
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

/* Depth-first walk of dirfd/rel for a symbolic link; *budget entries at most. */
static int find_link_at(int dirfd, char *rel, size_t cap, int depth, long *budget) {
  int fd = *rel ? openat(dirfd, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                : openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno == ELOOP || errno == ENOTDIR ? 1 : -1;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -1;
  }
  int found = 0;
  const size_t len = strlen(rel);
  for (struct dirent *e; !found && (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (--*budget < 0 || depth > 32) {
      errno = E2BIG;
      found = -1;
      break;
    }
    unsigned char t = e->d_type;
    struct stat st;
    if (t == DT_UNKNOWN && !fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW))
      t = S_ISLNK(st.st_mode) ? DT_LNK : S_ISDIR(st.st_mode) ? DT_DIR : DT_REG;
    if (t != DT_LNK && t != DT_DIR) continue;
    if (len + strlen(e->d_name) + 2 > cap) {
      errno = ENAMETOOLONG;
      found = -1;
      break;
    }
    snprintf(rel + len, cap - len, "%s%s", len ? "/" : "", e->d_name);
    found = t == DT_LNK ? 1 : find_link_at(dirfd, rel, cap, depth + 1, budget);
    if (!found) rel[len] = 0;
  }
  closedir(d);
  return found;
}

int srv_find_link(int dirfd, const char *sub, char *found, size_t n) {
  long budget = 2000000;
  if (n < 2 || strlen(sub) >= n) {
    errno = ENAMETOOLONG;
    return -1;
  }
  snprintf(found, n, "%s", sub);
  struct stat st;
  if (*sub && fstatat(dirfd, sub, &st, AT_SYMLINK_NOFOLLOW)) return errno == ENOENT ? 0 : -1;
  if (*sub && S_ISLNK(st.st_mode)) return 1;
  if (*sub && !S_ISDIR(st.st_mode)) return 0;
  return find_link_at(dirfd, found, n, 0, &budget);
}

/* path made absolute (relative: to base) with "." and ".." folded, into out. */
static int normalize(const char *base, const char *path, char *out, size_t n) {
  char buf[2 * PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s/%s", path[0] == '/' ? "" : base, path) >= (int)sizeof buf)
    return -1;
  size_t o = 0;
  char *save = NULL;
  for (char *p = strtok_r(buf, "/", &save); p; p = strtok_r(NULL, "/", &save)) {
    if (!strcmp(p, ".")) continue;
    if (!strcmp(p, "..")) {
      while (o > 0 && out[o - 1] != '/') o--;
      if (o > 0) o--;
      continue;
    }
    size_t k = strlen(p);
    if (o + k + 2 > n) return -1;
    out[o++] = '/';
    memcpy(out + o, p, k);
    o += k;
  }
  if (o == 0) out[o++] = '/';
  out[o] = 0;
  return 0;
}

int srv_path_inside(const ct_serve *s, const char *run, const char *path, char *rel, size_t n) {
  char base[PATH_MAX + 200], abs[2 * PATH_MAX];
  const size_t rl = strlen(s->root);
  snprintf(base, sizeof base, "%s/%s", s->root, run);
  rel[0] = 0;
  if (normalize(base, path, abs, sizeof abs)) return -1;
  if (strncmp(abs, s->root, rl) || (abs[rl] && abs[rl] != '/')) return 0; /* outside */
  snprintf(rel, n, "%s", abs[rl] ? abs + rl + 1 : "");
  /* every component that exists, from the root down, must not be a link */
  char walk[2 * PATH_MAX];
  snprintf(walk, sizeof walk, "%s", rel);
  int cur = s->rootfd, res = 1;
  char *save = NULL;
  for (char *p = strtok_r(walk, "/", &save); p; p = strtok_r(NULL, "/", &save)) {
    int fd = openat(cur, p, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (cur != s->rootfd) close(cur);
    cur = s->rootfd;
    if (fd < 0) break; /* not there (yet): the run makes it */
    if (fstat(fd, &st) || S_ISLNK(st.st_mode)) {
      size_t upto = (size_t)(p - walk) + strlen(p);
      rel[upto < n ? upto : n - 1] = 0; /* rel names the link */
      res = 2;
      close(fd);
      break;
    }
    cur = fd;
  }
  if (cur != s->rootfd) close(cur);
  return res;
}
