"""Two models side by side: what each one is in a few words (:func:`summary`, :func:`preset_name`)
and the fields where they differ (:func:`differences`).

`train --init-from` loads weights only into the model they were trained as, and `compare` gives a
parity verdict only between runs of one model; both say which fields differ with these functions.
Models are compared as built, not as written: the mixer of each block (a ``layout.pattern`` and the
``mixer`` + ``hybrid_attention_ratio`` it spells out are the same model), the resolved head sizes of
KDA and GDN (``expand_v: 2`` and ``head_v_dim: 32`` over 16-wide keys are the same heads), and the
settings of a mixer only where both models have blocks of it. ``description`` is never a difference.

Each difference has a kind, which says what it means for weights trained as one model and loaded
into the other: ``layout`` and ``weights`` (they do not fit, or compute another function),
``vocabulary`` (they fit when the padded embedding rows are the same), ``positions`` (no weight
depends on them: the rotary positions are computed), ``training`` (initialisation and dropout: they
matter only while training).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from zebractl.schemas.preset import ModelConfig

Kind = Literal["layout", "weights", "vocabulary", "positions", "training"]

_KINDS: tuple[tuple[Kind, tuple[str, ...]], ...] = (
    ("training", ("init_std", "init_scaled_output", "dropout")),
    ("positions", ("max_position_embeddings", "mla.rope_base", "mla.rope_type", "mla.yarn")),
    ("vocabulary", ("vocab_size", "make_vocab_size_divisible_by")),
)
_FIRST = ("hidden_size", "ffn_hidden_size", "vocab_size", "make_vocab_size_divisible_by",
          "embedding rows", "tie_embeddings", "kda", "gdn", "mamba2", "mla")  # fmt: skip
"""The order fields are listed in (after the layout): the widths, the vocabulary, the mixers."""
_MIXER_SECTIONS = ("kda", "gdn", "mamba2", "mla")
_NOT_COMPARED = ("description", "layout", "num_blocks", *_MIXER_SECTIONS)
"""Compared otherwise: the blocks through :func:`_layout`, the mixers' settings by :func:`_mixer`."""
SHOWN = 8
"""Differences a one-line message lists before "and N more"."""


@dataclass(frozen=True)
class Difference:
    """One field where model A (the source, run A) differs from model B (the recipe's, run B)."""

    key: str
    """A dotted model key (``hidden_size``, ``kda.num_v_heads``), ``blocks`` (the block count and
    mixers) or ``block N mixer`` / ``blocks N-M mixer``."""
    a: Any
    """Model A's value (None: unset)."""
    b: Any
    """Model B's value."""
    kind: Kind
    """What the difference means for weights (see the module docstring)."""

    def text(self) -> str:
        """``hidden_size 64 ≠ 96``."""
        return f"{self.key} {show(self.a)} ≠ {show(self.b)}"


def show(value: Any) -> str:
    """A value as a message writes it: ``true``, ``unset``, ``64``, ``kda``."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value)


def blocks_text(blocks: list[str]) -> str:
    """The mixer of each block in a few words: ``kda, kda``; ``kda x 24``;
    ``(mla, kda, kda, kda) x 12``; a long irregular layout is cut after 6 blocks."""
    n = len(blocks)
    if n <= 4:
        return ", ".join(blocks)
    if len(set(blocks)) == 1:
        return f"{blocks[0]} x {n}"
    for period in range(2, n // 2 + 1):
        if n % period == 0 and blocks == blocks[:period] * (n // period):
            return f"({', '.join(blocks[:period])}) x {n // period}"
    return ", ".join(blocks[:6]) + f", ... ({n} in all)"


def summary(m: ModelConfig) -> str:
    """``2 blocks: kda, kda; hidden 64``."""
    n = m.num_blocks
    return f"{n} block{'s' if n != 1 else ''}: {blocks_text(m.blocks)}; hidden {m.hidden_size}"


def _kind(key: str) -> Kind:
    for kind, prefixes in _KINDS:
        if any(key == p or key.startswith(p + ".") for p in prefixes):
            return kind
    return "weights"


def _ranges(indices: list[int]) -> str:
    """1-based block numbers, consecutive ones as a range: ``1-2, 5``."""
    out: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start + 1) if start == prev else f"{start + 1}-{prev + 1}")
        if i is not None:
            start = prev = i
    return ", ".join(out)


def layout_differences(ba: list[str], bb: list[str]) -> list[Difference]:
    """The block count and the mixer of each block: one difference per (A, B) pair of mixers."""
    if len(ba) != len(bb):
        return [
            Difference(
                "blocks",
                f"{len(ba)} ({blocks_text(ba)})",
                f"{len(bb)} ({blocks_text(bb)})",
                "layout",
            )
        ]
    pairs: dict[tuple[str, str], list[int]] = {}
    for i, (x, y) in enumerate(zip(ba, bb, strict=True)):
        if x != y:
            pairs.setdefault((x, y), []).append(i)
    return [
        Difference(f"block{'s' if len(at) > 1 else ''} {_ranges(at)} mixer", x, y, "layout")
        for (x, y), at in pairs.items()
    ]


def _mixer_fields(m: ModelConfig, mixer: str) -> dict[str, Any]:
    """A mixer's settings as built: KDA's and GDN's head sizes resolved."""
    section = getattr(m, mixer)
    if section is None:
        return {}
    fields = section.model_dump(mode="json")
    if mixer in ("kda", "gdn"):
        dims = m.linear_attention_dims(mixer)  # type: ignore[arg-type]
        fields.pop("expand_v", None)
        fields |= dims._asdict()
    return {f"{mixer}.{k}": v for k, v in _flat(fields).items()}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out |= _flat(v, key + ".") if isinstance(v, dict) and v else {key: v}
    return out


