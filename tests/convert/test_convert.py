"""`zebractl convert` + `zebractl verify` on tiny runs (CPU): FLA exports of pure KDA / GDN models
and ``ZebraForCausalLM`` (zebractl.hf) exports of every layout (hybrid, pure Mamba2, pure KDA).

Each tiny model trains a few steps on the demo corpus; the export is checked by `verify`'s four tiers
(tier 3's tolerance: max rel logit error 1e-5 in fp32, see zebractl.convert.verify), loaded by its
class in a fresh process (and generates there), and damaged on purpose to see `verify` fail at the
right tier.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("fla.models")
pytest.importorskip("megatron.core")

from zebractl.runtime.dist import scoped  # noqa: E402

STEPS = ["schedule.iterations=3", "checkpoint.interval=3"]


_RUNS: dict[str, object] = {}
"""recipe and extra settings -> its run directory, trained once per test session (tests only read
it)."""


@pytest.fixture
def trained(tmp_path_factory, fast):
    """trained(recipe) -> a run directory of a few steps on the demo corpus."""

    def get(recipe: str, *sets: str):
        key = " ".join((recipe, *sets))
        if key not in _RUNS:
            out = tmp_path_factory.mktemp(recipe)
            with scoped():  # the in-process Trainer's process group goes with it
                fast.train(recipe, out, *STEPS, *sets)
            _RUNS[key] = out
        return _RUNS[key]

    return get


EXPORTS = [
    ("tiny_kda", "auto", "fla"),
    ("tiny_gdn", "auto", "fla"),
    ("tiny_hybrid", "auto", "zebra"),
    ("tiny_mamba", "auto", "zebra"),
    ("tiny_kda", "zebra", "zebra"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "fmt", "written"), EXPORTS)
def test_convert_then_verify_passes_every_tier(cli, trained, tmp_path, recipe, fmt, written):
    run = trained(recipe)
    out = tmp_path / "hf"
    r = cli("convert", str(run), str(out), "--dtype", "fp32", "--format", fmt, "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["iteration"] == 3 and report["format"] == written
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "README.md",
        "tokenizer.json",
    } <= set(report["files"])
    v = cli("verify", str(run), str(out), "--json")
    assert v.exit_code == 0, v.output
    import torch.distributed as dist

    assert not dist.is_initialized()  # convert and verify leave no process group behind
    doc = json.loads(v.stdout)
    assert doc["ok"] and [t["status"] for t in doc["tiers"]] == ["pass"] * 4
    assert doc["tiers"][2]["metrics"]["max_rel_err"] <= 1e-5

    # its class loads it in a fresh process (after the import the model card names): no missing
    # or unexpected keys; and it generates there
    register = "fla" if written == "fla" else "zebractl.hf"
    assert f"import {register}" in (out / "README.md").read_text()
    code = (
        f"import {register}, sys, torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "m, info = AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)\n"
        "bad = [*info['missing_keys'], *info['unexpected_keys']]\n"
        "print(type(m).__name__, sorted(bad))\n"
        "ids = AutoTokenizer.from_pretrained(sys.argv[1])('The cat', return_tensors='pt').input_ids\n"
        "out = m.generate(ids, max_new_tokens=4, do_sample=False, use_cache=False, pad_token_id=0)\n"
        "print('generated', out.shape[1] - ids.shape[1])\n"
        "sys.exit(1 if bad else 0)\n"
    )
    if written == "fla":  # FLA's classes on CPU: through FLA's references
        code = code.replace(
            "out = m.generate",
            "from zebractl.runtime.fla_cpu import on_cpu\nwith on_cpu():\n    out = m.generate",
        )
    p = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ForCausalLM []" in p.stdout and "generated 4" in p.stdout, p.stdout


def test_bf16_export_is_bitwise_in_bf16_and_sharded_above_the_limit(trained, tmp_path):
    from zebractl.convert.hf import export_hf
    from zebractl.convert.verify import verify_conversion
    from zebractl.hf.load import read_safetensors

    run = trained("tiny_kda")
    res = export_hf(run, tmp_path / "hf", max_shard_bytes=2**20, console=lambda s: None)
    assert len(res.shards) > 1 and (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert {str(v.dtype) for v in read_safetensors(tmp_path / "hf").values()} == {"torch.bfloat16"}
    tiers = verify_conversion(run, tmp_path / "hf", console=lambda s: None).tiers
    assert [t.status for t in tiers[:2]] == ["pass", "pass"], tiers


def _damaged(tmp_path, trained, how, recipe="tiny_kda"):
    from safetensors.torch import load_file, save_file

    from zebractl.convert.hf import export_hf

    run = trained(recipe)
    out = tmp_path / "hf"
    export_hf(run, out, dtype="fp32", console=lambda s: None)
    f = out / "model.safetensors"
    sd = load_file(f)
    # tiny_hybrid's block 0 is its MLA (DeepSeek-V3 names), the others KDA (FLA's names)
    k = "model.layers.0.attn.kv_b_proj.weight" if recipe == "tiny_hybrid" else None
    k = k or "model.layers.0.attn.q_proj.weight"
    if how == "perturbed":
        sd[k] = sd[k].clone()
        sd[k][0, 0] += 1e-3
        save_file(sd, f, {"format": "pt"})
    elif how == "renamed":
        sd[k + "X"] = sd.pop(k)
        save_file(sd, f, {"format": "pt"})
    else:
        c = json.loads((out / "config.json").read_text())
        if "zebractl_model" in c and c.get("model_type") == "zebra":
            c["zebractl_model"]["norm"]["eps"] *= 10  # ZebraConfig's source of truth
        else:
            c["norm_eps"] = c["norm_eps"] * 10
        (out / "config.json").write_text(json.dumps(c))
    return run, out


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_hybrid"])
@pytest.mark.parametrize(
    ("how", "tier"), [("perturbed", "weights"), ("renamed", "structure"), ("eps", "structure")]
)
def test_a_damaged_export_fails_at_the_right_tier(cli, trained, tmp_path, how, tier, recipe):
    run, out = _damaged(tmp_path, trained, how, recipe)
    v = cli("verify", str(run), str(out), "--json")
    assert v.exit_code == 3, v.output
    doc = json.loads(v.stdout)
    assert doc["first_failure"] == tier, doc
    assert f"tier {tier} failed" in v.stderr


def test_convert_refuses_what_it_cannot_do(cli, trained, tmp_path):
    run = trained("tiny_kda")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    cases = {
        ("--to", "megatron"): "not a Hugging Face folder (no config.json",
        ("--to", "onnx"): "expected hf or megatron",
        ("--dtype", "fp16"): "--dtype fp16",
        ("--iteration", "7"): "no checkpoint of iteration 7",
    }
    for extra, message in cases.items():
        r = cli("convert", str(run), str(tmp_path / "o"), *extra)
        assert r.exit_code == 2 and message in r.stderr, (extra, r.output)
    r = cli("convert", str(run), str(tmp_path / "full"))
    assert r.exit_code == 2 and "not an empty folder" in r.stderr
    r = cli("convert", str(tmp_path / "nothing"), str(tmp_path / "o2"))
    assert r.exit_code == 2 and "no such run directory" in r.stderr
    hybrid = trained("tiny_hybrid")
    r = cli("convert", str(hybrid), str(tmp_path / "o3"), "--format", "fla")
    assert r.exit_code == 2 and "FLA has classes for pure KDA and pure GDN" in r.stderr
    assert not (tmp_path / "o3").exists()


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_gdn", "tiny_hybrid", "tiny_mamba"])
def test_import_back_and_init_from_give_the_first_loss_of_the_original(
    cli, fast, trained, tmp_path, recipe
):
    """export (fp32) -> import -> --init-from: the same first loss as --init-from the original
    checkpoint; --init-from the HF folder directly too."""
    run = trained(recipe)
    hf_dir, imported = tmp_path / "hf", tmp_path / "imported"
    assert cli("convert", str(run), str(hf_dir), "--dtype", "fp32").exit_code == 0
    r = cli("convert", str(hf_dir), str(imported), "--to", "megatron", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["format"] == "megatron"
    first = {}
    for name, source in (("original", run), ("imported", imported), ("hf", hf_dir)):
        out = tmp_path / f"again_{name}"
        with scoped():
            fast.train(recipe, out, "schedule.iterations=2", init_from=source)
        first[name] = fast.losses(out)[1]
    assert first["imported"] == first["original"] == first["hf"], first


def test_import_refuses_a_folder_that_does_not_fit(cli, fast, trained, tmp_path):
    run = trained("tiny_kda")
    hf_dir = tmp_path / "hf"
    assert cli("convert", str(run), str(hf_dir), "--dtype", "fp32").exit_code == 0
    r = cli("convert", str(hf_dir), str(tmp_path / "o"), "--to", "megatron", "--preset", "tiny_gdn")
    assert r.exit_code == 2 and "does not fit the model" in r.stderr, r.output
    c = json.loads((hf_dir / "config.json").read_text())
    del c["zebractl_model"]
    (hf_dir / "config.json").write_text(json.dumps(c))
    r = cli("convert", str(hf_dir), str(tmp_path / "o"), "--to", "megatron")
    assert r.exit_code == 2 and "--preset NAME" in r.stderr, r.output
    r = cli("convert", str(hf_dir), str(tmp_path / "o"), "--to", "megatron", "--preset", "tiny_kda")
    assert r.exit_code == 0, r.output
    with scoped():  # the in-process Trainer's process group goes with it
        r = cli(
            "train",
            "tiny_gdn",
            *fast.args("schedule.iterations=2"),
            "--init-from",
            str(hf_dir),
            "--output",
            str(tmp_path / "wrong"),
        )
    assert r.exit_code == 2 and "does not fit the model" in r.stderr, r.output


@pytest.mark.parametrize("damage", ["truncated", "not_json", "bad_index", "no_weights"])
def test_verify_names_a_damaged_file_with_exit_2(cli, trained, tmp_path, damage):
    """Files damaged after the fact are input errors (exit 2, naming the file), never tracebacks."""
    from zebractl.convert.hf import export_hf

    run = trained("tiny_kda")
    out = tmp_path / "hf"
    export_hf(run, out, dtype="fp32", console=lambda s: None)
    weights = out / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
        name = "model.safetensors"
    elif damage == "not_json":
        (out / "config.json").write_text("{not json")
        name = "config.json"
    elif damage == "bad_index":
        (out / "model.safetensors.index.json").write_text("[]")
        name = "model.safetensors.index.json"
    else:
        weights.unlink()
        name = "model.safetensors"  # "no model.safetensors" / "not a Hugging Face folder (... safetensors)"
    for argv in (
        ["verify", str(run), str(out)],
        ["convert", str(out), str(tmp_path / "m"), "--to", "megatron"],
    ):
        r = cli(*argv)
        assert r.exit_code == 2, (argv, r.output)
        assert name in r.stderr and "Traceback" not in r.output, r.output


GPU_HEADS = {
    "tiny_kda": ["model.kda.head_k_dim=32", "model.kda.head_v_dim=64"],
    "tiny_gdn": ["model.gdn.head_k_dim=64", "model.gdn.head_v_dim=64"],
    "tiny_hybrid": ["model.kda.head_k_dim=32", "model.kda.head_v_dim=64"],
    "tiny_mamba": ["model.mamba2.head_dim=64", "model.mamba2.state_dim=64"],
}
"""The shipped 300M models' head sizes for the tiny models on FLA's kernels: on an H200 (2026-12-01,
1ad596d) tiny_kda, tiny_gdn and tiny_hybrid failed this test at their CPU head sizes (16; cause not
read), and FLA's kernels are what the shipped models run at these sizes."""


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_gdn", "tiny_hybrid", "tiny_mamba"])
def test_gpu_verify_in_bf16_on_the_kernels(trained, tmp_path, recipe):
    """The GPU tier: a bf16 export, our model and its class (FLA's, or ZebraForCausalLM for the
    hybrid and Mamba2) on their CUDA kernels (tolerance 2e-2 relative on the logits).

    The run that provides the weights trains on PyTorch's ops (``kernels.backend=torch``): what
    is tested is the export and the two models' forwards on FLA's kernels (verify builds ours with
    the FLA backend on CUDA, whatever the run trained with), not the training; training on FLA
    compiled and autotuned every forward and backward kernel at these tiny shapes (none is in the
    shipped tuned set), plus a TileLang nvcc build (~30 s) for KDA's backward, for each model."""
    from zebractl.convert.hf import export_hf
    from zebractl.convert.verify import verify_conversion

    run = trained(recipe, *GPU_HEADS[recipe], "kernels.backend=torch")
    export_hf(run, tmp_path / "hf", dtype="bf16", console=lambda s: None)
    tiers = verify_conversion(run, tmp_path / "hf", device="cuda", console=lambda s: None).tiers
    print({t.name: (t.status, t.detail) for t in tiers})
    assert [t.status for t in tiers[:3]] == ["pass"] * 3, tiers


