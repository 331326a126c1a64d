#!/usr/bin/env python3
"""A local stand-in for the Hugging Face Hub's HTTP API, for tests (never the
internet): serves directories as model repos under the hub's URL scheme.

  scripts/hub_server.py --repo org/name=DIR [--repo ...] --port-file F [--log F]
                        [--token T] [--cut-once] [--rate BYTES_PER_S]

  GET  /api/models/REPO/revision/REV   {"id", "sha", "siblings": [{"rfilename"}]}
  GET  /api/models/REPO/tree/REV        [{"type", "path", "size", "oid", "lfs"}] (one page)
  HEAD/GET /REPO/resolve/REV/PATH       small files: 200 with ETag (git-style sha1),
                                        X-Repo-Commit; LFS files (*.safetensors,
                                        *.model, *.bin): 302 to http://localhost:PORT/cdn/SHA256 (another
                                        host, as the real CDN) with
                                        X-Linked-Etag (the sha256) and X-Linked-Size,
                                        as huggingface.co answers
  GET  /cdn/SHA256                      the bytes; Range: bytes=N- gives 206

REV is "main" or the repo's commit (a sha1 of its files); anything else is
404 RevisionNotFound. --token: every request needs "Authorization: Bearer T"
(else 401, X-Error-Message "Invalid credentials in Authorization header"; the
CDN, another host on the real hub, needs none). --cut-once: the first full
GET of each LFS blob sends half its bytes and drops the connection. Every
request is logged as "METHOD PATH range=R auth=yes|no" (one line each) to --log. Listens on
127.0.0.1, a free port, written to --port-file once it listens. Exits after
HUB_SERVER_MAX_SECONDS (default 900)."""
import argparse
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

LFS = (".safetensors", ".model", ".bin")


def load_repo(root):
    files = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            files[os.path.relpath(p, root)] = p
    h = hashlib.sha1()
    for rel in sorted(files):
        h.update(rel.encode())
        with open(files[rel], "rb") as f:
            h.update(hashlib.sha1(f.read()).digest())
    return {"files": files, "sha": h.hexdigest()}


