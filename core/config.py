"""The cluster config file (`ClusterSpec`), validated with pydantic at the edge.

A user error here must read like an error message, not a traceback: `load_cluster_spec`
raises `ConfigError` whose text names each bad field by its dotted path and says what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

import os
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from hbmserve.core.autoscaling_spec import AutoscalingSpec, with_prior_read
from hbmserve.core.cache_spec import WeightCacheSpec
from hbmserve.core.adapters import AdapterSpec, LoraSlots, adapter_problems
from hbmserve.core.disagg_spec import DisaggregationSpec, Parallelism, RayResources, Role, disaggregation_problems
from hbmserve.core.engine_settings import EngineKind, EngineSettings, Strict as _Strict
from hbmserve.core.serve_spec import ServeSpec

DEFAULT_CONFIG_NAME = "default_cluster.yaml"


class ConfigError(ValueError):
    """A config file that cannot be used; the message is meant for the user as-is."""


class SLO(_Strict):
    ttft_p95_ms: Annotated[float, Field(gt=0)] = 2000.0
    tpot_p95_ms: Annotated[float, Field(gt=0)] = 100.0

    def seconds(self) -> SloSeconds:
        return SloSeconds(self.ttft_p95_ms / 1e3, self.tpot_p95_ms / 1e3)


@dataclass(frozen=True)
class SloSeconds:
    """The SLO inside the simulator, the planner and the benchmarks: p95 targets in seconds.
    `SLO` is the config file's form (milliseconds, validated); `SLO.seconds()` converts."""

    ttft_s: float = 2.0
    tpot_s: float = 0.1


class Hardware(_Strict):
    gpu: str = "cpu-local"
    # None means the catalog's default price for `gpu`.
    usd_per_gpu_hour: Annotated[float, Field(ge=0)] | None = None


class SimEngineSpec(_Strict):
    """What the simulated engine pretends to be (used when `engine: sim`)."""

    gpu: str = "h100-sxm"
    model_config_name: str = "llama-3.1-8b"
    speedup: Annotated[float, Field(gt=0)] = 1.0
    startup_s: Annotated[float, Field(ge=0)] = 0.0
    # Hold tp x pp (fake) GPUs as a real engine would, so GPU placement can be exercised on
    # machines without GPUs (Ray nodes started with a fake `num_gpus`).
    reserve_gpus: bool = False
    # Resolve `source` through the node's weight cache before the simulated load, as a real
    # engine does (the bytes are made local, not read): exercises the cache and the warm tier
    # without GPUs. Off: `source` is a label and is never read.
    cache_weights: bool = False
    # The link a prompt's KV crosses to this replica when a prefill replica computed it
    # (capacity/perf/perf_model.KV_LINKS): set from disaggregation.connector.link.
    kv_link: Literal["nvlink", "infiniband", "host"] = "nvlink"


