/* `ctuner serve`: the web UI (docs/webui.md) over a directory of runs — parses
 * the options, makes or takes the token, starts ct_serve and waits for
 * SIGINT/SIGTERM. The server itself is src/serve. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ctuner/serve.h"

void ct_cmd_serve_help(FILE *f) {
  fprintf(
      f,
      "usage: ctuner serve [--root DIR] [--host ADDR] [--port N] [--token T] [--max-body BYTES]\n"
      "                    [--hub-downloads]\n"
      "\n"
      "Serves the web UI and its JSON API (docs/webui.md): a dashboard of every\n"
      "run under --root (default: the current directory; each run an output_dir),\n"
      "a config builder over the config-key registry, and start/stop/resume of\n"
      "runs on this machine (1 rank, or N through mpirun; CT_MPIRUN overrides the\n"
      "launcher). Listens on --host 127.0.0.1 --port 8080 by default (--port 0:\n"
      "any free port). On any address but loopback a token is required: --token T\n"
      "(8 to 128 characters), or one is generated and printed once. Clients send it\n"
      "as 'Authorization: Bearer T', or open http://HOST:PORT/?token=T once in a\n"
      "browser (it sets a cookie). Nothing outside --root is served or written;\n"
      "request bodies are limited to --max-body bytes (default 1048576). Runs it\n"
      "starts resolve hub ids from the Hugging Face cache only (HF_HUB_OFFLINE=1): a\n"
      "download would write outside --root; --hub-downloads lets them download.\n"
      "Prints one line 'serving ROOT at URL' and runs until SIGINT or SIGTERM; runs\n"
      "it started keep running.\n");
}

int ct_cmd_serve(int argc, char **argv) {
  const char *root = ".", *host = "127.0.0.1", *token = NULL, *v;
  long port = 8080, max_body = 1 << 20;
  int hub_downloads = 0;
  char exe[4096], gen[33];
  ct_err err = {0};
  for (int i = 1; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_serve_help(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--hub-downloads")) {
      hub_downloads = 1;
    } else if ((r = ct_cli_opt(argc, argv, &i, "root", &v)) != 0) {
      if (r < 0) return 2;
      root = v;
    } else if ((r = ct_cli_opt(argc, argv, &i, "host", &v)) != 0) {
      if (r < 0) return 2;
      host = v;
    } else if ((r = ct_cli_opt(argc, argv, &i, "token", &v)) != 0) {
      if (r < 0) return 2;
      token = v;
    } else if ((r = ct_cli_opt(argc, argv, &i, "port", &v)) != 0) {
      if (r < 0 || ct_cli_int("port", v, 0, 65535, &port)) return 2;
    } else if ((r = ct_cli_opt(argc, argv, &i, "max-body", &v)) != 0) {
      if (r < 0 || ct_cli_int("max-body", v, 1024, 1L << 30, &max_body)) return 2;
    } else {
      fprintf(stderr, "ctuner serve: unknown argument '%s' (see ctuner serve --help)\n", argv[i]);
      return 2;
    }
  }
  int loopback = !strncmp(host, "127.", 4) || !strcmp(host, "::1");
  if (!loopback && !token) {
    if (ct_serve_new_token(gen, &err)) {
      fprintf(stderr, "ctuner serve: %s\n", err.msg);
      return 1;
    }
    token = gen;
    printf("token (printed once): %s\n", token);
  }
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  const char *mpirun = getenv("CT_MPIRUN");
  ct_serve_opts o = {.root = root,
                     .host = host,
                     .port = (int)port,
                     .token = token,
                     .ctuner = n > 0 ? exe : argv[0],
                     .mpirun = mpirun && *mpirun ? mpirun : NULL,
                     .max_body = (size_t)max_body,
                     .hub_downloads = hub_downloads};
  /* block the stop signals before any thread starts, so only sigwait sees them */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  ct_serve *s = NULL;
  if (ct_serve_start(&o, &s, &err)) {
    fprintf(stderr, "ctuner serve: %s\n", err.msg);
    return 1;
  }
  int v6 = strchr(host, ':') != NULL;
  printf("serving %s at http://%s%s%s:%d/%s%s\n", root, v6 ? "[" : "", host, v6 ? "]" : "",
         ct_serve_port(s), token ? "?token=" : "", token ? token : "");
  fflush(stdout);
  int sig = 0;
  do {
    sigwait(&set, &sig);
  } while (sig == SIGPIPE);
  ct_serve_stop(s);
  return 0;
}
