"""Training data: a recipe's prepared datasets as megatron-core GPTDatasets, fed by a DataLoader.

The datasets come from :func:`zebractl.data.spec.resolve_data` (the dataset contract: entries,
shards, weights, held-out data, one tokenizer).

The loader: a :class:`ConsumedSamplesSampler` yields this rank's micro-batches of every global batch
from a consumed-samples offset, so the data order depends only on (seed, consumed samples) and a
resumed run reads exactly what the uninterrupted one would have, with any ``data.num_workers``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from zebractl.data.spec import DataSpec, Shard
from zebractl.runtime import stop_signals
from zebractl.schemas.recipe import RunConfig


class _TokenizerFacts:
    """The duck-typed tokenizer megatron's GPTDataset reads (ids only; no text here)."""

    def __init__(self, spec: DataSpec) -> None:
        self.vocab_size = spec.vocab_size
        self.eod = spec.eod
        self.pad = -1
        self.unique_identifiers = {
            "class": "zebractl",
            "fingerprint": spec.tokenizer_fingerprint,
            "vocab_size": spec.vocab_size,
            "eod": spec.eod,
        }


def _blend(shards: list[Shard]) -> tuple[list[str], list[float]]:
    return [s.prefix for s in shards], [s.weight for s in shards]


def build_datasets(
    cfg: RunConfig, spec: DataSpec, train_samples: int, valid_samples: int, cache_dir: Path
) -> tuple[Any, Any | None]:
    """(train, valid) megatron GPTDatasets; valid is None without held-out data."""
    import torch.distributed as tdist
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    cache_dir.mkdir(parents=True, exist_ok=True)
    # Megatron's builder writes the cache on rank 0 while the other ranks wait at a barrier, then
    # they read it: only rank 0 may tidy it, or a slower rank deletes the files rank 0 is writing
    # as torn (a two-process run then failed on a missing ...-document_index.npy).
    if not tdist.is_initialized() or tdist.get_rank() == 0:
        drop_torn_cache(cache_dir)
    if cfg.data.split is None and spec.valid:
        where: dict[str, Any] = {"blend_per_split": [_blend(spec.train), _blend(spec.valid), None]}
    else:
        split = cfg.data.split or [1.0, 0.0, 0.0]
        where = {"blend": _blend(spec.train), "split": ",".join(f"{x:g}" for x in split)}
    has_valid = bool(spec.valid) if cfg.data.split is None else cfg.data.split[1] > 0
    config = GPTDatasetConfig(
        random_seed=cfg.seed,
        sequence_length=cfg.data.seq_length,
        path_to_cache=str(cache_dir),
        tokenizer=_TokenizerFacts(spec),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mmap_bin_files=True,
        **where,
    )
    sizes = [train_samples, valid_samples if has_valid else 0, 0]
    cls = GPTDataset
    if cfg.data.format == "chat":
        from zebractl.train.masked_data import MaskedGPTDataset

        cls = MaskedGPTDataset
    train, valid, _ = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build()
    if valid is not None and len(valid) == 0:
        valid = None
    return train, valid if has_valid else None


def drop_torn_cache(cache_dir: Path) -> list[Path]:
    """Delete index-cache files a killed run left half-written (and their siblings), so megatron
    rebuilds them instead of failing to memory-map a short file. Returns what was deleted."""
    import numpy as np

    torn: set[str] = set()
    for npy in cache_dir.glob("*.npy"):
        try:
            with npy.open("rb") as f:
                fmt = np.lib.format
                major, _ = fmt.read_magic(f)
                read = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
                shape, _, dtype = read(f)
                need = f.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            ok = npy.stat().st_size >= need
        except (OSError, ValueError, EOFError, SyntaxError):
            ok = False
        if not ok:
            torn.add(npy.name.split("-", 1)[0])  # megatron names them HASH-Class-split-what.npy
    gone = [p for p in cache_dir.iterdir() if p.name.split("-", 1)[0] in torn]
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


class ConsumedSamplesSampler:
    """Batch sampler: this rank's micro-batches of each global batch, from ``consumed`` on.

    Global batch ``k`` covers samples ``[k*G, (k+1)*G)``; rank ``r`` of ``W`` takes its contiguous
    ``G/W`` of them in micro-batches of ``micro``.
    """

    def __init__(
        self, size: int, consumed: int, micro: int, global_: int, rank: int, world: int
    ) -> None:
        self.size, self.consumed = size, consumed
        self.micro, self.global_, self.rank, self.world = micro, global_, rank, world

    def __iter__(self) -> Iterator[list[int]]:
        per_rank = self.global_ // self.world
        start = self.consumed
        while start + self.global_ <= self.size:
            first = start + self.rank * per_rank
            for m in range(per_rank // self.micro):
                yield list(range(first + m * self.micro, first + (m + 1) * self.micro))
            start += self.global_

    def __len__(self) -> int:
        steps = max(0, (self.size - self.consumed) // self.global_)
        return steps * (self.global_ // self.world) // self.micro


def loader(dataset: Any, sampler: ConsumedSamplesSampler, num_workers: int, pin: bool) -> Any:
    """A DataLoader over ``dataset`` in ``sampler``'s order, stacking tokens/labels/loss_mask."""
    from torch.utils.data import DataLoader

    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin,
        collate_fn=_collate,
        # stop signals are for the training process: it finishes the step and saves; a worker that
        # died from Ctrl-C or Slurm's SIGTERM would fail that last step instead
        worker_init_fn=stop_signals.ignore if num_workers else None,
    )


def _collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    return {
        k: torch.stack([torch.as_tensor(it[k]) for it in items])
        for k in ("tokens", "labels", "loss_mask")
    }


def keep_documents_apart(mb: dict[str, Any], eod: int) -> Any:
    """``data.packing: isolated``: the micro-batch's documents (a
    :class:`~zebractl.model.segments.Segments` for the model) and its ``loss_mask`` without the
    labels that follow an end-of-document token (the next document's first token), in place."""
    from zebractl.model.segments import Segments

    tokens = mb["tokens"]
    mb["loss_mask"] = mb["loss_mask"] * (tokens != eod).to(mb["loss_mask"].dtype)
    return Segments.from_tokens(tokens, eod)
