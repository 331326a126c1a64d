#!/usr/bin/python3
"""An HTTP receiver on 127.0.0.1 for the webhook tests: records every request
as one JSON line {"path", "headers", "body"} in LOG, and answers by MODE:
  ok      204
  fail    500 to every request
  slow    sleeps SECONDS (default 10), then 204
The chosen port is written to PORTFILE.
Usage: webhook_receiver.py PORTFILE LOG [MODE [SECONDS]]"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

portfile, log = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "ok"
delay = float(sys.argv[4]) if len(sys.argv) > 4 else 10.0
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n).decode("utf-8", "replace")
        with lock, open(log, "a") as f:
            f.write(json.dumps({"path": self.path, "headers": dict(self.headers), "body": body,
                                "t": time.time()}) + "\n")
        if mode == "slow":
            time.sleep(delay)
        code = 500 if mode == "fail" else 204
        try:
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args):
        pass


srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
srv.daemon_threads = True
with open(portfile + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
import os
os.rename(portfile + ".tmp", portfile)
srv.serve_forever()
