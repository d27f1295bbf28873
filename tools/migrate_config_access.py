"""Rewrite attribute accesses on run-config objects from the flat names to the sections.

    python tools/migrate_config_access.py [--dry-run] FILE_OR_DIR...

``cfg.gate_alpha`` becomes ``cfg.zscore.alpha``, ``self.config.b_min``
``self.config.batch_bounds.b_min`` and so on, by ``config_keys.ALIASES``
(the same map the config accepts its old keys by). Only attributes whose
receiver looks like a run config are touched: a name or attribute called
``config``, ``cfg``, ``run_config`` or ending in ``_config``/``_cfg``, or a
call to ``build_config``/``RunConfig``/``run_config``. ``args.gate_alpha``
(argparse) or ``controller.b_max`` are left alone. The source is edited at
the parsed attribute's exact position, so strings and comments never
change. String-keyed reads (``cfg["gate_alpha"]``, ``getattr(cfg, "b_min")``)
are printed for a human, not rewritten. Every change is printed as
``path:line: old -> new``; running it twice changes nothing the second time.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
try:
    from hermes.common.config_keys import ALIASES
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
    from config_keys import ALIASES  # type: ignore[no-redef]

CONFIG_NAME = re.compile(r"^(config|cfg|conf|run_config|runconfig)$|_(config|cfg)$")
CONFIG_CALL = re.compile(r"^(build_config|RunConfig|run_config)$")


def _is_config(node: ast.expr) -> bool:
    """Whether ``node`` is an expression we take for a run config (by its name)."""
    if isinstance(node, ast.Name):
        return bool(CONFIG_NAME.search(node.id))
    if isinstance(node, ast.Attribute):
        return bool(CONFIG_NAME.search(node.attr))
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return bool(CONFIG_CALL.search(name))
    return False


def edits(source: str) -> Iterator[tuple[int, int, int, str, str]]:
    """(line, start col, end col, old name, new dotted name) of each access to rewrite."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ALIASES and _is_config(node.value):
            assert node.end_lineno is not None and node.end_col_offset is not None
            end = node.end_col_offset
            yield node.end_lineno, end - len(node.attr), end, node.attr, ALIASES[node.attr]


def string_keyed(source: str) -> Iterator[tuple[int, str]]:
    """Reads by string key that the rewrite cannot prove safe: listed for a human."""
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            key = node.args[1].value
        if isinstance(key, str) and key in ALIASES:
            yield node.lineno, ast.unparse(node)


def migrate(path: Path, *, dry_run: bool = False) -> int:
    """Rewrite one file in place; returns the number of accesses changed."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    found = sorted(edits(text), reverse=True)  # right to left: earlier columns stay valid
    for line, start, end, old, new in found:
        row = lines[line - 1]
        # Column offsets are in UTF-8 bytes.
        raw = row.encode()
        before = raw[:start].decode()
        lines[line - 1] = before + new + raw[end:].decode()
        print(f"{path}:{line}: .{old} -> .{new}")
    for line, expr in sorted(string_keyed(text)):
        print(f"{path}:{line}: string-keyed, not rewritten: {expr}")
    if found and not dry_run:
        path.write_text("".join(lines))
    return len(found)


def _files(paths: list[str]) -> Iterator[Path]:
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(q for q in p.rglob("*.py") if ".venv" not in q.parts)
        else:
            yield p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="Python files or folders")
    ap.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    a = ap.parse_args(argv)
    total = sum(migrate(f, dry_run=a.dry_run) for f in _files(a.paths))
    print(f"{total} attribute access(es) {'to rewrite' if a.dry_run else 'rewritten'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
