"""Shared fixtures: a CLI runner, a YAML writer, a seed per test, an explicit process group, and a
probe of the process-wide state a model build must leave alone.

Every test runs with python ``random``, numpy and torch seeded from a fresh seed (or from
``ZEBRACTL_TEST_SEED`` when set); a failing test's report says how to rerun it with the same seed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from zebractl.cli import app

REPO = Path(__file__).resolve().parents[1]
SEED_ENV = "ZEBRACTL_TEST_SEED"
_SEED = pytest.StashKey[int]()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    if importlib.util.find_spec("numpy") is not None:
        import numpy as np

        np.random.seed(seed)
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.manual_seed(seed)


@pytest.fixture(autouse=True)
def _seeded(request: pytest.FixtureRequest) -> int:
    """Seed random, numpy and torch for this test: ``ZEBRACTL_TEST_SEED`` or a fresh seed."""
    given = os.environ.get(SEED_ENV)
    seed = int(given) if given else random.SystemRandom().randrange(2**32)
    request.node.stash[_SEED] = seed
    _seed_everything(seed)
    return seed


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    seed = item.stash.get(_SEED, None)
    if report.failed and seed is not None:
        report.sections.append(("random seed", f"rerun with {SEED_ENV}={seed}"))
    return report


def _group_initialized() -> bool:
    torch = sys.modules.get("torch")
    return bool(
        torch is not None
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    )


@pytest.fixture(autouse=True)
def _no_process_group_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves a torch.distributed process group it did not find fails (the group is
    torn down first): a group left behind changed what later tests saw (convert's "leaves no
    process group" check failed in whichever test came next)."""
    before = _group_initialized()
    yield
    if before or not _group_initialized():
        return
    import torch.distributed as dist

    megatron = sys.modules.get("megatron.core.parallel_state")
    if megatron is not None and megatron.model_parallel_is_initialized():
        megatron.destroy_model_parallel()
    dist.destroy_process_group()
    pytest.fail(
        f"{request.node.nodeid} left a torch.distributed process group behind: use the "
        "process_group fixture or zebractl.runtime.dist.scoped()"
    )


@pytest.fixture(scope="module")
def module_process_group() -> Iterator[None]:
    """One process group and megatron parallel state for a whole test module, on the CPU.

    ``Trainer.fit`` creates the group it needs and destroys it afterwards (``dist.scoped``).
    That setup and teardown costs about 80 ms per run on this machine: megatron makes and
    destroys its gloo subgroups. The modules of the SHARED_GROUP folders run many trainings in
    this process, so each keeps one group for all of its runs and ``fit``'s ``scoped()`` does
    not tear it down. (Not in tests/convert and tests/model: they check that convert, verify and
    a model build leave no process group behind.) Nothing happens without megatron, or on a CUDA
    machine, where the GPU tests keep their own setup.
    """
    if importlib.util.find_spec("megatron") is None:
        yield
        return
    import torch

    if torch.cuda.is_available():
        yield
        return
    from zebractl.runtime.dist import scoped

    with scoped():
        yield


# the test folders whose modules run trainings in this process: one process group per module
SHARED_GROUP = ("train", "compare", "evaluate", "run")


@pytest.fixture(autouse=True, scope="module")
def _shared_process_group(request: pytest.FixtureRequest) -> None:
    """A module in one of the SHARED_GROUP folders runs with ``module_process_group``."""
    if Path(request.path).parent.name in SHARED_GROUP:
        request.getfixturevalue("module_process_group")


@pytest.fixture
def process_group() -> Iterator[None]:
    """A one-process torch.distributed group and megatron's parallel state, for the tests that need
    them (sharded checkpoints, megatron DDP): building a model creates neither. Torn down afterwards
    when this fixture created them. (On CPU, megatron's DDP constructor and checkpoint writer also
    need ``zebractl.runtime.megatron_compat.patched()`` around them.)"""
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state

    from zebractl.runtime.dist import ensure_initialized

    had_group = dist.is_initialized()
    had_state = parallel_state.model_parallel_is_initialized()
    ensure_initialized()
    yield
    if not had_state:
        parallel_state.destroy_model_parallel()
    if not had_group:
        dist.destroy_process_group()


