"""The figures of a benchmark run, measured (`hbmserve bench`) or predicted (the simulator), and
how far apart they are. Pure: records in, figures out; no I/O, no clock.

A measured and a predicted figure must mean the same thing, so the definitions are the
simulator's (capacity/sim/metrics.py), and its functions compute both:
  TTFT  first streamed token - request sent;      E2E  last token - request sent
  TPOT  (E2E - TTFT) / (output tokens - 1), for replies of 2 tokens or more
  ITL   every gap between consecutive streamed chunks, all requests pooled (vLLM's `itl`)
  throughput  completed requests, and their output tokens, per second of the span (from the
              run's start to its last completion)
  goodput     requests that met both SLOs per second of span; SloSeconds attainment: the share of
              requests *sent* that met both (a failed request misses the SloSeconds)
Error kinds: the HTTP status ("429", "503", ...), "timeout", "connection" (refused, reset,
unreachable before a reply) or "stream" (the reply broke or came back short).

Relative error is (predicted - measured) / measured: positive when the simulator overestimates.
MAPE is the mean of its absolute value over TTFT and TPOT p50 and p95 (MAPE_KEYS), the
fidelity figures the calibration reports (docs/benchmarks.md).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from hbmserve.core.config import SloSeconds
from hbmserve.capacity.sim.metrics import LatencyStats, SimSummary, meets_slo, request_latencies

LATENCIES = ("ttft", "tpot", "itl", "e2e")
QUANTILE_NAMES = ("p50", "p90", "p95", "p99")
LATENCY_KEYS = tuple(f"{m}_{q}_s" for m in LATENCIES for q in QUANTILE_NAMES)  # seconds
FIGURE_KEYS = LATENCY_KEYS + ("request_rps", "output_tok_s", "goodput_rps", "slo_attainment")  # compared, in order
MAPE_KEYS = ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")


@dataclass(frozen=True)
class RequestRecord:
    """One request as the load generator saw it; times in seconds since the run's start."""

    index: int
    sent_s: float
    prompt_tokens: int  # asked for
    max_tokens: int  # asked for
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: tuple[float, ...] = ()
    output_tokens: int = 0  # generated: the server's usage count, else the streamed chunks
    error_kind: str | None = None  # None: the request succeeded
    error: str = ""
    scheduled_s: float | None = None  # open loop: when it was due (sent_s - scheduled_s: client lag)

    @property
    def ok(self) -> bool:
        return self.error_kind is None


@dataclass(frozen=True)
class BenchFigures:
    sent: int
    ok: int
    errors_by_kind: Mapping[str, int]
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    span_s: float
    request_rps: float
    output_tok_s: float
    output_tokens: int
    goodput_rps: float | None  # None: no SLO given
    slo_attainment: float | None
    slo: SloSeconds | None = None
    send_lag_max_s: float | None = None  # open loop: how late the client sent its worst request

    @property
    def errors(self) -> int:
        return sum(self.errors_by_kind.values())

    def figure(self, key: str) -> float | None:
        """A figure by its FIGURE_KEYS name (`ttft_p95_s`, `request_rps`, ...)."""
        name, _, rest = key.partition("_")
        if name in LATENCIES:
            return getattr(getattr(self, name), rest.removesuffix("_s"))
        return getattr(self, key)

    def to_json_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"sent": self.sent, "ok": self.ok, "errors": self.errors,
                                  "errors_by_kind": dict(self.errors_by_kind)}
        for name in LATENCIES:
            out |= {f"{name}_{k}_s": v for k, v in asdict(getattr(self, name)).items()}
        out |= {"span_s": self.span_s, "request_rps": self.request_rps, "output_tok_s": self.output_tok_s,
                "output_tokens": self.output_tokens, "goodput_rps": self.goodput_rps,
                "slo_attainment": self.slo_attainment, "send_lag_max_s": self.send_lag_max_s,
                "slo_ttft_s": self.slo.ttft_s if self.slo else None,
                "slo_tpot_s": self.slo.tpot_s if self.slo else None}
        return out


