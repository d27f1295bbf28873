"""The wheel: what it contains, and that an install of it alone works.

Builds the wheel from a copy of the working tree (so the repository's own
``build/`` and ``*.egg-info`` neither leak stale files into it nor get
written), installs it with ``--no-deps`` into a fresh venv made with
``--system-site-packages`` (torch & co. are not downloaded again), and runs
everything from a directory outside the repository.

The system site-packages also hold an editable install of this very project.
The venv's site-packages come first on ``sys.path`` and setuptools' editable
finder is appended to ``sys.meta_path`` after the path finder, so imports
resolve to the wheel; every test checks that by file path rather than
trusting it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = ("common", "client", "server", "deploy", "common/policies", "common/policies/allocation", "server/engine", "server/routes", "deploy/bench", "deploy/testbed")
# Heavy server-side modules an agent must never pull in.
SERVER_ONLY = ("fastapi", "uvicorn", "starlette",
               # heavy optional modules an agent never needs: their import is start-up time on a device
               "kafka", "matplotlib", "sklearn", "prometheus_client", "tensorboard")
STEP_TIMEOUT_S = 60


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    python: Path
    bin: Path
    site_packages: Path
    cwd: Path  # outside the repository

    def run(self, *args: str | os.PathLike, timeout: float = STEP_TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(a) for a in args], cwd=self.cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout,
        )

    def python_json(self, code: str) -> object:
        """Run ``code`` in the venv's python; it must print one JSON document."""
        r = self.run(self.python, "-c", code)
        assert r.returncode == 0, f"venv python failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
        return json.loads(r.stdout.strip().splitlines()[-1])


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _copy_sources(dest: Path) -> Path:
    """pyproject.toml, its readme/license files and the package folders it maps."""
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    src = dest / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "LICENSE.txt"):
        if (REPO_ROOT / name).is_file():
            shutil.copy2(REPO_ROOT / name, src / name)
    folders = set(meta.get("tool", {}).get("setuptools", {}).get("package-dir", {}).values())
    assert folders, "pyproject.toml maps no package folders ([tool.setuptools] package-dir)"
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for folder in sorted(folders):
        shutil.copytree(REPO_ROOT / folder, src / folder, ignore=junk)
    return src


