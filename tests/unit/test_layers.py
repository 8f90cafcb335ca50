"""Imports run one way: core <- brains <- simulator and wire <- live rooms and planner <- app
building <- Ray driver <- ops <- CLI; and the root shows the product's few named rooms.

An AST walk over every module of the package, imports inside functions included, so a late
`from hbmserve.x import y` cannot hide a cycle. Layers are kept per sub-folder: a module belongs
to the deepest folder named in LAYERS above it (placement/io/ is not placement/), and may import
its own folder's modules and those of strictly lower layers, never a sibling of its own layer nor
anything above it. So the ingress and the replica, both rooms of layer 3, share only what lies
below them (deployments/wire/, the brains, core), and a brain (layer 1) imports no adapter.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAYERS: dict[str, int] = {
    "core": 0,  # config schema and shared types; imports nothing of hbmserve
    # Brains, pure: decisions and models over snapshots, time passed in.
    "capacity/perf": 1,  # hardware catalog, model shapes, step costs, the engine model
    "capacity/traces": 1,  # arrival traces: generators and loaders, the simulator's and benchmarks' input
    "placement": 1, "autoscale": 1,
    "routing": 1,  # per request: admit, queue, choose, prefix hashes, the KV index
    "access": 1,  # API keys and tenant limits: the door's and the sim door's, so not the door's alone
    # The node's weight cache: does I/O, but imports only core and sits with the brains so that
    # a replica can resolve its model through it; its decision (eviction) is pure.
    "weights": 1,
    "capacity/sim": 2,  # the simulator: the brains driven on a virtual clock
    "deployments/wire": 2,  # what the rooms of a live cluster share: HTTP contract, names, records, stats
    "deployments/kv": 2,  # the engines' KV events and the door's tokenizer: replica and door share it
    "placement/io": 2,  # placement's I/O: NVML discovery, Ray placement groups, observed ranks
    # The live rooms: front door, engine replica, control plane; and the planner beside them.
    "deployments/ingress": 3, "deployments/replica": 3, "deployments/control": 3,
    "capacity/planning": 3,  # the capacity planner, which confirms its plans in the simulator
    "deployments/apps": 4,  # builds the Serve applications and every deployment's options from the rooms
    "cluster": 5,  # the Ray driver: local head, deploy, status
    "ops": 6,  # benchmarks, load generator, the sim door, Grafana
    "cli": 7,  # the `hbmserve` command
}
# Folders that only group the rooms above: an __init__ with a docstring and sub-folders, no modules.
CONTAINERS = {"capacity", "deployments"}
MAX_ROOT_PACKAGES = 11
MAX_MODULES = 15  # per folder, __init__ aside
SHELVES = {"ops/bench"}  # independent benchmark scripts, one a file


def folder_of(parts: tuple[str, ...] | list[str]) -> str | None:
    """The deepest LAYERS folder that holds the module at `parts` (a path under the root)."""
    for n in range(len(parts), 0, -1):
        key = "/".join(parts[:n])
        if key in LAYERS:
            return key
    return None


def _modules_imported(root: Path, path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for each import of hbmserve in `path`, relative ones resolved."""
    package = ["hbmserve", *path.relative_to(root).parent.parts]
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


def package_files(root: Path) -> list[Path]:
    tops = {k.split("/")[0] for k in LAYERS} | CONTAINERS
    return sorted(p for top in tops if (root / top).is_dir() for p in (root / top).rglob("*.py"))


def violations(root: Path = ROOT) -> list[str]:
    bad = []
    for path in package_files(root):
        rel = path.relative_to(root)
        folder = folder_of(rel.parent.parts)
        if folder is None:  # a container's own __init__: it may import nothing of hbmserve
            bad += [f"{rel}:{line} (a container) imports {m}" for line, m in _modules_imported(root, path)]
            continue
        for line, module in _modules_imported(root, path):
            target = folder_of(module.split(".")[1:])
            if target == folder:
                continue
            if target is None or LAYERS[target] >= LAYERS[folder]:
                bad.append(f"{rel}:{line} ({folder}, layer {LAYERS[folder]}) imports "
                           f"{module} (layer {LAYERS[target] if target else 'top'})")
    return bad


