#!/usr/bin/env python3
"""PyTorch peer of the MMDiT described in docs/model.md (Flux semantics and
parameter names). Two uses:

  bench   time one flow-matching training step on the CPU, the figure a user would
          otherwise get from PyTorch:  python3 mmdit_torch.py bench --preset bench
  golden  write a safetensors file with weights, inputs, outputs, loss and parameter
          gradients for a preset, for parity tests of another implementation:
          python3 mmdit_torch.py golden --preset tiny --seed 0 --out tiny.safetensors
          (--set FIELD=VALUE overrides a preset field; the file's __metadata__ holds
          every field as JSON: lat, hidden, heads, axes, nd, ns, ctx, vec, B, hw, T).
          Tensors: param.<name>, grad.<name>, input.{x0,eps,t,txt,y},
          output.{xt,v_pred,loss}; all F32.

Needs only Debian's python3-torch (apt-get install python3-torch); run it with
/usr/bin/python3. It is the independent reference the parity tests (tests/cli_model.sh,
scripts/golden.sh) and `make bench` compare ctuner with; it imports nothing of ctuner.
"""
import argparse, json, math, struct, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
SDPA = hasattr(F, "scaled_dot_product_attention")

PRESETS = {
    # name: latent_ch, hidden, heads, axes_dim, double, single, context_in, vec_in, batch, lat_hw, txt_len
    "tiny":  dict(lat=4,  hidden=64,  heads=2, axes=(8, 12, 12),  nd=1, ns=1, ctx=32,  vec=32,  B=2,  hw=(4, 6),  T=5),
    "small": dict(lat=12, hidden=192, heads=3, axes=(16, 24, 24), nd=2, ns=4, ctx=128, vec=128, B=32, hw=(16, 16), T=32),
    "bench": dict(lat=4,  hidden=384, heads=6, axes=(16, 24, 24), nd=4, ns=8, ctx=256, vec=256, B=16, hw=(16, 16), T=16),
}

def timestep_embedding(t, dim, max_period=10000, time_factor=1000.0):
    t = time_factor * t
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

def rope(pos, dim, theta):
    scale = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    omega = 1.0 / (theta ** scale)
    out = pos[..., None].double() * omega            # ..., n, dim/2
    return torch.stack([out.cos(), out.sin()], -1).float()   # ..., n, dim/2, 2

def pe_embed(ids, axes, theta=10000):
    # ids: B, L, n_axes -> B, 1, L, head_dim/2, 2 (cos, sin)
    return torch.cat([rope(ids[..., i], axes[i], theta) for i in range(len(axes))], dim=-2)[:, None]

def apply_rope(x, pe):
    # rotate consecutive pairs (x[2j], x[2j+1]) by the angle of pair j
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    c, s = pe[..., 0], pe[..., 1]
    out = torch.stack([c * xs[..., 0] - s * xs[..., 1], s * xs[..., 0] + c * xs[..., 1]], -1)
    return out.reshape(*x.shape).type_as(x)

def attention(q, k, v, pe):
    q, k = apply_rope(q, pe), apply_rope(k, pe)
    if SDPA and q.is_cuda:  # the fused kernel a CUDA user of torch 2 gets (flash / cuDNN)
        a = F.scaled_dot_product_attention(q, k, v)
    else:
        a = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]), dim=-1) @ v
    B, H, L, D = a.shape
    return a.transpose(1, 2).reshape(B, L, H * D)

class RMSNorm(nn.Module):
    def __init__(s, d):
        super().__init__(); s.scale = nn.Parameter(torch.ones(d))
    def forward(s, x):
        return x * torch.rsqrt(torch.mean(x.float() ** 2, -1, keepdim=True) + 1e-6) * s.scale

class QKNorm(nn.Module):
    def __init__(s, d):
        super().__init__(); s.query_norm = RMSNorm(d); s.key_norm = RMSNorm(d)
    def forward(s, q, k):
        return s.query_norm(q), s.key_norm(k)

class MLPEmbedder(nn.Module):
    def __init__(s, i, h):
        super().__init__(); s.in_layer = nn.Linear(i, h); s.out_layer = nn.Linear(h, h)
    def forward(s, x):
        return s.out_layer(F.silu(s.in_layer(x)))

class Modulation(nn.Module):
    def __init__(s, d, double):
        super().__init__(); s.n = 6 if double else 3; s.lin = nn.Linear(d, s.n * d)
    def forward(s, vec):
        return s.lin(F.silu(vec))[:, None, :].chunk(s.n, dim=-1)   # shift, scale, gate (x2)

def ln(x):
    return F.layer_norm(x, x.shape[-1:], eps=1e-6)

