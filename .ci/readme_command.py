"""Print one of README.md's CI commands: the ```bash block right after a `<!-- ci: NAME -->` line.

    python3 .ci/readme_command.py main-job     # the quick start's whole pipeline
    python3 .ci/readme_command.py tests        # the test command

Exit 2 naming the problem when the marker is missing, repeated, or not followed by a one-line bash
block: CI must run what the README says, so the README is where the commands live.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def command(readme: str, name: str) -> str:
    lines = readme.splitlines()
    marks = [i for i, line in enumerate(lines) if line.strip() == f"<!-- ci: {name} -->"]
    if len(marks) != 1:
        raise ValueError(f"README.md: expected one `<!-- ci: {name} -->` line, found {len(marks)}")
    i = marks[0] + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines) or not re.fullmatch(r"```(bash|sh)", lines[i].strip()):
        raise ValueError(f"README.md:{i + 1}: `<!-- ci: {name} -->` must be followed by ```bash")
    body = []
    for j in range(i + 1, len(lines)):
        if lines[j].strip() == "```":
            break
        body.append(lines[j])
    else:
        raise ValueError(f"README.md:{i + 1}: the code block after `ci: {name}` is not closed")
    code = [b for b in body if b.strip()]
    if len(code) != 1:
        raise ValueError(f"README.md:{i + 2}: the `ci: {name}` block must be one command line")
    return code[0].strip()


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    readme = Path(__file__).resolve().parent.parent / "README.md"
    try:
        print(command(readme.read_text(encoding="utf-8"), sys.argv[1]))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
