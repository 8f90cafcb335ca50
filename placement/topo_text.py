"""Parser for the text that `nvidia-smi topo -m` prints.

The matrix has one row per GPU and per NIC, one column per GPU and per NIC, then the
`CPU Affinity`, `NUMA Affinity` and (newer drivers) `GPU NUMA ID` columns. The legend below it
explains the cell codes (X, NV#, PIX, PXB, PHB, NODE, SYS) and maps NIC labels to devices.

Drivers separate columns with tabs padded unevenly (sometimes two tabs in a row) and pasted
copies often turn tabs into spaces, so rows are split on any whitespace: every link cell is one
token, and the affinity columns that follow are filled left to right.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hbmserve.placement.topology import Gpu, Link, Nic, NodeTopology, PathKind, link_from_code


class TopoParseError(ValueError):
    """The text is not `nvidia-smi topo -m` output; the message names the line or cell."""


_GPU_LABEL = re.compile(r"^GPU(\d+)$")
_TRAILING_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_NIC_LEGEND_LINE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


@dataclass(frozen=True)
class _Row:
    label: str
    cells: tuple[str, ...]
    trailing: dict[str, str]


def _find_header(lines: list[str]) -> int:
    for number, line in enumerate(lines):
        tokens = line.split()
        # Every matrix row holds its X (self) cell; the header is the GPU0 line without one.
        if "GPU0" in tokens and "X" not in tokens:
            return number
    raise TopoParseError("no header line with a GPU0 column: is this `nvidia-smi topo -m` output?")


def _split_header(line: str) -> tuple[list[str], list[str]]:
    """Link column names, then the trailing column names in the order they appear."""
    positions = sorted((line.find(name), name) for name in _TRAILING_COLUMNS if name in line)
    cut = positions[0][0] if positions else len(line)
    return line[:cut].split(), [name for _, name in positions]


def _parse_rows(lines: list[str], columns: list[str], trailing: list[str]) -> list[_Row]:
    rows: list[_Row] = []
    for number, line in enumerate(lines):
        tokens = line.split()
        if not tokens:
            if rows:
                break
            continue
        if tokens[0].rstrip(":").lower() in ("legend", "nic"):
            break
        label = tokens[0]
        if label not in columns:
            raise TopoParseError(f"matrix line {number + 1}: row {label!r} has no matching column")
        cells = tokens[1 : 1 + len(columns)]
        if len(cells) != len(columns):
            raise TopoParseError(
                f"row {label}: expected {len(columns)} link cells, found {len(cells)}"
            )
        extra = tokens[1 + len(columns) :]
        if len(extra) > len(trailing):
            raise TopoParseError(f"row {label}: {len(extra)} values after the matrix, "
                                 f"but the header names only {len(trailing)} columns")
        rows.append(_Row(label, tuple(cells), dict(zip(trailing, extra))))
    return rows


def _nic_legend(lines: list[str]) -> dict[str, str]:
    legend: dict[str, str] = {}
    for line in lines:
        match = _NIC_LEGEND_LINE.match(line)
        if match:
            legend[match.group(1)] = match.group(2)
    return legend


def _cell(row: _Row, column: str, position: int) -> Link:
    try:
        return link_from_code(row.cells[position])
    except ValueError as err:
        raise TopoParseError(f"row {row.label}, column {column}: {err}") from None


def _optional(value: str | None) -> str | None:
    return None if value is None or value.upper() in ("N/A", "") else value


def _optional_int(value: str | None, where: str) -> int | None:
    text = _optional(value)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise TopoParseError(f"{where}: GPU NUMA ID {text!r} is not a number") from None


def parse_topo_text(
    text: str,
    name: str,
    labels: Mapping[str, str] | None = None,
    nvlink_domain: str | None = None,
    rack: str | None = None,
) -> NodeTopology:
    """Build a NodeTopology from the verbatim output of `nvidia-smi topo -m` on node `name`."""
    lines = text.expandtabs(8).splitlines()
    header_at = _find_header(lines)
    columns, trailing = _split_header(lines[header_at])
    rows = _parse_rows(lines[header_at + 1 :], columns, trailing)
    by_label = {row.label: row for row in rows}

    gpu_columns = [(pos, col) for pos, col in enumerate(columns) if _GPU_LABEL.match(col)]
    nic_columns = [(pos, col) for pos, col in enumerate(columns) if not _GPU_LABEL.match(col)]
    missing = [col for col in columns if col not in by_label]
    if missing:
        raise TopoParseError(f"columns without a row: {', '.join(missing)}")

    gpus: list[Gpu] = []
    for _, col in gpu_columns:
        row = by_label[col]
        gpus.append(
            Gpu(
                index=int(_GPU_LABEL.match(col).group(1)),  # type: ignore[union-attr]
                cpu_affinity=_optional(row.trailing.get("CPU Affinity")),
                numa_affinity=_optional(row.trailing.get("NUMA Affinity")),
                gpu_numa_id=_optional_int(row.trailing.get("GPU NUMA ID"), f"row {col}"),
            )
        )
    links = tuple(
        tuple(_cell(by_label[row_col], col, pos) for pos, col in gpu_columns)
        for _, row_col in gpu_columns
    )
    for i, (_, col) in enumerate(gpu_columns):
        for j, (_, other) in enumerate(gpu_columns):
            if (i == j) != (links[i][j].kind is PathKind.SELF):
                raise TopoParseError(f"row {col}, column {other}: X must appear exactly on the diagonal")

    legend = _nic_legend(lines[header_at + 1 :])
    nics = tuple(
        Nic(
            label=col,
            device=legend.get(col, None if col.startswith("NIC") else col),
            gpu_links=tuple(_cell(by_label[col], gcol, gpos) for gpos, gcol in gpu_columns),
        )
        for _, col in nic_columns
    )
    try:
        return NodeTopology(
            name=name,
            gpus=tuple(gpus),
            links=links,
            nics=nics,
            labels=dict(labels or {}),
            nvlink_domain=nvlink_domain,
            rack=rack,
        )
    except ValueError as err:
        raise TopoParseError(str(err)) from None
