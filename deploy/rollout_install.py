"""Preparing a device: ``check`` probes it, ``install`` uploads the hermes-edge wheel into its venv.

The wheel is built from the checkout hermes-deploy runs from (``find_source_tree``,
``build_wheel``) unless one is given; it lands in ``workdir/wheels/`` and is
installed into ``workdir/venv/`` (see the layout in ``hermes.deploy.rollout``).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes.deploy.inventory import TORCH_CPU_INDEX, Host
from hermes.deploy.remote import RemoteSession
from hermes.deploy.rollout import CommandFailed, quote, remote_path, require_ok, script, shown

log = logging.getLogger(__name__)

MIN_PYTHON = (3, 11)


# ---------------------------------------------------------------------------
# check

_PROBE = r"""
import importlib.metadata as md, importlib.util, json, os, platform, shutil, socket, sys
wd = os.path.abspath(sys.argv[1])
probe = wd
while not os.path.exists(probe):
    probe = os.path.dirname(probe)
du = shutil.disk_usage(probe)
mem = {}
try:
    with open("/proc/meminfo") as fh:
        for line in fh:
            k, v = line.split(":", 1)
            mem[k] = int(v.split()[0]) * 1024
except OSError:
    pass
def version(name):
    try:
        return md.version(name) if importlib.util.find_spec(name) else None
    except Exception:
        return None
