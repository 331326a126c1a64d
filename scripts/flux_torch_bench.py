#!/usr/bin/env python3
"""The PyTorch peer a user would pick: diffusers' FluxTransformer2DModel on
PyTorch 2 from PyPI, one flow-matching training step of ctuner's `bench`
preset, timed as `ctuner bench step` times it (warm-up steps, then the median
of N). Run it with the diffusers venv (scripts/py_deps.sh diffusers):

  ~/.cache/ctuner/py-venv-torch2/bin/python scripts/flux_torch_bench.py \
      --mode eager-fp32 --threads 2 [--steps 10 --warmup 3]

Modes: eager-fp32, eager-bf16 (torch.autocast("cpu", bfloat16) around the
forward and the loss, fp32 weights, gradients and AdamW state), compile-fp32,
compile-bf16 (the same under torch.compile of the transformer, default
inductor backend). Prints one JSON line like scripts/mmdit_torch.py's; a mode
that fails prints {"mode": ..., "error": "..."} with the exception's first
line and exits 3, so scripts/bench.sh can report why.

The shape is ctuner's `bench` preset (src/model/mmdit_params.c, and PRESETS
in scripts/mmdit_torch.py): 4 latent channels packed 2x2 outside the model as
FluxPipeline does (in_channels 16, patch_size 1; ctuner packs inside with
patch 2), hidden 384 = 6 heads x 64, axes_dims_rope 16,24,24, 4 double + 8
single blocks, joint_attention_dim 256, pooled_projection_dim 256, no
guidance embedding; batch 16, a 16x16 latent (64 image tokens), 16 text
tokens. One step: x_t = (1-t) x0 + t eps, v = model(pack(x_t), ...),
MSE(v, pack(eps - x0)), backward, AdamW(lr 1e-4, weight decay 0.01, as
`ctuner bench step`). It imports nothing of ctuner.
"""
import argparse, json, sys, time, traceback

PRESET = dict(lat=4, hidden=384, heads=6, axes=(16, 24, 24), nd=4, ns=8, ctx=256, vec=256, B=16,
              hw=(16, 16), T=16)
MODES = ("eager-fp32", "eager-bf16", "compile-fp32", "compile-bf16")


def pack(x):
    # (B, C, H, W) -> (B, H/2 * W/2, 4C), features (c, dy, dx): FluxPipeline._pack_latents
    B, C, H, W = x.shape
    return x.view(B, C, H // 2, 2, W // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(B, (H // 2) * (W // 2), C * 4)


def run(a):
    import torch
    import torch.nn.functional as F
    from diffusers import FluxTransformer2DModel

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    p = PRESET
    m = FluxTransformer2DModel(patch_size=1, in_channels=p["lat"] * 4, out_channels=None, num_layers=p["nd"],
                               num_single_layers=p["ns"], attention_head_dim=p["hidden"] // p["heads"],
                               num_attention_heads=p["heads"], joint_attention_dim=p["ctx"],
                               pooled_projection_dim=p["vec"], guidance_embeds=False, axes_dims_rope=p["axes"])
    # random, non-zero weights everywhere (diffusers zero-initialises nothing here, but be explicit)
    with torch.no_grad():
        for prm in m.parameters():
            prm.normal_(0.0, 0.02)
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    B, (H, W), T = p["B"], p["hw"], p["T"]
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(B, p["lat"], H, W, generator=g)
    txt = torch.randn(B, T, p["ctx"], generator=g)
    y = torch.randn(B, p["vec"], generator=g)
    img_ids = torch.zeros(H // 2, W // 2, 3)
    img_ids[..., 1] = torch.arange(H // 2)[:, None]
    img_ids[..., 2] = torch.arange(W // 2)[None]
    img_ids = img_ids.reshape(-1, 3)
    txt_ids = torch.zeros(T, 3)
    bf16 = a.mode.endswith("bf16")
    fwd = torch.compile(m) if a.mode.startswith("compile") else m

    def step():
        t = torch.sigmoid(torch.randn(B, generator=g))
        eps = torch.randn(x0.shape, generator=g)
        tt = t[:, None, None, None]
        xt = (1 - tt) * x0 + tt * eps
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            v = fwd(hidden_states=pack(xt), encoder_hidden_states=txt, pooled_projections=y, timestep=t,
                    img_ids=img_ids, txt_ids=txt_ids, return_dict=False)[0]
            loss = F.mse_loss(v.float(), pack(eps - x0))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
    warm = time.perf_counter() - t0
    ts = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    import diffusers
    dyn = {}
    if a.mode.startswith("compile"):  # graphs compiled and graph breaks: a recompile inside the timed steps shows here
        from torch._dynamo.utils import counters
        dyn = {"unique_graphs": counters["stats"].get("unique_graphs", 0),
               "graph_breaks": sum(counters["graph_break"].values())}
    return {"peer": "diffusers-flux", "mode": a.mode, "torch": torch.__version__, "diffusers": diffusers.__version__,
            "preset": "bench", "threads": torch.get_num_threads(),
            "params": sum(x.numel() for x in m.parameters()), "steps": a.steps, "warmup": a.warmup,
            "ms_per_step_median": round(ts[len(ts) // 2] * 1e3, 2), "ms_per_step_min": round(ts[0] * 1e3, 2),
            "warmup_s": round(warm, 2), "loss_last": round(float(loss.detach()), 6),
            "blas": "mkl" if torch.backends.mkl.is_available() else "other", **({"dynamo": dyn} if dyn else {})}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=MODES, default="eager-fp32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    try:
        out = run(a)
    except Exception as e:  # report why a mode does not run (e.g. inductor without a C++ compiler)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        tb = traceback.extract_tb(e.__traceback__)
        where = f"{tb[-1].filename.split('site-packages/')[-1]}:{tb[-1].lineno}" if tb else ""
        print(json.dumps({"peer": "diffusers-flux", "mode": a.mode, "error": f"{type(e).__name__}: {first[:400]}",
                          "where": where}))
        traceback.print_exc(file=sys.stderr)
        sys.exit(3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
