"""`hbmserve bench --plot out.png`: output tokens/s and TTFT over the run, and the TTFT and TPOT
distributions (CDFs); measured, and predicted beside it with `--predict`.

Both sides go through the same per-request arrays (`Timings`), so a gap in the picture is a gap
in the numbers. A request's tokens are spread evenly between its first and last token (the
simulator keeps no per-token times), measured ones too, so the two curves are made alike.
matplotlib is imported inside `plot_bench` (Agg backend) so importing this module costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hbmserve.ops.bench_figures import RequestRecord
from hbmserve.capacity.sim.metrics import RequestTimes, request_latencies


@dataclass(frozen=True)
class Timings:
    """Per completed request, wall seconds since the run's start."""

    sent: np.ndarray
    first: np.ndarray
    finish: np.ndarray
    tokens: np.ndarray

    @staticmethod
    def of_records(records: Sequence[RequestRecord]) -> Timings:
        ok = [r for r in records if r.ok and r.ttft_s is not None and r.e2e_s is not None]
        sent = np.array([r.sent_s for r in ok], dtype=np.float64)
        return Timings(sent, sent + np.array([r.ttft_s for r in ok], dtype=np.float64),
                       sent + np.array([r.e2e_s for r in ok], dtype=np.float64),
                       np.array([r.output_tokens for r in ok], dtype=np.int64))

    @staticmethod
    def of_sim(times: RequestTimes, clock: float = 1.0) -> Timings:
        return Timings(times.arrival / clock, times.first / clock, times.finish / clock, times.output)

    def tokens_per_second(self, seconds: int) -> np.ndarray:
        """Output tokens in each whole second [0, seconds): each request's spread evenly over
        [first token, last token] (all at once when they coincide)."""
        out = np.zeros(max(seconds, 0))
        for a, b, n in zip(self.first.tolist(), self.finish.tolist(), self.tokens.tolist()):
            times = np.linspace(a, b, int(n)) if n > 0 else np.zeros(0)
            idx = times.astype(np.int64)
            np.add.at(out, idx[(idx >= 0) & (idx < len(out))], 1.0)
        return out

    def ttft_by_second(self, seconds: int) -> np.ndarray:
        """Mean TTFT of the requests sent in each second (NaN where none was)."""
        idx = np.clip(self.sent.astype(np.int64), 0, max(seconds - 1, 0))
        total = np.bincount(idx, weights=self.first - self.sent, minlength=seconds)[:seconds]
        count = np.bincount(idx, minlength=seconds)[:seconds]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / np.maximum(count, 1), np.nan)

    def ttft_tpot(self) -> tuple[np.ndarray, np.ndarray]:
        ttft, tpot, _ = request_latencies(self.sent, self.first, self.finish, self.tokens)
        return ttft, tpot[~np.isnan(tpot)]


def plot_bench(path: str | os.PathLike[str], measured: Timings, predicted: Timings | None = None,
               slo_ttft_s: float | None = None, slo_tpot_s: float | None = None, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = [("measured", measured, "tab:blue")] + ([("predicted", predicted, "tab:orange")] if predicted else [])
    end = max([1.0, *(float(t.finish.max()) for _, t, _ in sides if len(t.finish))])
    seconds = int(np.ceil(end))
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (tok_ax, ttft_ax), (ttft_cdf, tpot_cdf) = axes
    for label, t, color in sides:
        x = np.arange(seconds)
        tok_ax.plot(x, t.tokens_per_second(seconds), color=color, label=label)
        ttft_ax.plot(x, t.ttft_by_second(seconds) * 1e3, ".-", color=color, ms=3, lw=0.8, label=label)
        ttft, tpot = t.ttft_tpot()
        for ax, values in ((ttft_cdf, ttft), (tpot_cdf, tpot)):
            if len(values):
                v = np.sort(values) * 1e3
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), color=color, label=label)
    tok_ax.set(xlabel="seconds", ylabel="output tokens/s", title="throughput")
    ttft_ax.set(xlabel="second sent", ylabel="TTFT ms (mean)", title="TTFT over the run")
    ttft_cdf.set(xlabel="TTFT ms", ylabel="fraction of requests", title="TTFT distribution")
    tpot_cdf.set(xlabel="TPOT ms", ylabel="fraction of requests", title="TPOT distribution")
    for ax, slo in ((ttft_ax, slo_ttft_s), (ttft_cdf, slo_ttft_s), (tpot_cdf, slo_tpot_s)):
        if slo is not None:
            (ax.axhline if ax is ttft_ax else ax.axvline)(slo * 1e3, color="tab:red", ls="--", lw=1, label="SLO")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title or "hbmserve bench")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
