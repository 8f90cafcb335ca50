"""`hbmserve up`, `deploy` and `serve-config` refuse an engine budget whose full chunked step breaks
the TPOT target (exit 2, the field and the budget that fits) before anything starts, unless
--allow-slo-miss. Every step that would start something is a recorder (conftest.py `started`), so
a refusal shows as an empty record."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import hbmserve.cli.serve as serve_cli

CONFIG = """
models:
  - name: m70
    source: simulated
    engine: sim
    engine_settings: {max_model_len: 8192, max_num_seqs: 128, max_num_batched_tokens: %d}
    parallelism: {tp: 4}
    slo: {ttft_p95_ms: 2000, tpot_p95_ms: 100}
    sim: {gpu: h100-sxm, model_config_name: llama-3.1-70b}
"""
REFUSAL = ("error: models.m70.engine_settings.max_num_batched_tokens: a decode step carrying a full 8,192-token "
           "chunk takes 0.5")


def _run(tmp_path: Path, budget: int, *args: str):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG % budget)
    app = typer.Typer()
    serve_cli.register(app)
    command, *flags = args
    return CliRunner().invoke(app, [command, str(cfg), *flags])


@pytest.mark.parametrize("command", ["up", "deploy"])
def test_a_budget_over_the_tpot_target_is_refused_before_anything_starts(tmp_path, started, command):
    r = _run(tmp_path, 8192, command, *(["--detach"] if command == "up" else []))
    assert r.exit_code == 2, r.output
    assert REFUSAL in r.output and "set it to <= 1,344" in r.output and "--allow-slo-miss" in r.output
    assert started == []


@pytest.mark.parametrize("command, expected", [("up", ["models", "head", "connect", "deploy"]),
                                               ("deploy", ["connect", "deploy"])])
def test_allow_slo_miss_serves_with_the_warning_of_before(tmp_path, started, command, expected):
    r = _run(tmp_path, 8192, command, "--allow-slo-miss", *(["--detach"] if command == "up" else []))
    assert r.exit_code == 0, r.output
    assert "warning: models.0.engine_settings.max_num_batched_tokens: decode steps carrying a chunk of 8,192" \
        in r.output
    assert started == expected


def test_a_budget_that_fits_serves_without_a_word(tmp_path, started):
    r = _run(tmp_path, 1024, "deploy")
    assert r.exit_code == 0, r.output
    assert "warning" not in r.output and "error" not in r.output and started == ["connect", "deploy"]


def test_serve_config_deploys_as_deploy_would_so_it_refuses_the_same(tmp_path, started):
    r = _run(tmp_path, 8192, "serve-config")
    assert r.exit_code == 2 and REFUSAL in r.output, r.output
    assert _run(tmp_path, 8192, "serve-config", "--allow-slo-miss").exit_code == 0
