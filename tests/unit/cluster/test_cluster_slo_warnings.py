"""`hbmserve up` / `deploy` warn when a model's engine settings cannot meet its SLO, with the
setting to change (cluster/checks.py `slo_warnings`); warnings, never a refusal."""

from __future__ import annotations

from hbmserve.cluster.checks import slo_warnings
from hbmserve.core.config import parse_cluster_spec

MODEL = {"name": "m70", "source": "meta-llama/Llama-3.1-70B-Instruct", "engine": "vllm-gpu",
         "engine_settings": {"max_model_len": 8192, "max_num_seqs": 128, "max_num_batched_tokens": 8192},
         "parallelism": {"tp": 4}, "slo": {"ttft_p95_ms": 2000, "tpot_p95_ms": 100},
         "hardware": {"gpu": "h100-sxm"}, "sim": {"model_config_name": "llama-3.1-70b"}}


def _warnings(**changes) -> list[str]:
    return slo_warnings(parse_cluster_spec({"models": [{**MODEL, **changes}]}))


def test_a_budget_whose_full_step_misses_tpot_is_named_with_the_budget_that_fits():
    (line,) = _warnings()
    assert line.startswith("models.0.engine_settings.max_num_batched_tokens: decode steps carrying a chunk of "
                           "8,192 tokens take 0.5")
    assert "lower max_num_batched_tokens to <= 1," in line


def test_a_fitting_budget_is_silent_and_an_unreachable_slo_is_named():
    assert _warnings(engine_settings={**MODEL["engine_settings"], "max_num_batched_tokens": 1024}) == []
    (line,) = _warnings(slo={"ttft_p95_ms": 2000, "tpot_p95_ms": 5})
    assert "m70 cannot meet its SLO at any replica count" in line and "p95 TPOT" in line


def test_a_model_the_capacity_model_cannot_cost_is_not_judged(tmp_path):
    # A local source with no config.json yet and no `sim` shape named: judging a stand-in would mislead.
    unknown = {k: v for k, v in MODEL.items() if k != "sim"}
    assert slo_warnings(parse_cluster_spec({"models": [{**unknown, "source": str(tmp_path)}]})) == []
