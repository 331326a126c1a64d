#!/usr/bin/env python3
"""Goldens for ctuner's FlowMatchEulerDiscreteScheduler (src/train/fm_sched.c)
from diffusers itself (0.42.1, torch 2: scripts/py_deps.sh diffusers), driven
as FluxPipeline drives it: sigmas = np.linspace(1, 1/N, N),
mu = pipeline_flux.calculate_shift(image_seq_len, <scheduler config>),
pipeline_flux.retrieve_timesteps(scheduler, N, sigmas=sigmas, mu=mu), then
scheduler.step(v, t, x) for every t with set_begin_index(0).

Writes OUT (default tests/data/fm_sched_golden.json): per case the
scheduler_config.json it was built from, N, image_seq_len, mu, the sigmas
(N+1) and timesteps (N), and for some cases a 12-value sample x0, the N
velocities fed to step() and the sample after the last step.

A shift_terminal schedule of one step divides 0 by 0 in diffusers (NaN
sigmas, written as null): such cases are kept, and ctuner must refuse them.

  --check FILE  recompute every case of FILE with the installed diffusers and
                compare (exact float32 equality of sigmas/timesteps/samples)
  --seed N      other random sequence lengths / step counts / samples

Usage: $(scripts/py_deps.sh diffusers) scripts/fm_sched_golden.py [--out F] [--seed N]
"""
import argparse
import json
import os
import random
import sys
import warnings

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers import FlowMatchEulerDiscreteScheduler  # noqa: E402
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEV = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.30.0.dev0",
       "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
       "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True}
SCHNELL = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.30.0.dev0",
           "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096,
           "max_shift": 1.15, "num_train_timesteps": 1000, "shift": 1.0,
           "use_dynamic_shifting": False}
CONFIGS = [
    ("dev", DEV),
    ("schnell", SCHNELL),
    ("static3", dict(SCHNELL, shift=3.0)),
    ("linear", dict(DEV, time_shift_type="linear")),
    ("terminal", dict(DEV, shift_terminal=0.1)),
    ("invert", dict(SCHNELL, shift=2.0, invert_sigmas=True)),
    ("t500", dict(DEV, num_train_timesteps=500, base_shift=0.3, max_shift=1.5,
                  base_image_seq_len=64, max_image_seq_len=1024)),
    ("defaults", {"_class_name": "FlowMatchEulerDiscreteScheduler"}),
]


def nan_null(v):
    """JSON has no NaN: write it as null."""
    if isinstance(v, list):
        return [nan_null(x) for x in v]
    return None if isinstance(v, float) and v != v else v


def run(cfg, n, seq, x0=None, vs=None):
    s = FlowMatchEulerDiscreteScheduler.from_config(cfg)
    sig = np.linspace(1.0, 1 / n, n)
    mu = calculate_shift(seq, s.config.get("base_image_seq_len", 256),
                         s.config.get("max_image_seq_len", 4096),
                         s.config.get("base_shift", 0.5), s.config.get("max_shift", 1.15))
    ts, n2 = retrieve_timesteps(s, n, "cpu", sigmas=sig, mu=mu)
    assert n2 == n
    out = {"mu": mu, "sigmas": nan_null(s.sigmas.tolist()), "timesteps": nan_null(ts.tolist())}
    if x0 is not None:
        x = torch.tensor(x0, dtype=torch.float32)
        s.set_begin_index(0)
        for i, t in enumerate(ts):
            x = s.step(torch.tensor(vs[i], dtype=torch.float32), t, x, return_dict=False)[0]
        out["x_final"] = nan_null(x.tolist())
    return out


def cases(seed):
    r = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    out = []
    for name, cfg in CONFIGS:
        steps = [1, 4, 28, 50] if seed == 0 else [r.randint(1, 60) for _ in range(3)]
        seqs = [256, 1024, 4096, 4352, 64] if seed == 0 else [r.randint(16, 8192) for _ in range(3)]
        for k, n in enumerate(steps):
            for seq in seqs if k < 2 else seqs[:1]:
                c = {"name": name, "config": cfg, "N": n, "image_seq_len": seq}
                if seq == seqs[0] and n <= 28:
                    c["x0"] = torch.randn(12, generator=g).tolist()
                    c["v"] = torch.randn(n, 12, generator=g).tolist()
                out.append(c)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "..", "tests", "data",
                                                  "fm_sched_golden.json"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check")
    a = ap.parse_args()
    if a.check:
        g = json.load(open(a.check))
        bad = 0
        for c in g["cases"]:
            now = run(c["config"], c["N"], c["image_seq_len"], c.get("x0"), c.get("v"))
            for k, v in now.items():
                if v != c[k]:
                    bad += 1
                    print("case %s N=%d seq=%d: %s differs" % (c["name"], c["N"],
                                                              c["image_seq_len"], k))
        print("%d cases, %d differences" % (len(g["cases"]), bad))
        sys.exit(1 if bad else 0)
    cs = cases(a.seed)
    for c in cs:
        c.update(run(c["config"], c["N"], c["image_seq_len"], c.get("x0"), c.get("v")))
    import diffusers
    with open(a.out, "w") as f:
        json.dump({"diffusers": diffusers.__version__, "torch": torch.__version__,
                   "numpy": np.__version__, "cases": cs}, f, separators=(",", ":"))
    print("wrote %s: %d cases" % (a.out, len(cs)))


if __name__ == "__main__":
    main()
