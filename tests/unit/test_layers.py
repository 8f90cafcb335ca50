"""Imports run one way: core <- brains <- simulator and wire <- live rooms <- app building <- Ray driver <- ops <- CLI.

An AST walk over every module of the package, imports inside functions included, so a
late `from hbmserve.x import y` cannot hide a cycle. A folder may import its own modules and
those of strictly lower layers, never a sibling of its own layer nor anything above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAYERS: dict[str, int] = {
    "core": 0,  # config schema and shared types; imports nothing of hbmserve
    # Brains, pure: decisions and models over snapshots, time passed in.
    "capacity": 1, "placement": 1, "autoscale": 1, "routing": 1, "access": 1,
    "kvindex": 1,  # the KV index: which blocks each replica holds, kept from its engine's KV events
    "traces": 1,  # arrival traces: generators and loaders, the simulator's and the benchmarks' input
    # The node's weight cache: does I/O, but imports only core and sits with the brains so that
    # a replica can resolve its model through it; its decision (eviction) is pure.
    "weights": 1,
    "sim": 2,  # the simulator: the brains driven on a virtual clock
    "wire": 2,  # what the rooms of a live cluster share: HTTP contract, names, records, stats
    "placement_io": 2,  # placement's I/O: NVML discovery, Ray placement groups, observed ranks
    "ingress": 3, "replica": 3, "control": 3,  # the live rooms: front door, engine replica, control plane
    "apps": 4,  # builds the Serve applications and every deployment's options from the rooms
    "planning": 4,  # the capacity planner, which confirms its plans in the simulator
    "cluster": 5,  # the Ray driver: local head, deploy, status
    "ops": 6,  # benchmarks, load generator
    "cli": 7,  # the `hbmserve` command
}


def _modules_imported(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for each import of hbmserve in `path`, relative ones resolved."""
    package = ["hbmserve", *path.relative_to(ROOT).parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                found.append((node.lineno, ".".join([*base, *([node.module] if node.module else [])])))
            elif node.module:
                found.append((node.lineno, node.module))
    return [(line, m) for line, m in found if m.split(".")[0] == "hbmserve"]


def _package_files() -> list[Path]:
    return sorted(p for folder in LAYERS for p in (ROOT / folder).rglob("*.py"))


def violations() -> list[str]:
    bad = []
    for path in _package_files():
        folder = path.relative_to(ROOT).parts[0]
        for line, module in _modules_imported(path):
            parts = module.split(".")
            target = parts[1] if len(parts) > 1 else "hbmserve"
            if target == folder:
                continue
            if target not in LAYERS or LAYERS[target] >= LAYERS[folder]:
                bad.append(f"{path.relative_to(ROOT)}:{line} ({folder}, layer {LAYERS[folder]}) imports "
                           f"{module} (layer {LAYERS.get(target, 'top')})")
    return bad


def test_every_top_level_folder_has_a_layer() -> None:
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert folders - {"tests"} == set(LAYERS), "add the new folder to LAYERS (and to docs/architecture.md)"


def test_imports_run_one_way() -> None:
    assert violations() == []


@pytest.mark.parametrize("snippet, expected", [
    ("def f():\n    from hbmserve.cli.main import main\n", True),  # hidden inside a function
    ("from hbmserve.core.config import ModelSpec\n", False),
    ("import hbmserve.sim.cluster_sim\n", True),  # a brain importing a driver
    ("from hbmserve.routing.choose import choose\n", True),  # brain -> sibling brain
])
def test_the_check_catches_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            snippet: str, expected: bool) -> None:
    """The walk is proven on a planted file: a capacity module with `snippet`."""
    fake = tmp_path / "capacity"
    fake.mkdir()
    (fake / "planted.py").write_text(snippet)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert bool(violations()) is expected


def test_unit_tests_mirror_the_tree():
    """tests/unit/<folder>/ for every package folder, and no test folder without one (data/ holds
    fixtures shared between folders)."""
    unit = ROOT / "tests" / "unit"
    folders = {p.name for p in unit.iterdir() if p.is_dir() and p.name not in ("data", "__pycache__")}
    assert folders == set(LAYERS)
    assert sorted(p.name for p in unit.glob("test_*.py")) == ["test_docs.py", "test_layers.py"], "put a test in its folder"