class SelfAttention(nn.Module):
    def __init__(s, d, h):
        super().__init__(); s.qkv = nn.Linear(d, 3 * d); s.norm = QKNorm(d // h); s.proj = nn.Linear(d, d)

class DoubleStreamBlock(nn.Module):
    def __init__(s, d, h):
        super().__init__(); s.h = h
        s.img_mod = Modulation(d, True); s.img_attn = SelfAttention(d, h)
        s.img_mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        s.txt_mod = Modulation(d, True); s.txt_attn = SelfAttention(d, h)
        s.txt_mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
    def qkv(s, x, m, at):
        B, L, _ = x.shape
        q, k, v = at.qkv((1 + m[1]) * ln(x) + m[0]).view(B, L, 3, s.h, -1).permute(2, 0, 3, 1, 4)
        q, k = at.norm(q, k)
        return q, k, v
    def forward(s, img, txt, vec, pe):
        im, tm = s.img_mod(vec), s.txt_mod(vec)
        iq, ik, iv = s.qkv(img, im, s.img_attn); tq, tk, tv = s.qkv(txt, tm, s.txt_attn)
        a = attention(torch.cat([tq, iq], 2), torch.cat([tk, ik], 2), torch.cat([tv, iv], 2), pe)
        T = txt.shape[1]
        img = img + im[2] * s.img_attn.proj(a[:, T:])
        img = img + im[5] * s.img_mlp((1 + im[4]) * ln(img) + im[3])
        txt = txt + tm[2] * s.txt_attn.proj(a[:, :T])
        txt = txt + tm[5] * s.txt_mlp((1 + tm[4]) * ln(txt) + tm[3])
        return img, txt

class SingleStreamBlock(nn.Module):
    def __init__(s, d, h):
        super().__init__(); s.h = h; s.d = d
        s.linear1 = nn.Linear(d, 3 * d + 4 * d); s.linear2 = nn.Linear(d + 4 * d, d)
        s.norm = QKNorm(d // h); s.modulation = Modulation(d, False)
    def forward(s, x, vec, pe):
        B, L, d = x.shape
        m = s.modulation(vec)
        qkv, mlp = s.linear1((1 + m[1]) * ln(x) + m[0]).split([3 * d, 4 * d], -1)
        q, k, v = qkv.view(B, L, 3, s.h, -1).permute(2, 0, 3, 1, 4)
        q, k = s.norm(q, k)
        a = attention(q, k, v, pe)
        return x + m[2] * s.linear2(torch.cat([a, F.gelu(mlp, approximate="tanh")], 2))

class LastLayer(nn.Module):
    def __init__(s, d, out):
        super().__init__(); s.linear = nn.Linear(d, out)
        s.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
    def forward(s, x, vec):
        shift, scale = s.adaLN_modulation(vec).chunk(2, dim=1)
        return s.linear((1 + scale[:, None]) * ln(x) + shift[:, None])

class MMDiT(nn.Module):
    def __init__(s, p):
        super().__init__(); d = p["hidden"]; s.p = p
        s.img_in = nn.Linear(p["lat"] * 4, d)
        s.time_in = MLPEmbedder(256, d); s.vector_in = MLPEmbedder(p["vec"], d)
        s.txt_in = nn.Linear(p["ctx"], d)
        s.double_blocks = nn.ModuleList([DoubleStreamBlock(d, p["heads"]) for _ in range(p["nd"])])
        s.single_blocks = nn.ModuleList([SingleStreamBlock(d, p["heads"]) for _ in range(p["ns"])])
        s.final_layer = LastLayer(d, p["lat"] * 4)
    def forward(s, x, t, txt, y):
        B, C, H, W = x.shape; gh, gw = H // 2, W // 2
        img = x.view(B, C, gh, 2, gw, 2).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * 4)
        img_ids = torch.zeros(gh, gw, 3); img_ids[..., 1] = torch.arange(gh)[:, None]; img_ids[..., 2] = torch.arange(gw)[None]
        ids = torch.cat([torch.zeros(B, txt.shape[1], 3), img_ids.reshape(1, -1, 3).expand(B, -1, -1)], 1)
        pe = pe_embed(ids, s.p["axes"])
        vec = s.time_in(timestep_embedding(t, 256)) + s.vector_in(y)
        img = s.img_in(img); txt = s.txt_in(txt)
        for b in s.double_blocks:
            img, txt = b(img, txt, vec, pe)
        T = txt.shape[1]; xx = torch.cat([txt, img], 1)
        for b in s.single_blocks:
            xx = b(xx, vec, pe)
        out = s.final_layer(xx[:, T:], vec)
        return out.view(B, gh, gw, C, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)

def init_random(m, gen):
    # golden files use non-zero random weights everywhere so that every path is exercised
    with torch.no_grad():
        for n, prm in m.named_parameters():
            if n.endswith(".scale"):
                prm.copy_(1 + 0.1 * torch.randn(prm.shape, generator=gen))
            else:
                prm.copy_(0.05 * torch.randn(prm.shape, generator=gen))

def inputs(p, gen):
    B, (H, W), T = p["B"], p["hw"], p["T"]
    x0 = torch.randn(B, p["lat"], H, W, generator=gen)
    eps = torch.randn(B, p["lat"], H, W, generator=gen)
    t = torch.sigmoid(torch.randn(B, generator=gen))
    txt = torch.randn(B, T, p["ctx"], generator=gen)
    y = torch.randn(B, p["vec"], generator=gen)
    return x0, eps, t, txt, y

def flow_loss(m, x0, eps, t, txt, y):
    tt = t[:, None, None, None]
    xt = (1 - tt) * x0 + tt * eps
    out = m(xt, t, txt, y)
    return F.mse_loss(out.float(), eps - x0), xt, out

def write_safetensors(path, tensors, meta):
    header, blobs, off = {"__metadata__": meta}, [], 0
    for name, tns in tensors.items():
        b = tns.detach().contiguous().float().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tns.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h)
        for b in blobs: f.write(b)

