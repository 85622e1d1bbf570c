"""`zebractl convert PRIMUS_CHECKPOINT OUT --to megatron --preset NAME`: Primus / Megatron-LM torch
checkpoints (TP = PP = 1) through their declarative table, with Transformer Engine and no-TE names;
and nothing in such a file's pickle runs.

The checkpoints are written here the way Primus writes them (primus.md §5: `iter_N/mp_rank_00/
model_optim_rng.pt` holding `{"model": ..., "args": ..., "iteration": N}`, `latest_checkpointed_
iteration.txt`), from a zebractl model with fresh random weights; the import must give back exactly
those weights.
"""

from __future__ import annotations

import argparse
import io
import os
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.config.resolve import resolve_preset  # noqa: E402
from zebractl.runtime.dist import scoped  # noqa: E402

TE = [  # no-TE name -> the name under a Transformer Engine spec (the norm fused into a linear)
    (r"(layers\.\d+)\.norm\.weight$", r"\1.mixer.in_proj.layer_norm_weight"),
    (r"(layers\.\d+)\.pre_mlp_layernorm\.weight$", r"\1.mlp.linear_fc1.layer_norm_weight"),
    (r"self_attention\.q_layernorm\.weight$", "self_attention.linear_q_up_proj.layer_norm_weight"),
    (
        r"self_attention\.kv_layernorm\.weight$",
        "self_attention.linear_kv_up_proj.layer_norm_weight",
    ),
]


class Payload:
    """An object whose unpickling would run a shell command (a hostile checkpoint)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _ours(preset: str, seed: int):
    from zebractl.model.model import build_model

    m = resolve_preset(preset).config
    with scoped():
        model = build_model(m, seed=seed)
    return m, {
        k: v.clone() for k, v in model.state_dict().items() if not k.endswith("_extra_state")
    }


def _write_primus(root, sd, m, te: bool, iteration: int = 10, extra=None):
    """A Primus save directory holding ``sd`` with Primus' names."""
    out = {}
    for k, v in sd.items():
        if k.endswith("mixer.A_log") and "kda" in m.sublayers[int(k.split(".")[2])]:
            v = v.view(1, 1, -1, 1)  # Primus' KDA A_log layout
        if te:
            if k.endswith("input_layernorm.weight"):  # TE: MLA's input norm in both down linears
                base = k.rsplit(".", 2)[0] + ".self_attention."
                out[base + "linear_q_down_proj.layer_norm_weight"] = v
                out[base + "linear_kv_down_proj.layer_norm_weight"] = v.clone()
                continue
            for pat, rep in TE:
                if re.search(pat, k) and ".mixer.norm." not in k:
                    k = re.sub(pat, rep, k)
                    break
            out[k.rsplit(".", 1)[0] + "._extra_state"] = io.BytesIO(b"te fp8 metadata")
        out[k] = v
    folder = root / f"iter_{iteration:07d}" / "mp_rank_00"
    folder.mkdir(parents=True)
    state = {
        "model": out,
        "args": argparse.Namespace(tensor_model_parallel_size=1, seq_length=2048),
        "iteration": iteration,
        "checkpoint_version": 3.0,
        **(extra or {}),
    }
    torch.save(state, folder / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(f"{iteration}\n")
    return root


def _imported(path, m):
    from zebractl.model.model import build_model
    from zebractl.run.checkpoint import load_weights

    with scoped():
        model = build_model(m, seed=0)
        load_weights(path, model)
    return {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("preset", "te"),
    [
        ("tiny_kda", True),
        ("tiny_kda", False),
        ("tiny_gdn", True),
        ("tiny_hybrid", True),
        ("tiny_hybrid", False),
        ("tiny_mamba", True),
    ],
)
def test_a_primus_checkpoint_imports_bitwise(cli, tmp_path, preset, te):
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    m, sd = _ours(preset, seed)
    src = _write_primus(tmp_path / "primus", sd, m, te)
    out = tmp_path / "imported"
    r = cli("convert", str(src), str(out), "--to", "megatron", "--preset", preset, "--json")
    assert r.exit_code == 0, r.output
    back = _imported(out / "iter_0000000", m)
    assert back.keys() == sd.keys()
    assert all(torch.equal(back[k], sd[k]) for k in sd), [
        k for k in sd if not torch.equal(back[k], sd[k])
    ]


def test_primus_refusals_name_the_problem(cli, tmp_path):
    m, sd = _ours("tiny_kda", 1)
    src = _write_primus(tmp_path / "p", sd, m, te=True)
    r = cli("convert", str(src), str(tmp_path / "o1"), "--to", "megatron")
    assert r.exit_code == 2 and "--preset NAME" in r.stderr, r.output
    r = cli("convert", str(src), str(tmp_path / "o2"), "--to", "megatron", "--preset", "tiny_gdn")
    assert r.exit_code == 2 and "does not fit tiny_gdn" in r.stderr, r.output
    assert "Traceback" not in r.output
    # the two copies of one norm disagree
    m2, sd2 = _ours("tiny_hybrid", 2)
    bad = _write_primus(tmp_path / "p2", sd2, m2, te=True)
    f = bad / "iter_0000010/mp_rank_00/model_optim_rng.pt"
    state = torch.load(f, weights_only=False)
    key = next(k for k in state["model"] if k.endswith("linear_kv_down_proj.layer_norm_weight"))
    state["model"][key] = state["model"][key] + 1
    torch.save(state, f)
    r = cli(
        "convert", str(bad), str(tmp_path / "o3"), "--to", "megatron", "--preset", "tiny_hybrid"
    )
    assert r.exit_code == 2 and "the same norm held twice" in r.stderr, r.output
    # tensor-parallel shards
    (src / "iter_0000010" / "mp_rank_01").mkdir()
    r = cli("convert", str(src), str(tmp_path / "o4"), "--to", "megatron", "--preset", "tiny_kda")
    assert r.exit_code == 2 and "TP = PP = 1" in r.stderr, r.output
    # a damaged file
    trunc = _write_primus(tmp_path / "p3", sd, m, te=False)
    f = trunc / "iter_0000010/mp_rank_00/model_optim_rng.pt"
    f.write_bytes(f.read_bytes()[:1000])
    r = cli("convert", str(trunc), str(tmp_path / "o5"), "--to", "megatron", "--preset", "tiny_kda")
    assert r.exit_code == 2 and "cannot be read as a megatron checkpoint" in r.stderr, r.output


def test_nothing_in_the_pickle_runs(cli, tmp_path):
    """A checkpoint whose pickle would run a command imports its weights and runs nothing."""
    marker = tmp_path / "pwned"
    m, sd = _ours("tiny_kda", 3)
    src = _write_primus(tmp_path / "p", sd, m, te=False, extra={"evil": Payload(str(marker))})
    r = cli("convert", str(src), str(tmp_path / "o"), "--to", "megatron", "--preset", "tiny_kda")
    assert r.exit_code == 0, r.output
    assert not marker.exists()
