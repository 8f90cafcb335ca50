"""A prompt-heavy trace: code completion, prompts of about 2,000 tokens, outputs of a few dozen.

The traffic the planner's SLO-as-a-batch-cap rule exists for (issue 14): almost every token a
replica processes is prefill, so how big a prefill chunk a decode step may carry decides TPOT.
Shape, as IDE completion traffic looks: the rate swells and ebbs over the hour (developers'
activity, a sine of +-`swing` around the mean, constant within each minute) and arrivals come in
clumps (gamma gaps, CV 1.5: keystroke bursts across many users); prompt lengths are log-normal
around 2,000 tokens (the file around the cursor), clipped to [256, 8,000]; outputs log-normal
around 40 tokens, clipped to [4, 256].

Seeded and pure. Written as a test fixture (tests/unit/capacity/perf/test_capacity_slo_batch_cap.py and the
planner benchmark load it from here); `python tests/unit/data/code_completion_trace.py --out
FILE` writes it as an Azure-layout CSV for `hbmserve plan --trace` and `simulate --trace`.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from hbmserve.capacity.traces.arrivals import Arrivals, gamma_arrivals

PROMPT_MEAN, PROMPT_CV, PROMPT_CLIP = 2000.0, 0.4, (256, 8000)
OUTPUT_MEAN, OUTPUT_CV, OUTPUT_CLIP = 40.0, 0.8, (4, 256)
GAP_CV = 1.5
SEGMENT_S = 60.0


def code_completion_arrivals(mean_rps: float = 8.0, duration_s: float = 3600.0, swing: float = 0.4,
                             seed: int = 0) -> Arrivals:
    if not (mean_rps > 0 and duration_s > 0 and 0 <= swing < 1):
        raise ValueError("need mean_rps > 0, duration_s > 0 and 0 <= swing < 1")
    n_seg = max(1, math.ceil(duration_s / SEGMENT_S))
    seeds = np.random.SeedSequence(seed).generate_state(n_seg + 2)
    ts = []
    for i in range(n_seg):
        start = i * SEGMENT_S
        span = min(SEGMENT_S, duration_s - start)
        rate = mean_rps * (1.0 + swing * math.sin(2 * math.pi * (start + span / 2) / duration_s))
        ts.append(gamma_arrivals(rate, span, GAP_CV, seed=int(seeds[i])).t + start)
    t = np.concatenate(ts)
    rng_p, rng_o = (np.random.default_rng(int(s)) for s in seeds[n_seg:])
    return Arrivals(t, _lognormal(rng_p, len(t), PROMPT_MEAN, PROMPT_CV, PROMPT_CLIP),
                    _lognormal(rng_o, len(t), OUTPUT_MEAN, OUTPUT_CV, OUTPUT_CLIP))


def _lognormal(rng: np.random.Generator, n: int, mean: float, cv: float, clip: tuple[int, int]) -> np.ndarray:
    sigma2 = math.log(1 + cv * cv)
    x = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), n)
    return np.clip(np.rint(x), *clip).astype(np.int64)


def write_csv(arr: Arrivals, path: Path) -> None:
    rows = (f"{t:.6f},{p},{o}" for t, p, o in zip(arr.t, arr.prompt, arr.output))
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rps", type=float, default=8.0)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    arrivals = code_completion_arrivals(a.rps, a.duration, seed=a.seed)
    write_csv(arrivals, a.out)
    print(f"{len(arrivals)} requests over {a.duration:g} s written to {a.out}")