venv_py = os.path.join(wd, "venv", "bin", "python")
print(json.dumps({
    "hostname": socket.gethostname(), "system": platform.system(), "machine": platform.machine(),
    "python": platform.python_version(), "python_path": sys.executable,
    "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    "mem_total": mem.get("MemTotal"), "mem_available": mem.get("MemAvailable"),
    "disk_free": du.free, "disk_path": probe, "workdir": wd,
    "torch": version("torch"), "venv": os.path.exists(venv_py),
}))
"""


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def check(host: Host, s: RemoteSession) -> tuple[str, dict[str, Any]]:
    """Python version, cores, memory and free disk of the device."""
    wd = remote_path(host.workdir)
    res = s.run(script(
        f"PY={quote(host.python)}",
        'command -v "$PY" >/dev/null 2>&1 || { echo "python $PY not found on the device" >&2; exit 20; }',
        f'exec "$PY" -c {quote(_PROBE)} {quote(wd)}',
    ), timeout=60)
    require_ok(res, f"probe with {host.python}")
    info = json.loads(res.stdout.strip().splitlines()[-1])
    too_old = tuple(int(x) for x in info["python"].split(".")[:2]) < MIN_PYTHON
    summary = (f"Python {info['python']}{' (too old: needs >= 3.11)' if too_old else ''}, "
               f"{info['usable_cores']}/{info['cores']} cores, "
               f"RAM {_gib(info['mem_total'])} ({_gib(info['mem_available'])} free), "
               f"disk {_gib(info['disk_free'])} free, torch {info['torch'] or 'missing'}, "
               f"{'installed' if info['venv'] else 'not installed'}")
    if too_old:
        raise CommandFailed(summary, info)
    return summary, info


# ---------------------------------------------------------------------------
# install


def find_source_tree() -> Path | None:
    """The project checkout this package runs from (an editable install), if any."""
    root = Path(__file__).resolve().parent.parent
    meta = root / "pyproject.toml"
    try:
        if tomllib.loads(meta.read_text())["project"]["name"] == "hermes-edge":
            return root
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    return None


def build_wheel(source: Path, out_dir: Path, *, timeout: float = 300.0) -> Path:
    """Build the hermes-edge wheel from a checkout, from a copy of its sources (the tree is not written to)."""
    meta = tomllib.loads((source / "pyproject.toml").read_text())
    folders = set(meta.get("tool", {}).get("setuptools", {}).get("package-dir", {}).values())
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hermes-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "LICENSE.txt"):
            if (source / name).is_file():
                shutil.copy2(source / name, src / name)
        junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
        for folder in sorted(folders):
            # A subpackage mapped on its own lies inside its parent's folder, copied already.
            if any(folder != f and Path(folder).is_relative_to(f) for f in folders):
                continue
            shutil.copytree(source / folder, src / folder, ignore=junk)
        dist = Path(tmp) / "dist"
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
               "--disable-pip-version-check", "--wheel-dir", str(dist), str(src)]
        log.info("building the wheel: %s", " ".join(cmd))
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        if r.returncode != 0:
            raise RuntimeError(f"wheel build failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        wheels = sorted(dist.glob("hermes_edge-*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"wheel build produced {[p.name for p in dist.iterdir()]}")
        target = out_dir / wheels[0].name
        shutil.copy2(wheels[0], target)
    log.info("built %s", target)
    return target


@dataclass(frozen=True)
class InstallOptions:
    wheel: Path
    deps: str | None = None  # None: each host's inventory value
    system_site_packages: bool | None = None
    recreate_venv: bool = False


_INDEX_OPTIONS = ("--index-url", "-i", "--no-index")


def torch_command(host: Host, pip: list[str]) -> list[str] | None:
    """The pip command that installs the host's torch before the wheel, or None (pip resolves it).

    Installed first, the CPU build satisfies the wheel's ``torch>=`` and pip
    never fetches the CUDA one. A host whose pip_args name their own index
    (an offline wheelhouse, a mirror) gets ``torch`` from there.
    """
    if host.torch in ("cuda", "pypi"):
        return None
    spec = "torch" if host.torch == "cpu" else host.torch
    own_index = any(a.split("=", 1)[0] in _INDEX_OPTIONS for a in host.pip_args)
    index = ["--index-url", TORCH_CPU_INDEX] if host.torch == "cpu" and not own_index else []
    return pip + index + [quote(spec)]


def install(host: Host, s: RemoteSession, opts: InstallOptions) -> tuple[str, dict[str, Any]]:
    """Upload the wheel and install it into ``workdir/venv``."""
    deps = opts.deps or host.deps
    site = host.system_site_packages if opts.system_site_packages is None else opts.system_site_packages
    wd = remote_path(host.workdir)
    prep = s.run(script(
        f"PY={quote(host.python)}",
        'command -v "$PY" >/dev/null 2>&1 || { echo "python $PY not found on the device" >&2; exit 20; }',
        f'"$PY" -c "import sys; sys.exit(0 if sys.version_info >= {MIN_PYTHON!r} else 1)" '
        '|| { echo "$("$PY" -V 2>&1) is too old: hermes-edge needs Python >= 3.11" >&2; exit 21; }',
        f"mkdir -p {quote(wd)}/wheels {quote(wd)}/logs {quote(wd)}/run",
        f"rm -f {quote(wd)}/wheels/*.whl",
    ), timeout=60)
    require_ok(prep, "preparing " + wd)
    remote_wheel = remote_path(wd, "wheels", opts.wheel.name)
    size = s.put(opts.wheel, remote_wheel)

    venv = remote_path(wd, "venv")
    flag = "true" if site else "false"
    pip = [f"{quote(venv)}/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    pip += [quote(a) for a in host.pip_args]
    spec = opts.wheel.name if not host.extras else f"{opts.wheel.name}[{','.join(host.extras)}]"
    if deps == "present":
        # Dependencies are on the device already (e.g. a preinstalled torch seen
        # through --system-site-packages): install only our wheel, offline.
        steps = [" ".join(pip + ["--no-deps", "--no-index", "--force-reinstall", quote(remote_wheel)])]
    else:
        torch = torch_command(host, pip)
        steps = [" ".join(torch)] if torch else []
        steps += [" ".join(pip + [quote(remote_path(wd, "wheels", spec))]),
                 " ".join(pip + ["--no-deps", "--force-reinstall", quote(remote_wheel)])]
    res = s.run(script(
        "set -e",
        f"PY={quote(host.python)}",
        f"VENV={quote(venv)}",
        f"WANT_SITE={flag}",
        # Recreate the venv when asked, or when its system-site-packages setting differs.
        'HAVE_SITE=$(sed -n "s/^include-system-site-packages *= *//p" "$VENV/pyvenv.cfg" 2>/dev/null || true)',
        f'if [ {"1" if opts.recreate_venv else "0"} = 1 ] || [ ! -x "$VENV/bin/python" ] || [ "$HAVE_SITE" != "$WANT_SITE" ]; then',
        '  rm -rf "$VENV"',
        '  if [ "$WANT_SITE" = true ]; then "$PY" -m venv --system-site-packages "$VENV"; else "$PY" -m venv "$VENV"; fi',
        "  echo venv=created",
        "fi",
        *steps,
        '"$VENV/bin/hermes-client" --help > /dev/null',
        'echo version=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version(\'hermes-edge\'))")',
        'echo torch=$("$VENV/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null || echo missing)',
    ), timeout=3600)  # the per-host deadline (--timeout) ends it sooner
    details = {"wheel": opts.wheel.name, "bytes": size, "deps": deps, "system_site_packages": site, "venv": venv,
               "torch_build": host.torch if deps == "full" else "present"}
    require_ok(res, "pip install", details)
    f = res.fields()
    details.update(version=f.get("version"), torch=f.get("torch"), venv_created=f.get("venv") == "created")
    return (f"installed hermes-edge {f.get('version')} ({size / 1e3:.0f} kB wheel, deps {deps}) in {shown(venv)}"
            f"{' (new venv)' if details['venv_created'] else ''}; torch {f.get('torch')}"), details
