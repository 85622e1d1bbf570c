"""Small readers of a GPU-check job folder, shared by check_record.py and record_memory.py: each
returns None (or empty) for a missing or damaged file, never raises. Stdlib only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def read_json(path: Path) -> Any:
    text = read_text(path)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        # a --json report is the last document on stdout; anything before it is noise
        start = text.find("\n{")
        while start != -1:
            try:
                return json.loads(text[start + 1 :])
            except ValueError:
                start = text.find("\n{", start + 1)
        return None


def read_kv(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (read_text(path) or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            out[key.strip()] = value.strip()
    return out


def read_tsv(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    rows = []
    for line in (read_text(path) or "").splitlines():
        if not line.strip():
            continue
        cells = line.split("\t")
        cells += [""] * (len(columns) - len(cells))
        rows.append(dict(zip(columns, cells, strict=False)))
    return rows


def num(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if x == x and x not in (float("inf"), float("-inf")) else None


def train_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in (read_text(path) or "").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("kind") == "train":
            rows.append(row)
    return rows
