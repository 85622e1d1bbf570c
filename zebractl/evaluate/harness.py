"""`zebractl eval`: lm-evaluation-harness, as a library, on any model and offline.

MODEL is a Hugging Face folder (any ``AutoModelForCausalLM``: our exports after ``import
zebractl.hf``, FLA's after ``import fla``, plain transformers models) or a zebractl run directory /
checkpoint, converted in memory to ``ZebraForCausalLM`` (no folder written). lm-eval's ``HFLM``
wraps the model object and its tokenizer; the tasks are :mod:`zebractl.evaluate.tasks`' YAMLs, written
to ``OUTPUT/eval/tasks/`` (the same folder a plain ``lm_eval --include_path`` run can read).

``OUTPUT/eval/results.json`` is an :class:`~zebractl.schemas.reports.EvalReport`: per task the
metrics with their standard errors and sample counts, the data's sha256, the model's fingerprint
(sha256 over its weights), dtype, batch size, max length, lm-eval's version and the wall time. A
later call with the same fingerprint and settings reuses the tasks it already holds (``force``
re-runs them).

One writer per run directory: :func:`evaluate` holds the lock (:mod:`zebractl.run.lock`) of the run
directory it writes ``eval/`` into (of OUTPUT itself when it is in no run) while it works. When
that run is tracked by W&B (``logging.wandb``: ``RUN/wandb.json``), the results are added to its W&B
run (:func:`zebractl.run.tracking.attach_eval`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zebractl.errors import ConfigError, first_line
from zebractl.evaluate import results as R
from zebractl.evaluate import tasks as T

DEFAULT_MAX_LENGTH = 2048
"""max_length for a Hugging Face folder (a run uses its training sequence length)."""
WIKI_MAX_DOCS = 1000
"""wikitext-like scores at most this many held-out documents (fewer with --limit)."""
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass
class Loaded:
    """The model under evaluation and what identifies it."""

    model: Any
    tokenizer: Any
    source: str  # "hf" | "run"
    model_class: str
    fingerprint: str
    max_length: int
    cfg: Any = None  # the run's RunConfig (a run or checkpoint)
    run_root: Path | None = None  # the run's directory (a run or checkpoint)
    iteration: int | None = None
    fla_on_cpu: bool = False  # FLA's classes on CPU: through FLA's naive torch code


def fingerprint(model: Any) -> str:
    """sha256 over the model's tensors (sorted names; name, dtype, shape and bytes of each)."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        if not isinstance(t, torch.Tensor):
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _dtype(name: str, device: str) -> Any:
    import torch

    if name == "auto":
        name = "bf16" if device == "cuda" else "fp32"
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name], name


def _tokenizer(folder: Path, what: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # noqa: BLE001 - a folder without a usable tokenizer is a usage error
        first = first_line(exc)
        raise ConfigError(
            f"{folder}: no tokenizer for {what} ({type(exc).__name__}: {first})"
        ) from None


def open_model(
    path: Path, *, device: str, dtype: str, iteration: int | str | None = None, console=print
) -> tuple[Loaded, str]:
    """Load MODEL (see the module docstring); returns it and the dtype's name."""
    import torch

    from zebractl.convert import hf as H
    from zebractl.hf.load import is_hf_folder

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such model folder, run directory or checkpoint")
    if is_hf_folder(path):
        if iteration is not None:
            raise ConfigError("--checkpoint applies to a run directory, not a Hugging Face folder")
        try:
            config = json.loads((path / "config.json").read_text())
        except ValueError as exc:
            raise ConfigError(f"{path / 'config.json'}: not JSON ({exc})") from None
        model_type = config.get("model_type") if isinstance(config, dict) else None
        fla_types = ("kda", "gated_deltanet")
        if model_type in fla_types:
            from zebractl.runtime.fla_import import whole

            whole()  # registers FLA's classes with the auto classes
        elif model_type == "zebra":
            import zebractl.hf  # noqa: F401 - registers ZebraForCausalLM
        from transformers import AutoModelForCausalLM

        dt, dname = _dtype(dtype, device)
        console(f"loading {path} ({dname})")
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dt).eval()
        except Exception as exc:  # noqa: BLE001 - a folder transformers cannot load
            first = first_line(exc)
            raise ConfigError(
                f"{path}: transformers cannot load this folder as a causal LM "
                f"({type(exc).__name__}: {first}); check config.json and the safetensors, or "
                "re-export it with `zebractl convert`"
            ) from None
        tok = _tokenizer(path, "this model folder (copy the tokenizer files into it)")
        digest = fingerprint(model)
        return (
            Loaded(
                model.to(device),
                tok,
                "hf",
                type(model).__name__,
                digest,
                DEFAULT_MAX_LENGTH,
                fla_on_cpu=model_type in fla_types and device == "cpu",
            ),
            dname,
        )
    src = H.open_source(path, iteration)
    dt, dname = _dtype(dtype, device)
    src.announce(console, "converting", f" in memory ({dname})")
    tok_dir = H.tokenizer_dir(src.cfg)
    if tok_dir is None:
        raise ConfigError(
            f"{src.run_root}: the run's dataset has no tokenizer/ folder (prepare it with "
            "`zebractl prepare`, which saves the tokenizer)"
        )
    tok = _tokenizer(tok_dir, "the run's dataset")
    with torch.no_grad():
        model = H.in_memory(src, dt)
    digest = fingerprint(model)
    return (
        Loaded(
            model.to(device),
            tok,
            "run",
            type(model).__name__,
            digest,
            src.cfg.data.seq_length,
            cfg=src.cfg,
            run_root=src.run_root,
            iteration=src.iteration,
        ),
        dname,
    )


