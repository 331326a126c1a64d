#!/usr/bin/python3
"""Writes tests/data/optim_golden.safetensors: reference optimizer trajectories and
learning-rate sequences that tests/test_optim.c replays.

References, none of them derived from ctuner's C code:
  - torch.optim.AdamW / Adam / Adagrad / SGD (PyTorch 1.13, CPU single-tensor path);
  - Lion from the paper (Chen et al. 2023, "Symbolic Discovery of Optimization
    Algorithms", Algorithm 2) written here in torch;
  - Lamb from the paper (You et al. 2019, Algorithm 2, Adam bias correction,
    identity scaling function) written here in torch;
  - Muon from Keller Jordan's public description (momentum + Nesterov, quintic
    Newton-Schulz with (3.4445, -4.7750, 2.0315), scale sqrt(max(1, rows/cols)),
    decoupled weight decay) in float32 torch, with torch.optim.AdamW on the rest;
  - MuAdam / MuAdamW / MuSGD: the `mup` package's parameter-group rule (InfShape:
    a dim is infinite when it differs from its base; width_mult is that of the
    last infinite dim) applied to torch.optim.Adam / AdamW / SGD param groups;
  - schedules: torch.optim.lr_scheduler.LambdaLR with diffusers' lambdas
    (diffusers/optimization.py) and DeepSpeed's WarmupLR / WarmupDecayLR
    (deepspeed/runtime/lr_schedules.py) re-typed in Python, stepped like the engine.

Layout: param.<tensor> (initial), grad.<step>.<tensor>, lr.<case> (per step, F32),
final.<case>.<tensor> (F32), sched.<case> (F64 lr after done = 0..N-1 steps).
Hyperparameters live here and in tests/test_optim.c (the case tables must agree).

    /usr/bin/python3 scripts/optim_golden.py   # rewrites tests/data/optim_golden.safetensors
"""
import json
import math
import os
import struct

import numpy as np
import torch

torch.set_num_threads(1)
STEPS = 6
# name, shape, in_mult, out_mult (µP), 2-D for Muon
TENSORS = [
    ("a.weight", (6, 10), 2.0, 3.0),   # both dims infinite: matrix-like
    ("a.bias", (6,), 1.0, 3.0),        # one infinite dim: vector-like
    ("b.weight", (12, 5), 1.0, 4.0),   # fan_out infinite only: vector-like (input layer)
    ("c.weight", (8, 8), 4.0, 1.0),    # fan_in infinite only: vector-like (readout)
    ("norm.scale", (3,), 1.0, 1.0),    # finite
]

# ---- µP (mup package rule) ----


def infshape(shape, in_mult, out_mult):
    """Width multipliers per dim of a torch-layout tensor ([out, in] or [out])."""
    if len(shape) == 2:
        return [out_mult, in_mult]
    return [out_mult]


def ninf(mults):
    return sum(1 for m in mults if m != 1.0)


def width_mult(mults):
    for m in reversed(mults):  # main = last infinite dim
        if m != 1.0:
            return m
    return 1.0


def mu_groups(params, lr, wd, sgd):
    groups = []
    for p, (name, shape, im, om) in zip(params, TENSORS):
        mults = infshape(shape, im, om)
        g = {"params": [p], "lr": lr, "weight_decay": wd}
        k = ninf(mults)
        if sgd:
            if k == 1:
                g["lr"] *= width_mult(mults)
                g["weight_decay"] /= width_mult(mults)
            elif k == 2:
                ratio = mults[1] / mults[0]  # fanin / fanout multipliers
                g["lr"] /= ratio
                g["weight_decay"] *= ratio
        elif k == 2:
            g["lr"] /= width_mult(mults)
            g["weight_decay"] *= width_mult(mults)
        g["lr_factor"] = g["lr"] / lr
        groups.append(g)
    return groups

# ---- paper / public-description optimizers ----


class Lion:
    def __init__(self, params, b1, b2, wd):
        self.params, self.b1, self.b2, self.wd = params, b1, b2, wd
        self.m = [torch.zeros_like(p) for p in params]

    def step(self, lr):
        for p, m in zip(self.params, self.m):
            c = self.b1 * m + (1 - self.b1) * p.grad
            p.mul_(1 - lr * self.wd).sub_(lr * torch.sign(c))
            m.mul_(self.b2).add_((1 - self.b2) * p.grad)


class Lamb:
    def __init__(self, params, b1, b2, eps, wd):
        self.params, self.b1, self.b2, self.eps, self.wd = params, b1, b2, eps, wd
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    def step(self, lr):
        self.t += 1
        for p, m, v in zip(self.params, self.m, self.v):
            g = p.grad
            m.mul_(self.b1).add_((1 - self.b1) * g)
            v.mul_(self.b2).add_((1 - self.b2) * g * g)
            mhat = m / (1 - self.b1 ** self.t)
            vhat = v / (1 - self.b2 ** self.t)
            r = mhat / (vhat.sqrt() + self.eps) + self.wd * p
            wn, rn = p.double().norm().item(), r.double().norm().item()
            trust = wn / rn if wn > 0 and rn > 0 else 1.0
            p.sub_(lr * trust * r)


