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

The WebP, BMP, GIF and EXIF fixtures (second half of main) get X.rgb from
ImageOps.exif_transpose(Image.open(X)).convert("RGB") — what SimpleTuner feeds
its pipeline — and probe.json lists every fixture's expected header geometry:
{name: [w, h, orientation, format]}, w and h as displayed (after orientation),
format as in ct_image_format (1 PNG, 2 JPEG, 3 WebP, 4 BMP, 5 GIF). Files
Pillow cannot write (16-bit and core-header BMPs, bit fields, 4-bit, top-down,
GIFs with a frame smaller than the screen, big-endian EXIF) are written or
patched by hand here; their .rgb still comes from Pillow's decode.
"""
import json
import math
import os
import random
import struct
import sys
import zlib

from PIL import Image, ImageOps

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
    more_formats(p)
    total = sum(os.path.getsize(p(n)) for n in os.listdir(OUT))
    print("image fixtures: %d files, %d bytes in %s" % (len(os.listdir(OUT)), total, OUT))


FORMAT = {"PNG": 1, "JPEG": 2, "WEBP": 3, "BMP": 4, "GIF": 5}
ORIENT_SWAP = (5, 6, 7, 8)


def ref_t(name):
    """Pillow's exif_transpose + convert("RGB") of fixture `name`, into name.rgb;
    returns its probe.json entry."""
    with Image.open(os.path.join(OUT, name)) as im:
        im.load()
        fmt = FORMAT[im.format]
        o = im.getexif().get(0x0112, 1)
        rgb = ImageOps.exif_transpose(im).convert("RGB")
    write(name + ".rgb", rgb.tobytes())
    o = o if o in range(1, 9) else 1
    return [rgb.size[0], rgb.size[1], o, fmt]


def exif_bytes(orientation, little_endian=False):
    """An EXIF block ("Exif\\0\\0" + TIFF) whose IFD0 holds the orientation
    (Pillow writes big-endian TIFF; little_endian builds an "II" one by hand,
    with another tag before the orientation)."""
    if little_endian:
        tiff = (b"II\x2a\x00" + struct.pack("<I", 8) + struct.pack("<H", 2) +
                struct.pack("<HHIH2x", 0x010F, 3, 1, 7) +
                struct.pack("<HHIH2x", 0x0112, 3, 1, orientation) + struct.pack("<I", 0))
        return b"Exif\x00\x00" + tiff
    ex = Image.Exif()
    ex[0x0112] = orientation
    return ex.tobytes()


def bmp_bytes(w, h, bpp, pixels, palette=None, hsize=40, compression=0, masks=None,
              topdown=False):
    """A BMP by hand. pixels[y][x] is a palette index (bpp <= 8) or a packed
    integer (16/32 bits) or an (r, g, b) tuple (24 bits); rows are top first."""
    stride = ((w * bpp + 31) // 32) * 4
    rows = []
    for y in range(h):
        row = pixels[y]
        if bpp <= 8:
            bits = "".join(format(v, "0%db" % bpp) for v in row)
            bits += "0" * (-len(bits) % 8)
            b = int(bits, 2).to_bytes(len(bits) // 8, "big") if bits else b""
        elif bpp == 24:
            b = b"".join(bytes((bl, g, r)) for (r, g, bl) in row)
        else:
            b = b"".join(v.to_bytes(bpp // 8, "little") for v in row)
        rows.append(b + b"\x00" * (stride - len(b)))
    if not topdown:
        rows = rows[::-1]
    pal = b""
    if palette is not None:
        esz = 3 if hsize == 12 else 4
        pal = b"".join(bytes((bl, g, r)) + (b"\x00" if esz == 4 else b"")
                       for (r, g, bl) in palette)
    extra = b""
    if hsize == 12:
        info = struct.pack("<IHHHH", 12, w, h, 1, bpp)
    else:
        info = struct.pack("<IiiHHIIiiII", hsize, w, -h if topdown else h, 1, bpp, compression,
                           stride * h, 2835, 2835, len(palette or []), 0)
        if masks is not None:
            m = struct.pack("<III", *masks[:3])
            if hsize == 40:
                extra = m
            else:
                info += m + struct.pack("<I", masks[3] if len(masks) > 3 else 0)
        info += b"\x00" * (hsize - len(info))
    off = 14 + len(info) + len(extra) + len(pal)
    data = b"".join(rows)
    return b"BM" + struct.pack("<IHHI", off + len(data), 0, 0, off) + info + extra + pal + data


def gif_blocks(data):
    """(offset of the first image descriptor) in a GIF."""
    off = 13
    if data[10] & 0x80:
        off += 3 << ((data[10] & 7) + 1)
    while data[off] != 0x2C:
        assert data[off] == 0x21, "unexpected GIF block"
        off += 2
        while data[off]:
            off += 1 + data[off]
        off += 1
    return off


def more_formats(p):
    probe = {}
    base = scene(23, 17, 1)
    big = scene(37, 29, 2)

    # Existing fixtures (no EXIF): their geometry.
    for n in ("rgb.png", "rgba.png", "palette.png", "grey.png", "grey_alpha.png", "bilevel.png",
              "rgb16.png", "interlaced.png", "interlaced_rgba.png"):
        probe[n] = [23, 17, 1, 1]
    for n in ("baseline.jpg", "progressive.jpg", "grey.jpg", "cmyk.jpg", "q95_444.jpg"):
        probe[n] = [37, 29, 1, 2]

    # JPEG with EXIF orientation 1..8 (and 9: invalid, ignored), a big-endian one.
    for o in range(1, 10):
        n = "exif_%d.jpg" % o
        base.save(p(n), quality=90, exif=exif_bytes(o))
        probe[n] = ref_t(n)
    base.save(p("exif_ii_6.jpg"), quality=90, exif=exif_bytes(6, little_endian=True))
    probe["exif_ii_6.jpg"] = ref_t("exif_ii_6.jpg")
    # PNG with an eXIf chunk before IDAT.
    base.save(p("exif_8.png"), exif=exif_bytes(8))
    probe["exif_8.png"] = ref_t("exif_8.png")

    # WebP: lossy (VP8), lossless (VP8L), alpha (VP8X + ALPH), EXIF, animation.
    rgba = base.copy()
    rgba.putalpha(Image.linear_gradient("L").resize(base.size))
    base.save(p("lossy.webp"), quality=80, method=4)
    base.save(p("lossless.webp"), lossless=True)
    rgba.save(p("alpha.webp"), quality=80, method=4)
    rgba.save(p("alpha_lossless.webp"), lossless=True)
    base.save(p("exif_6.webp"), quality=80, exif=exif_bytes(6))
    base.save(p("exif_5_raw.webp"), lossless=True, exif=exif_bytes(5)[6:])
    # Pillow writes the EXIF chunk as bare TIFF; some writers keep "Exif\0\0".
    chunks, d = [], open(p("exif_6.webp"), "rb").read()
    o = 12
    while o + 8 <= len(d):
        t, n = d[o:o + 4], struct.unpack("<I", d[o + 4:o + 8])[0]
        body = d[o + 8:o + 8 + n]
        if t == b"EXIF":
            body = exif_bytes(3, little_endian=True)
        chunks.append(t + struct.pack("<I", len(body)) + body + b"\x00" * (len(body) & 1))
        o += 8 + n + (n & 1)
    riff = b"WEBP" + b"".join(chunks)
    write("exif_3_prefixed.webp", b"RIFF" + struct.pack("<I", len(riff)) + riff)
    f2 = base.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    base.save(p("anim.webp"), save_all=True, append_images=[f2], duration=100, lossless=True)
    for n in ("lossy.webp", "lossless.webp", "alpha.webp", "alpha_lossless.webp", "exif_6.webp",
              "exif_5_raw.webp", "exif_3_prefixed.webp", "anim.webp"):
        probe[n] = ref_t(n)

    # BMP: what Pillow writes (24-bit, 32-bit BGRA, 8-bit palette, 1-bit) and by hand.
    base.save(p("rgb24.bmp"))
    rgba.save(p("rgba32.bmp"))
    base.quantize(colors=16).save(p("pal8.bmp"))
    base.convert("1").save(p("bilevel.bmp"))
    w, h = base.size
    px = [[base.getpixel((x, y)) for x in range(w)] for y in range(h)]
    write("topdown24.bmp", bmp_bytes(w, h, 24, px, topdown=True))
    write("core24.bmp", bmp_bytes(w, h, 24, px, hsize=12))
    q = base.quantize(colors=12)
    qpal = q.getpalette()[:36]
    qpal = [tuple(qpal[i:i + 3]) for i in range(0, 36, 3)]
    qidx = [[q.getpixel((x, y)) for x in range(w)] for y in range(h)]
    write("pal4.bmp", bmp_bytes(w, h, 4, qidx, palette=qpal))
    write("core_pal8.bmp", bmp_bytes(w, h, 8, qidx, palette=qpal, hsize=12))
    # 8-bit with a 4-entry palette but indices beyond it (Pillow: grey i, i, i).
    write("pal8_short.bmp", bmp_bytes(w, h, 8, [[(x * 11 + y) % 256 if (x + y) % 3 else x % 4
                                                  for x in range(w)] for y in range(h)],
                                      palette=qpal[:4]))
    rgb555 = [[(r >> 3) << 10 | (g >> 3) << 5 | (b >> 3) for (r, g, b) in row] for row in px]
    rgb565 = [[(r >> 3) << 11 | (g >> 2) << 5 | (b >> 3) for (r, g, b) in row] for row in px]
    write("rgb555.bmp", bmp_bytes(w, h, 16, rgb555))
    write("bitfields565.bmp", bmp_bytes(w, h, 16, rgb565, compression=3,
                                        masks=(0xF800, 0x7E0, 0x1F)))
    xbgr = [[r << 24 | g << 16 | b << 8 for (r, g, b) in row] for row in px]
    write("bitfields_xbgr.bmp", bmp_bytes(w, h, 32, xbgr, hsize=124, compression=3,
                                          masks=(0xFF000000, 0xFF0000, 0xFF00, 0)))
    for n in ("rgb24.bmp", "rgba32.bmp", "pal8.bmp", "bilevel.bmp", "topdown24.bmp",
              "core24.bmp", "pal4.bmp", "core_pal8.bmp", "pal8_short.bmp", "rgb555.bmp",
              "bitfields565.bmp", "bitfields_xbgr.bmp"):
        probe[n] = ref_t(n)

    # GIF: palette (interlaced, as Pillow writes 16+ rows), transparency, grey,
    # a frame smaller than the screen (with and without transparency), animation.
    base.save(p("palette.gif"))
    base.quantize(colors=8).save(p("transparent.gif"), transparency=2)
    base.convert("L").save(p("grey.gif"))
    f2 = base.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    base.save(p("anim.gif"), save_all=True, append_images=[f2], duration=100)
    for src, dst in (("transparent.gif", "offset_transparent.gif"), ("palette.gif",
                                                                    "offset.gif")):
        g = bytearray(open(p(src), "rb").read())
        d = gif_blocks(g)
        struct.pack_into("<HH", g, 6, w + 7, h + 5)    # a larger logical screen
        struct.pack_into("<HH", g, d + 1, 3, 2)        # the frame at (3, 2)
        write(dst, bytes(g))
    g = bytearray(open(p("palette.gif"), "rb").read())
    struct.pack_into("<HH", g, 6, w - 5, h - 4)        # a screen smaller than the frame
    write("small_screen.gif", bytes(g))
    for n in ("palette.gif", "transparent.gif", "grey.gif", "anim.gif", "offset.gif",
              "offset_transparent.gif", "small_screen.gif"):
        probe[n] = ref_t(n)

    write("probe.json", (json.dumps(probe, indent=0, sort_keys=True) + "\n").encode())


if __name__ == "__main__":
    sys.exit(main())
