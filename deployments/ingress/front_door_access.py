"""The front door's adapter to the access brain (access/): loads the key files, authorizes each
request, and keeps each tenant's rate-limit buckets.

Fails closed: a config with `serve.auth` whose files cannot be read or parsed raises
`AccessConfigError` in the front door's constructor, so the deployment fails and `hbmserve
deploy` says why; there is no fallback to "no auth". Errors name the config field and the file,
never a key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from hbmserve.access.authorize import Denied, authorize
from hbmserve.access.keys import KeyRing, KeysFileError, Tenant, parse_admin_token, parse_keys_file
from hbmserve.access.limits import Allowed, Limited, TenantLimits
from hbmserve.core.adapters import AdapterSpec
from hbmserve.core.serve_spec import AuthSpec


log = logging.getLogger("hbmserve.frontdoor")


class AccessConfigError(RuntimeError):
    """serve.auth names files this process cannot use; the message says which and why."""


@dataclass(frozen=True)
class Refusal:
    """A request answered with an OpenAI-style error instead of being served."""

    status: int
    message: str
    err_type: str
    code: str
    retry_after_s: int | None = None


@dataclass(frozen=True)
class Credential:
    tenant: Tenant | None  # None with auth off, or on an admin path


def _read(field: str, path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as err:
        raise AccessConfigError(f"serve.auth.{field}: cannot read {path} ({err.strerror or err}); the front "
                                "door refuses to start without its keys") from None


def _ring(auth: AuthSpec, keys_text: str, token_text: str | None) -> KeyRing:
    try:
        ring = parse_keys_file(keys_text, auth.keys_file)
        if token_text is not None:
            ring = KeyRing(tenants=ring.tenants, keys=ring.keys,
                           admin_digest=parse_admin_token(token_text, auth.admin_token_file))
    except KeysFileError as err:
        raise AccessConfigError(f"serve.auth: {err}") from None
    return ring


def _texts(auth: AuthSpec) -> tuple[str, str | None]:
    token = _read("admin_token_file", auth.admin_token_file) if auth.admin_token_file is not None else None
    return _read("keys_file", auth.keys_file), token


def load_key_ring(auth: AuthSpec | None) -> KeyRing | None:
    """The configured key ring, or None when the config has no `serve.auth` (auth off)."""
    return None if auth is None else _ring(auth, *_texts(auth))


class KeyFiles:
    """serve.auth's files, re-read by the front door every RELOAD_S: a Kubernetes Secret update
    (or an edited file) takes effect without a restart, so a revoked key is refused within
    seconds. A file that changed into something unusable is reported once (AccessConfigError)
    and the ring in use stays: a typo in a Secret must not open the door or lock every tenant out."""

    RELOAD_S = 2.0

    def __init__(self, auth: AuthSpec):
        self.auth = auth
        self._seen = _texts(auth)

    def ring(self) -> KeyRing:
        return _ring(self.auth, *self._seen)

    def changed(self) -> KeyRing | None:
        """The new ring when a file's contents changed since the last call, else None."""
        texts = _texts(self.auth)
        if texts == self._seen:
            return None
        self._seen = texts
        return _ring(self.auth, *texts)


class AccessGuard:
    def __init__(self, ring: KeyRing | None, clock=time.monotonic):
        self.ring = ring
        self._limits: dict[str, TenantLimits] = {}
        self._adapter_limits: dict[str, TenantLimits] = {}  # by adapter: its own buckets, all tenants
        self._clock = clock

    @property
    def enforced(self) -> bool:
        return self.ring is not None

    def use(self, ring: KeyRing) -> None:
        """Serve with a reloaded ring: a tenant keeps its buckets, under its new limits."""
        tenants = {t.name: t for t in ring.tenants}
        self._limits = {name: limits.under(tenants[name]) for name, limits in self._limits.items() if name in tenants}
        self.ring = ring

    def check(self, path: str, headers: list[tuple[bytes, bytes]]) -> Credential | Refusal:
        authorization = next((v for k, v in headers if k == b"authorization"), None)
        decision = authorize(self.ring, path, authorization)
        if isinstance(decision, Denied):
            return Refusal(decision.status, decision.reason, decision.err_type, decision.code)
        return Credential(decision.tenant)

    def charge(self, credential: Credential, tokens: int, doors: int = 1,
               adapter: AdapterSpec | None = None) -> Refusal | None:
        """Draw one request and the most `tokens` it may use from the tenant's buckets (this door's
        share of `doors`), then from the adapter's it names, or refuse: 403 when the adapter's
        access list leaves the tenant out, 429 with Retry-After when the tenant or the adapter is
        over its rate, 400 when the request alone exceeds a minute's allowance (no wait would help).
        The tenant's buckets come first: a tenant over its own limit spends nothing of the adapter's."""
        tenant = credential.tenant
        if adapter is not None and adapter.tenants is not None and (tenant is None or tenant.name not in adapter.tenants):
            who = f"tenant {tenant.name}" if tenant is not None else "this key"
            return Refusal(403, f"{who} may not use adapter {adapter.name}", "permission_error", "model_not_allowed")
        if tenant is not None and (tenant.requests_per_minute is not None or tenant.tokens_per_minute is not None):
            limits = self._limits.get(tenant.name) or TenantLimits.of(tenant)
            decision, self._limits[tenant.name] = limits.take(tokens, self._clock(), max(1, doors))
            if not isinstance(decision, Allowed):
                return _refusal(decision)
        if adapter is not None and (adapter.requests_per_minute is not None or adapter.tokens_per_minute is not None):
            limits = self._adapter_limits.get(adapter.name) or TenantLimits(adapter.requests_per_minute,
                                                                             adapter.tokens_per_minute)
            decision, self._adapter_limits[adapter.name] = limits.take(tokens, self._clock(), max(1, doors))
            if not isinstance(decision, Allowed):
                return _refusal(decision, f"adapter {adapter.name}: ")
        return None

    def settle(self, credential: Credential, charged: int, used: int, doors: int = 1,
               adapter: AdapterSpec | None = None) -> None:
        """Give back what an admitted request was charged beyond what it `used` (or take the overrun)."""
        if charged == used:
            return
        tenant = credential.tenant
        for name, buckets in ((tenant.name if tenant else None, self._limits),
                              (adapter.name if adapter else None, self._adapter_limits)):
            if name in buckets:
                buckets[name] = buckets[name].settle(charged, used, self._clock(), max(1, doors))


def _refusal(decision, prefix: str = "") -> Refusal:
    if isinstance(decision, Limited):
        return Refusal(429, prefix + decision.reason, "rate_limit_error", "rate_limit_exceeded",
                       decision.retry_after_s)
    return Refusal(400, prefix + decision.reason, "invalid_request_error", "request_too_large")


async def reload_keys(keys: KeyFiles, guard: AccessGuard) -> None:
    """One step of the front door's reload loop (every KeyFiles.RELOAD_S)."""
    try:
        ring = await asyncio.to_thread(keys.changed)
    except AccessConfigError as err:
        log.error("%s; still serving with the keys loaded before", err)
        return
    if ring is not None:
        guard.use(ring)
        log.info("serve.auth reloaded: %r", ring)
