"""Building and running a model leaves the process as it found it: no process group, megatron's
parallel state untouched, megatron's patches scoped; and what still needs a process group gets one
from the caller (the ``process_group`` fixture here)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.config.resolve import resolve_preset  # noqa: E402
from zebractl.model.model import build_model  # noqa: E402
from zebractl.runtime import megatron_compat  # noqa: E402


def _assert_untouched(before: dict, after: dict) -> None:
    assert before["torch.distributed initialised"] is False
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    if "megatron parallel state" in changed:
        b, a = changed.pop("megatron parallel state")
        changed["megatron parallel state"] = {k: (b.get(k), a.get(k)) for k in b if b[k] != a[k]}
    assert not changed, changed


@pytest.mark.slow
def test_building_on_meta_and_cpu_and_running_has_no_process_wide_side_effects(process_state):
    before, after = process_state(
        """
        from zebractl.config.resolve import resolve_preset
        from zebractl.model.model import build_model

        for name in ("kda_300M", "zebra_mamba_300M_hybrid"):  # YaRN MLA
            build_model(resolve_preset(name).config, device="meta")
        m = resolve_preset("tiny_hybrid").config  # RoPE MLA
        model = build_model(m)
        ids = torch.randint(0, m.vocab_size, (2, 24))
        loss, tokens = model(ids, labels=ids)
        loss.backward()
        """
    )
    _assert_untouched(before, after)


def test_patches_are_scoped_and_restored():
    import megatron.core.transformer.multi_latent_attention as mla

    saved = (torch.cuda.current_device, torch.cuda.synchronize, mla.HAVE_TE)
    with megatron_compat.patched():
        if not megatron_compat.have_transformer_engine():
            assert mla.HAVE_TE is False
        if not torch.cuda.is_available():
            assert torch.cuda.current_device() == "cpu"
            torch.cuda.synchronize()  # a no-op
        with megatron_compat.patched():  # re-entrant
            pass
        if not megatron_compat.have_transformer_engine():
            assert mla.HAVE_TE is False
    assert (torch.cuda.current_device, torch.cuda.synchronize, mla.HAVE_TE) == saved
    with pytest.raises(ValueError, match="boom"), megatron_compat.patched():
        raise ValueError("boom")
    assert (torch.cuda.current_device, torch.cuda.synchronize, mla.HAVE_TE) == saved


@pytest.mark.parametrize("rope_type", ["rope", "yarn"])
def test_rotary_table_equals_megatrons_bitwise(rope_type):
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
        YarnRotaryEmbedding,
    )

    from zebractl.model.attention import RotaryTable

    with megatron_compat.patched():
        if rope_type == "rope":
            theirs = RotaryEmbedding(24, rotary_percent=1.0, rotary_base=1234)
        else:
            theirs = YarnRotaryEmbedding(
                24,
                rotary_base=1234.0,
                scaling_factor=4.0,
                original_max_position_embeddings=64,
                beta_fast=16.0,
                beta_slow=2.0,
                mscale=1.5,
                mscale_all_dim=0.5,
            )
        ours = RotaryTable(theirs)
        for length, offset in ((1, 0), (37, 0), (300, 5)):
            expected = theirs(length, offset)
            got = ours(length, offset)
            if rope_type == "yarn":
                assert got[1] == expected[1] != 1.0  # the mscale
                expected, got = expected[0], got[0]
            assert got.dtype == torch.float32 and torch.equal(got, expected), (length, offset)


def test_rotary_table_follows_the_model_device_never_its_dtype():
    m = resolve_preset("tiny_hybrid").config
    model = build_model(m)
    table = model.decoder.layers[0].self_attention.rotary_pos_emb
    reference = table.inv_freq.clone()
    model.to(torch.bfloat16)
    assert table.inv_freq.dtype == torch.float32 and torch.equal(table.inv_freq, reference)
    model.to("meta")
    assert table.inv_freq.is_meta
    assert (
        build_model(m, device="meta")
        .decoder.layers[0]
        .self_attention.rotary_pos_emb.inv_freq.is_meta
    )


def test_sharded_checkpoint_of_a_model_built_without_a_process_group(request, tmp_path):
    """The model runs without a process group; a torch_dist checkpoint needs the caller's."""
    from megatron.core import dist_checkpointing, parallel_state

    m = resolve_preset("tiny_hybrid").config
    model = build_model(m, seed=3)
    assert not torch.distributed.is_initialized()
    request.getfixturevalue("process_group")
    md = {
        "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True),
        "singleton_local_shards": False,
        "chained_optim_avoid_prefix": True,
    }
    with megatron_compat.patched():  # the writer synchronises CUDA
        dist_checkpointing.save({"model": model.sharded_state_dict(metadata=md)}, str(tmp_path))
    other = build_model(m, seed=4)
    loaded = dist_checkpointing.load(
        {"model": other.sharded_state_dict(metadata=md)}, str(tmp_path)
    )
    other.load_state_dict(loaded["model"], strict=False)
    for (k, v), w in zip(model.state_dict().items(), other.state_dict().values(), strict=True):
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, w), k


def test_a_model_built_inside_the_callers_process_group_uses_its_groups(process_group):
    """Training builds after setting up its process group: the model takes those groups."""
    from megatron.core import parallel_state

    m = resolve_preset("tiny_hybrid").config
    model = build_model(m)
    tp = parallel_state.get_tensor_model_parallel_group()
    assert model.tp_group is tp and model.embedding.word_embeddings.tp_group is tp
    attn = model.decoder.layers[0].self_attention
    assert attn.pg_collection.cp is parallel_state.get_context_parallel_group()
    assert attn.linear_proj.tp_group is tp and attn.linear_kv_up_proj.tp_group is tp
    ids = torch.randint(0, m.vocab_size, (2, 24))
    loss, _ = model(ids, labels=ids)
    loss.backward()  # warnings are errors: no implicit-group deprecation on the way
    assert all(p.grad is not None for p in model.parameters())
