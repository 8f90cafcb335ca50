"""Fit the `cpu-local` hardware profile to measured vLLM-CPU latencies and report MAPE.

Input: a JSON file of closed-loop benchmark points (one per load level), e.g. from
`vllm.benchmarks.serve` with `--max-concurrency N --metric-percentiles 50,95`:

    {"model_config": "~/.cache/hbmserve/tiny-llama",      # config.json folder or shipped name
     "gpu": "cpu-local",
     "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048, "max_model_len": 512},
     "prompt_tokens": 64, "output_tokens": 32,
     "points": [{"concurrency": 1, "num_requests": 64,
                 "ttft_p50_s": 0.024, "ttft_p95_s": 0.03, "tpot_p50_s": 0.0055, "tpot_p95_s": 0.006},
                {"max_concurrency": 16, "num_prompts": 64, "p50_ttft_ms": 179, "p95_ttft_ms": 240,
                 "median_tpot_ms": 12, "p95_tpot_ms": 14}]}

Either key style works per point (ours in seconds, or vLLM's result keys in ms). The fit moves
the profile's per-step, per-sequence and per-request overheads and its FLOP/s and bandwidth
efficiencies (capacity/perf/calibration.py). `--fit-on 1,16` fits on some concurrencies and reports
MAPE on all of them, so held-out levels show fidelity rather than fit.

    python -m hbmserve.ops.bench.calibrate_cpu measured.json --out out/calibration.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from hbmserve.capacity.perf.calibration import MeasuredPoint, fit_profile, mape_pct, predict
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, memory_fit

VLLM_KEYS = {"ttft_p50_s": ("p50_ttft_ms", "median_ttft_ms"), "ttft_p95_s": ("p95_ttft_ms",),
             "tpot_p50_s": ("p50_tpot_ms", "median_tpot_ms"), "tpot_p95_s": ("p95_tpot_ms",)}


class _Engine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int = 512
    enable_chunked_prefill: bool = True


class _Input(BaseModel):
    model_config = ConfigDict(extra="ignore")  # "_source" and other notes are allowed
    model_config_name: str = "tiny-llama"
    gpu: str = "cpu-local"
    engine: _Engine = _Engine()
    prompt_tokens: int = 64
    output_tokens: int = 32
    points: list[dict]


def parse_point(raw: dict, prompt: int, output: int) -> MeasuredPoint:
    conc = raw.get("concurrency", raw.get("max_concurrency"))
    n = raw.get("num_requests", raw.get("num_prompts", raw.get("completed")))
    if conc is None or n is None:
        raise ValueError(f"point {raw}: needs concurrency (or max_concurrency) and num_requests (or num_prompts)")
    vals: dict[str, float] = {}
    for ours, theirs in VLLM_KEYS.items():
        if raw.get(ours) is not None:
            vals[ours] = float(raw[ours])
        else:
            hit = next((raw[k] for k in theirs if raw.get(k) is not None), None)
            if hit is not None:
                vals[ours] = float(hit) / 1e3
    return MeasuredPoint(int(conc), int(n), int(raw.get("prompt_tokens", prompt)),
                         int(raw.get("output_tokens", output)), **vals)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measured", type=Path)
    ap.add_argument("--fit-on", default=None, help="comma list of concurrencies to fit on (default: all)")
    ap.add_argument("--max-evals", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    raw = json.loads(args.measured.read_text())
    if "model_config" in raw:  # the documented key; pydantic reserves the attribute name
        raw["model_config_name"] = raw.pop("model_config")
    try:
        spec = _Input.model_validate(raw)
        points = [parse_point(p, spec.prompt_tokens, spec.output_tokens) for p in spec.points]
    except (ValidationError, ValueError) as err:
        print(f"error: {args.measured}: {err}", file=sys.stderr)
        return 2
    model = load_model_shape(spec.model_config_name)
    gpu = get_gpu(spec.gpu)
    fit = memory_fit(Deployment(model, gpu))
    e = spec.engine
    cfg = EngineConfig(num_blocks=fit.kv_tokens // 16, max_num_seqs=e.max_num_seqs,
                       max_num_batched_tokens=e.max_num_batched_tokens, max_model_len=e.max_model_len,
                       enable_chunked_prefill=e.enable_chunked_prefill)
    fit_on = {int(c) for c in args.fit_on.split(",")} if args.fit_on else {p.concurrency for p in points}
    train = [p for p in points if p.concurrency in fit_on]
    res = fit_profile(gpu, model, cfg, train, max_evals=args.max_evals)
    before, after = predict(gpu, model, cfg, points), predict(res.profile, model, cfg, points)
    mape_before, mape_after = mape_pct(points, before), mape_pct(points, after)
    held = [(p, a) for p, a in zip(points, after, strict=True) if p.concurrency not in fit_on]
    mape_held = mape_pct([p for p, _ in held], [a for _, a in held]) if held else None
    print(f"{'conc':>5} {'metric':12} {'measured':>10} {'default':>10} {'fitted':>10} {'err %':>7}")
    rows = []
    for p, b, a in zip(points, before, after, strict=True):
        for m, v in p.measured().items():
            err = 100 * abs(a[m] - v) / v
            rows.append({"concurrency": p.concurrency, "metric": m, "measured": v, "default": b[m], "fitted": a[m],
                         "err_pct": err, "held_out": p.concurrency not in fit_on})
            print(f"{p.concurrency:5d} {m:12} {v:10.4f} {b[m]:10.4f} {a[m]:10.4f} {err:7.1f}"
                  + ("  (held out)" if p.concurrency not in fit_on else ""))
    o, eff = res.profile.overheads, res.profile.efficiency
    print(f"MAPE default {mape_before:.1f}%  fitted {mape_after:.1f}%"
          + (f"  held-out {mape_held:.1f}%" if mape_held is not None else "") + f"  ({res.evaluations} evaluations)")
    print("catalog entry (capacity/perf/data/hardware.yaml, cpu-local):")
    print(f"    efficiency: {{flops: {eff.flops:.3g}, hbm_bw: {eff.hbm_bw:.3g}}}")
    print(f"    overheads: {{step_s: {o.step_s:.3g}, per_seq_s: {o.per_seq_s:.3g}, request_s: {o.request_s:.3g}}}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "input": str(args.measured), "fit_on": sorted(fit_on), "mape_default_pct": mape_before,
            "mape_fitted_pct": mape_after, "mape_held_out_pct": mape_held,
            "fitted": {"efficiency": {"flops": eff.flops, "hbm_bw": eff.hbm_bw},
                       "overheads": {"step_s": o.step_s, "per_seq_s": o.per_seq_s, "request_s": o.request_s}},
            "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