def _fields(m: ModelConfig, mixers: set[str]) -> dict[str, Any]:
    """Every compared field of ``m``, dotted: the top-level ones and the settings of ``mixers``."""
    top = {k: v for k, v in m.model_dump(mode="json").items() if k not in _NOT_COMPARED}
    out = _flat(top)
    for mixer in _MIXER_SECTIONS:
        if mixer in mixers:
            out |= _mixer_fields(m, mixer)
    return out


def _order(key: str) -> tuple[int, str]:
    head = key.split(".")[0]
    return (_FIRST.index(head) if head in _FIRST else len(_FIRST), key)


def differences(a: ModelConfig, b: ModelConfig) -> list[Difference]:
    """Where model A differs from model B (see the module docstring): the layout first, then the
    widths, the vocabulary, the mixers' settings and the rest."""
    shared = set(a.blocks) & set(b.blocks)
    fa, fb = _fields(a, shared), _fields(b, shared)
    keys = [k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)]
    rows = (
        [Difference("embedding rows", a.padded_vocab_size, b.padded_vocab_size, "weights")]
        if a.padded_vocab_size != b.padded_vocab_size
        else []
    )
    fields = [Difference(k, fa.get(k), fb.get(k), _kind(k)) for k in keys]
    return layout_differences(a.blocks, b.blocks) + sorted(
        rows + fields, key=lambda d: _order(d.key)
    )


def listed(diffs: list[Difference], shown: int = SHOWN) -> str:
    """The first ``shown`` differences, comma-separated, then ``and N more``."""
    text = ", ".join(d.text() for d in diffs[:shown])
    more = len(diffs) - shown
    return text + (f", and {more} more" if more > 0 else "")


def preset_name(m: ModelConfig, preset: str | None = None) -> str | None:
    """The preset ``m`` is: ``preset`` when ``m`` is that preset's model as written, ``preset with
    changes`` when a recipe or --set changed it; without ``preset``, the shipped preset whose
    model ``m`` is, else None."""
    from zebractl.config.resolve import resolve_preset
    from zebractl.errors import ConfigError

    if preset is not None:
        try:
            same = resolve_preset(preset).config == m
        except ConfigError:  # a preset file moved or deleted since: its name is all there is
            return preset
        return preset if same else f"{preset} with changes"
    from zebractl.config import catalog

    for name in catalog.shipped("preset"):
        try:
            if resolve_preset(name).config == m:
                return name
        except ConfigError:
            continue
    return None


def described(m: ModelConfig, preset: str | None = None) -> str:
    """``tiny_kda (2 blocks: kda, kda; hidden 64)``, or ``a model (...)`` of no known preset."""
    name = preset_name(m, preset)
    return f"{name or 'a model'} ({summary(m)})"


def blocking(diffs: list[Difference]) -> list[Difference]:
    """The differences weights trained as model A cannot be loaded across: the layout, anything
    that shapes or computes with a weight (the embedding rows included); not the vocabulary size
    within the same rows, the positions or the training settings."""
    return [d for d in diffs if d.kind in ("layout", "weights")]


def mismatch(source: str, held: str, wanted: str, diffs: list[Difference]) -> str:
    """The message of a source whose model is not the one wanted: ``SOURCE holds HELD, which does
    not fit the model WANTED: the fields (the source's value first)``, with what a user may have
    meant by a vocabulary of other rows."""
    text = f"{source} holds {held}, which does not fit the model {wanted}: {listed(diffs)}"
    text += " (the source's value first)"
    rows = next((d for d in diffs if d.key == "embedding rows"), None)
    if rows is not None:
        text += (
            f". A vocabulary is not resized on loading: a tokenizer of up to {rows.a:,} tokens "
            f"fits the source's {rows.a:,} embedding rows (set model.vocab_size to at most "
            f"{rows.a}; make_vocab_size_divisible_by pads it to the same rows)"
        )
    return text


def loading_notes(source: str, a: ModelConfig, diffs: list[Difference]) -> list[str]:
    """What a difference weights load across means (the positions, a vocabulary in the same rows),
    one line each; the training settings (initialisation, dropout) need no word."""
    out = []
    for d in diffs:
        if d.kind == "positions":
            out.append(
                f"note: {source} was trained with {d.key} {show(d.a)}, this model has "
                f"{show(d.b)}: no weight depends on it (positions are computed, not learned); "
                "the weights load as they are"
            )
        elif d.key == "vocab_size" and d.b > d.a:
            out.append(
                f"note: {source}'s vocabulary is {d.a:,} tokens, this model's {d.b:,}, in the same "
                f"{a.padded_vocab_size:,} embedding rows: tokens {d.a}-{d.b - 1} start from rows "
                "the source never trained (its padding)"
            )
        elif d.key == "vocab_size":
            out.append(
                f"note: {source}'s vocabulary is {d.a:,} tokens, this model's {d.b:,}: the rows of "
                f"tokens {d.b}-{d.a - 1} are loaded and never used"
            )
    return out
