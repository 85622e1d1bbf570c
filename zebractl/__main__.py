"""`python -m zebractl`."""

from zebractl.cli import app

app(prog_name="zebractl")
