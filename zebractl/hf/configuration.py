"""``ZebraConfig``: the Hugging Face config of a Zebra model (``model_type: zebra``).

The architecture is the zebractl model config itself (``zebractl_model``: the resolved
:class:`~zebractl.schemas.preset.ModelConfig`, validated when the model is built), so a folder can
never describe a model other than the one its weights belong to. The usual Hugging Face fields
(``vocab_size``, ``hidden_size``, ``num_hidden_layers``, ...) are derived from it for tools that read
them. ``mla_rope`` carries MLA's rotary frequencies, their scale and the softmax scale exactly as the
trained model computed them (RoPE or YaRN), so the Hugging Face class needs no rope arithmetic of
its own.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


class ZebraConfig(PretrainedConfig):
    """See the module docstring."""

    model_type = "zebra"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        zebractl_model: dict[str, Any] | None = None,
        mla_rope: dict[str, Any] | None = None,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        self.zebractl_model = zebractl_model or {}
        self.mla_rope = mla_rope
        m = self.zebractl_model
        if m:  # the derived fields, for tools that read them (never the other way round)
            from zebractl.schemas.preset import ModelConfig

            model = ModelConfig.model_validate(m)
            kwargs.setdefault("vocab_size", model.padded_vocab_size)
            kwargs.setdefault("hidden_size", model.hidden_size)
            kwargs.setdefault("intermediate_size", model.ffn_hidden_size)
            kwargs.setdefault("num_hidden_layers", model.num_blocks)
            kwargs.setdefault("max_position_embeddings", model.max_position_embeddings)
            kwargs.setdefault("rms_norm_eps", model.norm.eps)
            kwargs.setdefault("initializer_range", model.init_std)
            kwargs.setdefault(
                "block_types", [model.sublayers[2 * i] for i in range(model.num_blocks)]
            )
            tie_word_embeddings = model.tie_embeddings
        for key in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "max_position_embeddings",
            "rms_norm_eps",
            "initializer_range",
            "block_types",
        ):
            setattr(self, key, kwargs.pop(key, None))
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def model_config(self):
        """The zebractl :class:`~zebractl.schemas.preset.ModelConfig` this config holds."""
        from zebractl.schemas.preset import ModelConfig

        if not self.zebractl_model:
            raise ValueError("this ZebraConfig holds no zebractl_model")
        return ModelConfig.model_validate(self.zebractl_model)
