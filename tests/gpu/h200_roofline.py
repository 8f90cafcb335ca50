"""Roofline check on a lent H200: measured vs predicted (capacity/perf/perf_model.py). Never part of CI.

Measures, with torch only (random weights, no vLLM, no Ray):
  1. achievable dense BF16 matmul FLOP/s;
  2. HBM bandwidth (a large device-to-device copy: read + write);
  3. Llama-3.1-8B-shaped forward steps: prefill at several (batch, prompt) sizes and decode at
     several batch sizes and contexts (CUDA-graph captured, as vLLM runs decode).
Each step is printed next to the performance model's GPU-time prediction (step time minus the
modelled CPU overheads) and the efficiency it implies. Runs in about 3-6 minutes (budget 8).

    python tests/gpu/h200_roofline.py              # writes $OUT/h200_roofline.json when OUT is set
    python tests/gpu/h200_roofline.py --smoke      # tiny shapes on CPU: checks the script itself
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
SHAPE_8B = dict(layers=32, hidden=4096, inter=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256)
SHAPE_SMOKE = dict(layers=2, hidden=256, inter=512, heads=4, kv_heads=2, head_dim=64, vocab=1000)


def load_capacity():
    """capacity/perf/'s catalog, shapes and cost model, importing the checkout as package `hbmserve`
    (the repo need not be pip-installed here: its root is the package)."""
    if "hbmserve" not in sys.modules:
        spec = importlib.util.spec_from_file_location("hbmserve", ROOT / "__init__.py",
                                                      submodule_search_locations=[str(ROOT)])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules["hbmserve"] = pkg
        spec.loader.exec_module(pkg)
    return (importlib.import_module("hbmserve.capacity.perf.hardware"),
            importlib.import_module("hbmserve.capacity.perf.model_shape"),
            importlib.import_module("hbmserve.capacity.perf.perf_model"))


def timed(fn, dev: str, iters: int, warmup: int = 2) -> float:
    """Median seconds of fn() over iters runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_flops(dev: str, n: int, iters: int) -> float:
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    t = timed(lambda: a @ b, dev, iters)
    return 2 * n**3 / t


