#!/usr/bin/python3
"""Golden file for ctuner's text encoder: an independent plain-torch CLIP text
transformer following Hugging Face CLIPTextModel semantics (no transformers
package needed), plus the byte tokenizer.

Writes a safetensors file with
  text_model.*           random non-zero weights under HF names (F32)
  input.ids              (B, T) int32 token ids
  output.seq             (B, T, hidden) final-LN sequence (F32)
  output.pooled          (B, hidden) final-LN state at the first EOS
                         (or the last position when a row has no EOS)
and __metadata__ with the config (vocab, max_pos, hidden, heads, layers,
intermediate, ln_eps, B, T) and caption0..caption{B-1} (the texts; a row with
no caption holds raw ids without EOS).
The reference runs in float64 from the float32-rounded weights, so the stored
outputs are exact up to float32 output rounding.

Usage: /usr/bin/python3 scripts/textenc_golden.py --out tests/data/textenc_golden.safetensors
"""
import argparse
import json
import math
import struct

import torch

BOS, EOS, PAD = 256, 257, 258


def tokenize_bytes(text, T):
    b = list(text.encode("utf-8"))[: T - 2]
    ids = [BOS] + b + [EOS]
    return ids + [PAD] * (T - len(ids))


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased, as nn.LayerNorm
    return (x - mean) / torch.sqrt(var + eps) * w + b


def linear(x, p, name):
    return x @ p[name + ".weight"].t() + p[name + ".bias"]


def clip_text(p, ids, cfg):
    """HF CLIPTextTransformer.forward with attention_mask=None."""
    B, T = ids.shape
    d, H = cfg["hidden"], cfg["heads"]
    hd = d // H
    eps = cfg["ln_eps"]
    pre = "text_model."
    x = p[pre + "embeddings.token_embedding.weight"][ids] + p[pre + "embeddings.position_embedding.weight"][:T][None]
    # causal mask above the diagonal (HF adds finfo.min; the softmax is the same)
    mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    for l in range(cfg["layers"]):
        lp = pre + "encoder.layers.%d." % l
        r = x
        h = layer_norm(x, p[lp + "layer_norm1.weight"], p[lp + "layer_norm1.bias"], eps)
        q = linear(h, p, lp + "self_attn.q_proj") * hd ** -0.5
        k = linear(h, p, lp + "self_attn.k_proj")
        v = linear(h, p, lp + "self_attn.v_proj")
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) + mask, dim=-1)
        o = (a @ v).transpose(1, 2).reshape(B, T, d)
        x = r + linear(o, p, lp + "self_attn.out_proj")
        r = x
        h = layer_norm(x, p[lp + "layer_norm2.weight"], p[lp + "layer_norm2.bias"], eps)
        h = linear(h, p, lp + "mlp.fc1")
        h = h * torch.sigmoid(1.702 * h)  # quick_gelu
        x = r + linear(h, p, lp + "mlp.fc2")
    seq = layer_norm(x, p[pre + "final_layer_norm.weight"], p[pre + "final_layer_norm.bias"], eps)
    pooled = []
    for b in range(B):
        hits = (ids[b] == EOS).nonzero()
        at = int(hits[0]) if len(hits) else T - 1
        pooled.append(seq[b, at])
    return seq, torch.stack(pooled)


def write_safetensors(path, tensors, meta):
    codes = {torch.float32: "F32", torch.int32: "I32"}
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for blob in blobs:
            f.write(blob)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    cfg = dict(vocab=259, max_pos=16, hidden=48, heads=3, layers=2, intermediate=96, ln_eps=1e-5, T=16)
    d, I, T = cfg["hidden"], cfg["intermediate"], cfg["T"]
    captions = [
        "a red cube",
        "",  # empty caption: BOS EOS PAD...
        "a very long caption that does not fit in sixteen tokens",  # truncated
        "caf\u00e9 \u2615 na\u00efve",  # multi-byte UTF-8
    ]
    ids = [tokenize_bytes(c, T) for c in captions]
    # a row without EOS: pooled falls back to the last position
    ids.append([BOS] + [(7 * i + 3) % 256 for i in range(T - 1)])
    ids = torch.tensor(ids, dtype=torch.int64)

    # Random non-zero weights, scaled so that attention is far from uniform and
    # every tensor matters to the outputs.
    def rn(*shape, std=1.0, mean=0.0):
        return (mean + std * torch.randn(*shape)).float()

    p = {}
    pre = "text_model."
    p[pre + "embeddings.token_embedding.weight"] = rn(cfg["vocab"], d, std=0.5)
    p[pre + "embeddings.position_embedding.weight"] = rn(cfg["max_pos"], d, std=0.5)
    for l in range(cfg["layers"]):
        lp = pre + "encoder.layers.%d." % l
        for ln in ("layer_norm1", "layer_norm2"):
            p[lp + ln + ".weight"] = rn(d, std=0.2, mean=1.0)
            p[lp + ln + ".bias"] = rn(d, std=0.1)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            p[lp + "self_attn." + proj + ".weight"] = rn(d, d, std=2.0 / math.sqrt(d))
            p[lp + "self_attn." + proj + ".bias"] = rn(d, std=0.1)
        p[lp + "mlp.fc1.weight"] = rn(I, d, std=1.5 / math.sqrt(d))
        p[lp + "mlp.fc1.bias"] = rn(I, std=0.1)
        p[lp + "mlp.fc2.weight"] = rn(d, I, std=1.0 / math.sqrt(I))
        p[lp + "mlp.fc2.bias"] = rn(d, std=0.1)
    p[pre + "final_layer_norm.weight"] = rn(d, std=0.2, mean=1.0)
    p[pre + "final_layer_norm.bias"] = rn(d, std=0.1)

    p64 = {k: v.double() for k, v in p.items()}
    with torch.no_grad():
        seq, pooled = clip_text(p64, ids, cfg)
    tensors = dict(p)
    tensors["input.ids"] = ids.to(torch.int32)
    tensors["output.seq"] = seq.float()
    tensors["output.pooled"] = pooled.float()
    meta = {k: str(v) for k, v in cfg.items()}
    meta["B"] = str(ids.shape[0])
    for i, c in enumerate(captions):
        meta["caption%d" % i] = c
    write_safetensors(args.out, tensors, meta)
    print("wrote %s: B=%d T=%d hidden=%d, pooled[0][:4]=%s" % (args.out, ids.shape[0], T, d, pooled[0, :4].tolist()))


if __name__ == "__main__":
    main()