def with_overrides(preset, sets):
    p = dict(PRESETS[preset])
    for kv in sets or []:
        k, v = kv.split("=", 1)
        if k not in p:
            sys.exit(f"unknown preset field {k!r}; fields: {', '.join(p)}")
        p[k] = tuple(int(x) for x in v.split(",")) if isinstance(p[k], tuple) else int(v)
    if p["hw"][0] % 2 or p["hw"][1] % 2:
        sys.exit("hw is the latent height,width and must be even (patch 2)")
    if sum(p["axes"]) * p["heads"] != p["hidden"]:
        sys.exit("axes must sum to head_dim = hidden / heads")
    return p

def golden(a):
    p = with_overrides(a.preset, a.set); gen = torch.Generator().manual_seed(a.seed)
    m = MMDiT(p); init_random(m, gen)
    x0, eps, t, txt, y = inputs(p, gen)
    loss, xt, out = flow_loss(m, x0, eps, t, txt, y)
    loss.backward()
    ts = {f"param.{n}": prm for n, prm in m.named_parameters()}
    ts.update({f"grad.{n}": prm.grad for n, prm in m.named_parameters()})
    ts.update({"input.x0": x0, "input.eps": eps, "input.t": t, "input.txt": txt, "input.y": y,
               "output.xt": xt, "output.v_pred": out, "output.loss": loss.reshape(1)})
    meta = {k: json.dumps(v) for k, v in p.items()}
    write_safetensors(a.out, ts, meta)
    print(f"wrote {a.out}: {len(ts)} tensors, loss {loss.item():.6f}")

def bench(a):
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if dev.type == "cuda":  # float32 means float32 (ctuner's cuda backend computes without TF32)
        torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
    p = dict(PRESETS[a.preset]); gen = torch.Generator().manual_seed(0)
    m = MMDiT(p).to(dev); opt = torch.optim.AdamW(m.parameters(), lr=1e-4, **({"fused": True} if dev.type == "cuda" else {}))
    x0, _, _, txt, y = (v.to(dev) for v in inputs(p, gen))
    fwd = torch.compile(flow_loss) if a.compile else flow_loss
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    def step():
        t = torch.sigmoid(torch.randn(p["B"], device=dev)); eps = torch.randn_like(x0)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.bf16):
            loss, _, _ = fwd(m, x0, eps, t, txt, y)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    t0 = time.perf_counter()
    for _ in range(a.warmup): step()
    sync(); warm = time.perf_counter() - t0
    ts = []
    for _ in range(a.steps):
        t0 = time.perf_counter(); step(); sync(); ts.append(time.perf_counter() - t0)
    ts.sort(); med = ts[len(ts) // 2]
    n = sum(x.numel() for x in m.parameters())
    out = {"peer": "pytorch", "version": torch.__version__, "preset": a.preset, "threads": a.threads,
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "compile": a.compile,
           "bf16": a.bf16, "params": n, "ms_per_step_median": round(med * 1e3, 3),
           "ms_per_step_min": round(ts[0] * 1e3, 3), "warmup_s": round(warm, 1)}
    if dev.type == "cuda":
        out["device_peak_mb"] = round(torch.cuda.max_memory_allocated(dev) / 1048576, 1)
    print(json.dumps(out))

if __name__ == "__main__":
    ap = argparse.ArgumentParser(); sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("golden"); g.add_argument("--preset", default="tiny"); g.add_argument("--seed", type=int, default=0); g.add_argument("--out", required=True)
    g.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a preset field, e.g. hw=3,5 or hidden=96")
    b = sub.add_parser("bench"); b.add_argument("--preset", default="bench"); b.add_argument("--threads", type=int, default=2)
    b.add_argument("--steps", type=int, default=10); b.add_argument("--warmup", type=int, default=3); b.add_argument("--bf16", action="store_true")
    b.add_argument("--device", default="cpu", help="cpu or cuda (a GPU: scripts/gpu_check.sh)")
    b.add_argument("--compile", action="store_true", help="torch.compile the forward and loss (torch >= 2)")
    a = ap.parse_args()
    golden(a) if a.cmd == "golden" else bench(a)
