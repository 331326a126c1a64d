#!/usr/bin/env python3
"""Reads the TensorBoard event files of a ctuner run and prints what a
reader sees, one deterministic summary (no wall times), for a golden file.

  tb_read.py --reader tensorboard RUN_DIR [--metrics output_dir/metrics.jsonl]
  tb_read.py --reader builtin RUN_DIR [--metrics ...] [--no-purge]
  tb_read.py --serve RUN_DIR      # `tensorboard --logdir` answers with the scalars

--reader tensorboard: TensorBoard's own EventAccumulator (the `tensorboard`
package from PyPI: scripts/py_deps.sh); each file is also walked with
TensorBoard's TFRecord reader, which checks every CRC.
--reader builtin: this file's own reader (standard library only: CRC-32C,
TFRecord frames, the few protobuf fields ctuner writes) with the purge
rule of the reader behind `tensorboard --logdir` for files of version
brain.Event:2 (every session_log START but a directory's first drops each
event at a step >= its step read before it; EventAccumulator honours the
first one too, which changes nothing when every run writes one at its first
step, as ctuner does); --no-purge shows what the files hold without that
rule. `make test`
uses it offline against a golden that the tensorboard reader produced
(tests/cli_tensorboard.sh); `make interop` reruns both.

--metrics: every number of every metrics.jsonl line must equal the scalar of
the same name at that step (as float32, TensorBoard's simple_value), and each
step must appear once; the summary says how many matched.
"""
import argparse
import glob
import hashlib
import json
import math
import os
import struct
import sys

TIMING = ("seconds", "samples_per_s", "data_wait_s")  # not in the golden: they vary


# ---- the builtin reader ----

def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _crc_table()


def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = _T[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(c):
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    d = open(path, "rb").read()
    off = 0
    while off < len(d):
        if len(d) - off < 16:
            raise ValueError("%s: truncated record at byte %d" % (path, off))
        (n,) = struct.unpack_from("<Q", d, off)
        (hc,) = struct.unpack_from("<I", d, off + 8)
        if masked(crc32c(d[off:off + 8])) != hc:
            raise ValueError("%s: length CRC mismatch at byte %d" % (path, off))
        data = d[off + 12:off + 12 + n]
        (dc,) = struct.unpack_from("<I", d, off + 12 + n)
        if masked(crc32c(data)) != dc:
            raise ValueError("%s: data CRC mismatch at byte %d" % (path, off))
        yield data
        off += 16 + n


def fields(b):
    """(field, wire, value) of a protobuf message; value: int, bytes, or raw 4/8 bytes."""
    i = 0
    while i < len(b):
        k, i = _varint(b, i)
        f, w = k >> 3, k & 7
        if w == 0:
            v, i = _varint(b, i)
        elif w == 1:
            v, i = b[i:i + 8], i + 8
        elif w == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        elif w == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % w)
        yield f, w, v


def _varint(b, i):
    v = s = 0
    while True:
        x = b[i]
        i += 1
        v |= (x & 0x7F) << s
        s += 7
        if not x & 0x80:
            return v, i


def decode_event(b):
    ev = {"step": 0, "values": []}
    for f, _, v in fields(b):
        if f == 1:
            ev["wall_time"] = struct.unpack("<d", v)[0]
        elif f == 2:
            ev["step"] = v
        elif f == 3:
            ev["file_version"] = v.decode()
        elif f == 7:
            ev["session_log"] = dict((g, x) for g, _, x in fields(v))
        elif f == 5:
            for g, _, val in fields(v):
                if g == 1:
                    ev["values"].append(decode_value(val))
    return ev


def decode_value(b):
    out = {}
    for f, _, v in fields(b):
        if f == 1:
            out["tag"] = v.decode()
        elif f == 2:
            out["kind"], out["value"] = "scalar", struct.unpack("<f", v)[0]
        elif f == 4:
            im = dict((g, x) for g, _, x in fields(v))
            out["kind"] = "image"
            out["image"] = (im.get(2, 0), im.get(1, 0), im.get(4, b""))  # width, height, bytes
        elif f == 8:
            strs = [x for g, _, x in fields(v) if g == 8]
            out.setdefault("kind", "tensor")
            out["text"] = strs[0].decode() if strs else ""
        elif f == 9:
            pd = [x for g, _, x in fields(v) if g == 1]
            name = [x for g, _, x in fields(pd[0]) if g == 1] if pd else []
            out["plugin"] = name[0].decode() if name else ""
    return out


def read_builtin(run_dir, purge=True):
    """{kind: {tag: [(step, value)]}} as EventAccumulator would keep them."""
    kept = []  # (step, kind, tag, value) in reading order
    nrec = 0
    seen_start = False
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        version = None
        for rec in records(path):
            nrec += 1
            ev = decode_event(rec)
            if "file_version" in ev:
                version = ev["file_version"]
            sl = ev.get("session_log")
            if purge and sl and sl.get(1) == 1 and version and float(version.split(":")[1]) >= 2:
                if seen_start:
                    kept = [k for k in kept if k[0] < ev["step"]]
                seen_start = True
            for v in ev["values"]:
                kind = v.get("kind")
                if kind == "tensor" and v.get("plugin") == "text":
                    kept.append((ev["step"], "text", v["tag"], v["text"]))
                elif kind == "scalar":
                    kept.append((ev["step"], "scalars", v["tag"], v["value"]))
                elif kind == "image":
                    kept.append((ev["step"], "images", v["tag"], v["image"]))
    out = {"scalars": {}, "images": {}, "text": {}}
    for step, kind, tag, val in kept:
        out[kind].setdefault(tag, []).append((step, val))
    return out, nrec