def test_the_root_shows_the_named_rooms() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert {"cluster", "deployments", "placement", "autoscale", "ops"} <= packages
    assert all((ROOT / d).is_dir() for d in ("tests", "helm"))
    assert len(packages) <= MAX_ROOT_PACKAGES, sorted(packages)
    assert packages == {k.split("/")[0] for k in LAYERS} | CONTAINERS, "add the new folder to LAYERS"


def test_every_package_folder_has_a_layer() -> None:
    """Every folder with an __init__ is a LAYERS folder, lies inside one, or is a container."""
    folders = {p.parent.relative_to(ROOT) for p in package_files(ROOT) if p.name == "__init__.py"}
    orphans = [str(f) for f in folders if folder_of(f.parts) is None and str(f) not in CONTAINERS]
    assert orphans == []
    for c in CONTAINERS:
        assert sorted(p.name for p in (ROOT / c).glob("*.py")) == ["__init__.py"], f"{c}/ holds sub-folders only"


def test_no_folder_holds_more_than_15_modules() -> None:
    crowded = {}
    for d in {p.parent for p in package_files(ROOT)}:
        rel = str(d.relative_to(ROOT))
        n = len([p for p in d.glob("*.py") if p.name != "__init__.py"])
        if n > MAX_MODULES and rel not in SHELVES:
            crowded[rel] = n
    assert crowded == {}


def test_imports_run_one_way() -> None:
    assert violations() == []


@pytest.mark.parametrize("where, snippet, expected", [
    ("capacity/perf", "def f():\n    from hbmserve.cli.main import main\n", True),  # hidden in a function
    ("capacity/perf", "from hbmserve.core.config import ModelSpec\n", False),
    ("capacity/perf", "import hbmserve.capacity.sim.cluster_sim\n", True),  # a brain importing a driver
    ("capacity/perf", "from hbmserve.routing.choose import choose\n", True),  # brain -> sibling brain
    ("placement", "from hbmserve.placement.io.ray_adapter import x\n", True),  # the planner -> its driver
    ("placement/io", "from hbmserve.placement.placer import plan\n", False),  # the driver -> its planner
    ("deployments/ingress", "from hbmserve.deployments.replica.vllm_server import x\n", True),
    ("deployments/replica", "from hbmserve.deployments.ingress.relay import x\n", True),
    ("deployments/ingress", "from hbmserve.deployments.wire.http import x\n", False),  # the shared contract
    ("deployments/wire", "from hbmserve.deployments.ingress.relay import x\n", True),
    ("capacity/sim", "from hbmserve.capacity.planning.planner import x\n", True),
    ("deployments", "from hbmserve.core.config import ModelSpec\n", True),  # a container imports nothing
])
def test_the_check_catches_a_forbidden_import(tmp_path: Path, where: str, snippet: str, expected: bool) -> None:
    """The walk is proven on a planted file: a module in `where` with `snippet`."""
    fake = tmp_path / where
    fake.mkdir(parents=True)
    (fake / ("__init__.py" if where in CONTAINERS else "planted.py")).write_text(snippet)
    assert bool(violations(tmp_path)) is expected


def test_unit_tests_mirror_the_tree():
    """tests/unit/<folder>/<sub-folder>/ for every LAYERS folder, and no test folder without a
    package folder (data/ holds fixtures shared between folders)."""
    unit = ROOT / "tests" / "unit"
    folders = {str(p.relative_to(unit)) for p in unit.rglob("*") if p.is_dir()
               and not {"data", "__pycache__"} & set(p.relative_to(unit).parts)}
    package = {str(p.parent.relative_to(ROOT)) for p in package_files(ROOT) if p.name == "__init__.py"}
    assert set(LAYERS) <= folders
    assert folders - package == set(), "a test folder with no package folder beside it"
    assert sorted(p.name for p in unit.glob("test_*.py")) == ["test_docs.py", "test_layers.py"], "put a test in its folder"
    for c in CONTAINERS:
        assert not list((unit / c).glob("test_*.py")), f"tests of {c}/ go in its sub-folders"
