"""The start-up timeline at realistic sizes, from the model (capacity/perf/startup_timeline.py): no
measurement, arithmetic on the inputs printed with it (issue 11, requirement 9).

Llama-3.1-70B in bf16 (the catalog's shape) on H100 SXM, TP=4, over 25 Gb/s from the source,
NVMe at 3 and 7 GB/s; with and without node provisioning in the cold start. The promotion is
the one measured live on vLLM-CPU (capacity/perf/data/startup_measured.json); the loader's share of
the disk was measured on this machine's disk; the rest is assumed (capacity/perf/startup_measured.py
ASSUMED_*), the GPU wake included.

    .venv/bin/python -m hbmserve.ops.bench.startup_table
"""

from __future__ import annotations

import dataclasses

from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.startup_measured import startup_inputs_for
from hbmserve.capacity.perf.startup_timeline import Phase, StartKind, ratios, timeline
from hbmserve.core.config import ModelSpec

REFERENCE = ModelSpec.model_validate({
    "name": "llama-3.1-70b", "source": "meta-llama/Llama-3.1-70B-Instruct", "engine": "vllm-gpu",
    "engine_settings": {"dtype": "bfloat16"}, "parallelism": {"tp": 4}, "hardware": {"gpu": "h100-sxm"},
    "sim": {"model_config_name": "llama-3.1-70b"}})
PHASES = (Phase.NODE_READY, Phase.WEIGHTS_LOCAL, Phase.ENGINE_LOADED, Phase.PROMOTED, Phase.FIRST_TOKEN)


def main() -> None:
    base = startup_inputs_for(REFERENCE, get_gpu("h100-sxm"))
    print(f"weights {base.weights_bytes / 1e9:.1f} GB; inputs: " + "; ".join(
        f"{k} {v}" for k, v in base.sources.items()))
    print("| NVMe GB/s | node provisioned | tier | " + " | ".join(p.value for p in PHASES)
          + " | first token s | x cold | target |")
    print("|" + "---|" * (len(PHASES) + 6))
    for nvme in (3.0, 7.0):
        for node_s in (base.node_ready_s, 0.0):
            i = dataclasses.replace(base, disk_gbps=nvme, node_ready_s=node_s)
            cold = timeline(StartKind.COLD, i).first_token_s
            r = ratios(i)
            verdict = {StartKind.COLD: "", StartKind.WARM: f"<= 0.5: {'met' if r.warm_met else 'missed'}",
                       StartKind.HOT: f"<= 0.15: {'met' if r.hot_met else 'missed'}",
                       StartKind.SLEEPING: f"<= 0.15: {'met' if r.sleeping_met else 'missed'}"}
            for kind in (StartKind.COLD, StartKind.WARM, StartKind.SLEEPING, StartKind.HOT):
                t = timeline(kind, i)
                cells = " | ".join(f"{t.seconds(p):.1f}" if any(q is p for q, _ in t.phases) else "-"
                                   for p in PHASES)
                print(f"| {nvme:g} | {'yes' if node_s else 'no'} | {kind.value} | {cells} | "
                      f"{t.first_token_s:.1f} | {t.first_token_s / cold:.3f} | {verdict[kind]} |")


if __name__ == "__main__":
    main()
