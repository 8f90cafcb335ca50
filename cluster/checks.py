"""The config as `hbmserve up` and `hbmserve deploy` accept it: the schema (hbmserve.core.config)
plus the checks that need a layer above it, done before anything starts so that a bad file is
one error naming its field, not a replica that fails a minute later."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hbmserve.core.config import ClusterSpec, ConfigError, ModelSpec, load_cluster_spec
from hbmserve.core.engine_settings import EngineKind
from hbmserve.placement.cluster_file import TopologyFileError, load_cluster_file

if TYPE_CHECKING:  # the capacity model imports numpy; `hbmserve --help` stays fast without it
    from hbmserve.capacity.perf.slo_cap import SloCheck

_VLLM_ENGINES = (EngineKind.VLLM_CPU, EngineKind.VLLM_GPU)


def load_deployable(path: str | os.PathLike[str] | None = None) -> ClusterSpec:
    """`load_cluster_spec`, then the topology file's contents and each vLLM model's argument
    list as vLLM's own parser reads it; raises ConfigError naming every bad field."""
    spec = load_cluster_spec(path)
    source = str(path) if path is not None else "(embedded default)"
    problems = _topology_problems(spec) + vllm_problems(spec)
    if problems:
        raise ConfigError("\n  ".join([f"invalid config {source}:", *problems]))
    return spec


@dataclass(frozen=True)
class SloFindings:
    """What `up` and `deploy` find in the models' engine settings against their SLOs
    (capacity/perf/slo_cap.py), judged at a nominal request: the check knows no traffic
    (capacity/perf/scenario.py `nominal_workload`)."""

    # One per model whose decode step carrying a full chunk breaks its TPOT target: no replica
    # count rescues that, so the commands refuse it unless --allow-slo-miss.
    refusals: tuple[str, ...]
    # One per model that cannot meet its SLO at any replica count, or holds it only while few
    # steps carry a full chunk, with the setting to change: printed, never refused.
    warnings: tuple[str, ...]


def deploy_slo_check(m: ModelSpec) -> SloCheck | None:
    """`m`'s engine settings against its SLO at the nominal request, as `up` and `deploy` judge
    them; None for a model the capacity model cannot cost (unknown GPU or shape, weights that
    do not fit): the engine judges those."""
    from hbmserve.capacity.perf.hardware import load_catalog
    from hbmserve.capacity.perf.scenario import nominal_workload, scenario_for, scenario_slo_check

    if not _shape_known(m):
        return None
    try:
        sc = scenario_for(m, load_catalog())
    except (ValueError, OSError):  # ScenarioError, CatalogError, ModelConfigError
        return None
    return scenario_slo_check(sc, nominal_workload(sc))


def slo_findings(spec: ClusterSpec) -> SloFindings:
    """Each model judged by `deploy_slo_check`; the refusal names the model by name, as `simulate`
    and `autoscale evaluate` do; the warnings keep the index they always had."""
    refusals, warnings = [], []
    for i, m in enumerate(spec.models):
        check = deploy_slo_check(m)
        if check is None:
            continue
        refusal = check.budget_refusal(f"models.{m.name}.engine_settings.max_num_batched_tokens",
                                       _nominal_lengths(check))
        if refusal:
            refusals.append(refusal)
        if check.blocker:
            warnings.append(f"models.{i}.engine_settings: {m.name} cannot meet its SLO at any replica count: "
                            f"{check.blocker}")
        elif check.advice:
            warnings.append(f"models.{i}.engine_settings.max_num_batched_tokens: {check.advice}")
    return SloFindings(tuple(refusals), tuple(warnings))


def _nominal_lengths(check: SloCheck) -> str:
    """What `deploy_slo_check` judged, in the words of a refusal."""
    return (f"a nominal {check.prompt_mean:,.0f}-token prompt and {check.output_mean:,.0f}-token output (no "
            "trace here)")


