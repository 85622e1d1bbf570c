"""Input corpora: find the files, read documents, report bad input by file and line.

Formats (by name): ``.jsonl``/``.json`` lines and their ``.gz``; ``.parquet``; ``.arrow`` (IPC stream
or file, as Hugging Face ``save_to_disk`` writes); ``.txt``/``.md`` (one document per file). A folder is
searched recursively for those; a Hugging Face ``save_to_disk`` folder is recognised by its
``dataset_info.json``/``state.json``. Globs are expanded. Every document carries a location
(``file:line`` or ``file:row N``) for error messages.
"""

from __future__ import annotations

import glob as globlib
import gzip
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zebractl.errors import ConfigError, first_line

# a lone surrogate escape (\udXXX) that json.loads lets through: not Unicode text
SURROGATE = re.compile("[\ud800-\udfff]")
TEXT_SUFFIXES = (".txt", ".md")
SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".parquet", ".arrow", *TEXT_SUFFIXES)


class InputError(ConfigError):
    """Bad input data (exit code 2); ``reason`` is a short category counted with --skip-bad."""

    def __init__(self, message: str, reason: str = "bad_input") -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):  # survives the trip back from a worker process
        return (type(self), (str(self), self.reason))


@dataclass(frozen=True)
class Source:
    """One input file."""

    path: str
    size: int

    @property
    def kind(self) -> str:
        """jsonl | parquet | arrow | text."""
        name = self.path.lower()
        if name.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
            return "jsonl"
        if name.endswith(".parquet"):
            return "parquet"
        if name.endswith(".arrow"):
            return "arrow"
        return "text"


# Metadata files of Hugging Face save_to_disk folders, never data.
HF_METADATA = ("dataset_info.json", "state.json", "dataset_dict.json")


def _supported(path: Path) -> bool:
    return path.name.lower().endswith(SUFFIXES) and path.name not in HF_METADATA


def expand_inputs(inputs: list[str]) -> list[Source]:
    """Files behind the given paths, folders and globs, in a stable order (duplicates dropped)."""
    found: list[Path] = []
    for item in inputs:
        matches = sorted(globlib.glob(item, recursive=True)) if globlib.has_magic(item) else [item]
        if not matches:
            raise ConfigError(f"{item}: the pattern matches no file")
        for match in matches:
            path = Path(match)
            if path.is_dir():
                files = sorted(p for p in path.rglob("*") if p.is_file() and _supported(p))
                if not files:
                    raise ConfigError(
                        f"{item}: no input files in this folder (looked for {', '.join(SUFFIXES)})"
                    )
                found.extend(files)
            elif path.is_file():
                if not _supported(path):
                    raise ConfigError(
                        f"{item}: unsupported input format (use {', '.join(SUFFIXES)})"
                    )
                found.append(path)
            else:
                raise ConfigError(f"{item}: no such file or folder")
    seen: set[str] = set()
    out: list[Source] = []
    for p in found:
        key = str(p.resolve())
        if key not in seen:
            seen.add(key)
            out.append(Source(str(p), p.stat().st_size))
    return out


def documents(src: Source, text_key: str) -> Iterator[tuple[str, str] | InputError]:
    """Yield ``(text, location)`` per document, or an :class:`InputError` for a bad record (the
    caller raises it or, with --skip-bad, counts it and goes on with the next record). A problem
    with the whole file (unreadable, damaged archive) raises :class:`InputError`."""
    kind = src.kind
    if kind == "jsonl":
        yield from _jsonl(src.path, text_key)
    elif kind == "text":
        yield _text(src.path), src.path
    else:
        yield from _columnar(src.path, kind, text_key)


def records(src: Source, key: str) -> Iterator[tuple[Any, str] | InputError]:
    """Like :func:`documents`, but yield the value of ``key`` as it is (any JSON value: a chat
    record's ``messages`` list), for the caller to check; a plain text file has no records."""
    kind = src.kind
    if kind == "text":
        raise InputError(
            f"{src.path}: a plain text file holds no records; chat data is JSONL or Parquet with "
            f"a '{key}' field",
            "not_records",
        )
    if kind == "jsonl":
        yield from _jsonl(src.path, key, raw=True)
    else:
        yield from _columnar(src.path, kind, key, raw=True)


def _text(path: str) -> str:
    try:
        return Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = Path(path).read_bytes()[: exc.start].count(b"\n") + 1
        raise InputError(
            f"{path}:{line}: invalid UTF-8 (byte {exc.start})", "invalid_utf8"
        ) from None


