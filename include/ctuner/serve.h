/* `ctuner serve`: the web UI's HTTP server (libmicrohttpd) over a directory of
 * runs — a JSON API (docs/webui.md) and the embedded single-page app.
 *
 * Every run is a directory directly under root (an output_dir). The server
 * never serves or writes a path outside root: names are single components
 * checked against a small alphabet and every file is opened component by
 * component with O_NOFOLLOW below root's descriptor, so neither "..", encoded
 * slashes nor symbolic links lead out. Without a token only loopback clients
 * naming a loopback Host are served; with one, every API call must carry it.
 * Runs started from the API are children in their own session (the server
 * may stop or restart without them); their pid, rank count and exit status
 * are kept in RUN/serve.json, their output in RUN/train.log.
 */
#ifndef CTUNER_SERVE_H
#define CTUNER_SERVE_H

#include <stddef.h>

#include "ctuner/status.h"

typedef struct ct_serve_opts {
  const char *root;   /* the directory of runs (must exist) */
  const char *host;   /* address to bind: "127.0.0.1" (default), "::1", "0.0.0.0", ... */
  int port;           /* 0: any free port (ct_serve_port says which) */
  const char *token;  /* required on every API call when non-NULL (8 to 128 characters) */
  const char *ctuner; /* the ctuner executable runs are started with */
  const char *mpirun; /* launcher for ranks > 1 (default "mpirun") */
  size_t max_body;    /* largest request body accepted (default 1 MiB) */
  int hub_downloads;  /* 1: runs may download hub models into the user's Hugging Face cache
                         (outside root); 0 (default): they run with HF_HUB_OFFLINE=1 */
} ct_serve_opts;

typedef struct ct_serve ct_serve;

/* Binds and starts serving on background threads. */
ct_status ct_serve_start(const ct_serve_opts *opts, ct_serve **out, ct_err *err);
/* The port actually bound. */
int ct_serve_port(const ct_serve *s);
/* Stops serving and frees s (runs it started keep running); NULL is a no-op. */
void ct_serve_stop(ct_serve *s);

/* A random token of 32 hex digits into out (from /dev/urandom). */
ct_status ct_serve_new_token(char out[33], ct_err *err);

#endif
