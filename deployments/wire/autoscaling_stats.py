"""The stats a replica pushes to Serve's controller for the autoscaling policy: the body of
`record_autoscaling_stats()` (deployments/replica/engine_replica.py) and the names the policy adapter
(deployments/control/autoscaling.py) reads them by. Serve requires dict[str, int | float]; the names are
defined here, once, on the wire between the two.
"""

from __future__ import annotations

from collections.abc import Iterable

from hbmserve.autoscale.signals import p95

STAT_WAITING = "hbm_waiting"
STAT_RUNNING = "hbm_running"
STAT_KV_USAGE = "hbm_kv_usage"
STAT_TTFT_P95_S = "hbm_ttft_p95_s"  # the replica's p95 TTFT over its own recent window
STAT_TPOT_P95_S = "hbm_tpot_p95_s"  # p95 of its streamed requests' time per output token
STAT_ARRIVAL_RPS = "hbm_arrival_rps"  # requests/s the replica received over the window
STAT_LOAD_S = "hbm_load_s"  # seconds the replica took from its constructor to a loaded engine
STAT_WAKE_S = "hbm_wake_s"  # seconds its last wake from sleep mode took (standby_sleep.py); absent: none
# Mean prompt and output tokens of the requests the replica finished over its window, and how many.
STAT_PROMPT_TOKENS = "hbm_prompt_tokens_mean"
STAT_OUTPUT_TOKENS = "hbm_output_tokens_mean"
STAT_LENGTH_SAMPLES = "hbm_length_samples"

def autoscaling_stats(*, waiting: int, running: int, kv_usage: float,
                      ttft_samples_s: Iterable[float], tpot_samples_s: Iterable[float],
                      arrival_rps: float, load_s: float,
                      lengths: tuple[float, float, int] | None = None,
                      wake_s: float | None = None) -> dict[str, float]:
    """The body of an engine deployment's `record_autoscaling_stats()`. `lengths`: (mean prompt
    tokens, mean output tokens, requests) of the requests finished over the window. `wake_s`: the
    replica's last wake from sleep mode (None: it never woke)."""
    stats = {
        STAT_WAITING: float(waiting),
        STAT_RUNNING: float(running),
        STAT_KV_USAGE: float(kv_usage),
        STAT_ARRIVAL_RPS: float(arrival_rps),
        STAT_LOAD_S: float(load_s),
    }
    if wake_s is not None:
        stats[STAT_WAKE_S] = float(wake_s)
    if lengths is not None and lengths[2] > 0:
        stats.update({STAT_PROMPT_TOKENS: float(lengths[0]), STAT_OUTPUT_TOKENS: float(lengths[1]),
                      STAT_LENGTH_SAMPLES: float(lengths[2])})
    # No completed request, no latency: the key is simply absent.
    for key, samples in ((STAT_TTFT_P95_S, ttft_samples_s), (STAT_TPOT_P95_S, tpot_samples_s)):
        value = p95(tuple(samples))
        if value is not None:
            stats[key] = value
    return stats
