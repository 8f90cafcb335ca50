"""Which credential a request path needs. Deny by default: a path not listed needs the admin token.

| class     | paths                                                     | credential       |
|-----------|-----------------------------------------------------------|------------------|
| PUBLIC    | `/health` (exactly; not `/healthz`, not `/health/`), and   | none             |
|           | the ops dashboard's page and its two static files          |                  |
|           | (`/hbm/dashboard`, `/hbm/dashboard/app.js`, `.../app.css`: |                  |
|           | they hold no data; `/hbm/dashboard/data` is ADMIN)         |                  |
| INFERENCE | anything under `/v1/` (chat/completions, completions,      | a tenant key     |
|           | embeddings, models, models/{id}, responses, audio, ...)    |                  |
|           | and vLLM's extras outside it: `/tokenize`, `/detokenize`,  |                  |
|           | `/pooling`, `/classify`, `/score`, `/rerank`, `/v2/rerank`, |                  |
|           | `/invocations`                                            |                  |
| ADMIN     | everything else: `/metrics`, `/version`, `/docs`,          | the admin token  |
|           | `/openapi.json`, `/hbm/*`, vLLM's dev endpoints (`/sleep`, |                  |
|           | `/reset_prefix_cache`, ...), `/v1/load_lora_adapter` and   |                  |
|           | `/v1/unload_lora_adapter` (they change what the server     |                  |
|           | runs), and any path that is not in canonical form          |                  |

Non-canonical paths (`.` or `..` segments, `//`, backslashes, control characters) are ADMIN
whatever they spell: a server or proxy behind the check might normalise them into a path the
check never saw. Matching is case-sensitive, as the routers behind it are.
"""

from __future__ import annotations

import re
from enum import Enum


class PathClass(str, Enum):
    PUBLIC = "public"
    INFERENCE = "inference"
    ADMIN = "admin"


# The dashboard page asks for the admin token in the browser and sends it with each data request
# (deployments/ingress/dashboard_feed.py); the page itself must load without it.
DASHBOARD_PAGE_PATHS = frozenset({"/hbm/dashboard", "/hbm/dashboard/app.js", "/hbm/dashboard/app.css"})
PUBLIC_PATHS = frozenset({"/health"}) | DASHBOARD_PAGE_PATHS
INFERENCE_PREFIX = "/v1/"
# vLLM's OpenAI server serves these outside /v1/ (the SageMaker-style `/invocations` included).
INFERENCE_EXTRAS = frozenset({"/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank",
                              "/v2/rerank", "/invocations"})
# Under /v1/ but operations on the server, not inference: loading an adapter changes what runs.
ADMIN_UNDER_V1 = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})


_CONTROL = re.compile("[\x00-\x1f\x7f]")  # one search, not a generator step a character (every request pays it)


def _canonical(path: str) -> bool:
    if not path.startswith("/") or "\\" in path or _CONTROL.search(path):
        return False
    segments = path[1:].split("/")
    if segments[-1] == "":  # one trailing "/" is fine; any other empty segment is not
        segments.pop()
    return all(s not in ("", ".", "..") for s in segments)


def required_credential(path: str) -> PathClass:
    """The class of `path` (an ASGI `scope["path"]`: decoded, without the query string)."""
    if not _canonical(path):
        return PathClass.ADMIN
    if path in PUBLIC_PATHS:
        return PathClass.PUBLIC
    if path.rstrip("/") in ADMIN_UNDER_V1:
        return PathClass.ADMIN
    if path.startswith(INFERENCE_PREFIX) or path in INFERENCE_EXTRAS:
        return PathClass.INFERENCE
    return PathClass.ADMIN
