"""Request arrivals: trace files (CSV, JSONL) and synthetic Poisson / gamma-bursty generators.

All sources produce one `Arrivals` value: parallel numpy arrays sorted by time, plus optional
per-request prefix hash ids. Readers are kept apart from generators; generators are seeded and
pure (same seed, same arrivals).
"""

from __future__ import annotations

import csv
from datetime import datetime
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, line and field."""


@dataclass(frozen=True)
class Arrivals:
    t: np.ndarray  # seconds, sorted
    prompt: np.ndarray  # int64 tokens
    output: np.ndarray  # int64 tokens (max_tokens; the request generates exactly this many)
    hashes: tuple[tuple[int, ...], ...] | None = None  # prefix block hash ids per request
    # The LoRA adapter each request names, as an index into `adapter_names` (-1: the base model).
    adapters: np.ndarray | None = None
    adapter_names: tuple[str, ...] = ()

    def adapter_of(self, i: int) -> str | None:
        if self.adapters is None or self.adapters[i] < 0:
            return None
        return self.adapter_names[int(self.adapters[i])]

    def _with(self, t: np.ndarray, prompt: np.ndarray, output: np.ndarray, sl: slice = slice(None)) -> Arrivals:
        hs = self.hashes[sl] if self.hashes is not None else None
        ads = self.adapters[sl] if self.adapters is not None else None
        return Arrivals(t, prompt, output, hs, ads, self.adapter_names)

    def __len__(self) -> int:
        return len(self.t)

    @property
    def duration_s(self) -> float:
        return float(self.t[-1] - self.t[0]) if len(self.t) else 0.0

    def window(self, start_s: float, end_s: float) -> Arrivals:
        """Requests arriving in [start, end), re-based to start at 0."""
        lo, hi = np.searchsorted(self.t, [start_s, end_s])
        return self._with(self.t[lo:hi] - start_s, self.prompt[lo:hi], self.output[lo:hi], slice(lo, hi))

    def scaled(self, time_scale: float = 1.0) -> Arrivals:
        """Stretch (>1) or compress (<1) inter-arrival times; the rate divides by time_scale."""
        return self._with(self.t * time_scale, self.prompt, self.output)

    def clipped(self, max_model_len: int) -> Arrivals:
        """Shorten prompts so prompt + output fits max_model_len (outputs first capped at half)."""
        out = np.minimum(self.output, max(1, max_model_len // 2))
        prompt = np.clip(np.minimum(self.prompt, max_model_len - out), 1, None)
        return self._with(self.t, prompt.astype(np.int64), out.astype(np.int64))

    def rate_peak(self, window_s: float = 60.0) -> float:
        """Highest request rate over any aligned window (requests per second)."""
        if not len(self.t):
            return 0.0
        counts = np.bincount((self.t // window_s).astype(np.int64))
        return float(counts.max()) / window_s


def _finish(t: list[float], p: list[int], o: list[int], hs: list[tuple[int, ...]] | None, src: str,
            ads: list[str | None] | None = None) -> Arrivals:
    if not t:
        raise TraceError(f"trace {src} has no requests")
    ta = np.asarray(t, dtype=np.float64)
    order = np.argsort(ta, kind="stable")
    hashes = tuple(hs[i] for i in order) if hs is not None else None
    names = tuple(dict.fromkeys(a for a in ads or () if a is not None))
    index = {a: k for k, a in enumerate(names)}
    which = np.asarray([index.get(a, -1) for a in ads], dtype=np.int64)[order] if names else None
    return Arrivals(ta[order] - ta[order][0], np.asarray(p, dtype=np.int64)[order],
                    np.asarray(o, dtype=np.int64)[order], hashes, which, names)


# The Azure LLM inference dataset's CSVs as published (AzurePublicDataset, 2023/2024):
# a wall-clock TIMESTAMP with 7 fractional digits, ContextTokens, GeneratedTokens.
AZURE_RAW_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
CSV_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


def _azure_seconds(stamp: str) -> float:
    # Python's ISO parser takes at most 6 fractional digits; naive times are read as given
    # (no local time zone, so no daylight-saving jump inside a trace).
    day, _, frac = stamp.strip().partition(".")
    whole = (datetime.fromisoformat(day) - datetime(1970, 1, 1)).total_seconds()
    return whole + (float("0." + frac) if frac else 0.0)


def read_csv_trace(path: str | os.PathLike[str]) -> Arrivals:
    """CSV with columns arrived_at (s), num_prefill_tokens, num_decode_tokens (the Vidur /
    converted Azure layout), or the Azure dataset's own TIMESTAMP, ContextTokens,
    GeneratedTokens. Either way sorted and re-based to the first arrival."""
    p = Path(path)
    t: list[float] = []
    pr: list[int] = []
    out: list[int] = []
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        header = set(reader.fieldnames or ())
        columns = AZURE_RAW_COLUMNS if set(AZURE_RAW_COLUMNS) <= header else CSV_COLUMNS
        when = _azure_seconds if columns is AZURE_RAW_COLUMNS else float
        missing = set(columns) - header
        if missing:
            raise TraceError(f"trace {p}: missing column(s) {', '.join(sorted(missing))} (or "
                             f"the Azure dataset's {', '.join(AZURE_RAW_COLUMNS)})")
        at, prompt, output = columns
        for line, row in enumerate(reader, start=2):
            try:
                t.append(when(row[at]))
                pr.append(int(float(row[prompt])))
                out.append(int(float(row[output])))
            except (TypeError, ValueError):
                raise TraceError(f"trace {p} line {line}: not a number in {row}") from None
    return _finish(t, pr, out, None, str(p))


def read_jsonl_trace(path: str | os.PathLike[str]) -> Arrivals:
    """JSONL, one object per line: timestamp (ms, Mooncake) or arrived_at (s), input_length,
    output_length, optional hash_ids, optional adapter (the LoRA adapter it names; absent or null:
    the base model)."""
    p = Path(path)
    t: list[float] = []
    pr: list[int] = []
    out: list[int] = []
    hs: list[tuple[int, ...]] = []
    ads: list[str | None] = []
    any_hash = False
    with p.open() as f:
        for line, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
                ts = float(obj["arrived_at"]) if "arrived_at" in obj else float(obj["timestamp"]) / 1000.0
                pr.append(int(obj["input_length"]))
                out.append(int(obj["output_length"]))
                h = tuple(int(x) for x in obj.get("hash_ids") or ())
                adapter = obj.get("adapter")
                if adapter is not None and not (isinstance(adapter, str) and adapter):
                    raise ValueError(f"adapter must be a name or null, not {adapter!r}")
            except (KeyError, TypeError, ValueError, json.JSONDecodeError) as err:
                raise TraceError(f"trace {p} line {line}: {type(err).__name__}: {err}") from None
            t.append(ts)
            any_hash = any_hash or bool(h)
            hs.append(h)
            ads.append(adapter)
    return _finish(t, pr, out, hs if any_hash else None, str(p), ads)


def write_jsonl_trace(arrivals: Arrivals, path: str | os.PathLike[str]) -> None:
    """`arrivals` as `read_jsonl_trace` reads them: arrived_at (s), input_length, output_length,
    and hash_ids and adapter where the trace has them."""
    hashes = arrivals.hashes or ((),) * len(arrivals)
    with Path(path).open("w") as f:
        for i, (t, p, o, h) in enumerate(zip(arrivals.t.tolist(), arrivals.prompt.tolist(),
                                             arrivals.output.tolist(), hashes)):
            a = arrivals.adapter_of(i)
            f.write(json.dumps({"arrived_at": round(t, 6), "input_length": p, "output_length": o,
                                **({"hash_ids": list(h)} if arrivals.hashes is not None else {}),
                                **({"adapter": a} if a is not None else {})}) + "\n")


def read_trace(path: str | os.PathLike[str]) -> Arrivals:
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file not found: {p}")
    if p.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        return read_jsonl_trace(p)
    return read_csv_trace(p)


# ---- synthetic ----------------------------------------------------------------------------------

def lognormal_lengths(rng: np.random.Generator, n: int, mean: float, cv: float) -> np.ndarray:
    """`n` token lengths, log-normal with this mean and coefficient of variation, at least 1
    (cv 0: all equal to the mean)."""
    if cv <= 0:
        return np.full(n, max(1, round(mean)), dtype=np.int64)
    sigma2 = np.log(1 + cv * cv)
    mu = np.log(mean) - sigma2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, np.sqrt(sigma2), n))).astype(np.int64)


def gamma_arrivals(rate_rps: float, duration_s: float, cv: float = 1.0, prompt_tokens: float = 1000,
                   output_tokens: float = 200, length_cv: float = 0.0, seed: int = 0) -> Arrivals:
    """Renewal process with gamma inter-arrival times: cv=1 is Poisson, cv>1 is bursty."""
    if rate_rps <= 0 or duration_s <= 0:
        raise TraceError("rate and duration must be > 0")
    rng = np.random.default_rng(seed)
    n_guess = int(rate_rps * duration_s * 1.2 + 10 * np.sqrt(rate_rps * duration_s) + 10)
    shape = 1.0 / (cv * cv)
    gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), n_guess)
    t = np.cumsum(gaps)
    while t[-1] < duration_s:
        more = np.cumsum(rng.gamma(shape, 1.0 / (rate_rps * shape), n_guess)) + t[-1]
        t = np.concatenate([t, more])
    t = t[t < duration_s]
    n = len(t)
    return Arrivals(t, lognormal_lengths(rng, n, prompt_tokens, length_cv),
                    lognormal_lengths(rng, n, output_tokens, length_cv))


def length_stream(prompt_tokens: float, output_tokens: float, length_cv: float = 0.0,
                  seed: int = 0) -> Iterator[tuple[int, int]]:
    """Endless (prompt, output) token counts drawn as `gamma_arrivals` draws them, for a closed
    loop, whose number of requests is not known in advance."""
    rng = np.random.default_rng(seed)
    while True:
        prompts = lognormal_lengths(rng, 1024, prompt_tokens, length_cv)
        outputs = lognormal_lengths(rng, 1024, output_tokens, length_cv)
        yield from zip(prompts.tolist(), outputs.tolist())