def newton_schulz5(G, steps):
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.clone()
    tr = G.size(0) > G.size(1)
    if tr:
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.T if tr else X


class Muon:
    """2-D params: Muon; others: torch AdamW at lr * adamw_lr."""

    def __init__(self, params, is2d, mu, nesterov, ns, wd, betas, eps, adamw_lr):
        self.p2 = [p for p, d in zip(params, is2d) if d]
        self.buf = [torch.zeros_like(p) for p in self.p2]
        self.mu, self.nesterov, self.ns, self.wd, self.adamw_lr = mu, nesterov, ns, wd, adamw_lr
        rest = [p for p, d in zip(params, is2d) if not d]
        self.adam = torch.optim.AdamW(rest, lr=1.0, betas=betas, eps=eps, weight_decay=wd) if rest else None

    def step(self, lr):
        for p, b in zip(self.p2, self.buf):
            g = p.grad
            b.mul_(self.mu).add_(g)
            u = g + self.mu * b if self.nesterov else b
            o = newton_schulz5(u, self.ns)
            p.mul_(1 - lr * self.wd)
            p.add_(o, alpha=-lr * max(1.0, p.size(0) / p.size(1)) ** 0.5)
        if self.adam:
            for grp in self.adam.param_groups:
                grp["lr"] = lr * self.adamw_lr
            self.adam.step()

# ---- cases (tests/test_optim.c has the same table) ----


def torch_case(cls, **kw):
    def make(params):
        opt = cls(params, lr=1.0, **kw)

        def step(lr):
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
        return step
    return make


def mu_case(cls, sgd, wd, **kw):
    def make(params):
        groups = mu_groups(params, 1.0, wd, sgd)
        factors = [g.pop("lr_factor") for g in groups]
        opt = cls(groups, lr=1.0, weight_decay=wd, **kw)

        def step(lr):
            for g, f in zip(opt.param_groups, factors):
                # as mup does it: the scheduler scales the group's (already µP-scaled) lr
                g["lr"] = lr * f
            opt.step()
        return step
    return make


def obj_case(make_obj):
    def make(params):
        o = make_obj(params)
        return o.step
    return make