class ModelSpec(_Strict):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9._:/-]+$")]
    # A local directory, or a hub id (GPU clusters only: this project never downloads in tests).
    source: Annotated[str, Field(min_length=1)]
    engine: EngineKind = EngineKind.VLLM_CPU
    engine_settings: EngineSettings = EngineSettings()
    parallelism: Parallelism = Parallelism()
    replicas: Annotated[int, Field(ge=0)] = 1
    # At most this many replicas on one node (Serve's max_replicas_per_node): 1 spreads them, so
    # a lost node takes one replica, not all. Unset: Serve decides.
    max_replicas_per_node: Annotated[int, Field(ge=1)] | None = None
    # Ray custom resources each replica asks for: pins the model to the nodes that offer them (a
    # Helm chart's workerGroups[].rayResources), e.g. a disaggregated model's pools to their groups.
    ray_resources: RayResources = Field(default_factory=dict)
    autoscaling: AutoscalingSpec | None = None
    slo: SLO = SLO()
    hardware: Hardware = Hardware()
    sim: SimEngineSpec = SimEngineSpec()
    # LoRA fine-tunes served under their own names on this model's replicas (core/adapters.py).
    adapters: list[AdapterSpec] = []
    lora: LoraSlots = LoraSlots()
    # Prefill and decode on separate pools with the KV moved between them (core/disagg_spec.py).
    disaggregation: DisaggregationSpec | None = None

    @property
    def replica_ceiling(self) -> int:
        """The most replicas it runs at once: `replicas`, or `autoscaling.max_replicas`. The
        placement planner places this many up front (deployments/apps/placed_app.py)."""
        return self.replicas if self.autoscaling is None else self.autoscaling.max_replicas

    def pool(self, role: Role) -> ModelSpec:
        """A disaggregated model's pool as an aggregated model of its own: the pool's replicas,
        scaling, parallelism and engine settings, and the connector in vLLM's arguments. Every
        builder (Serve options, the replica, its engine) takes it as it takes any model."""
        assert self.disaggregation is not None, "only a disaggregated model has pools"
        p = self.disaggregation.of(role)
        settings = p.engine_settings or self.engine_settings
        kv = self.disaggregation.connector.vllm_config()
        if kv is not None:
            settings = settings.model_copy(update={"vllm_args": {**settings.vllm_args, "kv_transfer_config": kv}})
        sim = self.sim.model_copy(update={"kv_link": self.disaggregation.connector.link or self.sim.kv_link})
        return self.model_copy(update={"replicas": p.replicas, "autoscaling": p.autoscaling, "parallelism": p.parallelism,
                                       "max_replicas_per_node": p.max_replicas_per_node, "engine_settings": settings,
                                       "ray_resources": p.ray_resources, "sim": sim, "disaggregation": None})

    def serving(self) -> ModelSpec:
        """What the replicas that stream the replies run as: the model, or its decode pool. The
        door's admission counts their sequences."""
        return self if self.disaggregation is None else self.pool(Role.DECODE)

    @property
    def standbys_sleep(self) -> bool:
        """Its hot standbys sleep (vLLM sleep mode, or the simulated engine's model of it;
        deployments/replica/standby_sleep.py); refused below for vLLM-CPU, which has no sleep mode."""
        return self.autoscaling is not None and self.autoscaling.hot_standby.sleep

    @property
    def needs_gpus(self) -> bool:
        return self.engine is EngineKind.VLLM_GPU or (self.engine is EngineKind.SIM and self.sim.reserve_gpus)

    @property
    def reads_weights(self) -> bool:
        """Its replicas make `source` local through the node's weight cache before starting."""
        return self.engine is not EngineKind.SIM or self.sim.cache_weights

    @model_validator(mode="after")
    def _cpu_has_no_model_parallelism(self) -> ModelSpec:
        if self.engine is EngineKind.VLLM_CPU and self.parallelism.pp > 1:
            raise ValueError("parallelism.pp > 1 needs engine vllm-gpu (vLLM's CPU platform has no Ray executor)")
        return self

    @model_validator(mode="after")
    def _sleep_needs_sleep_mode(self) -> ModelSpec:
        if self.engine is EngineKind.VLLM_CPU and self.standbys_sleep:
            raise ValueError("autoscaling.hot_standby.sleep needs engine vllm-gpu (or sim): vLLM-CPU has "
                             "no sleep mode; remove it and the standbys stay loaded")
        return self

    @model_validator(mode="after")
    def _adapters_fit_their_slots(self) -> ModelSpec:
        problems = adapter_problems(self.adapters, self.lora, self.engine_settings.vllm_args)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _pools_can_work(self) -> ModelSpec:
        problems = disaggregation_problems(self)
        if not problems and self.disaggregation is not None:
            for role in Role:  # each pool must be a model that could be served on its own
                try:
                    ModelSpec.model_validate(self.pool(role).model_dump())
                except ValidationError as err:
                    problems += [f"disaggregation.{role.value}: {e['msg'].removeprefix('Value error, ')}"
                                 for e in err.errors()]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _sim_runs_no_vllm(self) -> ModelSpec:
        # Refused rather than ignored: the simulated engine cannot honour them (a LoRA adapter
        # or a tool parser would simply be missing), and a config that deploys must mean what it says.
        if self.engine is EngineKind.SIM and self.engine_settings.vllm_args:
            raise ValueError(f"engine_settings.vllm_args ({', '.join(self.engine_settings.vllm_args)}) needs "
                             "engine vllm-cpu or vllm-gpu: the simulated engine runs no vLLM; remove them")
        return self


