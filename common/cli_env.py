"""One command-line convention for every Hermes tool.

``HermesParser`` is an ``argparse.ArgumentParser`` with, for every option:

- an environment twin: ``--request-timeout`` reads ``HERMES_REQUEST_TIMEOUT``
  when the flag is absent (the flag wins), the help shows ``[HERMES_X]``, and
  a bad value is refused in one line naming the variable (exit 2). Switches
  (``store_true``) take 1/true/yes/on or 0/false/no/off. Repeatable
  (``append``) options, ``--help`` and ``--version`` have no twin.
- no prefix matching (``allow_abbrev=False``): ``--slow`` is not silently
  ``--slowdown``; an unknown flag or choice gets "did you mean" instead;
- errors in one line (``prog: message; see prog --help``), exit 2;
- ``--version`` (from the installed package's metadata) when ``version=True``;
- ``deprecated_alias``: an old spelling that still works, hidden from the
  help, warning once on stderr with the new one.

The twin name is the tool's prefix + the long flag in upper case with ``-``
as ``_``. The agent and the server use ``HERMES_``; the launchers have their
own (``HERMES_TESTBED_``, ``HERMES_BENCH_``, ``HERMES_DEPLOY_``) because the
processes they start inherit their environment: ``HERMES_TESTBED_THREADS``
must not become every agent's ``--threads``. ``env_names={"dest": "NAME"}``
keeps an older name, ``env_names={"dest": None}`` gives a flag no twin.

Subparsers made by ``add_subparsers`` are ``HermesParser`` too and apply the
same rules to their own options.

This is the one environment-twin mechanism: ``hermes-server`` uses it too,
with ``reads_env=False``, because its twins are read by its settings model
(pydantic-settings with ``ENV_PREFIX`` and ``ENV_NESTED``, so that ``uvicorn
--factory`` builds the app from the environment alone); the parser then only
names them in ``--help``.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any, NoReturn

__all__ = ["ENV_NESTED", "ENV_PREFIX", "HermesParser", "deprecated_alias", "env_name", "package_version"]

# The agent's and the server's prefix; the launchers pass their own (env_prefix).
ENV_PREFIX = "HERMES_"
# Between a settings section and its field: HERMES_SCREENING__NORM_FACTOR.
ENV_NESTED = "__"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
# A switch's twin set to a false value: the flag's own default stands.
_UNSET = object()


def package_version(dist: str = "hermes-edge") -> str:
    """The installed distribution's version ("unknown" when run from a bare source tree)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def env_name(action: argparse.Action, overrides: Mapping[str, str | None] | None = None,
             prefix: str = ENV_PREFIX) -> str | None:
    """The environment twin of an option, or None when it has none."""
    if overrides and action.dest in overrides:
        return overrides[action.dest]
    if not action.option_strings or action.help == argparse.SUPPRESS:
        return None
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._AppendAction,
                           argparse._CountAction, argparse._SubParsersAction, _DeprecatedAlias)):
        return None
    longs = [o for o in action.option_strings if o.startswith("--")]
    if not longs:
        return None
    return prefix + longs[0][2:].upper().replace("-", "_")


class HermesParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with environment twins, did-you-mean and one-line errors."""

    def __init__(self, *args: Any, version: bool = False, env_names: Mapping[str, str | None] | None = None,
                 env_prefix: str | None = None, reads_env: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.env_names: dict[str, str | None] = dict(env_names or {})
        # None: a subparser takes its parent's (set when the parent parses).
        self.env_prefix = env_prefix
        # False: a settings model reads the twins (hermes-server); the parser only names them.
        self.reads_env = reads_env
        self._env_applied = False
        if version:
            self.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")

    # ---- environment twins ---------------------------------------------------

    def _twins(self) -> list[tuple[argparse.Action, str]]:
        out = []
        for action in self._actions:
            name = env_name(action, self.env_names, self.env_prefix or ENV_PREFIX)
            if name:
                out.append((action, name))
        return out

    def annotate_twins(self) -> None:
        """Append ``[HERMES_X]`` to each option's help that has a twin (done again when parsing and in --help)."""
        for action, name in self._twins():
            if action.help is None:
                action.help = f"[{name}]"
            elif not self.names_twin(action.help, name):
                action.help = f"{action.help} [{name}]"

    def names_twin(self, help_text: str, name: str) -> bool:
        """Whether an option's help already shows its twin."""
        return f"[{name}]" in help_text

    def _apply_env(self) -> None:
        """Defaults from the environment, converted and checked like the flag would be."""
        if self._env_applied or not self.reads_env:
            return
        self._env_applied = True
        for action, name in self._twins():
            text = os.environ.get(name)
            if text is None:
                continue
            value = self._env_value(action, name, text)
            if value is _UNSET:
                continue
            # Every action of the dest: argparse takes the first one's default
            # (--system-site-packages / --no-system-site-packages share one).
            for other in self._actions:
                if other.dest == action.dest:
                    other.default = value
                    other.required = False  # the environment gave it

    def _inherit(self) -> None:
        """Subcommands use the tool's prefix and renames unless they were given their own."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    if isinstance(sub, HermesParser):
                        sub.env_prefix = sub.env_prefix or self.env_prefix
                        sub.env_names = {**self.env_names, **sub.env_names}

    def _env_value(self, action: argparse.Action, name: str, text: str) -> Any:
        flag = max(action.option_strings, key=len)
        where = f"{name}={text!r} (the environment twin of {flag})"
        if action.nargs == 0:  # store_true / store_false / store_const
            low = text.strip().lower()
            if low in _TRUE:
                return action.const
            if low in _FALSE:
                return _UNSET
            self._fail(f"{where}: expected 1/true/yes/on or 0/false/no/off")
        try:
            value = action.type(text) if callable(action.type) else text
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            kind = getattr(action.type, "__name__", "value")
            detail = str(exc) if isinstance(exc, argparse.ArgumentTypeError) else f"not a valid {kind}"
            self._fail(f"{where}: {detail}")
        if action.choices is not None and value not in action.choices:
            self._fail(f"{where}: choose from {', '.join(map(str, action.choices))}"
                       f"{_did_you_mean(str(value), [str(c) for c in action.choices])}")
        return value

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self._inherit()
        self.annotate_twins()
        argv = list(sys.argv[1:] if args is None else args)
        # --help and --version work whatever the environment holds.
        if not {"-h", "--help", "--version"} & set(argv):
            self._apply_env()
        return super().parse_known_args(argv, namespace)

    def format_help(self) -> str:
        self.annotate_twins()
        return super().format_help()

    # ---- errors --------------------------------------------------------------

    def _fail(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")

    def error(self, message: str) -> NoReturn:
        """One line, with the closest flag or choice when the user mistyped one."""
        hint = ""
        m = re.match(r"unrecognized arguments: (.*)", message)
        if m:
            known = _visible_options(self)
            for token in m.group(1).split():
                if token.startswith("-"):
                    hint = _did_you_mean(token.split("=", 1)[0], known)
                    if hint:
                        break
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            hint = _did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        self._fail(f"{message}{hint}; see {self.prog} --help")


def _visible_options(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag shown in the help, subcommands' included (their unknown flags are reported up here)."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _visible_options(sub)
        elif action.help != argparse.SUPPRESS:
            out += action.option_strings
    return out


def _did_you_mean(word: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class _DeprecatedAlias(argparse.Action):
    """An old spelling of ``target``: warns, then does what the new flag does."""

    def __init__(self, option_strings: list[str], dest: str, *, target: argparse.Action, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=target.nargs, const=target.const, default=argparse.SUPPRESS,
                         type=None if isinstance(target.type, str) else target.type, choices=target.choices, metavar=target.metavar, help=argparse.SUPPRESS)
        self.target = target

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        new = max(self.target.option_strings, key=len)
        print(f"{parser.prog}: {option_string} is deprecated; use {new}", file=sys.stderr)
        self.target(parser, namespace, values, new)


def deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Let ``old`` keep working as ``new`` (hidden from --help, a warning when used)."""
    target = next((a for a in parser._actions if new in a.option_strings), None)
    if target is None:
        raise ValueError(f"{new} is not an option of {parser.prog}")
    parser.add_argument(old, action=_DeprecatedAlias, dest=target.dest, target=target)
