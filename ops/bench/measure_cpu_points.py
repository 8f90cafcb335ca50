"""Measure bare vLLM-CPU on the tiny model at several load levels, for calibrate_cpu.py.

Runs vLLM's own serving benchmark (random 64-token prompts, 32 output tokens, --ignore-eos)
at each concurrency, --repeats times on one server, and writes the medians in the input
format of `hbmserve.ops.bench.calibrate_cpu`.

    python -m hbmserve.ops.bench.measure_cpu_points --concurrency 1 4 16 --out out/cpu_points.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from hbmserve.core.config import load_cluster_spec
from hbmserve.ops.bench.serving_overhead import bare_vllm, run_vllm_bench


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="out/cpu_points.json")
    a = p.parse_args()
    model = load_cluster_spec(a.config).models[0]
    s = model.engine_settings
    points = []
    with bare_vllm(model, {}) as url:
        run_vllm_bench(url, model.name, model.source, 4, 16)  # warm-up, discarded
        for c in a.concurrency:
            runs = [run_vllm_bench(url, model.name, model.source, c, a.prompts) for _ in range(a.repeats)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            points.append({"concurrency": c, "num_requests": a.prompts,
                           "ttft_p50_s": med["median_ttft_ms"] / 1e3, "ttft_p95_s": med["p95_ttft_ms"] / 1e3,
                           "tpot_p50_s": med["median_tpot_ms"] / 1e3, "tpot_p95_s": med["p95_tpot_ms"] / 1e3,
                           "output_tok_s": med["output_throughput"]})
    out = {"_source": f"bare vLLM-CPU api_server, median of {a.repeats} runs per level (measure_cpu_points.py)",
           "model_config": model.source, "gpu": "cpu-local",
           "engine": {"max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
                      "max_model_len": s.max_model_len},
           "prompt_tokens": 64, "output_tokens": 32, "points": points}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    for pt in points:
        print(json.dumps(pt))


if __name__ == "__main__":
    main()
