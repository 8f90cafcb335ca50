"""Traffic for many LoRA adapters of one base model: which adapter each request names, with
Zipf popularity (issue 25).

Many fine-tunes behind one endpoint is the shape multi-LoRA serving has: a few hot adapters
and a long tail of cold ones (S-LoRA and Punica evaluate on the same Zipf-like popularity).
Requests arrive as a Poisson process at `rate_rps`; request i names adapter k (0-based rank)
with weight 1 / (k + 1)**zipf_s, or the base model with probability `base_share`. Prompt and
output lengths are log-normal. Pure and seeded: the same spec and seed give the same arrivals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.traces.arrivals import Arrivals, TraceError


@dataclass(frozen=True)
class AdapterTraceSpec:
    adapters: int = 50
    zipf_s: float = 1.0
    base_share: float = 0.0
    rate_rps: float = 4.0
    duration_s: float = 300.0
    prompt_tokens: float = 600.0  # mean; log-normal, cv 0.6
    output_tokens: float = 150.0  # mean; log-normal, cv 0.6
    max_context_tokens: int = 4096
    prefix: str = "lora-"  # adapter k is named f"{prefix}{k}"

    def __post_init__(self) -> None:
        problems = [f"{n} must be > 0" for n in ("rate_rps", "duration_s", "prompt_tokens", "output_tokens")
                    if not getattr(self, n) > 0]
        if self.adapters < 1:
            problems.append("adapters must be >= 1")
        if self.zipf_s < 0:
            problems.append("zipf_s must be >= 0")
        if not 0 <= self.base_share < 1:
            problems.append("base_share must be in [0, 1)")
        if problems:
            raise TraceError("adapter trace: " + "; ".join(problems))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"{self.prefix}{k}" for k in range(self.adapters))

    def popularity(self) -> np.ndarray:
        """Each adapter's share of the adapter requests, most popular first."""
        w = 1.0 / np.arange(1, self.adapters + 1, dtype=np.float64) ** self.zipf_s
        return w / w.sum()


def _lognormal(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    sigma = np.sqrt(np.log1p(cv * cv))
    return rng.lognormal(np.log(mean) - sigma * sigma / 2, sigma, n)


def adapter_arrivals(spec: AdapterTraceSpec = AdapterTraceSpec(), seed: int = 0) -> Arrivals:
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(spec.rate_rps * spec.duration_s))
    t = np.sort(rng.uniform(0.0, spec.duration_s, n))
    out = np.clip(np.rint(_lognormal(rng, spec.output_tokens, 0.6, n)), 1, spec.max_context_tokens // 2)
    prompt = np.clip(np.rint(_lognormal(rng, spec.prompt_tokens, 0.6, n)), 1, spec.max_context_tokens - out)
    return Arrivals(t, prompt.astype(np.int64), out.astype(np.int64), adapters=_draw(rng, spec, n),
                    adapter_names=spec.names)


def _draw(rng: np.random.Generator, spec: AdapterTraceSpec, n: int) -> np.ndarray:
    """The adapter of each of `n` requests by `spec`'s popularity (-1: the base model)."""
    which = rng.choice(spec.adapters, size=n, p=spec.popularity())
    which[rng.random(n) < spec.base_share] = -1
    return which.astype(np.int64)


def with_adapters(arrivals: Arrivals, spec: AdapterTraceSpec = AdapterTraceSpec(), seed: int = 0) -> Arrivals:
    """`arrivals` (a recorded trace's times and lengths) with the adapter of each request drawn by
    `spec`'s popularity and base share; its rate, duration and lengths are not used."""
    which = _draw(np.random.default_rng(seed), spec, len(arrivals))
    return Arrivals(arrivals.t, arrivals.prompt, arrivals.output, arrivals.hashes, which, spec.names)
