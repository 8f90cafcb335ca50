"""`hbmserve plan --emit-config FILE`: the first plan as a cluster config that `autoscale evaluate
--config FILE --trace T`, `up` and `deploy` take as is.

"As is" means the file passes the checks those commands make: its engine budget is judged here
by the same rules, at the trace's lengths (`simulate`/`evaluate`, cli/slo_gate.py
`slo_check_for`) and at the nominal request `up`/`deploy` judge without a trace
(cluster/checks.py `deploy_slo_check`); where either would refuse the plan's budget, the file
gets the largest that fits both and says so. The folder must exist and the file must not, unless
--force: a plan should not silently replace a config someone edited.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from hbmserve.cli.user_errors import EXIT_FAILED, fail

if TYPE_CHECKING:
    from hbmserve.capacity.perf.slo_cap import SloCheck
    from hbmserve.core.config import SloSeconds
    from hbmserve.capacity.planning.emit_config import EmitTarget
    from hbmserve.capacity.planning.plan_types import PlanCandidate


def check_target(path: Path, force: bool) -> None:
    """Before planning (minutes on a long trace): refuse a file that cannot or should not be written."""
    if not path.parent.is_dir():
        raise fail(f"--emit-config {path}: no folder {path.parent}")
    if path.exists() and not force:
        raise fail(f"--emit-config {path}: the file exists; pass --force to replace it")


def model_refs(model: str, source: Optional[str]) -> tuple[str, str]:
    """(shape for the capacity model, weights for the engine) from `plan --model` and `--source`.
    A folder or its config.json is both; a shipped shape name is no model to serve, so it needs
    --source. Local paths are made absolute: the file may be read from another folder."""
    p = Path(os.path.expanduser(model))
    config = p / "config.json" if p.is_dir() else p
    shape = str(config.resolve()) if config.is_file() else model.strip().lower()
    weights = str(config.parent.resolve()) if config.name == "config.json" and config.is_file() else None
    if source is not None:
        weights = str(Path(os.path.expanduser(source)).resolve()) if source.startswith((".", "/", "~")) else source
    if weights is None:
        raise fail(f"--emit-config: --model {model} is a shape, not the model's folder: name its weights with "
                   "--source (a hub id or a folder)")
    return shape, weights


@dataclass(frozen=True)
class BudgetChecks:
    """A config's engine budget as the commands that take it judge it."""

    at_trace: SloCheck  # `simulate` and `autoscale evaluate`, at the trace's lengths
    at_up: SloCheck | None  # `up` and `deploy`, at a nominal request; None: they cannot cost it
    startup_s: dict[str, float] | None  # the start-up model's estimate per tier; None: nothing measured

    def fitting(self, budget: int) -> int:
        """`budget`, or the largest both accept where either refuses it (0: none fits)."""
        for c in (self.at_trace, self.at_up):
            if c is not None and c.budget_refusal("-"):
                budget = min(budget, c.budget_for_tpot)
        return budget

    def refusal(self, field: str) -> str | None:
        return next((r for c in (self.at_trace, self.at_up) if c and (r := c.budget_refusal(field))), None)


def write_plan_config(path: Path, force: bool, plan: PlanCandidate, target: EmitTarget, arr: Any,
                      catalog: dict, command: str, trace: Optional[Path]) -> str:
    """Write `plan` for `target` to `path`; returns the line that says so. Exit 1 when the plan
    cannot be written as a config its own checks accept (not expected: the planner caps the
    budget with the same step-time model)."""
    from hbmserve.capacity.planning.emit_config import cluster_config, render

    field = f"models.{target.name}.engine_settings.max_num_batched_tokens"
    first = _checks(cluster_config(plan, target), catalog, arr)
    budget = first.fitting(plan.max_num_batched_tokens)
    if budget == 0:
        raise fail(f"no engine budget meets the plan's TPOT target: {first.refusal(field)}", EXIT_FAILED)
    data = cluster_config(plan, target, budget, first.startup_s)
    checks = _checks(data, catalog, arr)
    refusal = checks.refusal(field)
    if refusal:
        raise fail(f"the plan does not make a config its own checks accept: {refusal}", EXIT_FAILED)
    text = render(data, _header(plan, target, arr, command, budget, checks, path, trace))
    try:
        with path.open("w" if force else "x") as f:
            f.write(text)
    except FileExistsError:
        raise fail(f"--emit-config {path}: the file exists; pass --force to replace it") from None
    except OSError as err:
        raise fail(f"--emit-config {path}: {err.strerror or err}") from None
    return f"config written to {path} (max_num_batched_tokens {budget:,})"


def _checks(data: dict, catalog: dict, arr: Any) -> BudgetChecks:
    """`data` loaded as the commands load it, then judged; exit 1 when it does not load."""
    from hbmserve.capacity.perf.scenario import scenario_for
    from hbmserve.capacity.perf.startup_measured import startup_estimate
    from hbmserve.cli.slo_gate import slo_check_for
    from hbmserve.cli.user_errors import user_errors
    from hbmserve.cluster.checks import deploy_slo_check
    from hbmserve.core.config import parse_cluster_spec

    try:
        m = parse_cluster_spec(data, "the emitted config").models[0]
        sc = scenario_for(m, catalog)
    except user_errors() as err:
        raise fail(f"the plan cannot be written as a config: {err}", EXIT_FAILED) from None
    startup = startup_estimate(m, sc.deployment.gpu)
    return BudgetChecks(slo_check_for(sc, arr, m.autoscaling.max_replicas), deploy_slo_check(m),
                        {t.value: s for t, s in startup.items()} if startup else None)


