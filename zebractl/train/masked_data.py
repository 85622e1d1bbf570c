"""Samples of chat data with their loss masks (``data.format: chat``).

`zebractl prepare --format chat` writes, beside each token dataset ``PREFIX``, a mask dataset
``PREFIX.mask`` of the same documents and lengths (one 0/1 byte per token). :class:`MaskedGPTDataset`
is megatron's GPTDataset over the tokens, whose sample of index ``i`` is also read from the mask
dataset through the very same document, sample and shuffle indices (a shallow copy of the dataset
whose indexed dataset is the mask one), so token and mask cannot drift apart. A label is trained on
when its token is marked: ``loss_mask = GPTDataset's loss mask * mask[1:]`` (padding stays 0).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from megatron.core.datasets.gpt_dataset import GPTDataset
from megatron.core.datasets.indexed_dataset import IndexedDataset


class MaskedGPTDataset(GPTDataset):
    """GPTDataset whose ``loss_mask`` is the chat data's mask (see the module docstring)."""

    def __init__(self, indexed_dataset: Any, dataset_path: str | None, *args: Any, **kw: Any):
        super().__init__(indexed_dataset, dataset_path, *args, **kw)
        if not self.config.add_extra_token_to_sequence:
            raise ValueError("chat data needs add_extra_token_to_sequence (labels = tokens[1:])")
        prefix = dataset_path or indexed_dataset.path_prefix
        self._masks = IndexedDataset(f"{prefix}.mask", mmap=self.config.mmap_bin_files)
        if not np.array_equal(self._masks.sequence_lengths, indexed_dataset.sequence_lengths):
            raise ValueError(f"{prefix}.mask: its documents' lengths differ from {prefix}'s")
        self._mask_view: GPTDataset | None = None

    def __getitem__(self, idx: int | None) -> dict[str, torch.Tensor]:
        item = super().__getitem__(idx)
        if self._mask_view is None:
            self._mask_view = copy.copy(self)
            self._mask_view.dataset = self._masks
        mask, _ = GPTDataset._query_document_sample_shuffle_indices(
            self._mask_view, 0 if idx is None else idx
        )
        marked = torch.from_numpy(np.asarray(mask[1:]) == 1)  # the labels' tokens; padding is not 1
        item["loss_mask"] = item["loss_mask"] * marked.to(item["loss_mask"].dtype)
        return item
