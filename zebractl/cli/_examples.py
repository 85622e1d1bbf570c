"""Examples shown at the end of every command's ``--help`` (plain text: the app has no rich markup).

Each command's examples run as written from a checkout (shipped names, the demo dataset's paths);
tests/cli/test_frictions.py requires at least one ``zebractl ...`` line in every command's help.
"""

from __future__ import annotations

EXIT_CODES = (
    "Exit codes: 0 ok; 1 runtime failure; 2 usage or config error; 3 a check ran and failed; "
    "130 interrupted. Merge order of every value: schema default < preset < recipe < --set."
)

EXAMPLES: dict[str, tuple[str, ...]] = {
    "presets": ("zebractl presets", "zebractl presets --json"),
    "recipes": ("zebractl recipes", "zebractl recipes --json"),
    "plan": (
        "zebractl plan kda_300M",
        "zebractl plan kda_300M --set parallelism.num_gpus=1 --set batch.micro=64 --json",
        "zebractl plan zebra_mamba_8B_hybrid --fit",
        "zebractl plan recipes/kda_300M.yaml --gpu-memory 139",
    ),
    "prepare": (
        "zebractl prepare --demo -o data/demo",
        "zebractl prepare corpus/*.jsonl.gz --tokenizer tok/ -o data/mycorpus --workers 8",
        "zebractl prepare chats.jsonl --format chat --tokenizer tok/ -o data/chat --seq-length 8192",
        "zebractl prepare --verify data/mycorpus",
    ),
    "train": (
        "zebractl train tiny_kda",
        "zebractl train kda_300M --check",
        "zebractl train kda_300M --nproc 8 -o runs/kda_300M_8gpu",
        "zebractl train zebra_mamba_8B_hybrid --slurm --submit",
        "zebractl train kda_300M --init-from hf/kda_300M --set schedule.lr=1e-4",
    ),
    "warmup": (
        "zebractl warmup kda_300M",
        "zebractl warmup kda_300M --micro 32 --micro 64",
    ),
    "convert": (
        "zebractl convert runs/tiny_kda hf/tiny_kda",
        "zebractl convert runs/kda_300M hf/kda_300M_it2000 --checkpoint 2000 --dtype fp32",
        "zebractl convert hf/kda_300M ckpt/imported --to megatron",
    ),
    "verify": (
        "zebractl verify runs/tiny_kda hf/tiny_kda",
        "zebractl verify runs/kda_300M hf/kda_300M --device cpu --json",
    ),
    "eval": (
        "zebractl eval runs/tiny_kda --tasks arc_easy --limit 20",
        "zebractl eval hf/kda_300M --tasks arc_easy,piqa,hellaswag --batch-size 32",
        "zebractl eval runs/kda_300M --tasks wikitext-like -o reports/kda_300M --json",
    ),
    "generate": (
        'zebractl generate runs/tiny_kda --prompt "Once upon a time" --max-new-tokens 32',
        "zebractl generate hf/kda_300M --prompt-file prompt.txt --temperature 0.8 --top-p 0.9 --seed 1",
        'zebractl generate runs/kda_300M --prompt "The capital of France is" --stop "." --json',
    ),
    "chat": (
        "zebractl chat runs/tiny_sft",
        'zebractl chat runs/tiny_sft --system "You are terse." --chat-template chatml',
        "zebractl chat runs/tiny_sft --json < questions.txt",
    ),
    "compare": (
        "zebractl compare runs/tiny_kda --fla",
        "zebractl compare runs/kda_300M runs/kda_300M-fla-reference --assert",
        "zebractl compare runs/tiny_sft runs/tiny_hybrid -o reports/sft",
    ),
    "doctor": ("zebractl doctor", "zebractl doctor train eval --json"),
    "env": ("zebractl env", "zebractl env --json"),
    "config show": (
        "zebractl config show kda_300M",
        "zebractl config show kda_300M --set schedule.lr=3e-4 --json",
        "zebractl config show runs/tiny_kda",
    ),
    "config validate": (
        "zebractl config validate my_recipe.yaml presets/*.yaml",
        "zebractl config validate runs/tiny_kda --json",
    ),
    "config diff": (
        "zebractl config diff kda_300M gdn_300M",
        "zebractl config diff runs/tiny_kda tiny_kda",
    ),
    "schema export": ("zebractl schema export", "zebractl schema export -o schemas --check"),
}


def epilog(command: str) -> str:
    """A command's help epilog: its examples (kept as written, not re-wrapped), then the exit
    codes."""
    lines = "\n".join(f"  {line}" for line in EXAMPLES[command])
    return f"Examples:\n\n\b\n{lines}\n\n{EXIT_CODES}"
