"""`zebractl env`: versions, GPUs, caches and paths of this machine, ready to paste into an issue."""

from __future__ import annotations

import typer

from zebractl.cli._common import JSON_HELP, emit_json, guarded


@guarded
def env(json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Print this machine's versions (Python, torch, triton, FLA, megatron-core, transformers,
    pydantic, zebractl, ...), GPUs, kernel cache and caches, and paths, as Markdown to paste into
    a bug report (--json: the same as one JSON document).

    Imports torch (to see its CUDA build and GPUs) but reports a torch that fails to import instead
    of failing; environment variables whose name holds TOKEN, KEY, SECRET or PASSWORD are never
    shown.
    """
    from zebractl.runtime.environment import collect, markdown

    report = collect()
    if json_out:
        emit_json(report)
    else:
        print(markdown(report), end="")
