"""The SLO gate `simulate`, `autoscale evaluate` and `plan --emit-config` share: can the
config meet its SLO on this trace at some replica count, and does its engine budget let any
fleet meet the TPOT target (issue 27: the engine budget before the fleet)."""

from __future__ import annotations

from typing import Any

import typer

from hbmserve.cli.user_errors import fail


def slo_check_for(sc: Any, arr: Any, max_replicas: int | None) -> Any:
    """Can the config meet its SLO on this trace at some replica count? Judged at the lightest load
    per replica its fleet can run: the busiest minute over max_replicas when the fleet scales,
    one request at a time when the replica count is the user's to choose (capacity/perf/slo_cap.py)."""
    from hbmserve.capacity.perf.scenario import scenario_slo_check
    from hbmserve.capacity.perf.slo_cap import LIGHT_RPS
    from hbmserve.capacity.sim.workload import workload_of

    w = workload_of(arr)
    return scenario_slo_check(sc, w, w.peak_rps / max_replicas if max_replicas else LIGHT_RPS)


def check_slo(check: Any, model_name: str, allow_slo_miss: bool) -> None:
    """Exit 2 when the engine budget breaks the TPOT target whatever the fleet (unless
    `allow_slo_miss`); otherwise one stderr line when the SLO cannot be met, or holds only at
    light load per replica."""
    refusal = check.budget_refusal(f"models.{model_name}.engine_settings.max_num_batched_tokens")
    if refusal and not allow_slo_miss:
        raise fail(refusal)
    if check.blocker:
        typer.echo(f"warning: models.{model_name}: cannot meet its SLO at any replica count: {check.blocker}",
                   err=True)
    elif check.advice:
        typer.echo(f"warning: models.{model_name}: {check.advice}", err=True)