class Cli:
    """Invoke the real Typer app in-process; stdout and stderr are kept apart."""

    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, *args: str):
        return self.runner.invoke(app, list(args), prog_name="zebractl")

    def chat(self, *args: str, stdin: str):
        """``zebractl chat ARGS`` reading the lines of ``stdin`` (a pipe's, not a terminal's)."""
        return self.runner.invoke(app, ["chat", *args], input=stdin, prog_name="zebractl")


@pytest.fixture
def cli() -> Cli:
    return Cli()


@pytest.fixture
def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], Path]:
    """write(name, text) -> path; the working directory is tmp_path, so messages show `name`."""
    monkeypatch.chdir(tmp_path)

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return _write


_STATE_PROBE = """
import json, os, sys

import torch
import megatron.core.transformer.multi_latent_attention as mla
from megatron.core import parallel_state


def snapshot():
    return {
        "torch.distributed initialised": torch.distributed.is_initialized(),
        "megatron parallel state": {
            k: repr(v)
            for k, v in vars(parallel_state).items()
            if k.startswith("_") and k.lstrip("_").isupper()
        },
        "torch.cuda.current_device": repr(torch.cuda.current_device),
        "torch.cuda.synchronize": repr(torch.cuda.synchronize),
        "multi_latent_attention.HAVE_TE": repr(mla.HAVE_TE),
        "os.environ": dict(os.environ),
    }


before = snapshot()
exec(compile(sys.argv[1], "<probe>", "exec"))
print("STATE:" + json.dumps({"before": before, "after": snapshot()}), file=sys.stderr)
"""


@pytest.fixture
def process_state() -> Callable[[str], tuple[dict, dict]]:
    """process_state(code) -> (before, after): the process-wide state that building or running a
    model must leave alone (torch.distributed, megatron's parallel state, the attributes megatron's
    patches touch, the environment), around ``code`` run in a fresh interpreter."""
    pytest.importorskip("megatron.core")
    import json
    import subprocess
    import sys

    def run(code: str) -> tuple[dict, dict]:
        out = subprocess.run(
            [sys.executable, "-c", _STATE_PROBE, textwrap.dedent(code)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=600,
        )
        lines = [x for x in out.stderr.splitlines() if x.startswith("STATE:")]
        assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
        doc = json.loads(lines[-1][len("STATE:") :])
        return doc["before"], doc["after"]

    return run


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="Rewrite tests/golden/*.txt from a fresh run instead of comparing with them.",
    )


# ---- a lock held by another process (zebractl.run.lock)


