#!/usr/bin/python3
"""Golden file for ctuner's AutoencoderKL (docs/vae.md): a plain-PyTorch
implementation of diffusers' AutoencoderKL architecture (no diffusers needed),
random weights in diffusers' state_dict names, an input batch, the encoder's
mean and logvar, a latent batch and the decoder's output, and the gradients of
a fixed loss with respect to the inputs and every parameter.

Usage: vae_golden.py --out tests/data/vae_golden.safetensors [--seed 0]
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6


class Resnet(nn.Module):
    def __init__(self, cin, cout, groups):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=EPS)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout, eps=EPS)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.conv_shortcut(x) if self.conv_shortcut is not None else x) + h


class Attention(nn.Module):
    def __init__(self, c, groups):
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, c, eps=EPS)
        self.to_q = nn.Linear(c, c)
        self.to_k = nn.Linear(c, c)
        self.to_v = nn.Linear(c, c)
        self.to_out = nn.ModuleList([nn.Linear(c, c)])

    def forward(self, x):
        b, c, h, w = x.shape
        t = self.group_norm(x).view(b, c, h * w).transpose(1, 2)
        q, k, v = self.to_q(t), self.to_k(t), self.to_v(t)
        a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(c), dim=-1) @ v
        o = self.to_out[0](a).transpose(1, 2).reshape(b, c, h, w)
        return x + o


class Mid(nn.Module):
    def __init__(self, c, groups, attn):
        super().__init__()
        self.attentions = nn.ModuleList([Attention(c, groups)] if attn else [])
        self.resnets = nn.ModuleList([Resnet(c, c, groups), Resnet(c, c, groups)])

    def forward(self, x):
        x = self.resnets[0](x)
        for a in self.attentions:
            x = a(x)
        return self.resnets[1](x)


class Down(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2, padding=0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Up(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Block(nn.Module):
    def __init__(self, cin, cout, n, groups, sampler):
        super().__init__()
        self.resnets = nn.ModuleList([Resnet(cin if i == 0 else cout, cout, groups) for i in range(n)])
        if sampler == "down":
            self.downsamplers = nn.ModuleList([Down(cout)])
        elif sampler == "up":
            self.upsamplers = nn.ModuleList([Up(cout)])
        self.kind = sampler

    def forward(self, x):
        for r in self.resnets:
            x = r(x)
        if self.kind == "down":
            x = self.downsamplers[0](x)
        elif self.kind == "up":
            x = self.upsamplers[0](x)
        return x


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        boc, g, n = cfg["block_out_channels"], cfg["norm_num_groups"], cfg["layers_per_block"]
        self.conv_in = nn.Conv2d(cfg["in_channels"], boc[0], 3, padding=1)
        blocks, prev = [], boc[0]
        for i, c in enumerate(boc):
            blocks.append(Block(prev, c, n, g, "down" if i < len(boc) - 1 else None))
            prev = c
        self.down_blocks = nn.ModuleList(blocks)
        self.mid_block = Mid(boc[-1], g, cfg["mid_block_add_attention"])
        self.conv_norm_out = nn.GroupNorm(g, boc[-1], eps=EPS)
        self.conv_out = nn.Conv2d(boc[-1], 2 * cfg["latent_channels"], 3, padding=1)

    def forward(self, x):
        x = self.conv_in(x)
        for b in self.down_blocks:
            x = b(x)
        x = self.mid_block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        boc, g, n = cfg["block_out_channels"], cfg["norm_num_groups"], cfg["layers_per_block"]
        self.conv_in = nn.Conv2d(cfg["latent_channels"], boc[-1], 3, padding=1)
        rev, blocks, prev = list(reversed(boc)), [], boc[-1]
        for i, c in enumerate(rev):
            blocks.append(Block(prev, c, n + 1, g, "up" if i < len(boc) - 1 else None))
            prev = c
        self.up_blocks = nn.ModuleList(blocks)
        self.mid_block = Mid(boc[-1], g, cfg["mid_block_add_attention"])
        self.conv_norm_out = nn.GroupNorm(g, boc[0], eps=EPS)
        self.conv_out = nn.Conv2d(boc[0], cfg["out_channels"], 3, padding=1)

    def forward(self, z):
        x = self.mid_block(self.conv_in(z))
        for b in self.up_blocks:
            x = b(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class AutoencoderKL(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        lc = cfg["latent_channels"]
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.quant_conv = nn.Conv2d(2 * lc, 2 * lc, 1) if cfg["use_quant_conv"] else None
        self.post_quant_conv = nn.Conv2d(lc, lc, 1) if cfg["use_post_quant_conv"] else None
        self.lc = lc

    def encode(self, x):
        m = self.encoder(x)
        if self.quant_conv is not None:
            m = self.quant_conv(m)
        mean, logvar = m[:, : self.lc], m[:, self.lc :]
        return mean, torch.clamp(logvar, -30.0, 20.0)

    def decode(self, z):
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        return self.decoder(z)


def blend_v(a, b, extent):
    extent = min(a.shape[2], b.shape[2], extent)
    for y in range(extent):
        b[:, :, y, :] = a[:, :, -extent + y, :] * (1 - y / extent) + b[:, :, y, :] * (y / extent)
    return b


def blend_h(a, b, extent):
    extent = min(a.shape[3], b.shape[3], extent)
    for x in range(extent):
        b[:, :, :, x] = a[:, :, :, -extent + x] * (1 - x / extent) + b[:, :, :, x] * (x / extent)
    return b


def tiles(inp, tile_in, tile_out, fn):
    """diffusers' tiling: tiles of tile_in every tile_in*0.75, outputs blended
    over tile_out*0.25 and cropped to tile_out - blend."""
    overlap = int(tile_in * 0.75)
    blend = int(tile_out * 0.25)
    limit = tile_out - blend
    rows = []
    for i in range(0, inp.shape[2], overlap):
        rows.append([fn(inp[:, :, i:i + tile_in, j:j + tile_in]) for j in range(0, inp.shape[3], overlap)])
    result = []
    for i, row in enumerate(rows):
        r = []
        for j, t in enumerate(row):
            if i > 0:
                t = blend_v(rows[i - 1][j], t, blend)
            if j > 0:
                t = blend_h(row[j - 1], t, blend)
            r.append(t[:, :, :limit, :limit])
        result.append(torch.cat(r, dim=3))
    return torch.cat(result, dim=2)


def tiled_encode(m, x, tile, f):
    def enc(t):
        h = m.encoder(t)
        return m.quant_conv(h) if m.quant_conv is not None else h
    mom = tiles(x, tile, tile // f, enc)
    return mom[:, : m.lc], torch.clamp(mom[:, m.lc :], -30.0, 20.0)


def tiled_decode(m, z, tile, f):
    return tiles(z, tile // f, tile, m.decode)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    cfg = {"_class_name": "AutoencoderKL", "in_channels": 3, "out_channels": 3, "block_out_channels": [8, 16],
           "down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2,
           "layers_per_block": 1, "latent_channels": 4, "norm_num_groups": 4, "act_fn": "silu",
           "scaling_factor": 0.5, "shift_factor": 0.1, "use_quant_conv": True, "use_post_quant_conv": True,
           "mid_block_add_attention": True}
    m = AutoencoderKL(cfg).double()
    with torch.no_grad():  # non-trivial norms
        for n, p in m.named_parameters():
            if "norm" in n:
                p.add_(0.2 * torch.randn_like(p))
    x = torch.rand(2, 3, 12, 10, dtype=torch.float64) * 2 - 1
    z = torch.randn(2, 4, 6, 5, dtype=torch.float64)
    x.requires_grad_(True)
    z.requires_grad_(True)
    mean, logvar = m.encode(x)
    dec = m.decode(z)
    # a fixed loss through both halves for the gradient checks
    rm = torch.linspace(-1, 1, mean.numel(), dtype=torch.float64).view_as(mean)
    rl = torch.linspace(1, -1, logvar.numel(), dtype=torch.float64).view_as(logvar)
    rd = torch.cos(torch.arange(dec.numel(), dtype=torch.float64)).view_as(dec)
    loss = (mean * rm).sum() + (logvar * rl).sum() + (dec * rd).sum()
    loss.backward()
    # tiled encode/decode as diffusers' AutoencoderKL.tiled_encode/tiled_decode
    # (tile_overlap_factor 0.25), on inputs larger than one tile
    with torch.no_grad():
        xt = torch.rand(1, 3, 20, 16, dtype=torch.float64) * 2 - 1
        zt = torch.randn(1, 4, 10, 7, dtype=torch.float64)
        tmean, tlogvar = tiled_encode(m, xt, 8, 2)
        tdec = tiled_decode(m, zt, 8, 2)
    out = {"in.xt": xt.float(), "in.zt": zt.float(), "out.tiled_mean": tmean.float(),
           "out.tiled_logvar": tlogvar.float(), "out.tiled_decoded": tdec.float()}
    for n, p in m.named_parameters():
        out[n] = p.detach().float().contiguous()
        out["grad." + n] = p.grad.detach().float().contiguous()
    out.update({"in.x": x.detach().float(), "in.z": z.detach().float(), "out.mean": mean.detach().float(),
                "out.logvar": logvar.detach().float(), "out.decoded": dec.detach().float(),
                "in.rm": rm.float(), "in.rl": rl.float(), "in.rd": rd.float(),
                "grad.in.x": x.grad.float(), "grad.in.z": z.grad.float()})
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from textenc_golden import write_safetensors
    write_safetensors(a.out, {k: v.contiguous() for k, v in out.items()}, {"config": json.dumps(cfg), "seed": str(a.seed)})


if __name__ == "__main__":
    main()
