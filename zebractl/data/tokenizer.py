"""Tokenizers from local files (or the Hub where it is reachable), with one interface.

Accepted:

- a directory or file holding a Hugging Face ``tokenizer.json`` (with ``tokenizer_config.json`` /
  ``special_tokens_map.json`` beside it for BOS/EOS when present);
- a directory with GPT-2 BPE files: ``vocab.json`` + ``merges.txt`` or ``encoder.json`` + ``vocab.bpe``;
- a SentencePiece ``.model`` file (or a directory holding ``tokenizer.model``);
- a Hub id (``org/name``), only where the Hub is reachable; otherwise a clear error (exit 2).

A tokenizer's own chat template (``chat_template`` in ``tokenizer_config.json``, a string or the
entry named ``default`` of a list, or a ``chat_template.jinja`` file beside it, which wins as in
``transformers``) is kept as ``chat_template`` (``prepare --format chat --chat-template auto``).

``save(dir)`` writes a self-contained copy (``tokenizer.json`` or ``tokenizer.model`` plus
``tokenizer_config.json``) that this module and ``transformers.AutoTokenizer`` both load, so a prepared
dataset carries the exact tokenizer it was made with. The fingerprint is the sha256 of the canonical
tokenizer content.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebractl.errors import ConfigError

GPT2_PAIRS = (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"))


def _sha256(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


def _chat_template(folder: Path) -> tuple[str | None, str | None, str | None]:
    """(the folder's chat template, the file it is read from, why it cannot be used). A problem
    is kept, not raised: only ``--chat-template auto`` needs the template (and must not silently
    fall back to another), while everything else that loads the tokenizer does not."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8"), str(jinja), None
        except (OSError, UnicodeDecodeError) as exc:
            return None, str(jinja), f"{jinja}: unreadable chat template ({exc})"
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None, None, None
    try:
        value = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None, None, None  # an unreadable config holds no template (_special_tokens agrees)
    if isinstance(value, list):  # named templates: transformers' default is the one named so
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if "default" not in named:
            return (
                None,
                str(config),
                (
                    f"{config}: chat_template lists templates named {', '.join(map(str, named))} but "
                    "none named 'default'; give one with --chat-template FILE"
                ),
            )
        value = named["default"]
    if value is None:
        return None, None, None
    if not isinstance(value, str):
        return None, str(config), f"{config}: chat_template is {type(value).__name__}, not text"
    return value, str(config), None


def _special_tokens(folder: Path) -> dict[str, str]:
    """bos/eos token strings from tokenizer_config.json or special_tokens_map.json, if any."""
    out: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key in ("bos_token", "eos_token"):
            value = data.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) and value:
                out[key] = value
    return out