class LockHolders:
    """Child processes that each hold the lock of a folder (as ``COMMAND`` would) until ended."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, folder: Path, command: str = "train") -> subprocess.Popen:
        """A live process holding the lock of ``folder``, once this returns."""
        code = textwrap.dedent(
            f"""
            import sys
            from zebractl.run import lock
            with lock.hold({str(folder)!r}, {command!r}, lambda s: None):
                print("held", flush=True)
                sys.stdin.read()
            """
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        self.procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        return proc

    @staticmethod
    def end(proc: subprocess.Popen) -> None:
        """Let it release the lock and exit (a killed one: reap it); idempotent."""
        assert proc.stdin is not None and proc.stdout is not None
        if not proc.stdin.closed:
            proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


@pytest.fixture
def lock_holders() -> Iterator[LockHolders]:
    """Start processes holding a folder's lock (``lock_holders.start(folder, "prepare")``); every
    one still running is ended after the test."""
    holders = LockHolders()
    yield holders
    for proc in holders.procs:
        holders.end(proc)


# ---- the prepared demo corpus and fast tiny runs (training, conversion tests)

FAST = [
    "batch.micro=4",
    "batch.global=8",
    "data.seq_length=64",
    "logging.interval=1",
    "logging.tensorboard=false",
    "checkpoint.interval=1000",
    "schedule.warmup_iterations=2",
    "validation=null",
]
"""Overrides that make a tiny recipe take a fraction of a second per step on a CPU."""


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory) -> Path:
    """The demo corpus prepared with its tokenizer; ``ZEBRACTL_TEST_DATA`` names a prepared dataset
    instead (the GPU machine has no demo-corpus packages)."""
    given = os.environ.get("ZEBRACTL_TEST_DATA")
    if given:
        return Path(given).resolve()
    from zebractl.data.demo import tokenizer_dir, write_sources
    from zebractl.data.prepare import PrepareOptions, prepare

    root = tmp_path_factory.mktemp("demo")
    srcs = write_sources(root / "sources")
    prepare(
        PrepareOptions(
            inputs=tuple(map(str, srcs)), tokenizer=str(tokenizer_dir()), output=str(root / "data")
        ),
        workers=2,
    )
    return root / "data"


@pytest.fixture(scope="session")
def demo_chat(tmp_path_factory) -> Path:
    """The demo conversations (GSM8K problems and worked answers) prepared as chat data with the
    demo tokenizer, 5% held out (``zebractl prepare --demo --format chat --valid-fraction 0.05``)."""
    from zebractl.data.demo import tokenizer_dir, write_chat_sources
    from zebractl.data.prepare import PrepareOptions, prepare

    root = tmp_path_factory.mktemp("demo_chat")
    srcs = write_chat_sources(root / "sources")
    opts = PrepareOptions(
        inputs=tuple(map(str, srcs)),
        tokenizer=str(tokenizer_dir()),
        output=str(root / "data"),
        text_key="messages",
        valid_fraction=0.05,
        format="chat",
    )
    prepare(opts, workers=2)
    return root / "data"


_ONCE: dict[tuple[str, ...], Path] = {}
_ONCE_RESULTS: dict[Path, Any] = {}


class FastRun:
    """Tiny runs on the demo corpus with the :data:`FAST` settings, and their metrics."""

    results = _ONCE_RESULTS
    """The RunResult of each run :meth:`once` trained, by folder."""

    def __init__(self, data: Path, factory: pytest.TempPathFactory | None = None) -> None:
        self.data = data
        self._factory = factory

    def sets(self, *sets: str) -> list[str]:
        """`--set` values of the fast tiny run plus ``sets``."""
        return [f"data.paths=[{{path: {self.data}}}]", *FAST, *sets]

    def args(self, *sets: str) -> list[str]:
        """The same as command-line arguments."""
        return [x for s in self.sets(*sets) for x in ("--set", s)]

    def resolve(self, recipe: str, *sets: str):
        """The resolved recipe."""
        from zebractl.config.resolve import resolve_recipe

        return resolve_recipe(recipe, self.sets(*sets))

    def train(self, recipe: str, out: Path, *sets: str, **kw):
        """Train in this process; returns the RunResult."""
        from zebractl.run import ResolvedConfigRecord, RunDir
        from zebractl.train.trainer import Trainer

        r = self.resolve(recipe, *sets)
        kw.setdefault("console", lambda s: None)
        run = RunDir.for_recipe(r.run, r.name, out)
        return Trainer(r.run, run, ResolvedConfigRecord.of(r), **kw).fit()

    def once(self, recipe: str, *sets: str, stop_after: int | None = None) -> Path:
        """The folder of ``train(recipe, out, *sets, stop_after=...)``, trained once per session
        for every test that asks for the same run (its RunResult: ``results[folder]``): tests read
        it, or :meth:`copy` it before changing it."""
        key = (str(self.data), recipe, *sets, f"stop_after={stop_after}")
        if key not in _ONCE:
            out = self._factory.mktemp(f"once_{recipe}") / "run"
            self.results[out] = self.train(recipe, out, *sets, stop_after=stop_after)
            _ONCE[key] = out
        return _ONCE[key]

    def copy(self, recipe: str, out: Path, *sets: str, stop_after: int | None = None) -> Path:
        """``out``: a copy of :meth:`once`'s run, for a test to change (resume, damage)."""
        shutil.copytree(self.once(recipe, *sets, stop_after=stop_after), out, dirs_exist_ok=True)
        return out

    @staticmethod
    def rows(out: Path, kind: str = "train") -> list[dict]:
        """metrics.jsonl rows of one kind."""
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["kind"] == kind]

    @classmethod
    def losses(cls, out: Path) -> dict[int, float]:
        """Training loss by iteration."""
        return {r["iteration"]: r["loss"] for r in cls.rows(out)}


def _masked_spans(tok: Any, ids: list[int], mask: list[int]) -> list[str]:
    spans: list[str] = []
    run: list[int] = []
    for i, on in zip(ids, mask, strict=True):
        if on:
            run.append(i)
        elif run:
            spans.append(tok._impl.decode(run))
            run = []
    return spans + ([tok._impl.decode(run)] if run else [])


