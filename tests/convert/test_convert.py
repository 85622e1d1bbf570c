"""`zebractl convert` + `zebractl verify` on tiny runs (CPU): FLA exports of pure KDA / GDN models.

Each tiny model trains a few steps on the demo corpus; the export is checked by `verify`'s four tiers
(tier 3's tolerance: max rel logit error 1e-5 in fp32, see zebractl.convert.verify), loaded by FLA's
own class in a fresh process, and damaged on purpose to see `verify` fail at the right tier.
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
"""recipe -> its run directory, trained once per test session (tests only read it)."""


@pytest.fixture
def trained(tmp_path_factory, fast):
    """trained(recipe) -> a run directory of a few steps on the demo corpus."""

    def get(recipe: str):
        if recipe not in _RUNS:
            out = tmp_path_factory.mktemp(recipe)
            with scoped():  # the in-process Trainer's process group goes with it
                fast.train(recipe, out, *STEPS)
            _RUNS[recipe] = out
        return _RUNS[recipe]

    return get


@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_gdn"])
def test_convert_then_verify_passes_every_tier(cli, trained, tmp_path, recipe):
    run = trained(recipe)
    out = tmp_path / "hf"
    r = cli("convert", str(run), str(out), "--dtype", "fp32", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["iteration"] == 3 and report["format"] == "fla"
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

    # FLA's own class loads it in a fresh process: no missing or unexpected keys
    code = (
        "import fla, sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "m, info = AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)\n"
        "bad = [*info['missing_keys'], *info['unexpected_keys']]\n"
        "print(type(m).__name__, sorted(bad))\n"
        "sys.exit(1 if bad else 0)\n"
    )
    p = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ForCausalLM []" in p.stdout


def test_bf16_export_is_bitwise_in_bf16_and_sharded_above_the_limit(trained, tmp_path):
    from zebractl.convert.hf import export_hf, read_safetensors
    from zebractl.convert.verify import verify

    run = trained("tiny_kda")
    res = export_hf(run, tmp_path / "hf", max_shard_bytes=2**20, console=lambda s: None)
    assert len(res.shards) > 1 and (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert {str(v.dtype) for v in read_safetensors(tmp_path / "hf").values()} == {"torch.bfloat16"}
    _, tiers = verify(run, tmp_path / "hf", console=lambda s: None)
    assert [t.status for t in tiers[:2]] == ["pass", "pass"], tiers


def _damaged(tmp_path, trained, how):
    from safetensors.torch import load_file, save_file

    from zebractl.convert.hf import export_hf

    run = trained("tiny_kda")
    out = tmp_path / "hf"
    export_hf(run, out, dtype="fp32", console=lambda s: None)
    f = out / "model.safetensors"
    sd = load_file(f)
    if how == "perturbed":
        k = "model.layers.0.attn.q_proj.weight"
        sd[k] = sd[k].clone()
        sd[k][0, 0] += 1e-3
        save_file(sd, f, {"format": "pt"})
    elif how == "renamed":
        sd["model.layers.0.attn.q_proj.weightX"] = sd.pop("model.layers.0.attn.q_proj.weight")
        save_file(sd, f, {"format": "pt"})
    else:
        c = json.loads((out / "config.json").read_text())
        c["norm_eps"] = c["norm_eps"] * 10
        (out / "config.json").write_text(json.dumps(c))
    return run, out


@pytest.mark.parametrize(
    ("how", "tier"), [("perturbed", "weights"), ("renamed", "structure"), ("eps", "structure")]
)
def test_a_damaged_export_fails_at_the_right_tier(cli, trained, tmp_path, how, tier):
    run, out = _damaged(tmp_path, trained, how)
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
    r = cli("convert", str(hybrid), str(tmp_path / "o3"))
    assert r.exit_code == 2 and "zebra format" in r.stderr
    assert not (tmp_path / "o3").exists()


@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_gdn"])
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


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_gdn"])
def test_gpu_verify_in_bf16_on_the_kernels(trained, tmp_path, recipe):
    """The GPU tier: a bf16 export, our model and FLA's class on their CUDA kernels (tolerance
    2e-2 relative on the logits)."""
    from zebractl.convert.hf import export_hf
    from zebractl.convert.verify import verify

    run = trained(recipe)
    export_hf(run, tmp_path / "hf", dtype="bf16", console=lambda s: None)
    _, tiers = verify(run, tmp_path / "hf", device="cuda", console=lambda s: None)
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
