"""The PromQL of the Grafana dashboard (hbmserve.json beside this file), as a test runs it.

A dashboard whose queries name a metric that does not exist, or that parse but return nothing,
shows empty panels that nobody notices until the day they are needed. So the dashboard's
queries are data a test can walk: every panel's targets with the dashboard variables
substituted as Grafana would, which a unit test parses with promtool and checks against the
README's metric list, and the live metrics test runs against a real Prometheus scraping a real
cluster, judging each answer with `answer_problem`.

Panels whose description starts with a mark read series that only some clusters have: GPU_ONLY,
GPU nodes (NVML gauges, the placement check of planned GPU replicas); KV_EVENTS_ONLY, models
whose engines publish KV events (the doors' KV index); ADAPTERS_ONLY, models that declare LoRA
adapters; DISAGG_ONLY, models served as prefill and decode pools. A cluster without them legitimately has
no data there, and the live test skips exactly those panels when the series are absent, saying
so.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).with_name("hbmserve.json")
GPU_ONLY = "GPU nodes only:"
KV_EVENTS_ONLY = "KV events only:"
ADAPTERS_ONLY = "LoRA adapters only:"
DISAGG_ONLY = "Disaggregated models only:"
MARKS = (GPU_ONLY, KV_EVENTS_ONLY, ADAPTERS_ONLY, DISAGG_ONLY)

# $name, ${name} and ${name:format} (Grafana's variable syntax; [[name]] is deprecated and unused).
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<metric>.+),\s*)?(?P<label>\w+)\)$")
# A series name of hbmserve's, as Ray (ray_ prefix) or a histogram (_bucket/_sum/_count) spells it.
_SERIES = re.compile(r"\b((?:ray_)?hbmserve_\w+?)(?:_bucket|_sum|_count)?\b(?![\w(])")


class UnknownVariable(ValueError):
    """An expression names a variable the caller gave no value for."""


@dataclass(frozen=True)
class PanelQuery:
    panel: str  # the panel's title (a variable query: "variable <name>")
    ref_id: str
    expr: str  # variables substituted
    only: str | None  # the panel's mark (MARKS): its series may be absent; None: every cluster has them


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel but rows, including those inside collapsed rows (Grafana nests them there)."""
    for p in dashboard.get("panels", []):
        if p.get("type") == "row":
            yield from p.get("panels", [])
        else:
            yield p


def substitute(expr: str, values: Mapping[str, str]) -> str:
    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise UnknownVariable(f"no value for ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(value, expr)


def mark_of(panel: Mapping[str, Any]) -> str | None:
    return next((m for m in MARKS if panel.get("description", "").startswith(m)), None)


def panel_queries(dashboard: Mapping[str, Any], values: Mapping[str, str]) -> list[PanelQuery]:
    """Each target of each panel, in dashboard order. `values`: every variable the expressions
    use, Grafana's own included (`__rate_interval`), as Grafana would substitute them."""
    return [PanelQuery(p["title"], t["refId"], substitute(t["expr"], values), mark_of(p))
            for p in panels(dashboard) for t in p.get("targets", [])]


def variable_queries(dashboard: Mapping[str, Any]) -> list[PanelQuery]:
    """Each `label_values(metric, label)` variable as the instant query with the same answer's
    label set (`group by (label) (metric)`), so a test can see it has values."""
    out = []
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = _LABEL_VALUES.match(query.strip())
        if m is None or m["metric"] is None:
            raise ValueError(f"variable {v['name']}: only label_values(metric, label) is supported, not {query!r}")
        out.append(PanelQuery(f"variable {v['name']}", "-", f"group by ({m['label']}) ({m['metric']})", None))
    return out


def metric_families(expr: str) -> set[str]:
    """The hbmserve families an expression reads, as Prometheus names them (with Ray's `ray_`
    prefix where they come through Ray's metrics port), a histogram's `_bucket`/`_sum`/`_count`
    suffix dropped: the names the README lists, `ray_` aside."""
    return set(_SERIES.findall(expr))


def answer_problem(answer: Mapping[str, Any]) -> str | None:
    """What is wrong with a Prometheus HTTP API answer to a panel's query (None: it has data).
    An error, no series, or only NaN (histogram_quantile over no observations) all draw an
    empty panel."""
    if answer.get("status") != "success":
        return f"error: {answer.get('errorType', '?')}: {answer.get('error', answer)}"
    result = answer["data"]["result"]
    if answer["data"]["resultType"] == "scalar":
        result = [{"value": result}]
    if not result:
        return "empty result"
    values = [float(v) for s in result for _, v in ([s["value"]] if "value" in s else s["values"])]
    if all(math.isnan(v) for v in values):
        return f"only NaN in {len(result)} series"
    return None