CASES = [
    # name, base lr, factory
    ("adamw", 1e-2, torch_case(torch.optim.AdamW, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)),
    ("adam", 1e-2, torch_case(torch.optim.Adam, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
    ("adagrad", 1e-1, torch_case(torch.optim.Adagrad, lr_decay=0.05, weight_decay=0.01,
                                 initial_accumulator_value=0.1, eps=1e-10)),
    ("sgd", 5e-2, torch_case(torch.optim.SGD)),
    ("sgd_momentum", 5e-2, torch_case(torch.optim.SGD, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd_nesterov", 5e-2, torch_case(torch.optim.SGD, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("lion", 1e-3, obj_case(lambda ps: Lion(ps, 0.9, 0.99, 0.1))),
    ("lamb", 1e-2, obj_case(lambda ps: Lamb(ps, 0.9, 0.999, 1e-6, 0.01))),
    # c.weight is passed with cols = 0: the caller sends it to AdamW
    ("muon", 2e-2, obj_case(lambda ps: Muon(ps, [True, False, True, False, False], 0.95, True, 5, 0.01,
                                            (0.9, 0.95), 1e-10, 0.5))),
    ("muon_plain", 2e-2, obj_case(lambda ps: Muon(ps, [True, False, True, True, False], 0.9, False, 3, 0.0,
                                                  (0.9, 0.95), 1e-8, 1.0))),
    ("muadam", 1e-2, mu_case(torch.optim.Adam, False, 0.05)),
    ("muadamw", 1e-2, mu_case(torch.optim.AdamW, False, 0.1)),
    ("musgd", 5e-2, mu_case(torch.optim.SGD, True, 0.01, momentum=0.9)),
]

# ---- schedules ----


def diffusers_lambda(kind, W, T, num_cycles=0.5, lr_init=None, lr_end=1e-7, power=1.0):
    def warm(step):
        return float(step) / float(max(1, W))
    if kind == "constant":
        return lambda s: 1.0
    if kind == "constant_with_warmup":
        return lambda s: warm(s) if s < W else 1.0
    if kind == "linear":
        return lambda s: warm(s) if s < W else max(0.0, float(T - s) / float(max(1, T - W)))
    if kind == "cosine":  # diffusers' cosine: ctuner's "diffusers_cosine" (issue 21)
        def f(s):
            if s < W:
                return warm(s)
            progress = float(s - W) / float(max(1, T - W))
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))
        return f
    if kind == "polynomial":
        def f(s):
            if s < W:
                return warm(s)
            elif s > T:
                return lr_end / lr_init
            lr_range = lr_init - lr_end
            decay_steps = T - W
            pct_remaining = 1 - (s - W) / decay_steps
            return (lr_range * pct_remaining ** power + lr_end) / lr_init
        return f
    raise ValueError(kind)


class DSWarmup:
    """DeepSpeed WarmupLR / WarmupDecayLR: lr set at construction (iteration -1),
    step() after every optimizer step."""

    def __init__(self, min_lr, max_lr, W, wtype, total=None):
        self.min_lr, self.delta = min_lr, max_lr - min_lr
        self.W = max(2, W)
        self.inv_log = 1.0 / math.log(self.W)
        self.wtype, self.total = wtype, total
        self.it = -1

    def gamma(self):
        if self.it < self.W:
            if self.wtype == "log":
                return self.inv_log * math.log(self.it + 1)
            return self.it / self.W
        if self.total is None:
            return 1.0
        return max(0.0, float(self.total - self.it) / float(max(1.0, self.total - self.W)))

    def lr(self):
        if self.it < 0:
            return self.min_lr
        return self.min_lr + self.delta * self.gamma()

    def step(self):
        self.it += 1


SCHEDS = [
    # name, kind, lr, warmup, total, cycles, lr_end, power, N
    ("constant", "constant", 1e-4, 0, 0, 0.5, 1e-7, 1.0, 5),
    ("constant_with_warmup", "constant_with_warmup", 1e-4, 3, 0, 0.5, 1e-7, 1.0, 8),
    ("linear", "linear", 2e-4, 3, 10, 0.5, 1e-7, 1.0, 14),
    ("linear_w0", "linear", 2e-4, 0, 10, 0.5, 1e-7, 1.0, 12),
    ("cosine", "cosine", 1e-3, 2, 10, 0.5, 1e-7, 1.0, 14),
    ("cosine_cycles", "cosine", 1e-3, 0, 8, 1.5, 1e-7, 1.0, 10),
    ("polynomial", "polynomial", 1e-3, 2, 10, 0.5, 1e-6, 2.0, 14),
    ("polynomial_w0", "polynomial", 1e-3, 0, 5, 0.5, 1e-7, 1.0, 8),
]
DS_SCHEDS = [
    # name, min, max, W, type, total (None: WarmupLR), N
    ("warmuplr_log", 1e-6, 1e-3, 5, "log", None, 10),
    ("warmuplr_linear", 0.0, 1e-3, 4, "linear", None, 8),
    ("warmuplr_w0", 0.0, 1e-3, 0, "log", None, 5),
    ("warmupdecay_log", 1e-5, 1e-3, 3, "log", 10, 14),
    ("warmupdecay_linear", 0.0, 2e-3, 4, "linear", 8, 12),
]


def sched_lrs(kind, lr, W, T, cycles, lr_end, power, N):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    lam = diffusers_lambda(kind, W, T, cycles, lr, lr_end, power)
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lam)
    out = []
    for _ in range(N):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    return out


def ds_lrs(mn, mx, W, wtype, total, N):
    s = DSWarmup(mn, mx, W, wtype, total)
    out = []
    for _ in range(N):
        out.append(s.lr())
        s.step()
    return out

# ---- safetensors writer (struct + json) ----


def write_st(path, tensors, meta):
    header, blobs, off = {}, [], 0
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr)
        dt = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}[arr.dtype]
        b = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    rng = np.random.default_rng(1234)
    init = [(rng.standard_normal(s) * 0.5).astype(np.float32) for _, s, _, _ in TENSORS]
    grads = [[(rng.standard_normal(s) * 0.1).astype(np.float32) for _, s, _, _ in TENSORS]
             for _ in range(STEPS)]
    out = []
    for (name, _, _, _), a in zip(TENSORS, init):
        out.append(("param." + name, a))
    for t in range(STEPS):
        for (name, _, _, _), g in zip(TENSORS, grads[t]):
            out.append((f"grad.{t}.{name}", g))
    for cname, base, make in CASES:
        # a varying lr per step (as a schedule would give), exactly representable in F32
        lrs = np.array([base * (0.5 + 0.15 * t) for t in range(STEPS)], dtype=np.float32)
        params = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in init]
        step = make(params)
        for t in range(STEPS):
            for p, g in zip(params, grads[t]):
                p.grad = torch.from_numpy(g.copy())
            with torch.no_grad():
                step(float(lrs[t]))
        out.append(("lr." + cname, lrs))
        for (name, _, _, _), p in zip(TENSORS, params):
            out.append((f"final.{cname}.{name}", p.detach().numpy().astype(np.float32)))
    for name, kind, lr, W, T, cyc, lr_end, power, N in SCHEDS:
        out.append(("sched." + name, np.array(sched_lrs(kind, lr, W, T, cyc, lr_end, power, N))))
    for name, mn, mx, W, wtype, total, N in DS_SCHEDS:
        out.append(("sched." + name, np.array(ds_lrs(mn, mx, W, wtype, total, N))))
    meta = {"steps": str(STEPS), "torch": torch.__version__,
            "cases": ",".join(c[0] for c in CASES),
            "generator": "scripts/optim_golden.py"}
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "tests", "data", "optim_golden.safetensors")
    write_st(path, out, meta)
    print(f"wrote {os.path.normpath(path)} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
