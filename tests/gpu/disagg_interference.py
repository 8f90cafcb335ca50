"""What disaggregation removes, measured on a lent GPU: a decode step's slow-down when a prefill
chunk shares it, and what moving a prompt's KV off the GPU costs (issue 23). Never part of CI.

The planner (capacity/planning/disagg_plan.py) splits pools where a TPOT target leaves no room
for a prefill chunk beside the decode batch; the simulator charges the KV's crossing by bytes
over the catalog's links (perf_model.kv_transfer_s). Both rest on the performance model; this
script puts measured figures beside its predictions, with torch only (random weights, no vLLM,
no Ray, Llama-3.1-8B shape):
  1. mixed steps: a decode batch (B sequences at context C) alone, then with a prefill chunk of
     N tokens in the same step (run back to back in one timed step: vLLM fuses them, so this
     bounds its cost from above), against cost_model.step_time of the same mix;
  2. the KV of one prompt (2 x layers x KV heads x head dim x tokens x 2 bytes) copied GPU ->
     pinned host -> GPU: the host path of the CPU connector and of offloading, against
     kv_transfer_s(..., "host"). GPU-to-GPU links (NVLink, RDMA) need two GPUs: not measured
     on one.
About 2-4 minutes on one H200 (budget 8).

    python tests/gpu/disagg_interference.py            # writes $OUT/disagg_interference.json when OUT is set
    python tests/gpu/disagg_interference.py --smoke    # tiny shapes on CPU: checks the script itself
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from h200_roofline import SHAPE_8B, SHAPE_SMOKE, Model, load_capacity, timed  # noqa: E402


def kv_cache(shape: dict, batch: int, ctx: int, dev: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(batch, shape["kv_heads"], ctx, shape["head_dim"], device=dev, dtype=torch.bfloat16),
             torch.randn(batch, shape["kv_heads"], ctx, shape["head_dim"], device=dev, dtype=torch.bfloat16))
            for _ in range(shape["layers"])]


def mixed_steps(model: Model, dev: str, iters: int, cases) -> list[dict]:
    """Per (batch, context, chunk): the decode step alone and with the chunk beside it."""
    s, rows = model.s, []
    for batch, ctx, chunk in cases:
        kv = kv_cache(s, batch, ctx, dev)
        x = torch.randn(batch, 1, s["hidden"], device=dev, dtype=torch.bfloat16)
        p = torch.randn(1, chunk, s["hidden"], device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            alone = timed(lambda: model.decode(x, kv), dev, iters)
            mixed = timed(lambda: (model.decode(x, kv), model.prefill(p)), dev, iters)
        rows.append({"batch": batch, "context": ctx, "chunk": chunk, "decode_alone_s": alone, "mixed_s": mixed,
                     "slowdown": mixed / alone})
        del kv
    return rows


def host_round_trip(shape: dict, dev: str, tokens: int, iters: int) -> dict:
    """One prompt's KV, GPU -> pinned host -> GPU, timed each way."""
    per_token = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * 2
    n = tokens * per_token // 2
    gpu = torch.randn(n, device=dev, dtype=torch.bfloat16)
    host = torch.empty(n, dtype=torch.bfloat16, pin_memory=dev == "cuda")
    out = torch.empty_like(gpu)
    down = timed(lambda: host.copy_(gpu, non_blocking=True), dev, iters)
    up = timed(lambda: out.copy_(host, non_blocking=True), dev, iters)
    return {"tokens": tokens, "bytes": n * 2, "to_host_s": down, "to_gpu_s": up, "round_trip_s": down + up,
            "gbps_each_way": n * 2 / ((down + up) / 2) / 1e9}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU to test the script")
    ap.add_argument("--gpu-profile", default="h200-sxm")
    args = ap.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("no GPU: run with --smoke to exercise the script on CPU")
        return 2
    t0 = time.perf_counter()
    shape, iters = (SHAPE_SMOKE, 2) if args.smoke else (SHAPE_8B, 8)
    cases = [(4, 128, 64)] if args.smoke else [(32, 1024, 256), (32, 1024, 1024), (64, 2048, 512),
                                                (64, 2048, 2048), (128, 1024, 512), (128, 1024, 2048)]
    out: dict = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)", "torch": torch.__version__}
    model = Model(shape, dev)
    out["mixed"] = mixed_steps(model, dev, iters, cases)
    out["host_path"] = [host_round_trip(shape, dev, t, iters) for t in ((256,) if args.smoke else (1024, 8192))]
    try:
        hw, ms, pm = load_capacity()
        gpu = hw.load_catalog()[args.gpu_profile]
        m = ms.load_model_shape("llama-3.1-8b")
        if args.smoke:
            m = ms.ModelShape("smoke", shape["layers"], shape["hidden"], shape["inter"], shape["heads"],
                              shape["kv_heads"], shape["head_dim"], shape["vocab"])
        dep = pm.Deployment(m, gpu)
        cost, o = pm.cost_model(dep), gpu.overheads
        for r in out["mixed"]:
            b, c, n = r["batch"], r["context"], r["chunk"]
            alone = float(cost.step_time(b, float(b * c), 0, 0.0, 0.0, 0)) - o.step_s - o.per_seq_s * b
            mixed = float(cost.step_time(b, float(b * c), n, n * (n + 1) / 2, n, 1)) - o.step_s - o.per_seq_s * (b + 1)
            r |= {"predicted_alone_s": alone, "predicted_mixed_s": mixed, "predicted_slowdown": mixed / alone}
        for r in out["host_path"]:
            r["predicted_one_way_s"] = pm.kv_transfer_s(dep, dep, r["tokens"], "host") / 2
    except ImportError as err:  # pydantic / pyyaml missing on the lent machine: measure anyway
        out["predictions_error"] = f"capacity modules not importable: {err}"
    print(f"{'batch':>5} {'ctx':>5} {'chunk':>5} {'alone ms':>9} {'mixed ms':>9} {'slowdown':>8} {'predicted':>9}")
    for r in out["mixed"]:
        print(f"{r['batch']:5d} {r['context']:5d} {r['chunk']:5d} {r['decode_alone_s'] * 1e3:9.2f} "
              f"{r['mixed_s'] * 1e3:9.2f} {r['slowdown']:8.2f} {r.get('predicted_slowdown', float('nan')):9.2f}")
    for r in out["host_path"]:
        print(f"KV of {r['tokens']} tokens ({r['bytes'] / 2**20:.0f} MiB): to host {r['to_host_s'] * 1e3:.2f} ms, "
              f"back {r['to_gpu_s'] * 1e3:.2f} ms ({r['gbps_each_way']:.1f} GB/s); predicted one way "
              f"{r.get('predicted_one_way_s', float('nan')) * 1e3:.2f} ms")
    out["wall_s"] = time.perf_counter() - t0
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "disagg_interference.json"
        path.write_text(json.dumps(out, indent=2))
        print(f"wrote {path}")
    print(f"done in {out['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
