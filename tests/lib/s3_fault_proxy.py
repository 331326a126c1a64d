#!/usr/bin/python3
"""A fault-injecting HTTP/1.1 reverse proxy in front of an S3 server (s3rver),
for the storage tests (tests/cli_s3.sh). Standard library only.

It forwards each request unchanged — method, path, query, every header
including Host, and the body — over a kept-alive connection to the upstream,
and answers with the upstream's response. The client signs the proxy's
host:port; the upstream (s3rver) reads the Host header as received, so
path-style and virtual-hosted requests (BUCKET.s3.localhost:PORT with s3rver's
--service-endpoint localhost) work through it.

It also checks every request's AWS Signature V4 itself (s3rver 3.7.1 only
checks that the access key exists, not the signature): the canonical request
is rebuilt from what arrived (path and query re-encoded per RFC 3986, the
signed headers, x-amz-content-sha256, which must match the body unless it is
UNSIGNED-PAYLOAD) and a mismatch is answered 403 SignatureDoesNotMatch, as S3
does. --no-verify turns this off.

Faults (--mode, or the control file): none, 500 (InternalError), 503
(SlowDown), 429 (TooManyRequests), slow (wait --slow-seconds, then answer),
drop (close without answering), reset (status line and headers, half the
body — or part of the status line when the body is empty — then a TCP reset), mixed
(cycles through 500, 503, 429, slow, drop, reset). Which requests: --every K
(every K-th request the proxy receives) or --first N (the first N attempts of
each distinct request: method + path + query + Range), optionally only those
whose "METHOD /path?query" matches --match REGEX.

The control file (--control FILE) holds "key=value" words (mode, every, first,
match, slow_seconds); it is re-read when it changes, replacing the
command-line settings, and a change starts the attempt counts afresh.

One log line per request (--log FILE): seq, method, target, Host, range, attempt,
fault, status, seconds. The proxy exits by itself after --max-seconds.

  s3_fault_proxy.py --upstream 127.0.0.1:PORT --port-file F [--log F]
                    [--mode M] [--every K | --first N] [--match RE]
                    [--slow-seconds S] [--control F] [--max-seconds S]
                    [--credentials AK:SK | --no-verify]
"""
import argparse
import datetime
import faulthandler
import hashlib
import hmac
import http.client
import http.server
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse

HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te",
       "trailer", "transfer-encoding", "upgrade", "expect"}
CYCLE = ["500", "503", "429", "slow", "drop", "reset"]
ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "SlowDown", "Please reduce your request rate."),
    "429": (429, "TooManyRequests", "Too many requests. Please slow down."),
}
MAX_BODY = 1 << 30


class Settings:
    def __init__(self, a):
        self.mode, self.every, self.first, self.match = a.mode, a.every, a.first, a.match
        self.slow_seconds = a.slow_seconds

    def update(self, words):
        for w in words:
            k, _, v = w.partition("=")
            if k == "mode":
                if v not in ["none", "mixed"] + CYCLE:
                    raise ValueError("mode " + v)
                self.mode = v
            elif k == "every":
                self.every = int(v)
            elif k == "first":
                self.first = int(v)
            elif k == "match":
                self.match = v or None
            elif k == "slow_seconds":
                self.slow_seconds = float(v)
            elif k:
                raise ValueError("unknown key " + k)


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.RLock()  # reload() logs under it
        self.base = Settings(args)
        self.cur = Settings(args)
        self.seq = 0
        self.faulted = 0
        self.attempts = {}
        self.control_mtime = None
        self.log = open(args.log, "a", buffering=1) if args.log else None
        self.stop = threading.Event()

    def reload(self):
        """Re-read the control file if it changed (call with the lock held)."""
        p = self.args.control
        if not p:
            return
        try:
            st = os.stat(p)
            mt = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            mt = None
        if mt == self.control_mtime:
            return
        self.control_mtime = mt
        s = Settings(self.args)
        if mt is not None:
            try:
                with open(p) as f:
                    s.update(f.read().split())
            except (OSError, ValueError) as e:
                self.write_log("control file %s: %s (ignored)" % (p, e))
                return
        self.cur = s
        self.attempts = {}
        self.faulted = 0

    def decide(self, method, target, rng):
        """Sequence number, attempt number of this request, and the fault (or None)."""
        with self.lock:
            self.reload()
            self.seq += 1
            s = self.cur
            ident = "%s %s %s" % (method, target, rng or "")
            att = self.attempts.get(ident, 0) + 1
            self.attempts[ident] = att
            fault = None
            eligible = s.mode != "none" and (not s.match or re.search(s.match, method + " " + target))
            if eligible:
                if s.every > 0:
                    hit = self.seq % s.every == 0
                else:
                    hit = s.first < 0 or att <= s.first
                if hit:
                    fault = CYCLE[self.faulted % len(CYCLE)] if s.mode == "mixed" else s.mode
                    self.faulted += 1
            return self.seq, att, fault, s.slow_seconds

    def write_log(self, line):
        if self.log:
            with self.lock:
                self.log.write(line + "\n")


def uri_encode(s, slash_ok):
    return urllib.parse.quote(s, safe="/~" if slash_ok else "~")