def copy_bandwidth(dev: str, nbytes: int, iters: int) -> float:
    src = torch.empty(nbytes // 2, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), dev, iters)
    return 2 * nbytes / t  # read + write


class Model:
    """Random-weight Llama-shaped decoder: GQA attention (SDPA) and a gated-SiLU MLP per layer."""

    def __init__(self, s: dict, dev: str) -> None:
        self.s, self.dev = s, dev
        h, kvd = s["hidden"], s["kv_heads"] * s["head_dim"]
        qd = s["heads"] * s["head_dim"]
        w = lambda *shape: torch.randn(*shape, device=dev, dtype=torch.bfloat16) * 0.02  # noqa: E731
        self.layers = [dict(qkv=w(h, qd + 2 * kvd), o=w(qd, h), gu=w(h, 2 * s["inter"]), d=w(s["inter"], h))
                       for _ in range(s["layers"])]
        self.lm_head = w(h, s["vocab"])

    def _attn_mlp(self, x, lyr, attend):
        s = self.s
        qd, kvd = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
        qkv = x @ lyr["qkv"]
        a = attend(qkv[..., :qd], qkv[..., qd:qd + kvd], qkv[..., qd + kvd:])
        x = x + a @ lyr["o"]
        g, u = (x @ lyr["gu"]).chunk(2, dim=-1)
        return x + (F.silu(g) * u) @ lyr["d"]

    def prefill(self, x):  # x: [B, S, H]
        s = self.s
        B, S, _ = x.shape

        def attend(q, k, v):
            q = q.view(B, S, s["heads"], s["head_dim"]).transpose(1, 2)
            k = k.view(B, S, s["kv_heads"], s["head_dim"]).transpose(1, 2)
            v = v.view(B, S, s["kv_heads"], s["head_dim"]).transpose(1, 2)
            rep = s["heads"] // s["kv_heads"]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return o.transpose(1, 2).reshape(B, S, -1)

        for lyr in self.layers:
            x = self._attn_mlp(x, lyr, attend)
        return x[:, -1] @ self.lm_head

    def decode(self, x, kv):  # x: [B, 1, H]; kv: per layer (k, v) [B, kv_heads, C, D]
        s = self.s
        B = x.shape[0]

        def make(k_cache, v_cache):
            def attend(q, k, v):
                q = q.view(B, 1, s["heads"], s["head_dim"]).transpose(1, 2)
                rep = s["heads"] // s["kv_heads"]
                kk, vv = k_cache.repeat_interleave(rep, 1), v_cache.repeat_interleave(rep, 1)
                return F.scaled_dot_product_attention(q, kk, vv).transpose(1, 2).reshape(B, 1, -1)
            return attend

        for lyr, (kc, vc) in zip(self.layers, kv, strict=True):
            x = self._attn_mlp(x, lyr, make(kc, vc))
        return x[:, -1] @ self.lm_head


def decode_step(model: Model, dev: str, batch: int, ctx: int, iters: int) -> tuple[float, bool]:
    s = model.s
    kv = [(torch.randn(batch, s["kv_heads"], ctx, s["head_dim"], device=dev, dtype=torch.bfloat16),
           torch.randn(batch, s["kv_heads"], ctx, s["head_dim"], device=dev, dtype=torch.bfloat16))
          for _ in range(s["layers"])]
    x = torch.randn(batch, 1, s["hidden"], device=dev, dtype=torch.bfloat16)
    fn = lambda: model.decode(x, kv)  # noqa: E731
    graphed = False
    if dev == "cuda":
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn()
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            fn, graphed = g.replay, True
        except RuntimeError as err:  # report and fall back to eager launches
            print(f"  (decode b={batch}: CUDA graph capture failed, timing eager: {err})")
    return timed(fn, dev, iters), graphed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU to test the script")
    ap.add_argument("--gpu-profile", default="h200-sxm")
    args = ap.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("no GPU: run with --smoke to exercise the script on CPU")
        return 2
    t_start = time.perf_counter()
    shape = SHAPE_SMOKE if args.smoke else SHAPE_8B
    iters = 3 if args.smoke else 10
    out: dict = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)",
                 "torch": torch.__version__, "shape": shape}
    out["bf16_matmul_tflops"] = matmul_flops(dev, 512 if args.smoke else 8192, iters) / 1e12
    out["hbm_copy_gbps"] = copy_bandwidth(dev, (64 << 20) if args.smoke else (8 << 30), iters) / 1e9
    print(f"BF16 matmul: {out['bf16_matmul_tflops']:.1f} TFLOP/s   copy bandwidth: {out['hbm_copy_gbps']:.0f} GB/s")
    try:
        hw, ms, pm = load_capacity()
        gpu = hw.load_catalog()[args.gpu_profile]
        m = ms.load_model_shape("llama-3.1-8b")
        if args.smoke:
            m = ms.ModelShape("smoke", shape["layers"], shape["hidden"], shape["inter"], shape["heads"],
                              shape["kv_heads"], shape["head_dim"], shape["vocab"])
        cost = pm.cost_model(pm.Deployment(m, gpu))
        out["catalog"] = {"bf16_tflops": gpu.bf16_flops / 1e12, "hbm_gbps": gpu.hbm_bw_bytes_s / 1e9,
                          "eff_flops": gpu.efficiency.flops, "eff_bw": gpu.efficiency.hbm_bw}
        out["measured_eff_flops"] = out["bf16_matmul_tflops"] * 1e12 / gpu.bf16_flops
        out["measured_eff_bw"] = out["hbm_copy_gbps"] * 1e9 / gpu.hbm_bw_bytes_s
    except ImportError as err:  # pydantic / pyyaml missing on the lent machine: measure anyway
        cost = None
        out["predictions_error"] = f"capacity modules not importable: {err}"
        print(out["predictions_error"])

    def predicted(n_dec, ctx, n_pre, pairs, kvr, chunks):
        if cost is None:
            return None
        o = cost.dep.gpu.overheads
        return float(cost.step_time(n_dec, ctx, n_pre, pairs, kvr, chunks)) - o.step_s - o.per_seq_s * (n_dec + chunks)

    model = Model(shape, dev)
    rows = []
    prefills = [(1, 128), (2, 128)] if args.smoke else [(1, 512), (1, 2048), (4, 2048), (8, 2048), (1, 8192)]
    for b, sl in prefills:
        x = torch.randn(b, sl, shape["hidden"], device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            t = timed(lambda x=x: model.prefill(x), dev, iters)
        p = predicted(0, 0.0, b * sl, b * sl * (sl + 1) / 2, b * sl, b)
        rows.append({"kind": "prefill", "batch": b, "tokens": sl, "measured_s": t, "predicted_s": p})
    decodes = [(1, 128), (4, 128)] if args.smoke else [(1, 1024), (8, 1024), (32, 1024), (64, 1024), (128, 1024),
                                                        (256, 1024), (64, 4096)]
    for b, ctx in decodes:
        with torch.no_grad():
            t, graphed = decode_step(model, dev, b, ctx, iters)
        p = predicted(b, float(b * ctx), 0, 0.0, 0.0, 0)
        rows.append({"kind": "decode", "batch": b, "context": ctx, "measured_s": t, "predicted_s": p,
                     "cuda_graph": graphed})
    print(f"{'step':8} {'batch':>5} {'tokens/ctx':>10} {'measured ms':>12} {'predicted ms':>13} {'pred/meas':>9}")
    for r in rows:
        size = r.get("tokens", r.get("context"))
        pred = r["predicted_s"]
        ratio = pred / r["measured_s"] if pred else math.nan
        r["pred_over_measured"] = ratio
        print(f"{r['kind']:8} {r['batch']:5d} {size:10d} {r['measured_s'] * 1e3:12.3f} "
              f"{(pred or math.nan) * 1e3:13.3f} {ratio:9.2f}")
    ratios = [r["pred_over_measured"] for r in rows if not math.isnan(r["pred_over_measured"])]
    if ratios:
        out["mape_pct"] = 100 * float(np.mean([abs(1 - x) for x in ratios]))
        print(f"MAPE of predicted step time: {out['mape_pct']:.1f}%")
    out["rows"] = rows
    out["wall_s"] = time.perf_counter() - t_start
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "h200_roofline.json"
        path.write_text(json.dumps(out, indent=2))
        print(f"wrote {path}")
    print(f"done in {out['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
