"""`hbmserve cache ls|prefetch|evict|manifest`: the node-local weight cache (hbmserve/weights).

The cache is the one under `cache.root` of --config (the embedded default config when none is
given), or --root. `--json` prints one JSON document on stdout; progress and errors go to
stderr. Exit codes: 0 done, 1 a cache or source error (the message names the cause), 2 bad input.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from hbmserve.cli.user_errors import EXIT_BAD_INPUT, EXIT_FAILED, fail

err = Console(stderr=True)  # the progress bar

if TYPE_CHECKING:
    from hbmserve.core.cache_spec import WeightCacheSpec
    from hbmserve.core.config import ClusterSpec
    from hbmserve.weights.cache import WeightCache


out = Console()

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="cluster YAML (its `cache:` section and models)")]
RootOpt = Annotated[Optional[Path], typer.Option("--root", help="cache root; overrides the config's cache.root")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def _load(config: Optional[Path], root: Optional[Path]) -> tuple[WeightCacheSpec, ClusterSpec]:
    from hbmserve.core.config import ConfigError, load_cluster_spec

    try:
        cluster = load_cluster_spec(config)
    except ConfigError as e:
        raise fail(str(e), EXIT_BAD_INPUT) from None
    spec = cluster.cache if root is None else cluster.cache.model_copy(update={"root": str(root.resolve())})
    return spec, cluster


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f}"


def ls(config: ConfigOpt = None, root: RootOpt = None, json_out: JsonOpt = False) -> None:
    """List the cached models, most recently used first."""
    from hbmserve.weights.resolve import cache_for

    spec, _ = _load(config, root)
    entries = cache_for(spec).ls()
    if json_out:
        out.print_json(json.dumps({"root": spec.root, "max_bytes": spec.max_bytes,
                                   "entries": [{**asdict(e), "path": str(e.path)} for e in entries]}))
        return
    table = Table(title=f"weight cache {spec.root} (cap {spec.max_gib:g} GiB)")
    for col in ("key", "source", "GiB", "files", "in use", "pinned"):
        table.add_column(col)
    for e in entries:
        table.add_row(e.key[:12], e.source, _gib(e.size_bytes), str(e.files), "yes" if e.in_use else "",
                      "yes" if e.pinned else "")
    out.print(table)


def prefetch(sources: Annotated[Optional[list[str]], typer.Argument(
                 help="model names from the config, or sources (path, URL, org/name, s3://...); "
                      "none: every model in the config")] = None,
             config: ConfigOpt = None, root: RootOpt = None, json_out: JsonOpt = False,
             pin: Annotated[bool, typer.Option("--pin", help="keep them for the warm pool (never evicted)")] = False,
             ) -> None:
    """Make models local now, so a replica started here later hits the cache."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from hbmserve.weights.errors import WeightCacheError
    from hbmserve.weights.resolve import resolve

    spec, cluster = _load(config, root)
    wanted = sources or [m.name for m in cluster.models]
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=err, transient=json_out) as bar:
        for name in wanted:
            model = cluster.model(name)
            source = model.source if model else name
            task = bar.add_task(name, total=None)
            try:
                got = resolve(source, spec, model=name, pin=pin,
                              progress=lambda n, total, t=task: bar.update(t, advance=n, total=total))
            except WeightCacheError as e:
                raise fail(str(e), EXIT_FAILED) from None
            got.release()  # a prefetch keeps nothing open: the entry stays until evicted
            bar.update(task, total=got.acquired.bytes_fetched or 1, completed=got.acquired.bytes_fetched or 1)
            a = got.acquired
            results.append({"model": name, "source": got.source, "key": a.key, "path": str(a.path), "hit": a.hit,
                            "offline": got.offline, "bytes_fetched": a.bytes_fetched, "seconds": round(a.seconds, 3),
                            "gbps": round(a.bytes_fetched / a.seconds / 1e9, 3) if a.seconds else None})
    if json_out:
        out.print_json(json.dumps(results))
        return
    for r in results:
        how = "hit" if r["hit"] else f"fetched {_gib(r['bytes_fetched'])} GiB in {r['seconds']} s"
        out.print(f"{r['model']}: {how} -> {r['path']}" + (" (source unreachable)" if r["offline"] else ""),
                  highlight=False, soft_wrap=True)


def evict(targets: Annotated[Optional[list[str]], typer.Argument(help="keys, key prefixes or sources")] = None,
          all_unused: Annotated[bool, typer.Option("--all", help="every entry neither in use nor pinned")] = False,
          force: Annotated[bool, typer.Option("--force", help="evict pinned entries too (never one in use)")] = False,
          config: ConfigOpt = None, root: RootOpt = None, json_out: JsonOpt = False) -> None:
    """Remove entries now. An entry a running replica uses is never removed."""
    from hbmserve.weights.errors import WeightCacheError
    from hbmserve.weights.resolve import cache_for

    spec, _ = _load(config, root)
    cache = cache_for(spec)
    if all_unused == bool(targets):
        raise fail("name entries to evict, or pass --all (not both)", EXIT_BAD_INPUT)
    keys = [e.key for e in cache.ls() if not e.in_use and (force or not e.pinned)] if all_unused else []
    for t in targets or []:
        key = cache.find(t) or _find_by_source(cache, t)
        if key is None:
            raise fail(f"no cache entry matches {t!r} in {spec.root}", EXIT_BAD_INPUT)
        keys.append(key)
    evicted = []
    for key in keys:
        try:
            info = cache.evict(key, force=force)
        except WeightCacheError as e:  # in use, pinned without --force
            raise fail(str(e), EXIT_FAILED) from None
        evicted.append({"key": info.key, "source": info.source, "bytes": info.size_bytes})
    if json_out:
        out.print_json(json.dumps({"evicted": evicted}))
    else:
        out.print(f"evicted {len(evicted)} entries ({_gib(sum(e['bytes'] for e in evicted))} GiB)")


def _find_by_source(cache: WeightCache, text: str) -> str | None:
    """A source as the user typed it (a relative path, say), normalized as resolve() records it."""
    from hbmserve.weights.errors import SourceError
    from hbmserve.weights.sources import parse_source

    try:
        return cache.last_key(parse_source(text).uri)
    except SourceError:
        return None


def manifest(model_dir: Annotated[Path, typer.Argument(help="the model folder to publish")]) -> None:
    """Write DIR/hbmserve-manifest.json (every file's size and sha256) for HTTP and S3 sources to serve."""
    from hbmserve.weights.errors import WeightCacheError
    from hbmserve.weights.manifest import MANIFEST_NAME, manifest_of_dir

    if not model_dir.is_dir():
        raise fail(f"no directory at {model_dir}", EXIT_BAD_INPUT)
    try:
        m = manifest_of_dir(model_dir)
    except WeightCacheError as e:
        raise fail(str(e), EXIT_FAILED) from None
    (model_dir / MANIFEST_NAME).write_text(m.to_json())
    out.print(f"wrote {model_dir / MANIFEST_NAME}: {len(m.files)} files, {_gib(m.total_bytes)} GiB, key {m.key}")


def register(app: typer.Typer) -> None:
    cache_app = typer.Typer(help="The node-local weight cache: list, prefetch, evict.", no_args_is_help=True)
    cache_app.command("ls")(ls)
    cache_app.command("prefetch")(prefetch)
    cache_app.command("evict")(evict)
    cache_app.command("manifest")(manifest)
    app.add_typer(cache_app, name="cache")