def canonical_query(raw):
    pairs = []
    for part in raw.split("&") if raw else []:
        k, _, v = part.partition("=")
        k = uri_encode(urllib.parse.unquote(k), False)
        v = uri_encode(urllib.parse.unquote(v), False)
        pairs.append((k, v))
    pairs.sort()
    return "&".join("%s=%s" % kv for kv in pairs)


def sign_key(secret, date, region, service):
    k = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for m in (region, service, "aws4_request"):
        k = hmac.new(k, m.encode(), hashlib.sha256).digest()
    return k


def verify_sigv4(method, path, query, headers, body, creds, skew=True):
    """None if the request's Signature V4 is right, else (code, message, canonical request)."""
    auth = headers.get("authorization")
    if not auth:
        return ("AccessDenied", "Access Denied (the request is not signed)", "")
    m = re.match(r"AWS4-HMAC-SHA256 +Credential=([^,]+), *SignedHeaders=([^,]+), *Signature=([0-9a-f]{64})$",
                 auth.strip())
    if not m:
        return ("AuthorizationHeaderMalformed", "The authorization header is malformed.", "")
    cred, signed, sig = m.groups()
    parts = cred.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        return ("AuthorizationHeaderMalformed", "The Credential is malformed: " + cred, "")
    ak, date, region, service = parts[:4]
    if ak != creds[0]:
        return ("InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.", "")
    amz_date = headers.get("x-amz-date", "")
    if not re.match(r"^\d{8}T\d{6}Z$", amz_date) or amz_date[:8] != date:
        return ("AccessDenied", "x-amz-date is missing or does not match the credential scope", "")
    t = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
    if skew and abs((datetime.datetime.now(datetime.timezone.utc) - t).total_seconds()) > 900:
        return ("RequestTimeTooSkewed", "The difference between the request time and the current time is too large.",
                "")
    payload = headers.get("x-amz-content-sha256")
    if payload is None:
        return ("InvalidRequest", "Missing required header for this request: x-amz-content-sha256", "")
    if payload != "UNSIGNED-PAYLOAD":
        if not re.match(r"^[0-9a-f]{64}$", payload):
            return ("InvalidArgument", "x-amz-content-sha256 must be UNSIGNED-PAYLOAD or a SHA-256 in hex", "")
        if hashlib.sha256(body).hexdigest() != payload:
            return ("XAmzContentSHA256Mismatch",
                    "The provided 'x-amz-content-sha256' header does not match what was computed.", "")
    names = signed.split(";")
    if names != sorted(names) or any(n != n.lower() for n in names):
        return ("SignatureDoesNotMatch", "SignedHeaders must be lowercase and sorted", "")
    for need in ["host", "x-amz-content-sha256", "x-amz-date"]:
        if need not in names:
            return ("AccessDenied", "the signed headers do not include " + need, "")
    for h in headers:
        if h.startswith("x-amz-") and h not in names:
            return ("AccessDenied", "header %s is not signed" % h, "")
    canon_headers = ""
    for n in names:
        if n not in headers:
            return ("AccessDenied", "signed header %s is not in the request" % n, "")
        canon_headers += "%s:%s\n" % (n, re.sub(" +", " ", headers[n].strip()))
    creq = "\n".join([method, uri_encode(urllib.parse.unquote(path), True), canonical_query(query), canon_headers,
                      signed, payload])
    scope = "/".join([date, region, service, "aws4_request"])
    sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])
    want = hmac.new(sign_key(creds[1], date, region, service), sts.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, sig):
        return ("SignatureDoesNotMatch", "The request signature we calculated does not match the signature you "
                "provided. Check your key and signing method.", creq)
    return None


