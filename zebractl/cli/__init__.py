"""The `zebractl` command line: one Typer app, one module per command group.

Nothing heavy is imported here or in the command modules at import time (no torch, megatron, fla,
transformers, and not even pydantic): `--help` and Tab completion stay instant.
"""

from __future__ import annotations

import sys

import typer

from zebractl import __version__
from zebractl.cli import catalog as _catalog
from zebractl.cli import compare as _compare
from zebractl.cli import config as _config
from zebractl.cli import convert as _convert
from zebractl.cli import doctor as _doctor
from zebractl.cli import env as _env
from zebractl.cli import eval as _eval
from zebractl.cli import generate as _generate
from zebractl.cli import plan as _plan
from zebractl.cli import prepare as _prepare
from zebractl.cli import schema as _schema
from zebractl.cli import train as _train
from zebractl.cli import warmup as _warmup
from zebractl.cli._common import state
from zebractl.cli._examples import EXIT_CODES as EPILOG
from zebractl.cli._examples import epilog
from zebractl.cli.completion import INSTALL_OPTION, SHOW_OPTION, Group
from zebractl.runtime import quiet

app = typer.Typer(
    name="zebractl",
    help="Declarative pretraining of Zebra hybrid recurrent-attention language models "
    "(KDA / GDN / Mamba2 mixers + MLA + SwiGLU) on megatron-core with FLA kernels.",
    epilog=EPILOG,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
    cls=Group,  # completion: zebractl's scripts and protocol (zebractl/cli/completion.py)
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        print(f"zebractl {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="Show tracebacks on errors, and the libraries' warnings, log lines and progress bars.",
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    install_completion: str | None = INSTALL_OPTION,
    show_completion: str | None = SHOW_OPTION,
) -> None:
    """Zebra pretraining: configs that never lie, FLA-speed training, provable parity."""
    state.verbose = verbose
    # the libraries' warnings, log lines and bars off unless -v, for this command and the processes
    # it starts; put back when the command ends (it may run in-process, under a test runner)
    ctx.call_on_close(quiet.enable(verbose, tty=sys.stderr.isatty()))


app.add_typer(_config.app, name="config")
app.command("presets", epilog=epilog("presets"))(_catalog.presets)
app.command("recipes", epilog=epilog("recipes"))(_catalog.recipes)
app.command("plan", epilog=epilog("plan"))(_plan.plan)
app.command("prepare", epilog=epilog("prepare"))(_prepare.prepare)
app.command("train", epilog=epilog("train"))(_train.train)
app.command("warmup", epilog=epilog("warmup"))(_warmup.warmup)
app.command("convert", epilog=epilog("convert"))(_convert.convert)
app.command("verify", epilog=epilog("verify"))(_convert.verify)
app.command("eval", epilog=epilog("eval"))(_eval.eval_)
app.command("generate", epilog=epilog("generate"))(_generate.generate)
app.command("chat", epilog=epilog("chat"))(_generate.chat)
app.add_typer(_schema.app, name="schema")
app.command("compare", epilog=epilog("compare"))(_compare.compare)
app.command("doctor", epilog=epilog("doctor"))(_doctor.doctor)
app.command("env", epilog=epilog("env"))(_env.env)
