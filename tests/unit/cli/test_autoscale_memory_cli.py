"""`hbmserve autoscale learn` and `evaluate --prior-trace` (cli/autoscale.py) through typer's CliRunner (issue 38):
the prior file the config takes, what it holds, and the policy judged with and without it."""

from __future__ import annotations

import json

import typer
import yaml
from typer.testing import CliRunner

from hbmserve.cli.autoscale import NO_PRIOR, register


def _trace(path, seconds: float, burst_every_s: float = 400.0):
    """2 req/s, with 12 req/s for 60 s every `burst_every_s`."""
    rows, t = [], 0.0
    while t < seconds:
        rows.append(f"{t:.4f},{600 + len(rows) % 7 * 50},{60 + len(rows) % 5 * 10}")
        t += 1.0 / (12 if t % burst_every_s >= burst_every_s - 60 else 2)
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    return path


def run(*args):
    app = typer.Typer()
    register(app)
    return CliRunner().invoke(app, ["autoscale", *args])


def test_learn_writes_a_prior_the_config_takes_and_says_what_it_holds(tmp_path):
    past = _trace(tmp_path / "past.csv", 2400)
    out = tmp_path / "prior.yaml"
    r = run("learn", "--trace", str(past), "--out", str(out))
    assert r.exit_code == 0, r.output
    prior = yaml.safe_load(out.read_text())
    assert out.read_text().startswith("# hbmserve autoscale learn") and "autoscaling.prior" in out.read_text()
    assert prior["bucket_s"] > 0 and max(prior["rises_rps"]) > 5 and prior["learned_from"].startswith("past.csv")
    assert "before any traffic: burst envelope: peak" in r.output and "hold " in r.output


def test_learn_refuses_a_past_too_short_in_one_line(tmp_path):
    r = run("learn", "--trace", str(_trace(tmp_path / "short.csv", 60)), "--out", str(tmp_path / "p.yaml"))
    assert r.exit_code == 2 and r.output.startswith("error: ") and "bucket" in r.output, r.output
    assert not (tmp_path / "p.yaml").exists()


def test_evaluate_judges_the_policy_with_a_prior_from_another_trace_beside_it_without(tmp_path):
    past, today = _trace(tmp_path / "past.csv", 2400), _trace(tmp_path / "today.csv", 900, burst_every_s=300)
    r = run("evaluate", "--trace", str(today), "--prior-trace", str(past), "--policy", "hbmserve", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["policy"] == "hbmserve" and out["without_prior"]["policy"] == NO_PRIOR
    assert out["prior"]["trace"].endswith("past.csv") and max(out["prior"]["rises_rps"]) > 5
    # The past knows these bursts' top (12 rps, which one replica carries): no replica is ordered for the
    # climb, which without it is projected over a cold start. Nothing is missed either way.
    assert out["slo_attainment"] >= out["without_prior"]["slo_attainment"]
    assert out["gpu_hours"] < out["without_prior"]["gpu_hours"]
    table = run("evaluate", "--trace", str(today), "--prior-trace", str(past), "--policy", "hbmserve")
    assert table.exit_code == 0 and NO_PRIOR in table.output and "starts from the prior" in table.output