def held_out_texts(cfg: Any, tokenizer: Any, limit: int | None) -> list[str]:
    """The run's held-out documents (``data.split``'s validation part), decoded to text."""
    from zebractl.convert.verify import documents

    n = min(limit or WIKI_MAX_DOCS, WIKI_MAX_DOCS)
    out = []
    for doc in documents(cfg, held_out=True):
        text = tokenizer.decode(doc, skip_special_tokens=True).strip()
        if text:
            out.append(text)
        if len(out) >= n:
            break
    if not out:
        raise ConfigError(f"--tasks {T.WIKI}: the run's held-out split has no text")
    return out


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """No Hub: offline variables set; lm-eval's logger at warnings."""
    import logging

    saved = {k: os.environ.get(k) for k in OFFLINE}
    os.environ.update(OFFLINE)
    log = logging.getLogger("lm_eval")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_lm_eval(
    loaded: Loaded,
    names: list[str],
    task_dir: Path,
    *,
    batch_size: str,
    max_length: int,
    limit: int | None,
) -> dict[str, Any]:
    """One ``simple_evaluate`` over the local tasks ``names`` (0-shot, lm-eval's default seeds)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(
        pretrained=loaded.model,
        tokenizer=loaded.tokenizer,
        batch_size=batch_size,
        max_length=max_length,
    )
    tm = TaskManager(include_path=str(task_dir), include_defaults=False)
    ctx: Any = contextlib.nullcontext()
    if loaded.fla_on_cpu:
        from zebractl.runtime.fla_cpu import on_cpu

        ctx = on_cpu()
    import lm_eval.evaluator as ev

    # lm-eval records the git commit of the working directory (a stray "fatal: not a git
    # repository" outside one); the model's identity here is its fingerprint
    git_hash, ev.get_git_commit_hash = ev.get_git_commit_hash, lambda: None
    try:
        with ctx:
            return simple_evaluate(
                model=lm, tasks=names, task_manager=tm, limit=limit, log_samples=False
            )
    finally:
        ev.get_git_commit_hash = git_hash


def _is_hf_folder(path: Path) -> bool:
    """:func:`zebractl.hf.load.is_hf_folder`, without importing torch (before the lock)."""
    return (path / "config.json").is_file() and (
        (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()
    )


def write_dir(model_path: Path, output: Path | None) -> Path:
    """The folder :func:`evaluate` writes ``eval/`` into: ``output``, else the run directory of a
    run or checkpoint (the run's own, as :func:`open_model` finds it), else the model folder."""
    from zebractl.run.rundir import RunDir

    path = Path(model_path)
    if not path.exists():
        raise ConfigError(f"{path}: no such model folder, run directory or checkpoint")
    if output is not None:
        if Path(output).exists() and not Path(output).is_dir():
            raise ConfigError(f"--output {output}: exists and is not a folder; choose another")
        return Path(output)
    if _is_hf_folder(path):
        return path
    root = next(
        (p for p in (path, path.parent, path.parent.parent) if (p / RunDir.CONFIG).is_file()), None
    )
    if root is None:  # what open_model (convert's open_source) says of it
        raise ConfigError(
            f"{path}: no {RunDir.CONFIG} here or above it; pass the run directory (or a "
            "checkpoint inside one) that `zebractl train` wrote"
        )
    return root


def check(
    model_path: Path,
    *,
    tasks: str | None,
    limit: int | None,
    batch_size: str,
    max_length: int | None,
    dtype: str,
    device: str,
    output: Path | None,
    data_run: Path | None,
) -> tuple[list[T.Task], Path]:
    """The usage errors :func:`evaluate` can tell without loading anything (no torch imported);
    returns the tasks and :func:`write_dir`. Whether a CUDA GPU is there is checked later."""
    chosen = T.parse(tasks)
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit {limit}: expected a positive number of documents per task")
    if batch_size != "auto" and not (batch_size.isdigit() and int(batch_size) > 0):
        raise ConfigError(f"--batch-size {batch_size}: expected a positive integer or auto")
    if max_length is not None and max_length < 2:
        raise ConfigError(f"--max-length {max_length}: expected at least 2")
    if dtype not in ("auto", "bf16", "fp32"):
        raise ConfigError(f"--dtype {dtype}: expected auto, bf16 or fp32")
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device {device}: expected auto, cpu or cuda (with a CUDA GPU)")
    folder = write_dir(model_path, output)
    wiki = any(t.name == T.WIKI and t.skip is None for t in chosen)
    if wiki and data_run is None and _is_hf_folder(Path(model_path)):
        raise ConfigError(
            f"--tasks {T.WIKI} scores a run's held-out documents: pass --data RUN_DIR (or "
            "evaluate the run directory itself)"
        )
    return chosen, folder


def evaluate(
    model_path: Path,
    *,
    tasks: str | None = None,
    limit: int | None = None,
    batch_size: str = "16",
    device: str = "auto",
    dtype: str = "auto",
    max_length: int | None = None,
    output: Path | None = None,
    iteration: int | str | None = None,
    data_run: Path | None = None,
    force: bool = False,
    console: Callable[[str], None] = print,
) -> Any:
    """Evaluate (see the module docstring); returns the EvalReport written.

    Every call writes (``eval/results.json`` and the task YAMLs under :func:`write_dir`), so every
    call holds the lock of the directory it writes into (:func:`zebractl.run.lock.writer_root`:
    the run directory by default), taken after the usage checks and before torch is imported: an eval
    of a run that a train is writing to (or a second eval of it) fails at once naming the holder.
    Only the output is locked: a run read but not written (``output`` elsewhere, ``data_run``) is
    evaluated while it trains, from its newest complete checkpoint."""
    from zebractl.run import lock

    t0 = time.perf_counter()
    chosen, output = check(
        model_path,
        tasks=tasks,
        limit=limit,
        batch_size=batch_size,
        max_length=max_length,
        dtype=dtype,
        device=device,
        output=output,
        data_run=data_run,
    )
    # one writer per run directory: OUTPUT/eval/ is written under the lock of the run holding it
    # (a train of it, or a second eval, is refused), taken before torch is imported
    with lock.hold(lock.writer_root(output), "eval", console):
        report = _evaluate(
            model_path,
            chosen,
            t0=t0,
            limit=limit,
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            max_length=max_length,
            output=output,
            iteration=iteration,
            data_run=data_run,
            force=force,
            console=console,
        )
        from zebractl.run.tracking import attach_eval

        attach_eval(report, output, console)  # a run tracked by W&B (RUN/wandb.json) gets them
        return report


def _evaluate(
    model_path: Path,
    chosen: list[T.Task],
    *,
    t0: float,
    limit: int | None,
    batch_size: str,
    device: str,
    dtype: str,
    max_length: int | None,
    output: Path,
    iteration: int | str | None,
    data_run: Path | None,
    force: bool,
    console: Callable[[str], None],
) -> Any:
    """Load the model, run the tasks an earlier results.json does not hold, write the report."""
    from zebractl.schemas.reports import EvalReport

    device = _device(device)
    runnable = [t for t in chosen if t.skip is None]
    needs_data = [t for t in runnable if t.files]
    root = T.data_root() if needs_data else None
    digests = T.check_data(needs_data, root) if root is not None else {}
    wiki = next((t for t in runnable if t.name == T.WIKI), None)
    loaded, dname = open_model(
        model_path, device=device, dtype=dtype, iteration=iteration, console=console
    )
    length = max_length or loaded.max_length
    out_dir = Path(output) / "eval"
    results_file = out_dir / "results.json"
    fields = _fields(model_path, loaded, device, dname, batch_size, length, limit, results_file)
    old = None if force else R.previous(results_file)
    reused = R.reusable(old, fields)
    held_out: list[str] | None = None
    if wiki is not None:
        held_out = _held_out(loaded, data_run, limit)
        digests[wiki.name] = {
            "held-out.jsonl": hashlib.sha256("\n".join(held_out).encode()).hexdigest()
        }
    todo = [
        t
        for t in runnable
        if not (t.name in reused and reused[t.name].data_sha256 == digests.get(t.name, {}))
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    task_dir = out_dir / "tasks"
    T.write_tasks(runnable, task_dir, root, held_out)
    res: dict[str, Any] = {}
    seconds = 0.0
    if todo:
        console(
            f"running {', '.join(t.name for t in todo)} on {device} ({dname}, batch {batch_size}, "
            f"max length {length}{f', limit {limit}' if limit else ''})"
        )
        t1 = time.perf_counter()
        res = _run_offline(loaded, todo, task_dir, batch_size, length, limit)
        seconds = time.perf_counter() - t1
    report = EvalReport(
        **fields,
        wall_seconds=time.perf_counter() - t0,
        lm_eval_seconds=seconds,
        tasks=R.task_rows(chosen, todo, res, reused, digests, old),
    )
    R.write(report, results_file)
    return report


def _run_offline(
    loaded: Loaded,
    todo: list[T.Task],
    task_dir: Path,
    batch_size: str,
    length: int,
    limit: int | None,
) -> dict[str, Any]:
    """:func:`run_lm_eval` on the tasks ``todo``, with the Hub out of reach."""
    with _offline():
        return run_lm_eval(
            loaded,
            [t.lm_eval_name for t in todo],
            task_dir,
            batch_size=batch_size,
            max_length=length,
            limit=limit,
        )


def _device(device: str) -> str:
    """``auto`` resolved; ``cuda`` without a CUDA GPU is a usage error."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: expected auto, cpu or cuda (with a CUDA GPU)")
    return device


def _fields(
    model_path: Path,
    loaded: Loaded,
    device: str,
    dname: str,
    batch_size: str,
    length: int,
    limit: int | None,
    results_file: Path,
) -> dict[str, Any]:
    """The report's fields that name the model and the settings (see :data:`R.SETTINGS`)."""
    import importlib.metadata

    return {
        "model": str(model_path),
        "source": loaded.source,
        "model_class": loaded.model_class,
        "iteration": loaded.iteration,
        "fingerprint": loaded.fingerprint,
        "lm_eval_version": importlib.metadata.version("lm_eval"),
        "data_package": T.DATA_PACKAGE,
        "device": device,
        "dtype": dname,
        "batch_size": batch_size,
        "max_length": length,
        "limit": limit,
        "results_file": str(results_file),
    }


def _held_out(loaded: Loaded, data_run: Path | None, limit: int | None) -> list[str]:
    """wikitext-like's documents: the held-out text of the model's run (of ``data_run`` when
    given), decoded with the tokenizer that run's data was prepared with (the model reads the
    text with its own)."""
    cfg, decoder = loaded.cfg, loaded.tokenizer
    if data_run is not None:
        from zebractl.convert.hf import open_source, tokenizer_dir

        cfg = open_source(data_run).cfg
        tok_dir = tokenizer_dir(cfg)
        if tok_dir is None:
            raise ConfigError(f"--data {data_run}: the run's dataset has no tokenizer/ folder")
        decoder = _tokenizer(tok_dir, "the --data run's dataset")
    return held_out_texts(cfg, decoder, limit)
