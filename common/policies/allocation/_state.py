"""Checkpoint states of the allocators: plain JSON-able dicts stamped with who wrote them.

A state goes through ``json.dumps`` into the server checkpoint's metadata and
comes back through ``json.loads``: tuples come back as lists, every dict key
as a string, so loaders convert explicitly and never rely on the types
``state_dict`` had. The stamp names the policy and the parameters that give
the saved numbers their meaning (steps per cycle, base batch, bounds...): a
batch saved under other bounds, or counts saved by another policy, are
refused rather than loaded into a state they do not describe.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from hermes.common.policies.allocation import AllocatorStateError, Resize, Workload

STATE_FORMAT = 1

# Keys the batch size had before it got one name (issue 26), old -> new. A
# checkpoint written then still loads: its parameters are read under the new
# names (no current parameter uses an old one), its body through ``renamed``.
RENAMED_PARAMS = {"base": "batch_size", "mbs": "batch_size", "base_mbs": "base_batch_size"}


def stamp(policy: str, params: Mapping[str, Any], **body: Any) -> dict[str, Any]:
    return {"policy": policy, "format": STATE_FORMAT, "params": dict(params), **body}


def unstamp(policy: str, state: Any, params: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state`` if this policy wrote it in this format with these parameters; AllocatorStateError if not."""
    if not isinstance(state, Mapping):
        raise AllocatorStateError(f"{policy!r} allocator state must be a mapping, got {type(state).__name__}")
    written_by = state.get("policy")
    if written_by != policy:
        raise AllocatorStateError(f"allocator state was written by policy {written_by!r}; "
                                  f"this run's allocation is {policy!r}")
    if state.get("format") != STATE_FORMAT:
        raise AllocatorStateError(f"{policy!r} allocator state has format {state.get('format')!r}; "
                                  f"this server reads {STATE_FORMAT}")
    saved = state.get("params")
    if not isinstance(saved, Mapping):
        raise AllocatorStateError(f"{policy!r} allocator state lacks its parameters")
    saved = {RENAMED_PARAMS.get(k, k): v for k, v in saved.items()}
    differing = sorted(k for k in set(saved) | set(params) if saved.get(k) != params.get(k))
    if differing:
        changes = ", ".join(f"{k} {saved.get(k)!r} -> {params.get(k)!r}" for k in differing)
        raise AllocatorStateError(f"{policy!r} allocator state was saved with other parameters: {changes}")
    return state


@contextmanager
def malformed_as_state_error(policy: str) -> Iterator[None]:
    """A state with the right stamp but a broken body is refused like a foreign one."""
    try:
        yield
    except AllocatorStateError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise AllocatorStateError(f"{policy!r} allocator state is malformed: {exc!r}") from None


def renamed(state: Mapping[str, Any], key: str, old: str) -> Any:
    """``state[key]``, or ``state[old]`` in a checkpoint written before the key was renamed."""
    return state[key] if key in state or old not in state else state[old]


def resize_state(r: Resize) -> dict[str, Any]:
    w = r.workload
    return {"workload": [w.dss, w.batch_size, w.accumulation], "kind": r.kind, "detail": dict(r.detail)}


def resize_from_state(state: Mapping[str, Any]) -> Resize:
    dss, batch_size, acc = (int(v) for v in state["workload"])
    return Resize(Workload(dss, batch_size, acc), str(state["kind"]), dict(state["detail"]))


def str_ints(d: Mapping[Any, Any]) -> dict[str, int]:
    return {str(k): int(v) for k, v in d.items()}
