#!/usr/bin/python3
"""Writes the image test fixtures into tests/data/images/ (see tests/data/README.md).

Run with Debian's /usr/bin/python3 and python3-pil (the Pillow that links the
system libjpeg-turbo, so its JPEG decode is the reference for ours):
    /usr/bin/python3 scripts/image_fixtures.py
Every decodable fixture X gets X.rgb: Pillow's Image.open(X).convert("RGB")
pixels as raw bytes (w*h*3). PNG variants Pillow cannot write (16-bit RGB,
Adam7-interlaced) are written by hand here; their .rgb comes from Pillow's
decode too (checked against the pixels written). resize_*.rgb are Pillow
LANCZOS resizes of resize_src_40x30.rgb.
"""
import math
import os
import random
import struct
import sys
import zlib

from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "images")


def scene(w, h, seed):
    """A small RGB picture with gradients, hard edges and noise."""
    rnd = random.Random(seed)
    px = []
    for y in range(h):
        for x in range(w):
            r = int(255 * x / max(1, w - 1))
            g = int(255 * y / max(1, h - 1))
            b = int(127 + 127 * math.sin((x + 2 * y) / 3.0))
            if (x - w * 0.6) ** 2 + (y - h * 0.4) ** 2 < (min(w, h) * 0.25) ** 2:
                r, g, b = 250, 30, 40
            if w // 5 <= x < w // 5 + 4:
                r, g, b = 10, 10, 10
            n = rnd.randint(-12, 12)
            px.append(tuple(max(0, min(255, v + n)) for v in (r, g, b)))
    im = Image.new("RGB", (w, h))
    im.putdata(px)
    return im


def chunk(t, data):
    c = struct.pack(">I", len(data)) + t + data
    return c + struct.pack(">I", zlib.crc32(t + data) & 0xFFFFFFFF)


def png_bytes(w, h, depth, ctype, rows, interlace=False):
    """rows[y] = list of samples (ints); writes filter-0 scanlines."""
    spp = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]

    def pack(samples):
        if depth == 16:
            return b"".join(struct.pack(">H", v) for v in samples)
        return bytes(samples)

    raw = b""
    if not interlace:
        for y in range(h):
            raw += b"\x00" + pack(rows[y])
    else:
        passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
                  (1, 0, 2, 2), (0, 1, 1, 2)]
        for x0, y0, dx, dy in passes:
            for y in range(y0, h, dy):
                xs = list(range(x0, w, dx))
                if not xs:
                    continue
                s = []
                for x in xs:
                    s += rows[y][x * spp:(x + 1) * spp]
                raw += b"\x00" + pack(s)
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 1 if interlace else 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) +
            chunk(b"IEND", b""))


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def ref(name):
    """Pillow's decode of fixture `name` as raw RGB, into name.rgb."""
    with Image.open(os.path.join(OUT, name)) as im:
        im.load()
        rgb = im.convert("RGB")
    write(name + ".rgb", rgb.tobytes())
    return rgb


def main():
    os.makedirs(OUT, exist_ok=True)
    base = scene(23, 17, 1)
    p = lambda n: os.path.join(OUT, n)

    base.save(p("rgb.png"))
    rgba = base.copy()
    rgba.putalpha(Image.linear_gradient("L").resize(base.size))
    rgba.save(p("rgba.png"))
    base.quantize(colors=16).save(p("palette.png"), transparency=3)
    base.convert("L").save(p("grey.png"))
    base.convert("LA").save(p("grey_alpha.png"))
    base.convert("1").save(p("bilevel.png"))
    for n in ("rgb.png", "rgba.png", "palette.png", "grey.png", "grey_alpha.png", "bilevel.png"):
        ref(n)

    # 16-bit RGB (Pillow reads it as RGB;16B, i.e. the high byte) and Adam7.
    w, h = base.size
    data = list(base.getdata())
    rnd = random.Random(7)
    rows16 = [[v * 257 + rnd.randint(-100, 100) if 0 < v < 255 else v * 257
               for x in range(w) for v in data[y * w + x]] for y in range(h)]
    write("rgb16.png", png_bytes(w, h, 16, 2, rows16))
    hi = bytes(v >> 8 for row in rows16 for v in row)
    assert ref("rgb16.png").tobytes() == hi, "Pillow's 16-bit decode is not the high byte"
    rows8 = [[v for x in range(w) for v in data[y * w + x]] for y in range(h)]
    write("interlaced.png", png_bytes(w, h, 8, 2, rows8, interlace=True))
    assert ref("interlaced.png").tobytes() == base.tobytes()
    rowsa = [[v for x in range(w) for v in data[y * w + x] + (x * 11 % 256,)] for y in range(h)]
    write("interlaced_rgba.png", png_bytes(w, h, 8, 6, rowsa, interlace=True))
    ref("interlaced_rgba.png")

    # JPEG: baseline, progressive, grey, CMYK (Adobe), 4:4:4; odd sizes test edge MCUs.
    big = scene(37, 29, 2)
    big.save(p("baseline.jpg"), quality=90)
    big.save(p("progressive.jpg"), quality=85, progressive=True)
    big.convert("L").save(p("grey.jpg"), quality=90)
    big.convert("CMYK").save(p("cmyk.jpg"), quality=90)
    big.save(p("q95_444.jpg"), quality=95, subsampling=0)
    for n in ("baseline.jpg", "progressive.jpg", "grey.jpg", "cmyk.jpg", "q95_444.jpg"):
        ref(n)

    # Resize references.
    src = scene(40, 30, 3)
    write("resize_src_40x30.rgb", src.tobytes())
    for (rw, rh) in [(17, 13), (40, 15), (20, 30), (97, 61), (11, 47), (64, 64), (3, 2)]:
        write("resize_%dx%d.rgb" % (rw, rh), src.resize((rw, rh), Image.LANCZOS).tobytes())

    # Corrupt inputs.
    png = open(p("rgb.png"), "rb").read()
    jpg = open(p("baseline.jpg"), "rb").read()
    write("bad_truncated.png", png[: len(png) // 2])
    write("bad_truncated.jpg", jpg[: len(jpg) * 6 // 10])
    write("bad_garbage.png", bytes(random.Random(5).randrange(256) for _ in range(300)))
    write("bad_empty.png", b"")
    badcrc = bytearray(png)
    badcrc[30] ^= 0xFF  # the IHDR CRC
    write("bad_crc.png", bytes(badcrc))
    jbad = bytearray(jpg)
    for i in range(200, 260):
        jbad[i] = 0xFF if i % 7 == 0 else jbad[i] ^ 0x5A
    write("bad_corrupt.jpg", bytes(jbad))

    def bomb(bw, bh):
        ihdr = struct.pack(">IIBBBBB", bw, bh, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) +
                chunk(b"IDAT", zlib.compress(b"\x00" * 1000)) + chunk(b"IEND", b""))

    write("bad_bomb_100000.png", bomb(100000, 100000))
    write("bad_bomb_20000.png", bomb(20000, 20000))  # sides ok, pixel count too big
    write("bad_bomb_16000.png", bomb(16000, 16000))  # within limits; data cannot be there
    total = sum(os.path.getsize(p(n)) for n in os.listdir(OUT))
    print("image fixtures: %d files, %d bytes in %s" % (len(os.listdir(OUT)), total, OUT))


if __name__ == "__main__":
    sys.exit(main())
