#!/usr/bin/python3
"""Writes tests/data/st_python.safetensors byte by byte with struct + json + numpy
(+ torch for bfloat16 rounding), independently of ctuner's writer, so that the C
reader and converters are checked against other implementations.

Layout choices that differ from ctuner's writer on purpose: header keys in a
different order from the data, data written in reverse key order, metadata last,
ensure_ascii escapes (\\u00e9) in strings.

    /usr/bin/python3 tests/data/gen_st_python.py   # rewrites the .safetensors file
"""
import json
import os
import struct

import numpy as np
import torch


def f32_from_bits(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def source_values():
    special = [0.0, -0.0, 1.0, -2.5, 0.1, 1.0 / 3.0, 65504.0, 65519.0, 65520.0, 70000.0,
               1e-6, 6e-8, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25, -1e-8, 3.0e38,
               float("inf"), float("-inf"), float("nan"),
               f32_from_bits(0x3F808000),  # bf16 tie -> even (down)
               f32_from_bits(0x3F818000),  # bf16 tie -> even (up)
               1.0 + 2.0 ** -11,           # f16 tie -> even (down)
               1.0 + 3 * 2.0 ** -11,       # f16 tie -> even (up)
               f32_from_bits(0x7F7FFFFF),  # max float: bf16 rounds to inf
               2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 0.5, -65504.0, 1234.5678, -7.0e-5, 42.0]
    rng = np.random.default_rng(20240531)
    mags = 10.0 ** rng.uniform(-9, 6, size=32)
    rand = rng.standard_normal(32) * mags
    return np.array(special + list(rand), dtype=np.float32)


def main():
    src = source_values()
    assert src.size == 64
    with np.errstate(over="ignore"):  # 65520 and up become inf, on purpose
        f16 = src.astype(np.float16)
    bf16 = torch.from_numpy(src.copy()).to(torch.bfloat16).view(torch.int16).numpy()
    tensors = {
        # name: (dtype, shape, bytes)
        "weights.f32": ("F32", [8, 8], src.astype("<f4").tobytes()),
        "weights.f16": ("F16", [64], f16.astype("<f2").tobytes()),
        "weights.bf16": ("BF16", [4, 16], bf16.astype("<i2").tobytes()),
        "ids.i64": ("I64", [3], np.array([1, -2, 3], dtype="<i8").tobytes()),
        "empty": ("F32", [0, 4], b""),
        "scalar": ("F32", [], np.array([42.5], dtype="<f4").tobytes()),
    }
    data = b""
    offsets = {}
    for name in reversed(list(tensors)):
        offsets[name] = (len(data), len(data) + len(tensors[name][2]))
        data += tensors[name][2]
    header = {}
    for name in sorted(tensors):
        dtype, shape, _ = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": list(offsets[name])}
    header["__metadata__"] = {"format": "pt", "generator": "gen_st_python.py",
                              "note": "caf\u00e9 \"quoted\"\n\U0001F600"}
    text = json.dumps(header, ensure_ascii=True).encode("ascii")
    text += b" " * ((8 - len(text) % 8) % 8)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "st_python.safetensors")
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)
    print(f"wrote {out}: header {len(text)} bytes, data {len(data)} bytes")


if __name__ == "__main__":
    main()