def cdn_host(host):
    """The CDN on another host name (localhost for 127.0.0.1), as the hub's LFS
    redirects leave huggingface.co: clients keep the token and follow HEADs
    only on the hub's own host."""
    name, _, port = host.rpartition(":")
    return ("localhost" if name == "127.0.0.1" else "127.0.0.1") + ":" + port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", action="append", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log")
    ap.add_argument("--token")
    ap.add_argument("--cut-once", action="store_true")
    ap.add_argument("--rate", type=int, default=0, help="CDN bytes per second (0: unlimited)")
    a = ap.parse_args()
    repos = {}
    for r in a.repo:
        name, _, d = r.partition("=")
        repos[name] = load_repo(d)
    blobs = {}  # sha256 -> path
    cut = set()
    lock = threading.Lock()
    logf = open(a.log, "a", buffering=1) if a.log else None

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def note(self):
            if logf:
                with lock:
                    logf.write("%s %s range=%s auth=%s\n" % (self.command, self.path, self.headers.get("Range", ""),
                                                             "yes" if self.headers.get("Authorization") else "no"))

        def reply(self, code, body=b"", headers=None, head=False):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head and body:
                self.wfile.write(body)

        def error(self, code, ecode, msg, head=False):
            body = json.dumps({"error": msg}).encode()
            self.reply(code, body, {"X-Error-Code": ecode, "X-Error-Message": msg,
                                    "Content-Type": "application/json"}, head)

        def authorized(self, head=False):
            if a.token and self.headers.get("Authorization") != "Bearer " + a.token:
                self.error(401, "", "Invalid credentials in Authorization header", head)
                return False
            return True

        def do_HEAD(self):
            self.handle_any(True)

        def do_GET(self):
            self.handle_any(False)

        def handle_any(self, head):
            self.note()
            path = unquote(urlparse(self.path).path)
            if path.startswith("/cdn/"):
                return self.cdn(path[5:], head)
            if not self.authorized(head):
                return
            if path.startswith("/api/models/"):
                rest = path[len("/api/models/"):]
                if "/tree/" in rest:  # huggingface_hub >= 1's snapshot_download lists the tree
                    name, _, rev = rest.partition("/tree/")
                    return self.tree(name, rev, head)
                name, _, rev = rest.partition("/revision/")
                return self.api(name, rev, head)
            parts = path.lstrip("/").split("/")
            if len(parts) >= 5 and parts[2] == "resolve":
                return self.resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
            self.error(404, "EntryNotFound", "no such endpoint", head)

        def find(self, name, rev, head):
            r = repos.get(name)
            if r is None:
                self.error(401, "RepoNotFound", "Repository Not Found for url", head)
                return None
            if rev not in ("main", r["sha"]):
                self.error(404, "RevisionNotFound", "Invalid rev id: " + rev, head)
                return None
            return r

        def api(self, name, rev, head):
            r = self.find(name, rev, head)
            if r is None:
                return
            body = json.dumps({"id": name, "sha": r["sha"],
                               "siblings": [{"rfilename": f} for f in sorted(r["files"])]}).encode()
            self.reply(200, body, {"Content-Type": "application/json"}, head)

        def tree(self, name, rev, head):
            r = self.find(name, rev, head)
            if r is None:
                return
            out = []
            for f in sorted(r["files"]):
                with open(r["files"][f], "rb") as fh:
                    data = fh.read()
                e = {"type": "file", "path": f, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                if f.endswith(LFS):
                    e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 130}
                out.append(e)
            self.reply(200, json.dumps(out).encode(), {"Content-Type": "application/json"}, head)

        def resolve(self, name, rev, rel, head):
            r = self.find(name, rev, head)
            if r is None:
                return
            p = r["files"].get(rel)
            if p is None:
                return self.error(404, "EntryNotFound", rel + " does not exist", head)
            with open(p, "rb") as f:
                data = f.read()
            common = {"X-Repo-Commit": r["sha"], "ETag": '"%s"' % hashlib.sha1(data).hexdigest()}
            if rel.endswith(LFS):
                s = hashlib.sha256(data).hexdigest()
                with lock:
                    blobs[s] = p
                common.update({"X-Linked-Etag": '"%s"' % s, "X-Linked-Size": str(len(data)),
                               "Location": "http://%s/cdn/%s" % (cdn_host(self.headers.get("Host", "")), s)})
                return self.reply(302, b"", common, head)
            self.reply(200, data, common, head)

        def cdn(self, s, head):
            p = blobs.get(s)
            if p is None:
                return self.error(404, "EntryNotFound", "no such blob", head)
            with open(p, "rb") as f:
                data = f.read()
            rng = self.headers.get("Range")
            start = 0
            if rng and rng.startswith("bytes=") and rng.endswith("-"):
                start = int(rng[6:-1])
                if start >= len(data):
                    return self.reply(416, b"", {"Content-Range": "bytes */%d" % len(data)}, head)
            with lock:
                first = a.cut_once and not head and start == 0 and s not in cut
                if first:
                    cut.add(s)
            if first:  # half the bytes, then the connection drops
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if start:
                hdr = {"Content-Range": "bytes %d-%d/%d" % (start, len(data) - 1, len(data))}
                code, data = 206, data[start:]
            else:
                hdr, code = {}, 200
            if not a.rate or head:
                return self.reply(code, data, hdr, head)
            self.reply(code, b"", dict(hdr, **{"Content-Length": str(len(data))}), True)
            for i in range(0, len(data), max(1, a.rate // 10)):  # --rate: a slow link
                self.wfile.write(data[i:i + max(1, a.rate // 10)])
                self.wfile.flush()
                time.sleep(0.1)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.replace(tmp, a.port_file)
    t = threading.Timer(float(os.environ.get("HUB_SERVER_MAX_SECONDS", "900")), srv.shutdown)
    t.daemon = True
    t.start()
    srv.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