def xml_escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body leave in separate writes
    server_version = "s3-fault-proxy"
    sys_version = ""

    def log_message(self, fmt, *args):
        pass

    def read_body(self):
        te = self.headers.get("Transfer-Encoding", "").lower()
        if "chunked" in te:
            out = bytearray()
            while True:
                line = self.rfile.readline(1024)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                if len(out) + size > MAX_BODY:
                    raise ValueError("body too large")
                out += self.rfile.read(size)
                self.rfile.readline(16)
        n = int(self.headers.get("Content-Length", "0") or 0)
        if n < 0 or n > MAX_BODY:
            raise ValueError("bad Content-Length")
        return self.rfile.read(n) if n else b""

    def upstream(self):
        c = getattr(self, "_up", None)
        if c is None:
            host, port = self.server.state.args.upstream.rsplit(":", 1)
            c = http.client.HTTPConnection(host, int(port), timeout=120)
            c.connect()
            c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._up = c
        return c

    def forward(self, body):
        hdrs = [(k, v) for k, v in self.headers.items() if k.lower() not in HOP and k.lower() != "content-length"]
        for attempt in range(2):  # once more on a stale kept-alive upstream connection
            c = self.upstream()
            try:
                c.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in hdrs:
                    c.putheader(k, v)
                if body or self.command in ("PUT", "POST"):
                    c.putheader("Content-Length", str(len(body)))
                c.endheaders(body if body else None)
                r = c.getresponse()
                data = r.read()
                return r.status, r.reason, r.getheaders(), data
            except (http.client.HTTPException, OSError):
                c.close()
                self._up = None
                if attempt:
                    raise

    def send(self, status, reason, headers, data, head):
        self.send_response_only(status, reason)
        have_len = False
        for k, v in headers:
            if k.lower() in HOP or k.lower() == "date":
                continue
            if k.lower() == "content-length":
                have_len = True
                if not head:
                    v = str(len(data))
            self.send_header(k, v)
        if not have_len:
            self.send_header("Content-Length", str(len(data)))
        self.send_header("Date", self.date_time_string())
        self.end_headers()
        if not head:
            self.wfile.write(data)
        self.wfile.flush()

    def error_xml(self, status, code, msg, head, extra=""):
        rid = "%016X" % self.seq
        data = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message>%s'
                '<Resource>%s</Resource><RequestId>%s</RequestId></Error>' %
                (code, xml_escape(msg), extra, xml_escape(self.path), rid)).encode()
        self.send(status, None, [("Content-Type", "application/xml"), ("x-amz-request-id", rid)], data, head)

    def reset(self):
        try:
            self.wfile.flush()
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close_connection = True

    def handle_any(self):
        st = self.server.state
        t0 = time.monotonic()
        head = self.command == "HEAD"
        split = urllib.parse.urlsplit(self.path)
        rng = self.headers.get("Range")
        status, fault = "-", None
        self.seq = 0
        note = ""
        try:
            body = self.read_body()
        except (ValueError, OSError) as e:
            self.close_connection = True
            st.write_log("%s bad request body: %s" % (self.command, e))
            return
        self.seq, att, fault, slow_s = st.decide(self.command, self.path, rng)
        try:
            bad = None
            if st.args.verify:
                hdrs = {k.lower(): v for k, v in self.headers.items()}
                for k in set(k.lower() for k in self.headers.keys()):
                    vals = self.headers.get_all(k)
                    if vals and len(vals) > 1:
                        hdrs[k] = ",".join(v.strip() for v in vals)
                bad = verify_sigv4(self.command, split.path, split.query, hdrs, body, st.args.creds)
            if bad:
                code, msg, creq = bad
                fault, status, note = None, 403, " sig=" + code
                extra = "<CanonicalRequest>%s</CanonicalRequest>" % xml_escape(creq) if creq else ""
                if creq:
                    note += " canonical_request=" + repr(creq)
                self.error_xml(403, code, msg, head, extra)
            elif fault in ERRORS:
                status, code, msg = ERRORS[fault]
                self.error_xml(status, code, msg, head)
            elif fault == "drop":
                status = "closed"
                self.close_connection = True
            else:
                if fault == "slow":
                    st.stop.wait(slow_s)
                s, reason, h, data = self.forward(body)
                status = s
                if fault == "reset":
                    self.send_response_only(s, reason)
                    for k, v in h:
                        if k.lower() not in HOP and k.lower() != "content-length":
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    if data and not head and len(data) >= 2:
                        self.end_headers()
                        self.wfile.write(data[:len(data) // 2])
                    else:
                        # Nothing to cut in the body: cut the status line.
                        self._headers_buffer = []
                        self.wfile.write(b"HTTP/1.1 2")
                    status = "reset"
                    self.reset()
                else:
                    self.send(s, reason, h, data, head)
        except (OSError, http.client.HTTPException) as e:
            self.close_connection = True
            note += " error=" + type(e).__name__
        st.write_log("%.3f seq=%d %s %s host=%s range=%s attempt=%d fault=%s status=%s dt=%.3f%s" %
                     (time.time(), self.seq, self.command, self.path, self.headers.get("Host", "-"), rng or "-", att,
                      fault or "none", status, time.monotonic() - t0, note))

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = handle_any


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="HOST:PORT of the S3 server")
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log")
    ap.add_argument("--mode", default="none", choices=["none", "mixed"] + CYCLE)
    ap.add_argument("--every", type=int, default=0)
    ap.add_argument("--first", type=int, default=1, help="faults on the first N attempts (-1: every attempt)")
    ap.add_argument("--match")
    ap.add_argument("--slow-seconds", type=float, default=5.0)
    ap.add_argument("--control")
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--credentials", default="S3RVER:S3RVER", help="ACCESS:SECRET the signatures are checked with")
    ap.add_argument("--no-verify", dest="verify", action="store_false")
    a = ap.parse_args()
    a.creds = a.credentials.split(":", 1)
    st = State(a)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.state = st
    port = srv.server_address[1]
    tmpf = a.port_file + ".tmp"
    with open(tmpf, "w") as f:
        f.write("%d\n" % port)
    os.replace(tmpf, a.port_file)

    def deadline():
        if not st.stop.wait(a.max_seconds):
            st.write_log("max-seconds (%g) reached: exiting" % a.max_seconds)
        os._exit(0)

    def on_signal(signum, frame):
        st.write_log("signal %d: exiting" % signum)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    faulthandler.enable()
    threading.Thread(target=deadline, daemon=True).start()
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    st.stop.set()


if __name__ == "__main__":
    main()
