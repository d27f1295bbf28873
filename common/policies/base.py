"""One registry for every policy kind, and the generic compatibility check.

A run picks one policy of each kind (``KINDS``). Each policy is a class
registered under its kind and name with ``@register(kind, name, *aliases)``
and declares, as class attributes, what it offers and what it needs:

- ``provides``: capabilities this policy gives the run (``"barrier"``: the
  updates of one step are aggregated together; ``"lockstep"``: every worker
  pushes exactly once per round; ``"free_running"``: no worker ever waits
  for another, so skipped pushes are harmless and updates fold one at a
  time; ``"asynchronous"``: pushes are folded as they come, with no global
  step; ``"server_model"``: the server holds the model; ``"independent_steps"``:
  workers need not agree on optimizer steps per cycle).
- ``requires``: capability -> why it is needed (a sentence completed with
  ``{sync}``, the run's sync policy, and ``{providers}``, the policies that
  provide the capability). ``check_compatible`` refuses a run in which some
  chosen policy requires what no chosen policy provides, with that sentence.
- ``needs_*`` flags that tell the engine and the agent what to build for the
  policy (a candidate-model loss, a validation loss on the agent, compute
  powers from the allocator), so nobody recognises a policy by its name.
- ``sections``: the run-config sections the policy is built from. A policy is
  built (``build``) and checked (``check_params``) from a small ``Core``
  record of run-wide values plus those sections, passed by name, never from
  the whole run config: a policy can be built and tested without one, and
  this package does not import the config module (which imports it).

Nothing outside this registry compares a policy name with a string: code
asks ``get(kind, name)`` for the class and reads its declarations.

Policies from outside the package plug into this same registry: in Python
with ``register`` (``hermes.register_policy``), or by an entry point in the
group ``hermes.policies`` named ``KIND.NAME`` whose value is the class (or a
module that registers its policies when imported), loaded on the first
lookup of that kind (docs/extending.md).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

log = logging.getLogger(__name__)

KINDS = ("topology", "sync", "gate", "aggregation", "lr_scaling", "allocation")
# Kinds chosen once per direction rather than once per run (``compression.push`` / ``.pull``): registered and
# looked up like the others, but not part of a run's one-of-each choice (``check_compatible``).
PER_DIRECTION_KINDS = ("compression",)
ALL_KINDS = KINDS + PER_DIRECTION_KINDS
# The order in which declarations are checked: the first refusal is the one reported.
CHECK_ORDER = ("aggregation", "gate", "allocation", "lr_scaling", "sync", "topology")

# The modules whose import registers the built-in policies of each kind;
# imported on first lookup so that importing one policy module never pulls in
# the others (and no import cycle runs through the registry).
_BUILTIN_MODULES: dict[str, tuple[str, ...]] = {
    "topology": ("hermes.common.policies.topology",),
    # ebsp.py imports sync.py, so importing sync.py alone (as the config does, for its params) misses ebsp.
    "sync": ("hermes.common.policies.sync", "hermes.common.policies.ebsp", "hermes.common.policies.federated"),
    "gate": ("hermes.common.policies.gate",),
    "aggregation": ("hermes.common.policies.aggregation", "hermes.common.policies.federated",
                    "hermes.common.policies.robust"),
    "lr_scaling": ("hermes.common.policies.lr_scaling",),
    "allocation": tuple(f"hermes.common.policies.allocation.{m}" for m in (
        "uniform", "static", "pcontrol", "task_allocation", "dynamic_partitioning", "hermes_sizing")),
    "compression": ("hermes.common.policies.compression",),
}


@dataclass(frozen=True)
class Core:
    """The run-wide values a policy may read besides its own sections (the run config's core; no defaults
    here: each has its one default on the run config)."""

    lr: float
    batch_size: int  # the run's mini-batch size (MBS) before any allocator scales it
    cycle_samples: int  # samples per cycle between two pushes (DSS)
    shard_size: int  # samples per data shard, the unit of DSS
    seed: int
    sync: str  # the run's sync policy, for messages
    barrier: bool  # the sync policy aggregates one step's updates together (it provides "barrier")

    @property
    def local_steps(self) -> int:
        """Optimizer steps per cycle at the run's batch: ``cycle_samples // batch_size``, at least 1."""
        return max(1, self.cycle_samples // self.batch_size)


class Policy:
    """What every registered policy declares; subclasses override the class attributes."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    # Capabilities offered to the run, and capability -> reason it is needed.
    provides: ClassVar[frozenset[str]] = frozenset()
    requires: ClassVar[Mapping[str, str]] = {}
    # The engine scores each candidate model on validation data (Hermes Alg. 2).
    needs_candidate_loss: ClassVar[bool] = False
    # The agent sends its model's change since the first model (w - w0), not since its last
    # pull: the server blends worker models into the global one (Hermes Alg. 2, FedAsync).
    update_from_baseline: ClassVar[bool] = False
    # The agent measures a validation loss after every cycle (Hermes Alg. 1).
    needs_validation_loss: ClassVar[bool] = False
    # Aggregation weights come from the allocator's per-worker compute power (EDP-SGD).
    needs_compute_power: ClassVar[bool] = False
    # The allocator caps each worker's batch by its measured memory (OmniLearn Eq. 9): agents send a memory profile.
    needs_memory_profile: ClassVar[bool] = False
    # The allocator deals each epoch of the server's train set out among the workers (DP-SGD Alg. 1),
    # so it cannot run on device-local data, of which the server holds none.
    deals_server_data: ClassVar[bool] = False
    # The run-config sections (``zscore``, ``batch_bounds`` ...) passed by name to build/check_params/pushes_from_baseline.
    sections: ClassVar[tuple[str, ...]] = ()
    # Dotted parameters that only this policy may set: another choice of its kind refuses a value there.
    # Not inherited in spirit: a subclass that does not read them declares () (hermes of asp).
    exclusive_params: ClassVar[tuple[str, ...]] = ()

    # ``*args`` in these signatures lets a subclass name its sections as keyword-only parameters
    # (``zscore: GateParams``) and still override them (mypy treats *args/**kwargs: Any as any call).
    @classmethod
    def build(cls, core: Core, *args: Any, **params: Any) -> Any:
        """The run's policy object from ``core``, the declared ``sections`` and what only the engine knows
        (``dss_max``, ``epoch_samples`` for allocators). The class itself by default: rules whose answers
        need no state."""
        return cls

    @classmethod
    def pushes_from_baseline(cls, *args: Any, **sections: Any) -> bool:
        """Whether this run's agents push w - w0 (``update_from_baseline``, unless a parameter says otherwise)."""
        return cls.update_from_baseline

    @classmethod
    def proximal_rho(cls, *args: Any, **sections: Any) -> float:
        """rho of a proximal term rho/2 ||x - x_tau||^2 the agent adds to its loss (FedAsync Sec. 4); 0: none."""
        return 0.0

    @classmethod
    def check_params(cls, core: Core, *args: Any, **sections: Any) -> None:
        """Refuse (ValueError naming the field) parameters this policy cannot run with; called only when chosen."""


P = TypeVar("P", bound=type[Policy])

_REGISTRY: dict[str, dict[str, type[Policy]]] = {k: {} for k in ALL_KINDS}
_ALIASES: dict[str, dict[str, str]] = {k: {} for k in ALL_KINDS}
_loaded: set[str] = set()

# Third-party policies: entry points named "KIND.NAME" (the class) or "KIND" (a module that registers).
ENTRY_POINT_GROUP = "hermes.policies"
# Names registered from outside the package (register_policy, entry points): a second registration replaces them.
_PLUGINS: dict[str, set[str]] = {k: set() for k in KINDS}


class UnknownPolicy(ValueError):
    """A policy name that no policy of its kind registered."""


def register(kind: str, name: str, *aliases: str) -> Callable[[P], P]:
    """Class decorator: register ``cls`` as policy ``name`` (and ``aliases``) of ``kind``."""
    if kind not in ALL_KINDS:
        raise ValueError(f"unknown policy kind {kind!r}; known: {', '.join(ALL_KINDS)}")

    def deco(cls: P) -> P:
        if not (isinstance(cls, type) and issubclass(cls, Policy)):
            raise TypeError(f"{kind} policy {name!r}: {cls!r} is not a subclass of hermes Policy")
        for n in (name, *aliases):
            if n in _REGISTRY[kind] or n in _ALIASES[kind]:
                raise ValueError(f"{kind} policy {n!r} registered twice")
        cls.kind, cls.name, cls.aliases = kind, name, tuple(aliases)
        _REGISTRY[kind][name] = cls
        for a in aliases:
            _ALIASES[kind][a] = name
        return cls

    return deco


def register_policy(kind: str, name: str, cls: P | None = None, *aliases: str) -> Any:
    """The public way in (``hermes.register_policy``): register ``cls`` as policy ``name`` of ``kind``.

    Without ``cls`` it is a class decorator. The built-in policies of ``kind``
    are loaded first, so a name they use is refused at once (not when the
    built-ins are imported later); registering a plug-in's name again (a
    notebook cell run twice) replaces it.
    """
    _load(kind)
    for n in (name, *aliases):
        if n in _PLUGINS[kind]:
            _REGISTRY[kind].pop(n, None)
            _ALIASES[kind].pop(n, None)
            _PLUGINS[kind].discard(n)

    def deco(c: P) -> P:
        register(kind, name, *aliases)(c)
        _PLUGINS[kind].update((name, *aliases))
        return c

    return deco if cls is None else deco(cls)


def _load(kind: str) -> None:
    if kind in _loaded:
        return
    if kind not in ALL_KINDS:
        raise ValueError(f"unknown policy kind {kind!r}; known: {', '.join(ALL_KINDS)}")
    _loaded.add(kind)
    for module in _BUILTIN_MODULES[kind]:
        importlib.import_module(module)
    _load_entry_points(kind)


def _load_entry_points(kind: str) -> None:
    """The ``hermes.policies`` entry points of ``kind``; a broken one is one warning, never a crash of the run."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep_kind, _, name = ep.name.partition(".")
        if ep_kind != kind:
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # third-party code: any error it raises is its own
            log.warning("policy plug-in %s = %s not loaded: %s: %s", ep.name, ep.value, type(exc).__name__, exc)
            continue
        if not name or not isinstance(obj, type):
            continue  # a module: importing it registered its policies
        if not issubclass(obj, Policy):
            log.warning("policy plug-in %s = %s not loaded: %r is not a hermes Policy subclass",
                        ep.name, ep.value, obj)
        elif _REGISTRY[kind].get(name) is not obj:
            try:
                register(kind, name)(obj)
            except ValueError as exc:  # a name a built-in (or another plug-in) already has
                log.warning("policy plug-in %s = %s not loaded: %s", ep.name, ep.value, exc)
                continue
            _PLUGINS[kind].add(name)


def names(kind: str, *, aliases: bool = False) -> tuple[str, ...]:
    """Registered names of ``kind`` in registration order (with the aliases after them when asked)."""
    _load(kind)
    out = tuple(_REGISTRY[kind])
    return out + tuple(_ALIASES[kind]) if aliases else out


def canonical(kind: str, name: str) -> str:
    """The registered name for ``name`` or one of its aliases; UnknownPolicy otherwise."""
    _load(kind)
    if name in _REGISTRY[kind]:
        return name
    if name in _ALIASES[kind]:
        return _ALIASES[kind][name]
    raise UnknownPolicy(f"unknown {kind} {name!r}; known: {', '.join(names(kind, aliases=True))}")


def get(kind: str, name: str) -> type[Policy]:
    """The class registered as ``name`` (or an alias) of ``kind``."""
    return _REGISTRY[kind][canonical(kind, name)]


def build(kind: str, name: str, core: Core, sections: Mapping[str, Any], **context: Any) -> Any:
    """Build policy ``name`` of ``kind`` from ``core`` and its declared ``sections`` (section name -> parameters).

    ``context`` carries what only the engine knows (``dss_max``, ``epoch_samples`` for allocators).
    """
    cls = get(kind, name)
    return cls.build(core, **{s: sections[s] for s in cls.sections}, **context)


def quoted_names(items: Iterable[str]) -> str:
    return " or ".join(repr(i) for i in items)


def providers(capability: str, kind: str | None = None) -> tuple[str, ...]:
    """Names of the policies (of ``kind``, or of any kind) that provide ``capability``."""
    kinds = KINDS if kind is None else (kind,)
    out: list[str] = []
    for k in kinds:
        _load(k)
        out += [n for n, c in _REGISTRY[k].items() if capability in c.provides]
    return tuple(out)


def check_compatible(chosen: Mapping[str, type[Policy]], core: Core, sections: Mapping[str, Any]) -> None:
    """Refuse a run in which a chosen policy requires what none provides; then each policy's own parameter checks.

    ``chosen`` is the run's policy class of every kind. The message is the
    requiring policy's own reason, e.g. "allocation 'adaptive' splits one
    synchronous round's work ...: it needs sync 'bsp', not 'asp'".
    """
    offered: set[str] = set().union(*(c.provides for c in chosen.values()))
    for kind in CHECK_ORDER:
        cls = chosen[kind]
        for capability, reason in cls.requires.items():
            if capability not in offered:
                text = reason.format(sync=repr(core.sync), providers=quoted_names(providers(capability, "sync")))
                raise ValueError(f"{kind} {cls.name!r} {text}")
    for cls in chosen.values():
        cls.check_params(core, **{s: sections[s] for s in cls.sections})
