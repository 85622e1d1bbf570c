"""Bad configs: each must fail with exit code 2, a message naming the key path, the file and line
that set it (or `--set`), a suggestion where one exists, and never a traceback."""

from __future__ import annotations

import pytest

TINY_RECIPE_BODY = """
data:
  paths: [{path: data/demo}]
  seq_length: 128
  tokenizer: tok
batch: {micro: 2, global: 4}
schedule: {lr: 1.0e-3, iterations: 10}
"""

TINY_PRESET = """
vocab_size: 256
hidden_size: 64
ffn_hidden_size: 128
num_blocks: 2
layout: {mixer: kda}
max_position_embeddings: 512
kda: {num_heads: 2, head_k_dim: 16, head_v_dim: 32}
"""

# (id, {file: text}, argv, [expected substrings])
CASES = [
    (
        "bases-instead-of-extends",
        {"p.yaml": "bases: kda_300M\nhidden_size: 64\n"},
        ["config", "validate", "p.yaml"],
        [
            "p.yaml:1: bases: unknown key 'bases'",
            "exactly one inheritance key",
            "did you mean 'extends'?",
        ],
    ),
    (
        "bases-in-recipe",
        {"r.yaml": "bases: tiny_kda\npreset: tiny_kda\n" + TINY_RECIPE_BODY},
        ["config", "validate", "r.yaml"],
        ["r.yaml:1: bases: unknown key 'bases'", "did you mean 'extends'?"],
    ),
    (
        "misspelled-eps-in-recipe",
        {"r.yaml": "preset: tiny_kda\nmodel:\n  norm:\n    epsilon: 1.0e-6\n" + TINY_RECIPE_BODY},
        ["plan", "r.yaml"],
        ["r.yaml:4: model.norm.epsilon: unknown key 'epsilon' (did you mean 'eps'?)"],
    ),
    (
        "misspelled-eps-in-preset",
        {"p.yaml": TINY_PRESET + "norm:\n  epss: 1.0e-6\n"},
        ["config", "validate", "p.yaml"],
        ["p.yaml:9: norm.epss: unknown key 'epss' (did you mean 'eps'?)"],
    ),
    (
        "dropout-as-string",
        {"r.yaml": "preset: tiny_kda\nmodel:\n  dropout:\n    hidden: '0.1'\n" + TINY_RECIPE_BODY},
        ["config", "show", "r.yaml"],
        ["r.yaml:4: model.dropout.hidden: expected a number, got '0.1' (str)"],
    ),
    (
        "global-batch-does-not-divide",
        {
            "r.yaml": "preset: tiny_kda\nparallelism: {num_gpus: 2}\n"
            + TINY_RECIPE_BODY.replace("{micro: 2, global: 4}", "{micro: 3, global: 10}")
        },
        ["plan", "r.yaml"],
        [
            "r.yaml:8: batch.global: global batch 10 is not a multiple of micro batch 3 x "
            "data-parallel size 2 = 6"
        ],
    ),
    (
        "pattern-wrong-length",
        {
            "p.yaml": TINY_PRESET.replace(
                "layout: {mixer: kda}", "layout: {pattern: [kda, kda, kda]}"
            )
        },
        ["config", "validate", "p.yaml"],
        ["p.yaml:5: layout.pattern: has 3 entries but num_blocks is 2"],
    ),
    (
        "missing-mla-rank",
        {
            "p.yaml": TINY_PRESET.replace("layout: {mixer: kda}", "layout: {pattern: [mla, kda]}")
            + "mla:\n  num_heads: 4\n  kv_lora_rank: 16\n  qk_head_dim: 16\n  qk_pos_emb_head_dim: 8\n"
            "  v_head_dim: 16\n  rope_base: 10000.0\n  rope_type: rope\n"
        },
        ["config", "validate", "p.yaml"],
        ["p.yaml:8: mla.q_lora_rank: required key is missing"],
    ),
    (
        "negative-eps",
        {"p.yaml": TINY_PRESET + "norm:\n  eps: -1e-6\n"},
        ["config", "validate", "p.yaml"],
        ["p.yaml:9: norm.eps: must be > 0.0, got -1e-06 (float)"],
    ),
    (
        "misspelled-section",
        {"r.yaml": "preset: tiny_kda\noptimiser: {eps: 1e-8}\n" + TINY_RECIPE_BODY},
        ["plan", "r.yaml"],
        ["r.yaml:2: optimiser: unknown key 'optimiser' (did you mean 'optimizer'?)"],
    ),
    (
        "min-lr-above-lr",
        {
            "r.yaml": "preset: tiny_kda\n"
            + TINY_RECIPE_BODY.replace(
                "{lr: 1.0e-3, iterations: 10}", "{lr: 1.0e-3, min_lr: 1.0e-2, iterations: 10}"
            )
        },
        ["plan", "r.yaml"],
        ["r.yaml:8: schedule.min_lr: min_lr 0.01 is larger than lr 0.001"],
    ),
    (
        "warmup-longer-than-run",
        {
            "r.yaml": "preset: tiny_kda\n"
            + TINY_RECIPE_BODY.replace("iterations: 10}", "iterations: 10, warmup_iterations: 20}")
        },
        ["plan", "r.yaml"],
        ["r.yaml:8: schedule.warmup_iterations: warmup 20 is longer than the run (10 iterations)"],
    ),
    (
        "seq-length-beyond-max-positions",
        {
            "r.yaml": "preset: tiny_kda\n"
            + TINY_RECIPE_BODY.replace("seq_length: 128", "seq_length: 4096")
        },
        ["plan", "r.yaml"],
        [
            "r.yaml:5: data.seq_length: seq_length 4096 exceeds the model's max_position_embeddings "
            "(2048)"
        ],
    ),
    (
        "hidden-not-divisible-by-heads",
        {
            "p.yaml": TINY_PRESET.replace(
                "{num_heads: 2, head_k_dim: 16, head_v_dim: 32}", "{num_heads: 3, head_v_dim: 32}"
            )
        },
        ["config", "validate", "p.yaml"],
        ["p.yaml:7: kda.num_heads: hidden_size 64 is not divisible by kda.num_heads 3"],
    ),
    (
        "gva-ratio",
        {
            "p.yaml": TINY_PRESET.replace(
                "{num_heads: 2, head_k_dim: 16, head_v_dim: 32}",
                "{num_heads: 2, head_k_dim: 16, head_v_dim: 32, num_v_heads: 3}",
            )
        },
        ["config", "validate", "p.yaml"],
        ["p.yaml:7: kda.num_v_heads: num_v_heads 3 must be a multiple of num_heads 2"],
    ),
    (
        "mamba-heads-vs-groups",
        {
            "p.yaml": TINY_PRESET.replace(
                "layout: {mixer: kda}", "layout: {mixer: mamba2}"
            ).replace(
                "kda: {num_heads: 2, head_k_dim: 16, head_v_dim: 32}",
                "mamba2: {state_dim: 16, head_dim: 16, num_groups: 3, expand: 2}",
            )
        },
        ["config", "validate", "p.yaml"],
        ["p.yaml:7: mamba2.num_groups: 8 heads do not divide into num_groups 3"],
    ),
    (
        "layers-vs-pp",
        {"r.yaml": "preset: tiny_kda\nparallelism: {num_gpus: 3, pp: 3}\n" + TINY_RECIPE_BODY},
        ["plan", "r.yaml"],
        ["parallelism.pp: 4 sublayers (2 blocks) do not split evenly into 3 pipeline stages"],
    ),
    (
        "gpus-vs-model-parallel",
        {"r.yaml": "preset: tiny_kda\nparallelism: {num_gpus: 3, cp: 2}\n" + TINY_RECIPE_BODY},
        ["plan", "r.yaml"],
        ["r.yaml:2: parallelism.num_gpus: num_gpus 3 is not divisible by tp*pp*cp"],
    ),
    (
        "mixer-typo",
        {"p.yaml": TINY_PRESET.replace("layout: {mixer: kda}", "layout: {mixer: kdaa}")},
        ["config", "validate", "p.yaml"],
        [
            "p.yaml:5: layout.mixer: expected one of 'kda', 'gdn' or 'mamba2', got 'kdaa' (str)",
            "(did you mean 'kda'?)",
        ],
    ),
    (
        "yes-is-not-a-boolean",
        {"p.yaml": TINY_PRESET + "tie_embeddings: yes\n"},
        ["config", "validate", "p.yaml"],
        ["p.yaml:8: tie_embeddings: expected true or false, got 'yes' (str)"],
    ),
    (
        "float-for-integer",
        {"p.yaml": TINY_PRESET.replace("num_blocks: 2", "num_blocks: 2.5")},
        ["config", "validate", "p.yaml"],
        ["p.yaml:4: num_blocks: expected an integer, got 2.5"],
    ),
    (
        "iterations-and-token-budget",
        {
            "r.yaml": "preset: tiny_kda\n"
            + TINY_RECIPE_BODY.replace("iterations: 10}", "iterations: 10, train_tokens: 100000}")
        },
        ["plan", "r.yaml"],
        [
            "r.yaml:8: schedule.iterations: set exactly one of schedule.iterations and "
            "schedule.train_tokens"
        ],
    ),
    (
        "unknown-preset-name",
        {"r.yaml": "preset: kda_300m\n" + TINY_RECIPE_BODY},
        ["plan", "r.yaml"],
        ["r.yaml:1: preset: no preset named 'kda_300m' (did you mean 'kda_300M'?)"],
    ),
    (
        "extends-cycle",
        {"a.yaml": "extends: b.yaml\n" + TINY_PRESET, "b.yaml": "extends: a.yaml\n"},
        ["config", "validate", "a.yaml"],
        ["`extends` cycle: a.yaml -> b.yaml -> a.yaml"],
    ),
    (
        "extends-list",
        {"p.yaml": "extends: [tiny_kda, tiny_gdn]\n"},
        ["config", "validate", "p.yaml"],
        [
            "p.yaml:1: extends: expected the name or path of one preset, got ['tiny_kda', 'tiny_gdn']"
        ],
    ),
    (
        "set-unknown-key",
        {},
        ["plan", "tiny_kda", "--set", "schedule.lrr=1e-3"],
        ["--set: schedule.lrr: unknown key 'lrr' (did you mean 'lr'?)"],
    ),
    (
        "set-malformed",
        {},
        ["plan", "tiny_kda", "--set", "schedule.lr"],
        ["--set 'schedule.lr': expected dotted.key=value"],
    ),
    (
        "set-wrong-type",
        {},
        ["config", "show", "tiny_kda", "--set", "model.norm.eps=small"],
        ["--set: model.norm.eps: expected a number, got 'small' (str)"],
    ),
    (
        "set-through-a-value",
        {},
        ["plan", "tiny_kda", "--set", "seed.x=1"],
        ["--set 'seed.x=1': seed is a value, not a section"],
    ),
    (
        "duplicate-key",
        {"p.yaml": TINY_PRESET + "hidden_size: 128\n"},
        ["config", "validate", "p.yaml"],
        ["p.yaml:8: hidden_size: duplicate key (first set on line 2)"],
    ),
    (
        "invalid-yaml",
        {"p.yaml": "hidden_size: [64\nvocab_size: 3\n"},
        ["config", "validate", "p.yaml"],
        ["p.yaml:", "invalid YAML"],
    ),
    (
        "section-missing-for-mixer",
        {"p.yaml": TINY_PRESET.replace("layout: {mixer: kda}", "layout: {mixer: gdn}")},
        ["config", "validate", "p.yaml"],
        [
            "p.yaml:5: layout: the layout uses gdn but the `gdn:` section is missing",
            "p.yaml:7: kda: `kda:` is set but no block uses kda",
        ],
    ),
    (
        "yarn-without-parameters",
        {
            "p.yaml": TINY_PRESET.replace("layout: {mixer: kda}", "layout: {pattern: [mla, kda]}")
            + "mla: {num_heads: 4, q_lora_rank: 8, kv_lora_rank: 16, qk_head_dim: 16,\n"
            "      qk_pos_emb_head_dim: 8, v_head_dim: 16, rope_base: 1.0e4, rope_type: yarn}\n"
        },
        ["config", "validate", "p.yaml"],
        ["p.yaml:8: mla.yarn: rope_type is yarn but the `yarn:` section is missing"],
    ),
    (
        "tp-with-kda",
        {"r.yaml": "preset: tiny_kda\nparallelism: {num_gpus: 2, tp: 2}\n" + TINY_RECIPE_BODY},
        ["plan", "r.yaml"],
        ["r.yaml:2: parallelism.tp: KDA's fused f_a/g_a bottleneck"],
    ),
    (
        "recipe-without-preset",
        {"r.yaml": "schedule: {lr: 1.0e-3, iterations: 3}\n"},
        ["plan", "r.yaml"],
        ["r.yaml: preset: required key is missing"],
    ),
    (
        "model-not-a-mapping",
        {"r.yaml": "preset: tiny_kda\nmodel: 3\n" + TINY_RECIPE_BODY},
        ["plan", "r.yaml"],
        ["r.yaml:2: model: expected a mapping of keys to values, got 3 (int)"],
    ),
    (
        "unknown-recipe-name",
        {},
        ["plan", "tiny_kdaa"],
        ["no recipe named 'tiny_kdaa' (did you mean 'tiny_kda'?)"],
    ),
]


@pytest.mark.parametrize(
    ("files", "argv", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_config_exits_2_with_location(cli, write, files, argv, expected):
    for name, text in files.items():
        write(name, text)
    result = cli(*argv)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    for fragment in expected:
        assert fragment in result.stderr, f"{fragment!r} not in:\n{result.stderr}"


def test_at_least_25_cases():
    assert len(CASES) >= 25
    assert len({c[0] for c in CASES}) == len(CASES)


def test_verbose_shows_traceback_for_config_errors(cli, write):
    write("p.yaml", "bases: kda_300M\n")
    verbose = cli("-v", "config", "show", "p.yaml")
    assert verbose.exit_code == 2
    assert "Traceback (most recent call last)" in verbose.stderr
    assert "zebractl.errors.ConfigError: p.yaml:1: bases" in verbose.stderr
    quiet = cli("config", "show", "p.yaml")
    assert quiet.exit_code == 2 and "p.yaml:1: bases: unknown key" in quiet.stderr
    assert "Traceback" not in quiet.stderr + quiet.stdout