def _jsonl(path: str, text_key: str, raw: bool = False) -> Iterator[tuple[Any, str] | InputError]:
    gz = path.lower().endswith(".gz")
    opener = gzip.open if gz else open
    lineno = 0
    try:
        with opener(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield _jsonl_record(line, f"{path}:{lineno}", text_key, raw)
                    except InputError as exc:
                        yield exc
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        what = "not gzip data" if lineno == 0 else "truncated or corrupt gzip data"
        after = f" after line {lineno}" if lineno else ""
        raise InputError(
            f"{path}: {what}{after} ({type(exc).__name__}: {exc}); re-download or re-compress "
            "it, or leave it out",
            "corrupt_file",
        ) from None
    except OSError as exc:
        raise InputError(
            f"{path}: cannot read{f' after line {lineno}' if lineno else ''} ({exc})",
            "corrupt_file",
        ) from None


def _jsonl_record(data: bytes, where: str, text_key: str, raw: bool = False) -> tuple[Any, str]:
    try:
        line = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{where}: invalid UTF-8 (byte {exc.start} of the line)", "invalid_utf8"
        ) from None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{where}: malformed JSON ({exc.msg}, column {exc.colno})", "malformed_json"
        ) from None
    except RecursionError:
        raise InputError(f"{where}: malformed JSON (nested too deeply)", "malformed_json") from None
    if not isinstance(obj, dict) or text_key not in obj:
        keys = ", ".join(sorted(obj)[:8]) if isinstance(obj, dict) else type(obj).__name__
        raise InputError(
            f"{where}: no '{text_key}' key (found: {keys}); choose the field with --text-key",
            "missing_text_key",
        )
    text = obj[text_key]
    if raw:
        return text, where
    if not isinstance(text, str):
        raise InputError(f"{where}: '{text_key}' holds {type(text).__name__}, not text", "not_text")
    bad = SURROGATE.search(text)
    if bad:
        raise InputError(
            f"{where}: '{text_key}' holds a lone surrogate escape (\\u{ord(bad.group()):04x} at "
            f"character {bad.start()}), which is not Unicode text; fix the record or pass "
            "--skip-bad",
            "invalid_unicode",
        )
    return text, where


def _columnar(
    path: str, kind: str, text_key: str, raw: bool = False
) -> Iterator[tuple[Any, str] | InputError]:
    try:
        import pyarrow as pa
        import pyarrow.ipc
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            f"{path}: reading {kind} needs pyarrow (pip install 'zebractl[data]')"
        ) from None
    try:
        if kind == "parquet":
            pf = pq.ParquetFile(path)
            names = pf.schema_arrow.names
            batches = pf.iter_batches(columns=[text_key]) if text_key in names else None
        else:  # Hugging Face save_to_disk writes IPC streams; plain .arrow files may be IPC files
            try:
                stream = pa.ipc.open_stream(pa.memory_map(path))
                names, batches = stream.schema.names, iter(stream)
            except pa.ArrowInvalid:
                file = pa.ipc.open_file(pa.memory_map(path))
                names = file.schema.names
                batches = (file.get_batch(i) for i in range(file.num_record_batches))
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable {kind} file ({exc})", "unreadable") from None
    if text_key not in names:
        raise InputError(
            f"{path}: no '{text_key}' column (columns: {', '.join(names)}); choose "
            "the field with --text-key",
            "missing_text_key",
        )
    row = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as exc:
            first = first_line(exc, type(exc).__name__)
            raise InputError(
                f"{path}: corrupt {kind} data after row {row} ({first}); re-export the file or "
                "leave it out",
                "corrupt_file",
            ) from None
        column = batch.column(batch.schema.get_field_index(text_key))
        for value in column.to_pylist():
            row += 1
            if raw:
                yield value, f"{path}:row {row}"
            elif value is None:
                yield "", f"{path}:row {row}"
            elif not isinstance(value, str):
                yield InputError(
                    f"{path}:row {row}: '{text_key}' holds {type(value).__name__}, not text",
                    "not_text",
                )
            elif SURROGATE.search(value):
                yield InputError(
                    f"{path}:row {row}: '{text_key}' holds a lone surrogate, not Unicode text; "
                    "fix the row or pass --skip-bad",
                    "invalid_unicode",
                )
            else:
                yield value, f"{path}:row {row}"
