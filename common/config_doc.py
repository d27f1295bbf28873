"""The configuration reference (docs/configuration.md), generated from the run config's field descriptions.

    python -m hermes.common.config_doc                                  # print the table
    python -m hermes.common.config_doc --write docs/configuration.md    # update the doc in a checkout

The doc holds the output between ``<!-- config-table:start -->`` and
``<!-- config-table:end -->``; a unit test keeps the two equal, so a field
without a description, or a changed default, shows up as a failing test.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from hermes.common.config import SECTIONS, RunConfig
from hermes.common.config_keys import ALIASES

START, END = "<!-- config-table:start -->", "<!-- config-table:end -->"
# Where the table lives, relative to the repository root.
DOC = "docs/configuration.md"


def _default(info: FieldInfo) -> str:
    value: Any = info.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str | dict | list):
        return f"`{value}`" if value != {} else "`{}`"
    return str(value)


def _cell(text: str | None, key: str) -> str:
    if not text:
        raise ValueError(f"run-config field {key!r} has no description")
    return text.replace("|", "\\|").replace("\n", " ")


def table() -> str:
    """The markdown table: core fields and policy names, then one block of rows per section."""
    old = {new: flat for flat, new in ALIASES.items()}
    rows = ["| key | default | meaning | old flat name |", "| --- | --- | --- | --- |"]
    for name, info in RunConfig.model_fields.items():
        if SECTIONS[name] is None:
            rows.append(f"| `{name}` | {_default(info)} | {_cell(info.description, name)} | |")
    for name, info in RunConfig.model_fields.items():
        section: type[BaseModel] | None = SECTIONS[name]
        if section is None:
            continue
        rows.append(f"| **`{name}`** | | **section of {_cell(info.description, name)}** | |")
        for field, sub in section.model_fields.items():
            key = f"{name}.{field}"
            flat = f"`{old[key]}`" if key in old else ""
            rows.append(f"| `{key}` | {_default(sub)} | {_cell(sub.description, key)} | {flat} |")
    return "\n".join(rows) + "\n"


def replaced(doc: str, generated: str) -> str:
    """``doc`` with the text between the markers replaced by ``generated``."""
    head, start, rest = doc.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"no {START} ... {END} block in the file")
    return f"{head}{START}\n{generated}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Print (or write into the configuration doc) the run-config reference table.")
    ap.add_argument("--write", metavar="FILE", nargs="?", const=DOC,
                    help=f"replace the table between the markers in this file (default {DOC})")
    a = ap.parse_args(argv)
    if a.write:
        p = Path(a.write)
        try:
            p.write_text(replaced(p.read_text(), table()))
        except (OSError, ValueError) as exc:
            print(f"config_doc: {p}: {exc}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
