"""The `serve:` section of the cluster config: the front door's listener and its hardening, auth,
routing, migration and rollouts (validated with the rest in core/config.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, IPvAnyNetwork, model_validator
from pydantic_core import PydanticCustomError

from hbmserve.core.engine_settings import Strict as _Strict


class HttpSpec(_Strict):
    """The front door: every model on one port, on every node (deployments/ingress/front_door.py)."""

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    # Connection hardening: a client must send its headers, then its body, within these; slow
    # or idle clients never hold an admission slot (admission starts once the body is in).
    header_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    body_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    max_body_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024  # past it: 413
    keep_alive_s: Annotated[int, Field(ge=1)] = 5  # idle keep-alive connections are closed after it
    # Requests one front door handles at once (probes apart); past it: 429 + Retry-After. Idle
    # and silent sockets are not requests and do not count (deployments/wire/hardened_http.py).
    max_in_flight: Annotated[int, Field(ge=16)] = 1024
    # Sockets one client address may hold open on a front door; past it: 429 and close.
    max_connections_per_client: Annotated[int, Field(ge=1)] = 64
    # Load balancers or proxies (addresses or CIDR networks) that carry many clients' sockets:
    # the per-client cap skips them (tenant limits still apply per key).
    trusted_proxies: list[IPvAnyNetwork] = Field(default_factory=list)
    # A replica that accepted a request but sent no byte within this is answered 504.
    first_byte_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    # Header floods: past either cap the request is answered 431 and its connection closed
    # (deployments/wire/hardened_http.py; replicas use the defaults).
    max_header_bytes: Annotated[int, Field(ge=4096)] = 64 * 1024
    max_headers: Annotated[int, Field(ge=16)] = 100
    # A connection that sends no byte at all within this is closed (silent sockets).
    idle_connection_s: Annotated[float, Field(gt=0)] = 2.0

    @model_validator(mode="before")
    @classmethod
    def _no_socket_cap(cls, data):
        if isinstance(data, dict) and "max_connections" in data:
            raise ValueError("max_connections is gone: it counted silent sockets, which then starved /health. "
                             "Use max_in_flight (requests at once) and max_connections_per_client")
        return data


class AuthSpec(_Strict):
    """Where the ingress reads API keys; files (a mounted Kubernetes Secret, say), so keys never
    depend on the environment of whoever ran `ray start`. Formats: hbmserve.access.keys."""

    # YAML: tenants: [{name, keys: [...], priority, requests_per_minute, tokens_per_minute}]
    keys_file: Annotated[str, Field(min_length=1)]
    # One line: the token for ops and admin paths (/metrics, /hbm/*, ...); unset = those are refused.
    admin_token_file: Annotated[str, Field(min_length=1)] | None = None


class RolloutSpec(_Strict):
    """How `hbmserve deploy` rolls a model whose section changed (autoscale/rollout.py)."""

    # Replicas a rollout may run beyond the model's fleet. 0: no GPU beyond the fleet's, so an
    # old replica drains before each new one starts (a lone replica leaves a gap).
    max_surge: Annotated[int, Field(ge=0, le=64)] = 0
    # A new replica not serving this long after it was asked for rolls the model back.
    ready_timeout_s: Annotated[float, Field(gt=0, le=7200)] = 900.0


class ServeSpec(_Strict):
    http: HttpSpec = HttpSpec()
    # Unset: no auth, every path open. Set: every path but /health needs a key (fails closed).
    auth: AuthSpec | None = None
    # How the front doors pick a replica (routing/routers.py ROUTERS). `choose` is the product;
    # the others exist to measure it against (ops/bench/prefix_routing_live.py).
    router: Literal["choose", "round-robin", "power-of-two", "least-loaded", "choose-adapter-blind"] = "choose"
    # How many times one stream may move to another replica when its replica dies mid-stream
    # (deployments/ingress/migration.py); 0: a broken stream ends with an SSE error event.
    migration_limit: Annotated[int, Field(ge=0, le=10)] = 3
    rollout: RolloutSpec = RolloutSpec()
    # Ray dashboard port for `hbmserve up`.
    dashboard_port: Annotated[int, Field(ge=1, le=65535)] = 8265
    # Where the head `hbmserve up` starts listens. Loopback (the default): every Ray port on
    # 127.0.0.1, one machine. Another address lets other machines join with
    # `ray start --address`; Ray's token authentication guards it either way.
    head_host: Annotated[str, Field(min_length=1)] = "127.0.0.1"

    @model_validator(mode="before")
    @classmethod
    def _no_api_key_env(cls, data: Any) -> Any:
        if isinstance(data, dict) and "api_key_env" in data:
            raise PydanticCustomError("removed_field", "api_key_env was removed: keys no longer come from "
                                      "an environment variable. Put them in a keys file and name it in "
                                      "serve.auth.keys_file (see hbmserve.access.keys for the format)")
        return data
