"""`hbmserve up` / `deploy` judge each model's engine settings against its SLO at a nominal request
(cluster/checks.py `slo_findings`): a full chunked step over the TPOT target is a refusal naming
the field and the budget that fits; whatever else cannot meet the SLO is a warning."""

from __future__ import annotations

from hbmserve.capacity.perf.hardware import load_catalog
from hbmserve.capacity.perf.perf_model import cost_model
from hbmserve.capacity.perf.scenario import nominal_workload, scenario_for
from hbmserve.capacity.perf.slo_cap import ROUND_TOKENS, chunk_step_s
from hbmserve.cluster.checks import deploy_slo_check, slo_findings
from hbmserve.core.config import parse_cluster_spec

MODEL = {"name": "m70", "source": "meta-llama/Llama-3.1-70B-Instruct", "engine": "vllm-gpu",
         "engine_settings": {"max_model_len": 8192, "max_num_seqs": 128, "max_num_batched_tokens": 8192},
         "parallelism": {"tp": 4}, "slo": {"ttft_p95_ms": 2000, "tpot_p95_ms": 100},
         "hardware": {"gpu": "h100-sxm"}, "sim": {"model_config_name": "llama-3.1-70b"}}
FIELD = "models.m70.engine_settings.max_num_batched_tokens"


def _spec(*models: dict):
    return parse_cluster_spec({"models": list(models)})


def _findings(**changes):
    return slo_findings(_spec({**MODEL, **changes}))


def _budget(budget: int) -> dict:
    return {"engine_settings": {**MODEL["engine_settings"], "max_num_batched_tokens": budget}}


def test_a_budget_whose_full_step_breaks_tpot_is_refused_naming_the_field_and_the_budget_that_fits():
    found = _findings()
    (refusal,) = found.refusals
    assert refusal.startswith(f"{FIELD}: a decode step carrying a full 8,192-token chunk takes 0.5")
    assert "> the TPOT target 0.1 s at a nominal 2,048-token prompt and 128-token output (no trace here)" in refusal
    assert refusal.endswith("(or pass --allow-slo-miss to run anyway)")
    # The budget it names is the largest (to ROUND_TOKENS) whose full step fits, derived here
    # from the step-time model at the nominal request: 128 decodes at context 2,048 + 128 / 2.
    fits = int(refusal.split("set it to <= ")[1].split(" ")[0].replace(",", ""))
    sc = scenario_for(_spec(MODEL).models[0], load_catalog())
    w = nominal_workload(sc)
    ctx = w.prompt_mean + w.output_mean / 2

    def step(budget: int) -> float:
        return chunk_step_s(cost_model(sc.deployment), budget, 128, ctx, w.prompt_mean)

    assert fits % ROUND_TOKENS == 0 and step(fits) <= 0.1 < step(fits + ROUND_TOKENS)
    # The same budget passes, and the warning of today still comes with the refusal (printed
    # as it was when --allow-slo-miss lets the command run).
    assert _findings(**_budget(fits)) == slo_findings(_spec({**MODEL, **_budget(1024)}))
    (warning,) = found.warnings
    assert warning.startswith(f"models.0.engine_settings.max_num_batched_tokens: decode steps carrying a chunk "
                              f"of 8,192 tokens take 0.5")


def test_a_fitting_budget_is_silent_and_an_unreachable_slo_is_only_a_warning():
    fits = _findings(**_budget(1024))
    assert fits.refusals == () and fits.warnings == ()
    # TPOT 5 ms: not even the 128 decodes fit a step (refused), and the light-load TPOT misses (warned).
    tight = _findings(**_budget(1024), slo={"ttft_p95_ms": 2000, "tpot_p95_ms": 5})
    (warning,) = tight.warnings
    assert "m70 cannot meet its SLO at any replica count" in warning and "p95 TPOT" in warning
    (refusal,) = tight.refusals
    assert "even the decodes alone exceed it: lower max_num_seqs" in refusal


def test_every_model_over_budget_is_refused_by_name():
    small = {**MODEL, "name": "m8", "parallelism": {"tp": 1}, "sim": {"model_config_name": "llama-3.1-8b"}}
    found = slo_findings(_spec(MODEL, small, {**MODEL, "name": "ok", **_budget(1024)}))
    assert [r.split(":")[0] for r in found.refusals] == [FIELD, "models.m8.engine_settings.max_num_batched_tokens"]


def test_a_model_the_capacity_model_cannot_cost_is_not_judged(tmp_path):
    # A local source with no config.json yet and no `sim` shape named: judging a stand-in would mislead.
    unknown = {k: v for k, v in MODEL.items() if k != "sim"}
    m = _spec({**unknown, "source": str(tmp_path)}).models[0]
    assert deploy_slo_check(m) is None
    assert slo_findings(_spec({**unknown, "source": str(tmp_path)})) == slo_findings(_spec({**MODEL, **_budget(1024)}))
