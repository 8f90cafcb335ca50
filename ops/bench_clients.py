"""HTTP and SSE for `hbmserve bench`: one streamed completion a call, timed, its failure named.

hbmserve writes no HTTP or SSE code here; two maintained clients do that, and this module only
times and classifies what they return:

- **vLLM's benchmark request function** (`vllm/benchmarks/lib/endpoint_request_func.py`,
  `async_request_openai_completions`), the one `vllm bench serve` uses: TTFT and ITL then mean
  what they mean in vLLM's published numbers. Chosen first when vLLM is installed (the `cpu`
  and `gpu` extras). That file is self-contained by design (it imports aiohttp, regex and tqdm,
  no other vLLM module), so it is loaded from its path: importing the `vllm` package imports
  torch, about 10 s on a small machine, for nothing the request function uses. The function
  reports a failed HTTP status by its reason phrase only, so the status is read from aiohttp's
  request tracing, matched by the `x-request-id` header it sends. It skips an SSE error event
  without failing; the load generator's completeness check (loadgen.record_of) catches that.
  It also sends vLLM's sampling extras (`repetition_penalty`, `logprobs: null`), which a strict
  OpenAI-compatible server may refuse: use the SDK there.
- **The `openai` SDK's streaming client** (AsyncOpenAI, retries off so that a 429 is counted,
  not retried), when vLLM is not installed or with `--client openai`. Its typed exceptions give
  the error kind; an SSE error event raises.

`open_client` says which one it picked and why (`Client.note`), and the report repeats it.
"""

from __future__ import annotations

import importlib.util
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Protocol
from urllib.parse import urlsplit

CLIENTS = ("auto", "vllm", "openai")
_VLLM_FILE = Path("benchmarks", "lib", "endpoint_request_func.py")


class EndpointError(ValueError):
    """The endpoint cannot be benchmarked as given; the message is for the user as-is."""


@dataclass(frozen=True)
class Endpoint:
    api_url: str  # the completions URL: .../v1/completions
    model: str
    api_key: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold credentials too

    @property
    def base_url(self) -> str:
        return self.api_url.removesuffix("/completions")

    def auth_headers(self) -> dict[str, str]:
        key = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return key | dict(self.headers)


def completions_url(url: str) -> str:
    """`http://host:port`, `.../v1` or `.../v1/completions` -> the completions URL."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointError(f"--url {url!r}: expected http(s)://host[:port][/v1], e.g. http://127.0.0.1:8000")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise EndpointError(f"--url {url!r}: the port is not a number") from None
    path = parts.path.rstrip("/")
    if not path.endswith("/completions"):
        path = (path if path.endswith("/v1") else path + "/v1") + "/completions"
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass(frozen=True)
class Ask:
    index: int
    prompt: list[int] | str
    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool = True


@dataclass(frozen=True)
class Reply:
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: tuple[float, ...] = ()
    usage_tokens: int | None = None  # completion tokens the server reported, when it did
    error_kind: str | None = None
    error: str = ""

    @property
    def chunks(self) -> int:
        return 0 if self.ttft_s is None else len(self.itl_s) + 1


class Client(Protocol):
    name: str
    note: str  # why this client

    async def send(self, ask: Ask) -> Reply: ...

    async def aclose(self) -> None: ...


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- vLLM's request function -------------------------------------------------------------------

def load_vllm_request_func() -> ModuleType:
    """vLLM's endpoint_request_func module, from the installed vLLM, without importing `vllm`.
    ImportError (with the reason) when vLLM is absent or the file is not what this expects."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("vLLM is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / _VLLM_FILE
    if not path.is_file():
        raise ImportError(f"this vLLM has no {_VLLM_FILE}")
    name = "hbmserve_vllm_endpoint_request_func"
    if name in sys.modules:
        return sys.modules[name]
    mod_spec = importlib.util.spec_from_file_location(name, path)
    assert mod_spec is not None and mod_spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        mod_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        raise ImportError(f"{path}: {type(err).__name__}: {err}") from err
    if not all(hasattr(module, a) for a in ("async_request_openai_completions", "RequestFuncInput")):
        del sys.modules[name]
        raise ImportError(f"{path} has no async_request_openai_completions / RequestFuncInput")
    return module