def _shape_known(m: ModelSpec) -> bool:
    """The capacity model costs the model's own shape: its config.json is on disk, or the file
    names the shape to simulate (`sim`); otherwise it would judge a default stand-in."""
    if m.engine is EngineKind.SIM or "sim" in m.model_fields_set:
        return True
    return (Path(m.source).expanduser() / "config.json").is_file()


def _topology_problems(spec: ClusterSpec) -> list[str]:
    """The topology file, then every planned model's replicas (an autoscaled one's at its
    ceiling, `autoscaling.max_replicas`) placed on it as `deploy` will place them."""
    if spec.topology is None:
        return []
    try:
        topology = load_cluster_file(spec.topology)
    except TopologyFileError as err:
        return [f"topology: {err}"]
    from hbmserve.deployments.apps.placed_app import infeasible_message, plan_models, replica_count_field

    plans = plan_models(spec, topology)
    return [f"models.{i}.{replica_count_field(m)}: {infeasible_message(m, plans[m.name])}"
            for i, m in enumerate(spec.models) if m.name in plans and not plans[m.name].feasible]


def vllm_problems(spec: ClusterSpec) -> list[str]:
    """For each model on a vLLM engine, the argv its replicas will build (hbmserve's arguments
    plus `engine_settings.vllm_args`), put through vLLM's own parser and start-up checks, one
    line per problem naming the field. Needs vLLM where this runs; models on the simulated
    engine need nothing (the schema already refuses vllm_args there)."""
    models = [(i, m) for i, m in enumerate(spec.models) if m.engine in _VLLM_ENGINES]
    if not models:
        return []
    from hbmserve.deployments.replica.engine_args import vllm_launch
    from hbmserve.deployments.replica.vllm_argv import launch_problems, serve_parser

    try:
        parser = serve_parser()
    except ModuleNotFoundError as err:
        if err.name != "vllm":  # a broken vLLM install is not a config error
            raise
        return [f"models.{i}.engine: {m.engine.value} is checked with vLLM's own argument parser before any "
                f"replica starts, and vLLM is not installed here (install hbmserve[cpu] or hbmserve[gpu] where "
                f"`hbmserve up`/`hbmserve deploy` runs)" for i, m in models]
    problems = []
    for i, m in models:
        # Host and port do not change what vLLM accepts; the replica fills in its own.
        for err in launch_problems(parser, vllm_launch(m, spec.serve.http.host, spec.serve.http.port)):
            if err.key is not None:
                field = f"models.{i}.engine_settings.vllm_args.{err.key}"
            elif m.engine_settings.vllm_args:
                field = f"models.{i}.engine_settings.vllm_args"
            else:
                field = f"models.{i}"
            problems.append(f"{field}: {_indented(str(err))}")
    return problems


def _indented(text: str) -> str:
    # vLLM's messages can span lines (pydantic's, for a JSON argument); keep them under the field,
    # without pydantic's link to its own docs.
    lines = [line for line in text.splitlines() if line.strip() and "errors.pydantic.dev" not in line]
    return "\n      ".join(lines)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) is reachable only from this machine."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def exposure(spec: ClusterSpec, ray_auth: bool) -> list[str]:
    """What an unauthenticated client could reach with this config: one line each; empty when
    nothing. `up` and `deploy` refuse a non-empty list unless run with --insecure, and print it."""
    http = spec.serve.http
    lines = []
    if spec.serve.auth is None and not is_loopback(http.host):
        lines.append(f"the front door on {http.host}:{http.port} answers anyone without a key, every path "
                     "included: the models, /metrics and the admin paths /hbm/* (set serve.auth, or "
                     "serve.http.host: 127.0.0.1)")
    if not ray_auth:
        lines.append("the local Ray head runs without token authentication: anyone who reaches its ports "
                     "(GCS 6379, the dashboard, the raylet) can run code on this machine")
    return lines