@dataclass
class Tokenizer:
    """A loaded tokenizer: ``encode_batch`` plus the facts a dataset manifest records."""

    kind: str  # "hf" | "sentencepiece"
    source: str
    fingerprint: str
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    _impl: Any = field(repr=False)
    _files: dict[str, bytes] = field(repr=False, default_factory=dict)
    chat_template: str | None = field(repr=False, default=None)
    """The tokenizer's own chat template (Jinja text), if it has one."""
    chat_template_file: str | None = None
    """The file ``chat_template`` was read from."""
    chat_template_problem: str | None = None
    """Why the tokenizer's chat template cannot be used (a list without a default, ...)."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        if self.kind == "sentencepiece":
            return self._impl.encode(texts, out_type=int)
        fast = getattr(self._impl, "encode_batch_fast", None)
        encs = (fast or self._impl.encode_batch)(texts, add_special_tokens=False)
        return [e.ids for e in encs]

    def token_text(self, token_id: int | None) -> str | None:
        """The text of a token id (what a chat template's ``bos_token``/``eos_token`` is)."""
        if token_id is None:
            return None
        if self.kind == "sentencepiece":
            return self._impl.id_to_piece(token_id)
        return self._impl.id_to_token(token_id)

    def describe(self) -> dict[str, Any]:
        """What a manifest records about the tokenizer."""
        return {
            "kind": self.kind,
            "source": self.source,
            "fingerprint": self.fingerprint,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
        }

    def save(self, folder: Path) -> None:
        """Write a self-contained copy into ``folder`` (created; files replaced atomically)."""
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in self._files.items():
            tmp = folder / f".{name}.tmp"
            tmp.write_bytes(data)
            tmp.replace(folder / name)


def _hf_from_object(tok: Any, source: str, specials: dict[str, str]) -> Tokenizer:
    def tid(token: str | None) -> int | None:
        return tok.token_to_id(token) if token else None

    bos, eos = tid(specials.get("bos_token")), tid(specials.get("eos_token"))
    if eos is None:
        for candidate in ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>"):
            eos = tid(candidate)
            if eos is not None:
                break
    if bos is None:
        for candidate in ("<|begin_of_text|>", "<s>", "<bos>"):
            bos = tid(candidate)
            if bos is not None:
                break
    if bos is None:  # GPT-2 style: one <|endoftext|> marks every boundary
        bos = eos
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for key, value in (("bos_token", bos), ("eos_token", eos)):
        if value is not None:
            config[key] = tok.id_to_token(value)
    canonical = tok.to_str().encode("utf-8")
    files = {
        "tokenizer.json": canonical,
        "tokenizer_config.json": json.dumps(config, indent=2).encode("utf-8"),
    }
    # the fingerprint is that of the canonical serialisation, so a saved copy fingerprints the same
    fingerprint = hashlib.sha256(canonical).hexdigest()
    return Tokenizer(
        "hf", source, fingerprint, tok.get_vocab_size(with_added_tokens=True), bos, eos, tok, files
    )


def _load_gpt2(vocab: Path, merges: Path, source: str) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    tok = HFTokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return _hf_from_object(tok, source, {"eos_token": "<|endoftext|>"})


def _load_sentencepiece(path: Path, source: str) -> Tokenizer:
    try:
        import sentencepiece as spm
    except ImportError:
        raise ConfigError(
            "this tokenizer is a SentencePiece model: install `sentencepiece` "
            "(pip install 'zebractl[data]')"
        ) from None
    sp = spm.SentencePieceProcessor(model_file=str(path))
    bos = sp.bos_id() if sp.bos_id() >= 0 else None
    eos = sp.eos_id() if sp.eos_id() >= 0 else None
    config = {"tokenizer_class": "LlamaTokenizer"}
    for key, value in (("bos_token", bos), ("eos_token", eos)):
        if value is not None:
            config[key] = sp.id_to_piece(value)
    files = {
        "tokenizer.model": path.read_bytes(),
        "tokenizer_config.json": json.dumps(config, indent=2).encode("utf-8"),
    }
    return Tokenizer(
        "sentencepiece", source, _sha256(path), sp.get_piece_size(), bos, eos, sp, files
    )


def _load_tokenizer_json(path: Path, source: str) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    try:
        tok = HFTokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception subclasses
        raise ConfigError(f"{source}: not a valid tokenizer.json: {exc}") from None
    return _hf_from_object(tok, source, _special_tokens(path.parent))


def load_tokenizer(spec: str) -> Tokenizer:
    """Load a tokenizer from a local path or, where reachable, a Hub id."""
    tok, folder = _load(spec)
    tok.chat_template, tok.chat_template_file, tok.chat_template_problem = _chat_template(folder)
    return tok


def _load(spec: str) -> tuple[Tokenizer, Path]:
    """The tokenizer and the folder its files are in (where its chat template is looked for)."""
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix == ".model":
            return _load_sentencepiece(path, spec), path.parent
        if path.suffix == ".json":
            return _load_tokenizer_json(path, spec), path.parent
        raise ConfigError(
            f"{spec}: unknown tokenizer file (expected tokenizer.json, a "
            "SentencePiece .model, or a folder with GPT-2 vocab + merges)"
        )
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return _load_tokenizer_json(path / "tokenizer.json", spec), path
        for vocab, merges in GPT2_PAIRS:
            if (path / vocab).is_file() and (path / merges).is_file():
                return _load_gpt2(path / vocab, path / merges, spec), path
        if (path / "tokenizer.model").is_file():
            return _load_sentencepiece(path / "tokenizer.model", spec), path
        raise ConfigError(
            f"{spec}: no tokenizer here (looked for tokenizer.json, vocab.json + "
            "merges.txt, encoder.json + vocab.bpe, tokenizer.model)"
        )
    if _hub_id(spec, path):
        return _load_from_hub(spec)
    raise ConfigError(f"{spec}: no such tokenizer file or folder")


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def _hub_id(spec: str, path: Path) -> bool:
    """Whether a ``spec`` that names nothing here is a Hugging Face Hub id: spelled as one
    (``org/name`` or ``name``), not a file name (``.json``, ``.model``), and not under a folder
    that exists here (``data/tok`` with a ``data/`` folder is a local path that is missing, said
    at once rather than after the Hub's retries)."""
    if not _HUB_ID.fullmatch(spec) or path.suffix in (".json", ".model", ".txt", ".bpe"):
        return False
    return "/" not in spec or not path.parent.is_dir()


def _load_from_hub(repo_id: str) -> tuple[Tokenizer, Path]:
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    hint = (
        f"tokenizer '{repo_id}' is not a local path and the Hugging Face Hub is not reachable "
        f"from here; download it where the Hub is reachable (e.g. `huggingface-cli download "
        f"{repo_id} tokenizer.json tokenizer_config.json --local-dir DIR`) and pass DIR"
    )
    if offline:
        raise ConfigError(hint + " (HF_HUB_OFFLINE is set)")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ConfigError(hint) from None
    try:
        path = Path(hf_hub_download(repo_id, "tokenizer.json"))
        for extra in ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
            # optional; lands in the same snapshot folder, where _special_tokens looks
            with contextlib.suppress(Exception):
                hf_hub_download(repo_id, extra)
    except Exception as exc:  # noqa: BLE001 - network, auth, missing repo
        raise ConfigError(f"{hint} ({type(exc).__name__}: {exc})") from None
    return _load_tokenizer_json(path, repo_id), path.parent