class VllmClient:
    name = "vllm"

    def __init__(self, ep: Endpoint, funcs: ModuleType, note: str):
        import aiohttp

        self.ep, self.funcs, self.note = ep, funcs, note
        self.run = uuid.uuid4().hex[:12]
        self.status: dict[str, int] = {}
        self.failure: dict[str, BaseException] = {}
        trace = aiohttp.TraceConfig()
        trace.on_request_end.append(self._on_end)
        trace.on_request_exception.append(self._on_exception)
        # No timeout here (the load generator bounds each request) and no connection cap (an open
        # loop must not queue behind a connection pool).
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                             connector=aiohttp.TCPConnector(limit=0), trace_configs=[trace])

    async def _on_end(self, _session, _ctx, params) -> None:
        self.status[params.headers.get("x-request-id", "")] = params.response.status

    async def _on_exception(self, _session, _ctx, params) -> None:
        self.failure[params.headers.get("x-request-id", "")] = params.exception

    async def send(self, ask: Ask) -> Reply:
        rid = f"bench-{self.run}-{ask.index}"
        inp = self.funcs.RequestFuncInput(prompt=ask.prompt, api_url=self.ep.api_url, prompt_len=ask.prompt_tokens,
                                          output_len=ask.max_tokens, model=self.ep.model,
                                          extra_headers=self.ep.auth_headers(), ignore_eos=ask.ignore_eos,
                                          request_id=rid)
        try:
            out = await self.funcs.async_request_openai_completions(inp, self.session)
        finally:
            status, failure = self.status.pop(rid, None), self.failure.pop(rid, None)
        if out.success:
            return Reply(out.ttft, out.latency, tuple(out.itl), out.output_tokens or None)
        if status is not None and status != 200:
            return Reply(error_kind=str(status), error=_short(f"HTTP {status} {out.error}"))
        if failure is not None:  # before any reply: connecting, sending, or reading the status line
            return Reply(error_kind="connection", error=_short(f"{type(failure).__name__}: {failure}"))
        # A 200 whose stream broke or carried no token; the error is a formatted traceback.
        return Reply(error_kind="stream", error=_short((out.error.strip().splitlines() or ["no token"])[-1]))

    async def aclose(self) -> None:
        await self.session.close()


# ---- the openai SDK -----------------------------------------------------------------------------

class OpenAIClient:
    name = "openai"

    def __init__(self, ep: Endpoint, note: str):
        import openai

        self.ep, self.note, self.openai = ep, note, openai
        # No timeout here either: the load generator bounds each request.
        self.client = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key or "none", max_retries=0,
                                         timeout=None, default_headers=dict(ep.headers))

    async def send(self, ask: Ask) -> Reply:
        import httpx

        openai = self.openai
        st = time.perf_counter()
        ttft: float | None = None
        last, itl, usage, stream = st, [], None, None
        try:
            stream = await self.client.completions.create(
                model=self.ep.model, prompt=ask.prompt, max_tokens=ask.max_tokens, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True} if ask.ignore_eos else None)
            async for chunk in stream:
                if chunk.choices:
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - st
                    else:
                        itl.append(now - last)
                    last = now
                if chunk.usage is not None:
                    usage = chunk.usage.completion_tokens
        except openai.APIStatusError as err:
            return Reply(error_kind=str(err.status_code), error=_short(f"HTTP {err.status_code} {err.message}"))
        except (openai.APIError, httpx.HTTPError) as err:
            # Before the status line: the connection failed. After: the stream broke, or carried an
            # SSE error event (the SDK raises both as APIError subclasses).
            cause = f" ({err.__cause__})" if err.__cause__ else ""
            return Reply(error_kind="connection" if stream is None else "stream",
                         error=_short(f"{type(err).__name__}: {err}{cause}"))
        if ttft is None:
            return Reply(error_kind="stream", error="the stream ended before any token")
        return Reply(ttft, last - st, tuple(itl), usage or None)

    async def aclose(self) -> None:
        await self.client.close()


def open_client(kind: str, ep: Endpoint) -> Client:
    """`vllm`, `openai`, or `auto`: vLLM's request function when it loads, else the SDK."""
    if kind not in CLIENTS:
        raise EndpointError(f"--client {kind!r}: expected one of {', '.join(CLIENTS)}")
    if kind in ("auto", "vllm"):
        try:
            funcs = load_vllm_request_func()
        except ImportError as err:
            if kind == "vllm":
                raise EndpointError(f"--client vllm: {err}") from None
            return OpenAIClient(ep, f"openai SDK (vLLM's request function unavailable: {err})")
        return VllmClient(ep, funcs, "vLLM's benchmark request function (async_request_openai_completions)")
    return OpenAIClient(ep, "openai SDK (asked for)")


@dataclass(frozen=True)
class EndpointCheck:
    models: tuple[str, ...]  # what /v1/models lists; () when the endpoint has no such listing
    warning: str | None = None


def check_endpoint(ep: Endpoint, timeout_s: float = 10.0) -> EndpointCheck:
    """Reach `/v1/models` before the run, so a wrong URL, key or model name is one clear error
    (EndpointError) rather than thousands of failed requests."""
    import httpx

    url = f"{ep.base_url}/models"
    try:
        r = httpx.get(url, headers=ep.auth_headers(), timeout=timeout_s)
    except httpx.HTTPError as err:
        raise EndpointError(f"cannot reach {url}: {type(err).__name__}: {err or 'no reply'}") from None
    if r.status_code in (401, 403):
        raise EndpointError(f"{url} refused the credentials (HTTP {r.status_code}); give --api-key or set "
                            "OPENAI_API_KEY")
    if r.status_code != 200:
        return EndpointCheck((), f"{url} answered HTTP {r.status_code}; not checking the model name")
    try:
        models = tuple(str(m["id"]) for m in r.json()["data"])
    except (ValueError, KeyError, TypeError):
        return EndpointCheck((), f"{url} did not list models in the OpenAI shape; not checking the model name")
    if ep.model not in models:
        raise EndpointError(f"--model {ep.model!r} is not served at {ep.base_url} (it serves: "
                            f"{', '.join(models) or 'nothing'})")
    return EndpointCheck(models)
