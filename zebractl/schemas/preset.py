"""Architecture schema: what a preset (``presets/*.yaml``) declares and a recipe's ``model:`` overrides.

Naming: a *block* is one FLA layer = a mixer sublayer (KDA, GDN, Mamba2 or MLA attention) followed by a
SwiGLU MLP sublayer, each with its own pre-norm and residual. Megatron/Primus count sublayers, so Primus'
``num_layers: 24`` is ``num_blocks: 12`` here.

Cross-field rules live in :func:`model_problems`, which returns every problem at once with the dotted key
it concerns, so the resolver can point at the file and line that set it.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from pydantic import Field

from zebractl.schemas import bounds as B
from zebractl.schemas.base import StrictModel

RecurrentMixer = Literal["kda", "gdn", "mamba2"]
Mixer = Literal["kda", "gdn", "mamba2", "mla"]
Sublayer = Literal["kda", "gdn", "mamba2", "mla", "mlp"]


class NormConfig(StrictModel):
    """Every norm of the model: block pre-norms, the final norm, gated output norms and MLA LoRA norms."""

    type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    """Pre-norms, final norm and MLA LoRA norms (mixers' gated output norms are RMSNorm by design)."""
    eps: float = Field(1e-6, gt=0, le=1)
    """Epsilon of every norm; passed explicitly to each one (never a framework default)."""


class DropoutConfig(StrictModel):
    """Every dropout of the model. Pretraining recipes of the seeds use none."""

    hidden: float = Field(0.0, ge=0, lt=1)
    """Dropout on each sublayer output before the residual add, and on the embeddings."""
    attention: float = Field(0.0, ge=0, lt=1)
    """Dropout on MLA attention probabilities."""


class LayoutConfig(StrictModel):
    """Which mixer each block uses: a recurrent mixer plus an attention ratio, or an explicit pattern."""

    mixer: RecurrentMixer | None = None
    """Recurrent mixer of the non-attention blocks (kda, gdn or mamba2)."""
    hybrid_attention_ratio: float = Field(0.0, ge=0, le=1)
    """Fraction of blocks whose mixer is MLA; 0.25 gives the Zebra pattern mla,M,M,M repeated."""
    pattern: list[Mixer] | None = None
    """Explicit mixer per block (length num_blocks); when set, mixer and ratio must be left unset/0."""


class LinearAttentionConfig(StrictModel):
    """Fields shared by the delta-rule mixers (KDA, GDN)."""

    num_heads: int = Field(gt=0, le=B.HEADS)
    """Query/key heads."""
    head_k_dim: int | None = Field(None, gt=0, le=B.DIM)
    """Query/key head dimension; unset means hidden_size / num_heads."""
    head_v_dim: int | None = Field(None, gt=0, le=B.DIM)
    """Value head dimension; set this or expand_v, not both."""
    expand_v: float | None = Field(None, gt=0, le=64)
    """Value head dimension as a multiple of head_k_dim (FLA's expand_v)."""
    num_v_heads: int | None = Field(None, gt=0, le=B.HEADS)
    """Value heads; more than num_heads is grouped-value attention (GVA). Unset means num_heads."""
    use_short_conv: bool = True
    """Depthwise causal convolution + SiLU over [q|k|v]."""
    conv_size: int = Field(4, gt=0, le=B.KERNEL)
    """Kernel size of the short convolution."""
    allow_neg_eigval: bool = False
    """Scale beta to (0, 2) so the transition may have negative eigenvalues."""


class KDAConfig(LinearAttentionConfig):
    """Kimi Delta Attention: per-channel decay gate (f_a -> f_b), sigmoid output gate (g_a -> g_b)."""

    safe_gate: bool = False
    """FLA's bounded gate (requires lower_bound)."""
    lower_bound: float | None = Field(None, ge=-5, lt=0)
    """Lower bound of the safe gate, in [-5, 0)."""


class GDNConfig(LinearAttentionConfig):
    """Gated DeltaNet: scalar decay per value head, optional gated output norm."""

    use_gate: bool = True
    """Output gate z (FusedRMSNormGated); off means a plain RMSNorm on the output."""
    gate_activation: Literal["swish", "sigmoid"] = "swish"
    """Activation of the output gate."""


class Mamba2Config(StrictModel):
    """Mamba2 (SSD) mixer. d_inner = expand * hidden_size, heads = d_inner / head_dim."""

    state_dim: int = Field(gt=0, le=B.DIM)
    """SSM state size N."""
    head_dim: int = Field(gt=0, le=B.DIM)
    """SSM head dimension P."""
    num_groups: int = Field(gt=0, le=B.HEADS)
    """B/C groups; heads must divide evenly among them."""
    expand: int = Field(gt=0, le=64)
    """d_inner = expand * hidden_size."""
    conv_size: int = Field(4, gt=0, le=B.KERNEL)
    """Kernel size of the depthwise convolution over [x|B|C]."""
    conv_bias: bool = True
    """Bias on the depthwise convolution (Mamba2's default; a convolution, not a linear)."""


class YarnConfig(StrictModel):
    """YaRN RoPE scaling. factor 1.0 makes it plain RoPE."""

    factor: float = Field(gt=0, le=1024)
    """Context extension factor."""
    original_max_position_embeddings: int = Field(gt=0, le=B.POSITIONS)
    """Context length the RoPE frequencies were designed for."""
    beta_fast: float = Field(32.0, gt=0, le=1e4)
    """YaRN beta_fast."""
    beta_slow: float = Field(1.0, gt=0, le=1e4)
    """YaRN beta_slow."""
    mscale: float = Field(1.0, gt=0, le=1e3)
    """YaRN mscale."""
    mscale_all_dim: float = Field(1.0, ge=0, le=1e3)
    """YaRN mscale_all_dim."""


class MLAConfig(StrictModel):
    """Multi-Latent Attention (DeepSeek-V2 style). Every dimension must be given."""

    num_heads: int = Field(gt=0, le=B.HEADS)
    """Attention heads."""
    q_lora_rank: int | None = Field(gt=0, le=B.DIM)
    """Rank of the query down-projection; null means a full-rank query projection."""
    kv_lora_rank: int = Field(gt=0, le=B.DIM)
    """Rank of the joint key/value down-projection."""
    qk_head_dim: int = Field(gt=0, le=B.DIM)
    """Per-head query/key dimension without RoPE (FLA qk_nope_head_dim)."""
    qk_pos_emb_head_dim: int = Field(gt=0, le=B.DIM)
    """Per-head query/key RoPE dimension (FLA qk_rope_head_dim)."""
    v_head_dim: int = Field(gt=0, le=B.DIM)
    """Per-head value dimension."""
    rope_base: float = Field(gt=0, le=B.SCALE)
    """RoPE base (theta)."""
    rope_type: Literal["rope", "yarn"]
    """Plain RoPE or YaRN-scaled RoPE (then `yarn` is required)."""
    yarn: YarnConfig | None = None
    """YaRN parameters, required when rope_type is yarn."""


class ModelConfig(StrictModel):
    """A Zebra architecture: embeddings, blocks of (mixer, SwiGLU MLP), final norm, tied LM head."""

    description: str = ""
    """One-line summary shown by `zebractl presets`."""
    vocab_size: int = Field(gt=0, le=B.VOCAB)
    """Tokenizer vocabulary size."""
    make_vocab_size_divisible_by: int = Field(128, gt=0, le=1 << 16)
    """Embedding rows are padded up to a multiple of this."""
    hidden_size: int = Field(gt=0, le=B.DIM)
    """Model width."""
    ffn_hidden_size: int = Field(gt=0, le=B.FFN)
    """SwiGLU intermediate size (fc1 has 2x this many rows: [gate; up])."""
    num_blocks: int = Field(gt=0, le=B.BLOCKS)
    """Blocks of (mixer sublayer, MLP sublayer); Megatron sublayers = 2 * num_blocks."""
    layout: LayoutConfig
    """Mixer of each block."""
    max_position_embeddings: int = Field(gt=0, le=B.POSITIONS)
    """Longest sequence the model is configured for (MLA RoPE tables; FLA config field)."""
    tie_embeddings: bool = True
    """Share the input embedding with the output layer."""
    init_std: float = Field(0.02, gt=0, le=10)
    """Std of the normal init of every linear, conv and embedding weight."""
    init_scaled_output: bool = False
    """Depth-scale the init of output projections (Megatron's default; FLA does not)."""
    linear_bias: bool = False
    """Biases on linear layers (KDA's g_b bias is part of the KDA design and always present)."""
    ffn_activation: Literal["swiglu"] = "swiglu"
    """MLP activation."""
    norm: NormConfig = Field(default_factory=NormConfig)
    """Norm type and epsilon."""
    dropout: DropoutConfig = Field(default_factory=DropoutConfig)
    """Dropout probabilities."""
    kda: KDAConfig | None = None
    """KDA mixer dimensions (required when a block uses kda)."""
    gdn: GDNConfig | None = None
    """GDN mixer dimensions (required when a block uses gdn)."""
    mamba2: Mamba2Config | None = None
    """Mamba2 mixer dimensions (required when a block uses mamba2)."""
    mla: MLAConfig | None = None
    """MLA dimensions (required when a block uses mla)."""

    # ---- derived values -------------------------------------------------------------------------
    @property
    def padded_vocab_size(self) -> int:
        """Vocab rounded up to make_vocab_size_divisible_by."""
        m = self.make_vocab_size_divisible_by
        return -(-self.vocab_size // m) * m

    @property
    def blocks(self) -> list[Mixer]:
        """The mixer of each block, explicit (length num_blocks)."""
        return resolve_blocks(self.layout, self.num_blocks)

    @property
    def sublayers(self) -> list[Sublayer]:
        """Explicit per-sublayer list: mixer, mlp, mixer, mlp, ..."""
        out: list[Sublayer] = []
        for mixer in self.blocks:
            out += [mixer, "mlp"]
        return out

    def linear_attention_dims(self, which: Literal["kda", "gdn"]) -> LinearAttentionDims:
        """Resolved head counts and sizes of the KDA or GDN block."""
        block = self.kda if which == "kda" else self.gdn
        assert block is not None, which
        return _linear_attention_dims(block, self.hidden_size)

    @property
    def mamba2_dims(self) -> Mamba2Dims:
        """Resolved Mamba2 inner sizes."""
        assert self.mamba2 is not None
        d_inner = self.mamba2.expand * self.hidden_size
        return Mamba2Dims(d_inner=d_inner, num_heads=d_inner // self.mamba2.head_dim)


class LinearAttentionDims(NamedTuple):
    """Resolved KDA/GDN sizes."""

    num_heads: int
    head_k_dim: int
    num_v_heads: int
    head_v_dim: int

    @property
    def key_dim(self) -> int:
        """Width of q (and of k)."""
        return self.num_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        """Width of v (and of the output before out_proj)."""
        return self.num_v_heads * self.head_v_dim


class Mamba2Dims(NamedTuple):
    """Resolved Mamba2 sizes."""

    d_inner: int
    num_heads: int


def _linear_attention_dims(block: LinearAttentionConfig, hidden: int) -> LinearAttentionDims:
    dk = block.head_k_dim if block.head_k_dim is not None else hidden // block.num_heads
    if block.head_v_dim is not None:
        dv = block.head_v_dim
    else:
        dv = int(dk * (block.expand_v if block.expand_v is not None else 1.0))
    hv = block.num_v_heads if block.num_v_heads is not None else block.num_heads
    return LinearAttentionDims(block.num_heads, dk, hv, dv)


def resolve_blocks(layout: LayoutConfig, num_blocks: int) -> list[Mixer]:
    """Expand a layout into one mixer name per block.

    With a ratio r in (0, 0.5], n_attn = int(num_blocks * r) MLA blocks are spread as
    ``([mla] + [M] * (n_rec // n_attn)) * n_attn + [M] * (n_rec % n_attn)`` (Primus' allocation, so
    r = 0.25 gives mla,M,M,M repeated); for r > 0.5 the roles swap. Invalid layouts return what they
    can; :func:`model_problems` reports them.
    """
    if layout.pattern is not None:
        return list(layout.pattern)
    rec: Mixer = layout.mixer or "mla"
    n_attn = int(num_blocks * layout.hybrid_attention_ratio)
    n_rec = num_blocks - n_attn
    if n_attn == 0:
        return [rec] * num_blocks
    if n_rec == 0:
        return ["mla"] * num_blocks
    if n_attn <= n_rec:
        group: list[Mixer] = ["mla"] + [rec] * (n_rec // n_attn)
        return group * n_attn + [rec] * (n_rec % n_attn)
    group = [rec] + ["mla"] * (n_attn // n_rec)
    return group * n_rec + ["mla"] * (n_attn % n_rec)


Problem = tuple[str, str]
"""(dotted key, plain-language message)."""


_MIXERS = ("kda", "gdn", "mamba2", "mla")
_LAYOUT = ("layout.mixer", "layout.pattern", "layout.hybrid_attention_ratio")
MODEL_RELATED: dict[str, tuple[str, ...]] = {
    "layout": (*_MIXERS, *_LAYOUT, "num_blocks"),
    **dict.fromkeys(_MIXERS, ("layout", *_LAYOUT)),
    "layout.pattern": ("num_blocks", *_LAYOUT),
    "layout.mixer": _LAYOUT,
    "kda.lower_bound": ("kda.safe_gate",),
    **{
        f"{n}.{k}": ("hidden_size", f"{n}.num_heads", f"{n}.head_k_dim", f"{n}.head_v_dim",
                     f"{n}.expand_v")
        for n in ("kda", "gdn") for k in ("num_heads", "expand_v")
    },
}  # fmt: skip
"""For each key a cross-field problem of :func:`model_problems` is reported at, the other keys
whose values it depends on (relative to the model root): a problem caused by a later layer's value
(a recipe's override, a ``--set``) is blamed on that value's line, not on the key's own."""


def model_problems(m: ModelConfig) -> list[Problem]:
    """Every cross-field inconsistency of an architecture, keys relative to the model root."""
    out = _layout_problems(m) + _section_problems(m)
    for name in ("kda", "gdn"):
        block = getattr(m, name)
        if block is not None:
            out += _linear_attention_problems(name, block, m.hidden_size)
    if m.kda is not None and m.kda.safe_gate and m.kda.lower_bound is None:
        out.append(("kda.lower_bound", "safe_gate needs a lower_bound in [-5, 0)"))
    if m.mamba2 is not None:
        out += _mamba2_problems(m.mamba2, m.hidden_size)
    if m.mla is not None:
        out += _mla_problems(m.mla)
    return out


def _layout_problems(m: ModelConfig) -> list[Problem]:
    """The layout: a pattern or a mixer and ratio, one mixer per block, a recurrent mixer named."""
    out: list[Problem] = []
    lay = m.layout
    if lay.pattern is not None:
        if lay.mixer is not None or lay.hybrid_attention_ratio != 0:
            out.append(
                (
                    "layout.pattern",
                    "set either layout.pattern or layout.mixer/hybrid_attention_ratio, not both",
                )
            )
        if len(lay.pattern) != m.num_blocks:
            out.append(
                (
                    "layout.pattern",
                    f"has {len(lay.pattern)} entries but num_blocks is "
                    f"{m.num_blocks}: give one mixer per block",
                )
            )
    elif lay.mixer is None and lay.hybrid_attention_ratio < 1:
        out.append(
            (
                "layout.mixer",
                "no recurrent mixer given: set layout.mixer (kda, gdn or mamba2), "
                "layout.pattern, or hybrid_attention_ratio 1.0 for pure MLA",
            )
        )
    return out


def _section_problems(m: ModelConfig) -> list[Problem]:
    """A section for every mixer the layout uses, and none for a mixer it does not."""
    out: list[Problem] = []
    used = set(m.blocks)
    for name in ("kda", "gdn", "mamba2", "mla"):
        block = getattr(m, name)
        if name in used and block is None:
            out.append(("layout", f"the layout uses {name} but the `{name}:` section is missing"))
        if name not in used and block is not None:
            out.append(
                (
                    name,
                    f"`{name}:` is set but no block uses {name}; remove it (or set it to "
                    "null) so the preset says only what the model is",
                )
            )
    return out


def _linear_attention_problems(
    name: str, block: LinearAttentionConfig, hidden_size: int
) -> list[Problem]:
    """KDA's or GDN's head sizes: derivable, whole, value heads a multiple of key heads."""
    out: list[Problem] = []
    if block.head_k_dim is None and hidden_size % block.num_heads:
        out.append(
            (
                f"{name}.num_heads",
                f"hidden_size {hidden_size} is not divisible by "
                f"{name}.num_heads {block.num_heads}; set {name}.head_k_dim explicitly",
            )
        )
    if block.head_v_dim is not None and block.expand_v is not None:
        out.append((f"{name}.expand_v", "set head_v_dim or expand_v, not both"))
    d = _linear_attention_dims(block, hidden_size)
    if block.expand_v is not None and d.head_k_dim * block.expand_v != int(
        d.head_k_dim * block.expand_v
    ):
        out.append(
            (
                f"{name}.expand_v",
                f"head_k_dim {d.head_k_dim} * expand_v {block.expand_v} is not a whole number",
            )
        )
    if d.num_v_heads % d.num_heads:
        out.append(
            (
                f"{name}.num_v_heads",
                f"num_v_heads {d.num_v_heads} must be a multiple of "
                f"num_heads {d.num_heads} (GVA shares each key head among a whole number "
                "of value heads)",
            )
        )
    return out


def _mamba2_problems(mb: Mamba2Config, hidden_size: int) -> list[Problem]:
    """Mamba2's inner width divides into heads, and its heads into groups."""
    d_inner = mb.expand * hidden_size
    if d_inner % mb.head_dim:
        return [
            (
                "mamba2.head_dim",
                f"d_inner = expand*hidden_size = {d_inner} is not "
                f"divisible by head_dim {mb.head_dim}",
            )
        ]
    if (d_inner // mb.head_dim) % mb.num_groups:
        return [
            (
                "mamba2.num_groups",
                f"{d_inner // mb.head_dim} heads do not divide into num_groups {mb.num_groups}",
            )
        ]
    return []


def _mla_problems(mla: MLAConfig) -> list[Problem]:
    """MLA's RoPE: a ``yarn:`` section exactly with rope_type yarn, an even RoPE dimension."""
    out: list[Problem] = []
    if mla.rope_type == "yarn" and mla.yarn is None:
        out.append(("mla.yarn", "rope_type is yarn but the `yarn:` section is missing"))
    if mla.rope_type == "rope" and mla.yarn is not None:
        out.append(
            (
                "mla.yarn",
                "`yarn:` is set but rope_type is rope; remove it or use rope_type: yarn",
            )
        )
    if mla.qk_pos_emb_head_dim % 2:
        out.append(("mla.qk_pos_emb_head_dim", "RoPE dimension must be even"))
    return out


def max_sequence_length(m: ModelConfig) -> tuple[int, str]:
    """Longest sequence the model supports, and why (RoPE scaling may extend it)."""
    limit, why = m.max_position_embeddings, "max_position_embeddings"
    if m.mla is not None and m.mla.yarn is not None and m.mla.yarn.factor > 1:
        scaled = int(m.mla.yarn.original_max_position_embeddings * m.mla.yarn.factor)
        if scaled > limit:
            limit, why = scaled, "mla.yarn factor x original_max_position_embeddings"
    return limit, why
