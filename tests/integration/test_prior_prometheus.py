"""The autoscaler's prior read from the service's own Prometheus history (issue 38, req 1).

A real Prometheus serves two hours of a service's counters, backfilled by promtool from a lulls
trace: each replica's answered-request count (the TTFT histogram's) and the door's refusals, one
replica replaced half-way (its counter gone, a new one from 0), as a live fleet leaves them.
`hbmserve autoscale learn --prometheus` learns a prior from it as `--trace` does from the trace
itself, and a config's `autoscaling.prior: {prometheus: URL}` gives the deployed policy the same
prior; a Prometheus that cannot be read costs the deploy nothing and says why.
"""

from __future__ import annotations

import socket
import time

import pytest
import yaml
from typer.testing import CliRunner

from hbmserve.capacity.traces.lulls_trace import LullsTraceSpec, lulls_arrivals
from hbmserve.cli.main import build_app
from hbmserve.core.config import load_cluster_spec
from hbmserve.deployments.apps.autoscaling_options import live_policy
from hbmserve.deployments.control.prometheus_history import ANSWERED, request_rates
from tests.integration.prometheus_server import backfill, prometheus_server

SCRAPE_S = 15.0
SPAN_S = 7200.0


def _openmetrics(times: list[float], end: float) -> str:
    """The counters a fleet's scrapes would have left, every SCRAPE_S up to `end`: requests
    alternate between two replicas, r1 is replaced by r2 half-way; every 10th is refused."""
    start = end - SPAN_S
    series: dict[tuple[str, str], list[tuple[float, int]]] = {}
    counts: dict[tuple[str, str], int] = {}
    i = 0
    for k in range(int(SPAN_S / SCRAPE_S) + 1):
        now = k * SCRAPE_S
        while i < len(times) and times[i] <= now:
            late = times[i] > SPAN_S / 2
            key = (("hbmserve_refusals_total", "door") if i % 10 == 9
                   else (ANSWERED, "r0" if i % 2 == 0 else ("r2" if late else "r1")))
            counts[key] = counts.get(key, 0) + 1
            i += 1
        for key, n in counts.items():
            if key[1] == "r1" and now > SPAN_S / 2:
                continue  # r1 is gone
            series.setdefault(key, []).append((start + now, n))
    lines = [f"# TYPE {ANSWERED} unknown"]
    lines += [f'{ANSWERED}{{model="m",replica="{r}"}} {n} {t:.3f}'
              for (name, r), points in series.items() if name == ANSWERED for t, n in points]
    lines += ["# TYPE hbmserve_refusals counter"]
    lines += [f'hbmserve_refusals_total{{model="m",reason="overload"}} {n} {t:.3f}'
              for (name, _), points in series.items() if name != ANSWERED for t, n in points]
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("prom")
    arr = lulls_arrivals(LullsTraceSpec(duration_s=SPAN_S), seed=3)
    times = [float(t) for t in arr.t]
    trace = workdir / "past.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{t:.6f},{p},{o}\n" for t, p, o in zip(arr.t, arr.prompt, arr.output)))
    end = (time.time() // SCRAPE_S) * SCRAPE_S - 120  # two minutes ago, on a scrape
    tsdb = backfill(_openmetrics(times, end), workdir)
    with prometheus_server([], workdir, tsdb=tsdb) as prom:
        yield prom.url, trace, len(times), end


def _config(tmp_path, prior) -> str:
    model = {"name": "m", "source": "simulated", "engine": "sim",
             "autoscaling": {"min_replicas": 1, "max_replicas": 8, "prior": prior}}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"models": [model]}))
    return str(path)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_history_counts_every_request_across_replaced_replicas_and_refusals(history):
    url, _, sent, end = history
    got = request_rates(url, "m", SPAN_S + 60, SCRAPE_S, end + 60)
    assert got.step_s == SCRAPE_S and len(got.rates) == int((SPAN_S + 60) / SCRAPE_S)
    # rate() over two scrapes loses at most the requests of the first step and the replica swap.
    assert 0.97 * sent <= got.requests <= 1.01 * sent, (got.requests, sent)
    with pytest.raises(ValueError, match="holds no request of model 'other'"):
        request_rates(url, "other", SPAN_S, SCRAPE_S, end + 60)


def test_learn_from_prometheus_writes_the_prior_learn_from_the_trace_writes(history, tmp_path):
    url, trace, _, _ = history
    cfg = _config(tmp_path, None)
    out = {}
    for name, source in (("trace", ["--trace", str(trace)]), ("prometheus", ["--prometheus", url, "--window",
                                                                               f"{SPAN_S + 240:g}"])):
        r = CliRunner().invoke(build_app(), ["autoscale", "learn", "--config", cfg, "--out", str(tmp_path / f"{name}.yaml"),
                                     *source])
        assert r.exit_code == 0, r.output
        out[name] = yaml.safe_load((tmp_path / f"{name}.yaml").read_text())
    seen, kept = out["prometheus"], out["trace"]
    assert seen["bucket_s"] == kept["bucket_s"] and len(seen["rises_rps"]) == len(kept["rises_rps"])
    # The same bursts seen at 15-s resolution: the largest rise and the bursts' lengths agree
    # (medians 77 and 91 s of 29-230 s). Before a burst had to fall below a quarter of the largest
    # rise to end, Poisson noise about the half-way mark cut "bursts" of 1-6 s second by second,
    # which a 15-s count smoothed away, and the medians were 38 and 57 s.
    assert max(seen["rises_rps"]) == pytest.approx(max(kept["rises_rps"]), rel=0.1)
    for q in (0.5, 0.9, 1.0):
        assert _quantile(seen["lengths_s"], q) == pytest.approx(_quantile(kept["lengths_s"], q), rel=0.15)
    assert seen["learned_from"].startswith(f"Prometheus {url}")


def test_a_config_that_names_prometheus_deploys_with_the_prior_it_teaches(history, tmp_path):
    url, _, _, _ = history
    policy = live_policy(load_cluster_spec(_config(tmp_path, {"prometheus": url, "window_s": SPAN_S + 240}))
                         .models[0])
    assert policy.config.prior_rises_rps and policy.config.prior_lengths_s
    assert policy.config.prior_source.startswith(f"Prometheus {url}")
    assert policy.serve_config()["policy"]["policy_kwargs"]["prior_rises_rps"] == policy.config.prior_rises_rps


def test_a_prometheus_that_cannot_be_read_starts_the_policy_without_memory_and_says_why(tmp_path):
    dead = f"http://127.0.0.1:{_closed_port()}"
    policy = live_policy(load_cluster_spec(_config(tmp_path, {"prometheus": dead, "timeout_s": 2})).models[0])
    assert policy.config.prior_rises_rps == ()
    assert policy.config.prior_source.startswith(f"none: Prometheus at {dead}")
    r = CliRunner().invoke(build_app(), ["autoscale", "learn", "--config", _config(tmp_path, None), "--out",
                                 str(tmp_path / "p.yaml"), "--prometheus", dead])
    assert r.exit_code == 2 and f"error: Prometheus at {dead}" in r.output, r.output
    assert not (tmp_path / "p.yaml").exists()