class ClusterSpec(_Strict):
    name: Annotated[str, Field(min_length=1)] = "hbmserve"
    serve: ServeSpec = ServeSpec()
    # A cluster file (placement/cluster_file.py format). When set, every model that needs GPUs
    # gets its replicas placed by the placement planner (deployments/apps/placed_app.py); an
    # autoscaled one gets autoscaling.max_replicas of them planned up front.
    topology: str | None = None
    # The node-local weight cache every replica resolves its model through (hbmserve/weights).
    cache: WeightCacheSpec = WeightCacheSpec()
    models: Annotated[list[ModelSpec], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique_names(self) -> ClusterSpec:
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model names must be unique; repeated: {', '.join(dupes)}")
        # An adapter is called by its name through the same endpoint: one name, one thing.
        taken = set(names)
        for i, m in enumerate(self.models):
            for j, a in enumerate(m.adapters):
                if a.name in taken:
                    raise ValueError(f"models.{i}.adapters.{j}.name: {a.name!r} is already the name of a model or "
                                     "of another model's adapter; each must be unique in the cluster")
                taken.add(a.name)
                if a.tenants is not None and self.serve.auth is None:
                    raise ValueError(f"models.{i}.adapters.{j}.tenants: an access list needs serve.auth (API keys "
                                     "name the tenant); set serve.auth or remove the list")
        for i, m in enumerate(self.models):
            if m.ray_resources and self.plans_placement(m):
                raise ValueError(f"models.{i}.ray_resources: the placement planner places this model's replicas "
                                 "(topology); ray_resources pins models Serve places")
            if m.disaggregation is not None and self.plans_placement(m.pool(Role.PREFILL)):
                raise ValueError(f"models.{i}.disaggregation: the placement planner does not place a disaggregated "
                                 "model's pools yet; without `topology` Serve places them (per pool: "
                                 "max_replicas_per_node)")
        return self

    def model(self, name: str) -> ModelSpec | None:
        return next((m for m in self.models if m.name == name), None)

    def served(self, name: str) -> tuple[ModelSpec, AdapterSpec | None] | None:
        """What a request's `model` names: a model, or one of its adapters (served on the
        model's replicas, which apply it by that name); None when nothing has that name."""
        for m in self.models:
            if m.name == name:
                return m, None
            adapter = next((a for a in m.adapters if a.name == name), None)
            if adapter is not None:
                return m, adapter
        return None

    def plans_placement(self, model: ModelSpec) -> bool:
        """Whether `model`'s replicas are placed by the planner rather than by Serve alone."""
        return self.topology is not None and model.needs_gpus


def _format_errors(source: str, err: ValidationError) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        # A bad mapping key is reported at (..., key, "[key]"); the key itself names the field.
        path = ".".join(str(p) for p in e["loc"] if p != "[key]") or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        lines.append(f"  {path}: {msg}")
    return "\n".join(lines)


def parse_cluster_spec(data: object, source: str = "<data>") -> ClusterSpec:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {source}: the top level must be a mapping with a 'models' list")
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(source, err)) from None
    return spec


def load_cluster_spec(path: str | os.PathLike[str] | None = None) -> ClusterSpec:
    """Load a YAML config; None loads the embedded default (the tiny model on vLLM-CPU).

    Relative `source` paths are resolved against the config file's folder, so a config keeps
    working when run from elsewhere (for instance by `ray job submit`).
    """
    if path is None:
        text = resources.files("hbmserve.core").joinpath(DEFAULT_CONFIG_NAME).read_text()
        base = Path.cwd()
        source = f"(embedded {DEFAULT_CONFIG_NAME})"
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        text, base, source = p.read_text(), p.resolve().parent, str(p)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid config {source}: not valid YAML ({err})") from None
    spec = parse_cluster_spec(data, source)
    return _resolve_auth(_resolve_topology(_resolve_sources(spec, base, source), base, source), base)


def _absolute(path: str, base: Path) -> Path:
    p = Path(os.path.expanduser(path))
    return p if p.is_absolute() else (base / p).resolve()


def _resolve_sources(spec: ClusterSpec, base: Path, source: str) -> ClusterSpec:
    models = []
    for i, m in enumerate(spec.models):
        if m.autoscaling is not None and isinstance(m.autoscaling.prior, str):
            try:
                a = with_prior_read(m.autoscaling, base, f"models[{i}].autoscaling.prior")
            except ValueError as err:
                raise ConfigError(f"invalid config {source}: {err}") from None
            m = m.model_copy(update={"autoscaling": a})
        if m.source.startswith((".", "/", "~")):
            m = m.model_copy(update={"source": str(_absolute(m.source, base))})
        kv = m.disaggregation.connector if m.disaggregation is not None else None
        if kv is not None and kv.path is not None:  # the shared-storage folder, as a source
            kv = kv.model_copy(update={"path": str(_absolute(kv.path, base))})
            m = m.model_copy(update={"disaggregation": m.disaggregation.model_copy(update={"connector": kv})})
        models.append(m)
    return spec.model_copy(update={"models": models})


def _resolve_topology(spec: ClusterSpec, base: Path, source: str) -> ClusterSpec:
    """Make `topology` absolute (like model sources) and check that the file exists now, not at
    deploy. Its contents are checked by `hbmserve.cluster.checks.load_deployable` (the cluster file
    format belongs to placement, above this layer)."""
    if spec.topology is None:
        return spec
    path = _absolute(spec.topology, base)
    if not path.is_file():
        raise ConfigError(f"invalid config {source}:\n  topology: no cluster file at {path}")
    return spec.model_copy(update={"topology": str(path)})


def _resolve_auth(spec: ClusterSpec, base: Path) -> ClusterSpec:
    """Make the auth files absolute, as `topology`. Their existence is not checked here: they are
    read where the ingress runs (a Secret mounted there), which may not be this machine."""
    auth = spec.serve.auth
    if auth is None:
        return spec
    admin = auth.admin_token_file
    auth = auth.model_copy(update={"keys_file": str(_absolute(auth.keys_file, base)),
                                   "admin_token_file": None if admin is None else str(_absolute(admin, base))})
    return spec.model_copy(update={"serve": spec.serve.model_copy(update={"auth": auth})})