def _header(plan: PlanCandidate, target: EmitTarget, arr: Any, command: str, budget: int, checks: BudgetChecks,
            path: Path, trace: Optional[Path]) -> list[str]:
    """The file's opening comment: what wrote it, from what load, and why each number."""
    from hbmserve.capacity.sim.workload import workload_of

    w = workload_of(arr)
    startup = ("; startup_s is the start-up model's estimate for this model and GPU (capacity/perf/startup_measured.py: "
               "delete it and the drivers estimate it from what they measure)" if checks.startup_s else "")
    evaluate = (f"hbmserve autoscale evaluate --config {shlex.quote(str(path))} --trace "
                f"{shlex.quote(str(trace)) if trace else 'TRACE'} --policy all")
    return [
        f"Written by `{command}`.",
        f"Load: {len(arr):,} requests over {arr.duration_s:.0f} s (mean {w.rate_rps:.2f} req/s, busiest minute "
        f"{w.peak_rps:.2f}); prompts mean {w.prompt_mean:,.0f} tokens, outputs mean {w.output_mean:,.0f}.",
        f"Plan: {plan.layout}, {plan.replicas} active + {plan.warm_replicas} warm replica(s) at "
        f"${plan.usd_per_hour:.2f}/h, {plan.status}: {plan.reason}.",
        _budget_paragraph(plan, budget, checks, target.slo.tpot_s),
        "autoscaling: min_replicas is the plan's active fleet, max_replicas adds its warm replicas, "
        f"replica_capacity_rps is one replica's capacity within the SLO on this load{startup}.",
        f"Next: `{evaluate}`, then `hbmserve up` (or `deploy`) with this file.",
    ]


def _budget_paragraph(plan: PlanCandidate, budget: int, checks: BudgetChecks, tpot_s: float) -> str:
    c, up = checks.at_trace, checks.at_up
    target = f"<= the TPOT target {tpot_s * 1e3:g} ms at this load's lengths"
    nominal = ("" if up is None else f"the nominal {up.prompt_mean:,.0f}-token prompt and {up.output_mean:,.0f}-token "
               "output `up` and `deploy` judge without a trace")
    if not plan.chunked_prefill:
        return (f"enable_chunked_prefill false: a step prefilling {budget:,} tokens stalls the decodes beside it "
                f"{c.chunk_step_s * 1e3:.0f} ms {target}" + (f" and at {nominal}" if nominal else "") + ".")
    lowered = (f" (lowered from the plan's {plan.max_num_batched_tokens:,} so that every command below takes it)"
               if budget != plan.max_num_batched_tokens else "")
    return (f"max_num_batched_tokens {budget:,}{lowered}: a decode step of {min(plan.max_num_seqs, budget)} decodes "
            f"carrying a full chunk takes {c.chunk_step_s * 1e3:.0f} ms {target}, where the largest budget that fits "
            f"is {c.budget_for_tpot:,}" + (f" ({up.budget_for_tpot:,} at {nominal})" if nominal else "")
            + ". No replica count rescues a budget over it.")


def target_for(plan: PlanCandidate, shape_label: str, refs: tuple[str, str], slo: SloSeconds,
               catalog: dict) -> EmitTarget:
    """What the file needs beside the plan: `refs` from `model_refs`, the price the plan was costed at."""
    from hbmserve.capacity.planning.emit_config import EmitTarget, model_name

    return EmitTarget(model_name(shape_label), refs[1], refs[0], slo, catalog[plan.gpu].usd_per_gpu_hour)


def plan_command(model: str, trace: Optional[Path], rate: Optional[float], slo: SloSeconds, gpus: Optional[str],
                 path: Path) -> str:
    """The `hbmserve plan` line a header quotes: the options that decide the plan."""
    load = ["--trace", str(trace)] if trace is not None else ["--rate", f"{rate:g}"]
    words = ["hbmserve", "plan", "--model", model, *load, "--slo-ttft-p95", f"{slo.ttft_s:g}", "--slo-tpot-p95",
             f"{slo.tpot_s:g}", *(["--gpus", gpus] if gpus else []), "--emit-config", str(path)]
    return shlex.join(words)


def config_sections(plan: PlanCandidate) -> str:
    """The plan's `parallelism`, `engine_settings` and `autoscaling` sections, one line each, as
    `plan` prints them under its table (the whole file is `--emit-config`'s)."""
    from hbmserve.capacity.planning.planner import AUTOSCALING_KEYS

    def yaml(v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    section = plan.autoscaling().model_dump(include=AUTOSCALING_KEYS)
    return (f"  parallelism: {{tp: {plan.tp}, pp: {plan.pp}}}\n"
            "  engine_settings: {" + ", ".join(f"{k}: {yaml(v)}" for k, v in plan.engine_settings().items())
            + "}\n  autoscaling: {" + ", ".join(f"{k}: {v:g}" for k, v in section.items()) + "}")