@pytest.fixture
def masked_spans() -> Callable[[Any, list[int], list[int]], list[str]]:
    """``masked_spans(tok, ids, mask)``: the runs of trained (mask 1) tokens of a chat
    sample, each decoded with the tokenizer ``tok`` (a zebractl Tokenizer)."""
    return _masked_spans


@pytest.fixture
def fast(demo_data, tmp_path_factory) -> FastRun:
    """Fast tiny runs on the demo corpus."""
    return FastRun(demo_data, tmp_path_factory)


TRAINED_SETS = (
    "schedule.iterations=4",
    "checkpoint.interval=2",
    "checkpoint.keep_last=0",
    "validation={interval: 4, iterations: 1}",
)
_TRAINED: dict[str, Path] = {}


@pytest.fixture
def trained_sets() -> tuple[str, ...]:
    """The --set values of :func:`trained` (on top of the fast run's)."""
    return TRAINED_SETS


@pytest.fixture
def trained(tmp_path_factory, fast) -> Path:
    """A fast tiny_kda run of 4 iterations (checkpoints at 2 and 4, a validation row at 4),
    trained once per session: tests copy it before changing it."""
    if "run" not in _TRAINED:
        out = tmp_path_factory.mktemp("trained") / "run"
        fast.train("tiny_kda", out, *TRAINED_SETS)
        _TRAINED["run"] = out
    return _TRAINED["run"]


# ---- test runs with GPU tests


def _no_gpu_reason() -> str | None:
    """Why this machine cannot run a ``gpu`` test (None: it can)."""
    if importlib.util.find_spec("torch") is None:
        return "needs torch and a CUDA GPU"
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA GPU"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test marked ``gpu`` is skipped here, in one place, on a machine without a CUDA GPU
    (no test writes its own skip for that)."""
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = _no_gpu_reason() if gpu else None
    if reason is not None:
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session", autouse=True)
def _gpu_kernel_cache(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[None]:
    """A session that runs GPU tests gets the kernel cache a ``zebractl train`` process sets up
    (``zebractl.runtime.kernel_cache.configure``: Triton's and TileLang's disk caches, the shipped
    tuned configurations seeded), in a folder of its own under the session's temporary directory
    (``ZEBRACTL_CACHE_DIR`` names another); variables already set (benchmarks/device/check.sh
    exports them) are left alone. Without it the in-process Trainers of the GPU tests autotune
    every FLA kernel even at the shipped shapes (kda_300M's first step on an H200: 215 s, against
    81 s seeded). A session without GPU tests, or without CUDA, changes nothing."""
    if importlib.util.find_spec("torch") is None or not any(
        item.get_closest_marker("gpu") for item in request.session.items
    ):
        yield
        return
    import torch

    if not torch.cuda.is_available():
        yield
        return
    from zebractl.runtime import kernel_cache

    env = dict(os.environ)
    env.setdefault(kernel_cache.CACHE_ENV, str(tmp_path_factory.mktemp("kernel-cache")))
    cache = kernel_cache.configure(env)
    if cache is None:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        for var in ("TRITON_CACHE_DIR", "TILELANG_CACHE_DIR", "TRITON_CACHE_AUTOTUNING"):
            mp.setenv(var, env[var])
        print(f"\n{cache.describe()}")
        yield


@pytest.fixture(autouse=True)
def _gpu_memory_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a GPU test, its tensors, CUDA graphs and the allocator's cached blocks go back to the
    driver: the GPU check runs three test workers beside a 300M training run on one GPU, and a
    worker that kept what an earlier test cached (a CUDA graph's private pool: 19 GiB) left the
    others out of memory (the 2026-12-02 check at 7444598: four tests OOM)."""
    yield
    if request.node.get_closest_marker("gpu") is None:
        return
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def _interpreted(case: str, seed: int) -> Any:
    """Run ``case`` (Python source taking the seed as ``sys.argv[1]``) in a subprocess under
    Triton's interpreter (``TRITON_INTERPRET=1`` must be set before the kernels are defined: hence
    a process of its own); returns the JSON of its last stdout line."""
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run(
        [sys.executable, "-c", case, str(seed)], capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def triton_interpreted() -> Callable[[str, int], Any]:
    """``triton_interpreted(case, seed)``: a CPU test of Triton kernels (see :func:`_interpreted`)."""
    return _interpreted
