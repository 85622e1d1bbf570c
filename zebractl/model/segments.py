"""Documents packed into one row, kept apart (``data.packing: isolated``).

A training row concatenates documents, each closed by the tokenizer's end-of-document token (EOD).
By default (``concat``) a row is one sequence: attention, the short convolutions and the recurrent
states run across a document boundary, as FLA's and the seed's pretraining do. With isolation every
token sees its own document only:

- the recurrent mixers (KDA, GDN, Mamba2's SSD) and their short convolutions restart at each
  document. FLA's kernels take the batch flattened to one sequence with the documents' offsets
  (``cu_seqlens``, their variable-length mode); the torch path runs each document on its own;
- MLA attends within the document (flash's variable-length kernel on the documents' offsets, or a
  block-diagonal causal mask: :mod:`zebractl.model.attention`). RoPE's angles stay those of the
  row's positions: a rotary score depends only on the distance between the two positions, so a
  document is scored as if it began at position 0;
- the label after an EOD (the next document's first token) is not trained on.

``Segments`` is built once per micro-batch from the tokens (:meth:`Segments.from_tokens`) and
handed down the decoder; MLA's inputs (the offsets in int32 and the longest document, or the bias)
are made once, before the first sublayer, and shared by every MLA layer (and by their recomputation).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


class Segments:
    """Where each document of a ``[B, T]`` batch starts and ends.

    ``cu_seqlens`` (int64, on the batch's device) are the documents' offsets in the batch
    flattened to ``B * T`` tokens, row ends included (FLA's ``cu_seqlens``); ``doc`` ``[B, T]``
    numbers each token's document within its row.
    """

    def __init__(self, doc: Tensor, cu_seqlens: Tensor) -> None:
        self.doc, self.cu_seqlens = doc, cu_seqlens
        self._bias: dict[torch.dtype, Tensor] = {}
        self._varlen: tuple[Tensor, int] | None = None

    @classmethod
    def from_tokens(cls, tokens: Tensor, eod: int) -> Segments:
        """The documents of ``tokens`` ``[B, T]``: one starts at each row's start and after
        each ``eod``."""
        b, t = tokens.shape
        start = torch.ones_like(tokens, dtype=torch.bool)
        start[:, 1:] = tokens[:, :-1] == eod
        doc = start.cumsum(1) - 1
        offsets = start.reshape(-1).nonzero().squeeze(1)
        cu = torch.cat([offsets, offsets.new_tensor([b * t])])
        return cls(doc, cu)

    def attention_bias(self, dtype: torch.dtype) -> Tensor:
        """``[B, 1, T, T]`` additive attention bias in ``dtype``: 0 where a query may attend (an
        earlier or the same position of its own document), -inf elsewhere. Made once per dtype."""
        bias = self._bias.get(dtype)
        if bias is None:
            t = self.doc.shape[1]
            pos = torch.arange(t, device=self.doc.device)
            same = self.doc[:, :, None] == self.doc[:, None, :]
            allowed = same & (pos[None, :, None] >= pos[None, None, :])
            bias = torch.zeros(allowed.shape, dtype=dtype, device=self.doc.device)
            bias.masked_fill_(~allowed, float("-inf"))
            bias = self._bias[dtype] = bias[:, None]
        return bias

    def varlen_args(self) -> tuple[Tensor, int]:
        """``(cu_seqlens as int32, the longest document's length)``, as flash's variable-length
        kernel takes them. Made once (the length is read back from the device)."""
        if self._varlen is None:
            cu = self.cu_seqlens.to(torch.int32)
            self._varlen = (cu, int((cu[1:] - cu[:-1]).max().item()))
        return self._varlen

    def flatten(self, x: Tensor) -> Tensor:
        """``[B, T, ...]`` as the one sequence ``[1, B * T, ...]`` that ``cu_seqlens`` indexes."""
        return x.reshape(1, -1, *x.shape[2:])


def per_document(fn, cu_seqlens: Tensor, *xs: Tensor) -> Tensor:
    """``fn`` over each document of the flattened ``[1, N, ...]`` inputs, outputs concatenated
    along the sequence (the torch path of the variable-length kernels)."""
    edges = cu_seqlens.tolist()
    outs = [fn(*(x[:, a:b] for x in xs)) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    return torch.cat(outs, dim=1)
