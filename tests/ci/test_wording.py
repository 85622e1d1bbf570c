"""The project's own text speaks of the product, not of how it was built: no page, comment,
docstring, help text, changelog entry or schema description names a step of the development
process (an ordinal sitting, a try, a part) or the tools it was built with. A change is named by its
commit, a measurement by its date, machine and record. (A "training session", one launch of a run,
is product language and stays.)"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The patterns below do not match their own source (``\s+`` stands where the words have a space),
# and the examples in the tests at the end are built from pieces, so this file passes its own test.
_ORDINAL = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
    r"\d+(?:st|nd|rd|th)"
)
_WHEN = "this|that|next|previous|earlier|later|last|same|work|GPU|H100|H200|device|development"
PATTERNS: dict[str, str] = {
    "an ordinal of the development process": rf"\b(?:{_ORDINAL})\s+(?:[\w-]+\s+){{0,2}}?sessions?\b",
    "a sitting of the development process": rf"\b(?:{_WHEN})\s+sessions?\b",
    "a try of the development process": r"\b(?:first|second|third|another)\s+(?:try|part)\b",
    "a tool the project was built with": (
        r"\bdevice\s+tool\b|\bissues?\s+tool\b|\bsub-?agents?\b|\bhelper\s+agents?\b"
        r"|\bAI\s+assistant\b|\bthe\s+lent\b|\bthe\s+lead\b"
    ),
}
RX = re.compile("|".join(f"(?P<p{i}>{p})" for i, p in enumerate(PATTERNS.values())), re.IGNORECASE)
WHY = list(PATTERNS)

SKIP_SUFFIXES = (
    ".log", ".tgz", ".tar", ".xz", ".gz", ".zip", ".bz2", ".whl", ".png", ".jpg", ".jpeg",
    ".gif", ".pdf", ".bin", ".idx", ".pt", ".safetensors", ".npy", ".parquet",
)  # fmt: skip
"""Logs, tarballs and binaries: what a program wrote, not the project's own text."""


def _skipped(path: str) -> bool:
    if path.endswith(SKIP_SUFFIXES):
        return True
    # benchmarks/results holds records (JSON, JSONL, junit XML, summaries, progress files): what a
    # job wrote; its README.md files are pages and are read
    return path.startswith("benchmarks/results/") and not path.endswith(".md")


def text_files() -> list[Path]:
    """The tracked files and the new ones git does not ignore, as they are in the working tree."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no file list")
    files = []
    for name in sorted({n for n in out.decode().split("\0") if n}):
        path = REPO / name
        if not _skipped(name) and path.is_file():  # a file deleted from the tree is not read
            files.append(path)
    return files


def hits(text: str) -> list[tuple[int, str, str]]:
    """(line, matched words, why) for every development-process phrase in ``text``; a phrase may
    run over a line break (it is reported at the line it starts on)."""
    out = []
    for m in RX.finditer(text):
        why = WHY[int(next(k for k, v in m.groupdict().items() if v is not None)[1:])]
        out.append((text.count("\n", 0, m.start()) + 1, " ".join(m.group(0).split()), why))
    return out


def test_no_text_speaks_of_the_development_process():
    found = []
    files = text_files()
    assert len(files) > 100, "the file list looks wrong"
    for path in files:
        raw = path.read_bytes()
        if b"\0" in raw[:8192]:
            continue  # binary
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        rel = path.relative_to(REPO).as_posix()
        found += [f"{rel}:{line}: {words!r} ({why})" for line, words, why in hits(text)]
    assert not found, (
        "name a change by its commit and a measurement by its date, machine and record:\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize(
    "text",
    [
        "measured in the fif" + "teenth sess" + "ion",
        "(nin" + "th sess" + "ion, second pa" + "rt)",
        "the fourth H200 sess" + "ion saw it",
        "the fourth\nsess" + "ion's profile",
        "the 8th sess" + "ion",
        "a second tr" + "y",
        "this sess" + "ion's device time",
        "for the previous sess" + "ion",
        "in the work sess" + "ion",
        "through the device to" + "ol",
        "a sub" + "agent wrote it",
        "on the le" + "nt H200",
    ],
)
def test_the_patterns_find_process_words(text):
    assert hits(text), text


@pytest.mark.parametrize(
    "text",
    [
        "run_id: the training session that wrote the row",
        "The value of the previous training session.",
        "trained once per test session",
        "class ChatSession:",
        "@pytest.fixture(scope='session')",
        "the session's temporary directory",
        "issue 44 and the first iteration",
        "the assistant turns only",
        "retried at 3/4 of its micro-batch",
    ],
)
def test_the_patterns_leave_product_words_alone(text):
    assert not hits(text), text