def _require_build_backend() -> None:
    """A no-isolation build needs the backend here: setuptools >= 70.1 (or an older one plus wheel)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        have = tuple(int(p) for p in version("setuptools").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        pytest.skip("setuptools is not installed: a --no-build-isolation wheel build is impossible")
    if have < (70, 1):
        try:
            version("wheel")
        except PackageNotFoundError:
            pytest.skip(f"setuptools {have} < 70.1 has no bdist_wheel of its own and wheel is not installed")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    _require_build_backend()
    root = tmp_path_factory.mktemp("packaging")
    src = _copy_sources(root)
    dist = root / "dist"
    env = _clean_env()
    # pip rather than `python -m build`: with --no-build-isolation it does not
    # insist on every [build-system] requirement (the `wheel` package) being
    # installed, which setuptools >= 70.1 does not need. --no-index: no network.
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(dist), str(src)],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, f"wheel build failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    wheels = sorted(dist.glob("hermes_edge-*.whl"))
    assert len(wheels) == 1, f"expected one hermes_edge wheel, got {[w.name for w in dist.iterdir()]}"

    venv = root / "venv"
    # No pip inside the venv: the system pip (visible through
    # --system-site-packages) installs into the venv when run by its python.
    r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                       env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    assert r.returncode == 0, f"venv creation failed:\n{r.stderr}"
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")
    # --ignore-installed: the editable install in the system site-packages has
    # the same name and version; pip must neither skip nor try to uninstall it.
    r = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", str(wheels[0])],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, f"wheel install failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S,
    ).stdout.strip()
    cwd = root / "elsewhere"
    cwd.mkdir()
    return Installed(wheels[0], venv, python, bindir, Path(site).resolve(), cwd)


def _inside(path: str, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root)


def test_wheel_installs_only_the_hermes_namespace(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as zf:
        names = zf.namelist()
        top_level_txt = next((n for n in names if n.endswith(".dist-info/top_level.txt")), None)
        top_level = zf.read(top_level_txt).decode().split() if top_level_txt else []
    roots = {n.split("/", 1)[0] for n in names}
    dist_info = {r for r in roots if r.endswith(".dist-info")}
    assert len(dist_info) == 1, roots
    assert roots - dist_info == {"hermes"}, f"wheel installs top-level names besides hermes/: {sorted(roots)}"
    for forbidden in (*(p for p in SUBPACKAGES if "/" not in p), "hermes_edge", "tests", "benchmarks"):
        assert forbidden not in roots, f"wheel ships a top-level {forbidden}/"
    for pkg in SUBPACKAGES:
        assert f"hermes/{pkg}/__init__.py" in names, f"hermes.{pkg.replace('/', '.')} missing from the wheel"
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names), "wheel carries bytecode"
    assert set(top_level) <= {"hermes"}, f"top_level.txt lists {top_level}"


def test_imports_resolve_to_the_wheel(installed: Installed) -> None:
    got = installed.python_json(
        "import json, hermes, hermes.common, hermes.client, hermes.server, hermes.deploy\n"
        "import hermes.common.wire, hermes.client.agent, hermes.server.cli\n"
        "print(json.dumps({'path': [p for p in hermes.__path__],\n"
        "  'files': {m.__name__: m.__file__ for m in (hermes.common, hermes.client, hermes.server, hermes.deploy,\n"
        "            hermes.common.wire, hermes.client.agent, hermes.server.cli)}}))"
    )
    assert isinstance(got, dict)
    for name, file in got["files"].items():
        assert file and _inside(file, installed.site_packages), (
            f"{name} imported from {file}, not from the venv's {installed.site_packages}"
        )
        assert not _inside(file, REPO_ROOT), f"{name} imported from the repository: {file}"
    real_paths = [p for p in got["path"] if os.path.isdir(p)]
    assert real_paths and all(_inside(p, installed.site_packages) for p in real_paths), got["path"]


def test_agent_does_not_import_the_server_stack(installed: Installed) -> None:
    got = installed.python_json(
        "import json, sys\n"
        "import hermes.client.agent, hermes.client.cli, hermes.client.transport\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {SERVER_ONLY!r})\n"
        "print(json.dumps({'heavy': heavy, 'file': hermes.client.agent.__file__}))"
    )
    assert isinstance(got, dict)
    assert _inside(got["file"], installed.site_packages), got["file"]
    assert got["heavy"] == [], f"importing hermes.client.agent pulled in {got['heavy']}"


@pytest.mark.parametrize("script", ["hermes-server", "hermes-client", "hermes-deploy"])
def test_console_script_help(installed: Installed, script: str) -> None:
    exe = installed.bin / script
    assert exe.is_file(), f"{script} not installed in {installed.bin}: {sorted(p.name for p in installed.bin.iterdir())}"
    r = installed.run(exe, "--help")
    assert r.returncode == 0, f"{script} --help exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    assert f"usage: {script}" in r.stdout, r.stdout
    first = exe.read_text(errors="replace").splitlines()[0]
    # Not resolved: the venv's python is a symlink to the system interpreter.
    assert first.startswith("#!") and Path(first[2:].strip()).parent == installed.bin, f"{script} shebang: {first}"


def test_testbed_script(installed: Installed) -> None:
    has = installed.python_json(
        "import importlib.util, json\n"
        "print(json.dumps(importlib.util.find_spec('hermes.deploy.testbed') is not None))"
    )
    if not has:
        pytest.skip("hermes.deploy.testbed is not written yet, so the hermes-testbed entry point has no target")
    exe = installed.bin / "hermes-testbed"
    assert exe.is_file(), f"hermes-testbed not installed in {installed.bin}"
    r = installed.run(exe, "--help")
    assert r.returncode == 0, f"hermes-testbed --help exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    assert "usage:" in r.stdout, r.stdout


def test_wheel_ships_the_live_page(installed: Installed) -> None:
    """/ui is served from package data: a wheel without it would answer 500 on an installed server."""
    with zipfile.ZipFile(installed.wheel) as zf:
        names = set(zf.namelist())
    for asset in ("dashboard.html", "dashboard.js", "dashboard.css"):
        assert f"hermes/server/static/{asset}" in names, f"{asset} missing from the wheel"
    got = installed.python_json(
        # Where hermes.server.dashboard looks (STATIC_DIR), without importing FastAPI.
        "import json, pathlib, hermes.server\nstatic = pathlib.Path(hermes.server.__file__).parent / 'static'\n"
        "print(json.dumps({'dir': str(static), 'page': (static / 'dashboard.html').is_file()}))"
    )
    assert isinstance(got, dict) and got["page"] and _inside(got["dir"], installed.site_packages), got