def test_verify_refuses_token_counts_out_of_bounds(cli, trained, tmp_path):
    from zebractl.convert.hf import export_hf

    run = trained("tiny_kda")
    export_hf(run, tmp_path / "hf", console=lambda s: None)
    for n in ("0", "1", "1000000000", "-5"):
        r = cli("verify", str(run), str(tmp_path / "hf"), "--tokens", n)
        assert r.exit_code == 2 and "--tokens must be between 2 and" in r.stderr, (n, r.output)


def test_bitwise_comparison_sees_nan_bits_and_dtypes():
    import torch

    from zebractl.convert.verify import _bitwise_equal

    a = torch.tensor([1.0, float("nan")])
    assert _bitwise_equal(a, a.clone()) and not torch.equal(a, a.clone())
    assert not _bitwise_equal(a, a.double()) and not _bitwise_equal(a, torch.tensor([1.0, 2.0]))
    assert not _bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))


def test_real_tokens_of_the_held_out_split_and_a_run_that_held_nothing_out(trained):
    import torch

    from zebractl.convert.hf import open_source
    from zebractl.convert.verify import real_tokens
    from zebractl.errors import ConfigError

    cfg = open_source(trained("tiny_kda")).cfg  # tiny_kda holds out 2% (data.split [98, 2, 0])
    first, held = real_tokens(cfg, 64), real_tokens(cfg, 64, held_out=True)
    assert first.shape == held.shape == (1, 64) and not torch.equal(first, held)
    none = cfg.model_copy(update={"data": cfg.data.model_copy(update={"split": [100, 0, 0]})})
    with pytest.raises(ConfigError, match="held no data out"):
        real_tokens(none, 64, held_out=True)