def figures_of(records: Sequence[RequestRecord], slo: SloSeconds | None = None) -> BenchFigures:
    """The measured figures of a run's records (every request sent, failed ones included)."""
    ok = [r for r in records if r.ok and r.ttft_s is not None and r.e2e_s is not None]
    sent = np.fromiter((r.sent_s for r in ok), float, len(ok))
    first = sent + np.fromiter((r.ttft_s for r in ok), float, len(ok))
    finish = sent + np.fromiter((r.e2e_s for r in ok), float, len(ok))
    tokens = np.fromiter((r.output_tokens for r in ok), np.int64, len(ok))
    ttft, tpot, e2e = request_latencies(sent, first, finish, tokens)
    span = max([*finish.tolist(), *(r.sent_s for r in records), 0.0])

    def per_s(n: float) -> float:  # n / span; 0 when nothing completed (no 0 x inf for a tiny span)
        return n / span if n and span > 0 else 0.0

    good: int | None = None
    if slo is not None:
        good = int(np.count_nonzero(meets_slo(ttft, tpot, slo.ttft_s, slo.tpot_s)))
    lags = [r.sent_s - r.scheduled_s for r in records if r.scheduled_s is not None]
    itl = np.fromiter((g for r in ok for g in r.itl_s), float)
    kinds = Counter(r.error_kind for r in records if r.error_kind is not None)
    # Requests that "succeeded" without timings are counted as stream errors, never dropped.
    kinds["stream"] += sum(1 for r in records if r.ok) - len(ok)
    return BenchFigures(
        sent=len(records), ok=len(ok), errors_by_kind=dict(sorted((k, n) for k, n in kinds.items() if n)),
        ttft=LatencyStats.of(ttft), tpot=LatencyStats.of(tpot[~np.isnan(tpot)]), itl=LatencyStats.of(itl),
        e2e=LatencyStats.of(e2e), span_s=span, request_rps=per_s(len(ok)),
        output_tok_s=per_s(float(tokens.sum())), output_tokens=int(tokens.sum()),
        goodput_rps=None if good is None else per_s(good),
        slo_attainment=None if good is None else (good / len(records) if records else 0.0),
        slo=slo, send_lag_max_s=max(lags) if lags else None)


def figures_of_summary(s: SimSummary, clock: float = 1.0) -> BenchFigures:
    """A simulator summary as benchmark figures. `clock`: simulated seconds per wall second (a
    simulated engine's `speedup`): latencies divide by it, rates multiply. Requests the simulator
    refused (over max_model_len, an HTTP 400 live) or left unfinished count as errors."""
    def wall(st: LatencyStats) -> LatencyStats:
        return LatencyStats(*(None if v is None else v / clock for v in asdict(st).values()))

    kinds = {k: n for k, n in (("400", s.rejected), ("unfinished", s.unfinished)) if n}
    return BenchFigures(
        sent=s.requests, ok=s.finished, errors_by_kind=kinds, ttft=wall(s.ttft), tpot=wall(s.tpot),
        itl=wall(s.itl), e2e=wall(s.e2e), span_s=s.makespan_s / clock,
        request_rps=s.finished / s.makespan_s * clock if s.makespan_s > 0 else 0.0,
        output_tok_s=s.output_tok_s * clock, output_tokens=s.output_tokens, goodput_rps=s.goodput_rps * clock,
        slo_attainment=s.slo_attainment, slo=SloSeconds(s.slo_ttft_s / clock, s.slo_tpot_s / clock))


def relative_error_pct(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured in percent; None when either is missing or measured is 0."""
    if predicted is None or measured is None or measured == 0:
        return None
    if not (math.isfinite(predicted) and math.isfinite(measured)):
        return None
    return (predicted - measured) / measured * 100.0


@dataclass(frozen=True)
class FigureDelta:
    key: str
    measured: float | None
    predicted: float | None
    error_pct: float | None


@dataclass(frozen=True)
class Comparison:
    rows: tuple[FigureDelta, ...]
    mape_pct: float | None  # over MAPE_KEYS; None when none of them has an error
    mape_keys: tuple[str, ...] = field(default=MAPE_KEYS)

    def to_json_dict(self) -> dict[str, object]:
        return {"rows": [asdict(r) for r in self.rows], "mape_pct": self.mape_pct, "mape_keys": list(self.mape_keys)}


def compare(measured: BenchFigures, predicted: BenchFigures) -> Comparison:
    rows = tuple(FigureDelta(k, measured.figure(k), predicted.figure(k),
                             relative_error_pct(predicted.figure(k), measured.figure(k))) for k in FIGURE_KEYS)
    errors = [abs(r.error_pct) for r in rows if r.key in MAPE_KEYS and r.error_pct is not None]
    return Comparison(rows, sum(errors) / len(errors) if errors else None)


@dataclass(frozen=True)
class RunInfo:
    """What was benchmarked and how: the header of a report."""

    url: str
    model: str
    mode: str  # how the load was given: trace, rate or concurrency
    load: str
    client: str
    client_note: str
    plot: str | None = None
    predicted_for: str | None = None  # "<model>: <layout>" of the prediction beside it


@dataclass(frozen=True)
class BenchReport:
    """One `hbmserve bench` run: what `--json` prints and the table shows, typed."""

    run: RunInfo
    measured: BenchFigures
    error_examples: Mapping[str, str]  # one message per error kind
    predicted: BenchFigures | None = None
    comparison: Comparison | None = None

    def to_json_dict(self) -> dict[str, object]:
        return {"run": asdict(self.run), "measured": self.measured.to_json_dict(),
                "error_examples": dict(self.error_examples),
                "predicted": self.predicted.to_json_dict() if self.predicted else None,
                "comparison": self.comparison.to_json_dict() if self.comparison else None}
