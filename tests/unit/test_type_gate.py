"""The type gate sees across modules: mypy resolves every ``hermes.*`` import to its folder.

The folders install under ``hermes`` through setuptools' package-dir, an import hook mypy does not
follow; ``.typecheck/hermes/`` holds committed links that lay them out as installed (pyproject.toml's
[tool.mypy] says why). Before it, every ``hermes.*`` import type-checked as ``Any`` and a wrong call
to ``batch_scaled_lr`` passed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ROOT / ".typecheck" / "hermes"

WRONG = '''\
import hermes.client
import hermes.deploy
import hermes.server
from hermes.common.policies.lr_scaling import batch_scaled_lr

batch_scaled_lr(0.1, 32, 128)
batch_scaled_lr("0.1", 32, 128)
client_file: int = hermes.client.__file__
deploy_file: int = hermes.deploy.__file__
server_file: int = hermes.server.__file__
'''


def test_links_mirror_package_dir() -> None:
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    want = {name.removeprefix("hermes."): ROOT / folder for name, folder in package_dir.items() if name != "hermes"}
    want |= {f.name: f for f in (ROOT / package_dir["hermes"]).glob("*.py")}
    have = {link.name: link for link in LAYOUT.iterdir()}
    assert sorted(have) == sorted(want), (
        f"{LAYOUT.relative_to(ROOT)} must mirror [tool.setuptools] package-dir and hermes/*.py: "
        f"link the missing ones, e.g. `ln -s ../../NAME {LAYOUT.relative_to(ROOT)}/NAME`")
    for name, link in have.items():
        assert link.is_symlink() and not os.path.isabs(os.readlink(link)), f"{link}: a relative link"
        assert link.resolve() == want[name].resolve(), f"{link} -> {link.resolve()}, expected {want[name]}"


def test_wrong_cross_module_call_fails_mypy(tmp_path: Path) -> None:
    module = tmp_path / "wrong_call.py"
    module.write_text(WRONG)
    # The repository's cache: warm after CI's `python -m mypy`, so this takes seconds.
    out = subprocess.run([sys.executable, "-m", "mypy", str(module)], cwd=ROOT, capture_output=True, text=True,
                         timeout=240)
    errors = [line.split(": error: ", 1)[1] for line in out.stdout.splitlines() if ": error: " in line]
    assert out.returncode == 1, out.stdout + out.stderr
    assert errors == [
        'Argument 1 to "batch_scaled_lr" has incompatible type "str"; expected "float"  [arg-type]',
        *['Incompatible types in assignment (expression has type "str", variable has type "int")  [assignment]'] * 3,
    ], out.stdout
