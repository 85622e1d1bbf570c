"""Hybrid-aware FLOP count per token: matmuls + recurrent chunk terms + MLA attention.

Not Megatron's GPT/Mamba formula (which Primus reused for KDA/GDN and so over-reported MFU ~2x). One
multiply-add = 2 FLOPs; training = forward + backward = 3 x forward. Element-wise work (norms,
activations, gates) is not counted, as in every MFU convention.

Terms, per token of a sequence of length s:

- linear layers: 2 * rows * cols of every weight matrix, including the LM head (tied or not);
- depthwise short convolutions: 2 * channels * kernel;
- each recurrent mixer's scan: its ``recurrent_flops`` (:data:`zebractl.layout.MIXER_SPECS`): KDA's
  and GDN's chunked delta rule (:func:`zebractl.layout.common.delta_rule_flops`), Mamba2's SSD as
  scalar-decay linear attention (:mod:`zebractl.layout.mamba2`);
- MLA causal attention: each token attends to (s+1)/2 keys on average:
  nh * (qk + rope + v) * (s + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from zebractl.layout import MIXER_SPECS, SUBLAYER_SHAPES
from zebractl.schemas.preset import ModelConfig


@dataclass(frozen=True)
class FlopCount:
    """Forward FLOPs per token by component."""

    linear: int
    conv: int
    recurrent: int
    attention: int
    lm_head: int

    @property
    def forward(self) -> int:
        """All forward FLOPs per token."""
        return self.linear + self.conv + self.recurrent + self.attention + self.lm_head

    @property
    def training(self) -> int:
        """Forward + backward FLOPs per token (3x forward)."""
        return 3 * self.forward


def _matmul_and_conv(m: ModelConfig, kind: str) -> tuple[int, int]:
    linear = conv = 0
    for name, shape in SUBLAYER_SHAPES[kind](m).items():
        if name.endswith("conv1d.weight"):
            conv += 2 * shape[0] * shape[2]
        elif name.endswith(".weight") and len(shape) == 2:
            linear += 2 * shape[0] * shape[1]
    return linear, conv


def _attention(m: ModelConfig, seq_length: int) -> int:
    assert m.mla is not None
    a = m.mla
    return a.num_heads * (a.qk_head_dim + a.qk_pos_emb_head_dim + a.v_head_dim) * (seq_length + 1)


def flops_per_token(m: ModelConfig, seq_length: int) -> FlopCount:
    """Forward FLOPs per token for sequences of ``seq_length``."""
    linear = conv = recurrent = attention = 0
    for kind in m.sublayers:
        lin, cv = _matmul_and_conv(m, kind)
        linear, conv = linear + lin, conv + cv
        if kind in MIXER_SPECS:
            recurrent += MIXER_SPECS[kind].recurrent_flops(m)
        if kind == "mla":
            attention += _attention(m, seq_length)
    return FlopCount(
        linear=linear,
        conv=conv,
        recurrent=recurrent,
        attention=attention,
        lm_head=2 * m.padded_vocab_size * m.hidden_size,
    )