# ---- TensorBoard's reader ----

def read_tensorboard(run_dir):
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    nrec = 0
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        r = PyRecordReader_New(path)  # DataLossError on a CRC mismatch
        while True:
            try:
                r.GetNext()
            except errors.OutOfRangeError:
                break
            nrec += 1
    acc = ea.EventAccumulator(run_dir, size_guidance={ea.SCALARS: 0, ea.IMAGES: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    out = {"scalars": {}, "images": {}, "text": {}}
    for t in tags.get("scalars", []):
        out["scalars"][t] = [(e.step, e.value) for e in acc.Scalars(t)]
    for t in tags.get("images", []):
        out["images"][t] = [(e.step, (e.width, e.height, e.encoded_image_string)) for e in acc.Images(t)]
    try:
        text_tags = acc.PluginTagToContent("text")
    except KeyError:
        text_tags = {}
    for t in text_tags:
        out["text"][t] = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(t)]
    return out, nrec


# ---- the summary ----

def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check_metrics(data, path):
    lines = [json.loads(l.replace("nan", "NaN")) for l in open(path) if l.strip()]
    n = bad = 0
    for d in lines:
        for k, v in d.items():
            if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            got = [val for s, val in data["scalars"].get(k, []) if s == d["step"]]
            ok = len(got) == 1 and (got[0] == f32(v) or (math.isnan(v) and math.isnan(got[0])))
            n += 1
            if not ok:
                bad += 1
                if bad <= 5:
                    print("MISMATCH step %d %s: metrics.jsonl %r, TensorBoard %r" % (d["step"], k, v, got))
    print("metrics.jsonl: %d values at %d lines, %d equal to TensorBoard's scalars" % (n, len(lines), n - bad))
    return bad == 0


def decodes(png, w, h):
    """'png decodes' if Pillow reads the bytes as a w x h PNG."""
    import io
    from PIL import Image

    try:
        im = Image.open(io.BytesIO(png))
        im.load()
    except Exception as e:
        return "UNDECODABLE (%s)" % e
    return "png decodes" if im.format == "PNG" and im.size == (w, h) else "WRONG %s %s" % (im.format, im.size)


def summary(data, nrec):
    print("records: %d (every CRC checked)" % nrec)
    for tag in sorted(data["scalars"]):
        ev = data["scalars"][tag]
        steps = [s for s, _ in ev]
        if tag in TIMING:
            print("scalar %s: steps %s" % (tag, steps))
        else:
            print("scalar %s: %s" % (tag, " ".join("%d=%.9g" % (s, v) for s, v in ev)))
    for tag in sorted(data["images"]):
        for s, (w, h, png) in data["images"][tag]:
            print("image %s: step %d %dx%d %s sha256 %s" % (tag, s, w, h, decodes(png, w, h),
                                                             hashlib.sha256(png).hexdigest()[:16]))
    for tag in sorted(data["text"]):
        for s, text in data["text"][tag]:
            first = text.split("\n", 1)[0]
            body = "\n".join(l[4:] for l in text.split("\n")[2:])
            try:
                cfg = json.loads(body)
                keys = "config JSON: report_to=%s tracker_project_name=%s max_train_steps=%s" % (
                    cfg.get("report_to"), cfg.get("tracker_project_name"), cfg.get("max_train_steps"))
            except ValueError as e:
                keys = "config JSON unreadable: %s" % e
            print("text %s: step %d '%s' %s" % (tag, s, first, keys))


def serve(run_dir):
    """`tensorboard --logdir` over the run's parent: the scalars plugin lists the loss."""
    import socket
    import subprocess
    import time
    import urllib.parse
    import urllib.request

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    logdir, run = os.path.split(os.path.normpath(run_dir))
    exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    p = subprocess.Popen([exe, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port),
                          "--load_fast", "false"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = "http://127.0.0.1:%d" % port
        for _ in range(120):
            try:
                q = urllib.parse.urlencode({"run": run, "tag": "loss"})
                pts = json.load(urllib.request.urlopen(base + "/data/plugin/scalars/scalars?" + q, timeout=5))
                if pts:
                    break
            except Exception:
                pass
            time.sleep(0.5)
        else:
            print("tensorboard --logdir: no loss scalars served")
            return False
        tags = json.load(urllib.request.urlopen(base + "/data/plugin/images/tags", timeout=5))
        steps = [x[1] for x in pts]
        print("tensorboard --logdir serves run %s: loss at steps %s; image tags %d" % (
            run, steps, len(tags.get(run, {}))))
        return steps == sorted(set(steps))
    finally:
        p.terminate()
        p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--reader", choices=["tensorboard", "builtin"], default="builtin")
    ap.add_argument("--metrics")
    ap.add_argument("--no-purge", action="store_true")
    ap.add_argument("--serve", action="store_true")
    a = ap.parse_args()
    if a.serve:
        sys.exit(0 if serve(a.run_dir) else 1)
    if a.reader == "tensorboard":
        data, nrec = read_tensorboard(a.run_dir)
    else:
        data, nrec = read_builtin(a.run_dir, purge=not a.no_purge)
    summary(data, nrec)
    ok = check_metrics(data, a.metrics) if a.metrics else True
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
