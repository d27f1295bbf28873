"""Run-config keys: today's flat names as aliases of the nested ones, and key normalisation.

Inputs (``build_config`` keywords, presets, JSON/TOML files, ``--set``) may
name a parameter three ways: nested (``{"zscore": {"alpha": -1.0}}``),
dotted (``zscore.alpha``) or by its flat name before sections existed
(``gate_alpha``). ``normalise`` turns any mix into the nested form
``RunConfig`` is made of; a later value for the same leaf wins. The flat
names are input spellings only: attributes are read by the nested name.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

# Flat name (the config before sections) -> dotted name: the input aliases and the doc's "old flat name" column.
ALIASES: dict[str, str] = {
    "max_staleness": "asp.max_staleness",
    "ssp_staleness": "ssp.staleness",
    "ebsp_lookahead": "ebsp.lookahead",
    "ebsp_history": "ebsp.history",
    "world_size": "collective.world_size",
    "collective_timeout_seconds": "collective.timeout_seconds",
    "collective_regroup": "collective.regroup",
    "collective_regroup_seconds": "collective.regroup_seconds",
    "collective_min_world_size": "collective.min_world_size",
    "gate_window": "zscore.window",
    "gate_alpha": "zscore.alpha",
    "gate_beta": "zscore.beta",
    "gate_lambda": "zscore.lam",
    "gate_relaxation": "zscore.relaxation",
    "gate_validation_samples": "zscore.validation_samples",
    "loss_eval_samples": "loss.eval_samples",
    "b_min": "batch_bounds.b_min",
    "b_max": "batch_bounds.b_max",
    "memory_fraction": "batch_bounds.memory_fraction",
    "rebalance_min_observations": "rebalance.min_observations",
    "rebalance_warmup_cycles": "rebalance.warmup_cycles",
    "pcontrol_deadband": "pcontrol.deadband",
    "pcontrol_alpha": "pcontrol.alpha",
    "control_interval": "pcontrol.interval",
    "pcontrol_carry_smoothing": "pcontrol.carry_smoothing",
    "pcontrol_throughput_cap": "pcontrol.throughput_cap",
    "pcontrol_drop_margin": "pcontrol.drop_margin",
    "pcontrol_drop_cap_updates": "pcontrol.drop_cap_updates",
    "global_batch": "pcontrol.global_batch",
    "adaptive_epsilon": "adaptive.epsilon",
    "adaptive_patience": "adaptive.patience",
    "partition_window": "partition.window",
    "mbs_min": "dual_search.mbs_min",
    "mbs_max": "dual_search.mbs_max",
    "search_tolerance": "dual_search.tolerance",
    "cost_fit": "dual_search.cost_fit",
    "balance_band": "dual_search.balance_band",
}

# Names other frameworks use, so a near miss of those still finds ours
# (difflib alone cannot see that ``learning_rate`` means ``lr``).
SYNONYMS: dict[str, str] = {
    "learning_rate": "lr",
    "batch": "batch_size",
    "mini_batch_size": "batch_size",
    "microbatch_size": "batch_size",
    "dataset_size": "cycle_samples",
    "dss": "cycle_samples",
    "mbs": "batch_size",
    "staleness": "ssp.staleness",
}


class UnknownKey(ValueError):
    """A run-config key that names no field; the message suggests the closest known one."""


def known_keys(fields: Mapping[str, type[BaseModel] | None]) -> list[str]:
    """Every key a user may write: top-level fields, dotted section fields and the flat aliases.

    ``fields`` maps each top-level field to its section model, or None for a plain field.
    """
    out: list[str] = []
    for name, section in fields.items():
        out += [name] if section is None else [f"{name}.{f}" for f in section.model_fields]
    return out + list(ALIASES)


def suggestion(key: str, keys: Iterable[str]) -> str:
    """" did you mean 'x'?" for the closest known key (or synonym), else ""."""
    pool = {k: k for k in keys}
    pool.update({s: t for s, t in SYNONYMS.items() if s not in pool})
    # Also match on the leaf alone: ``alpha`` finds ``zscore.alpha``.
    leaves = {k.rpartition(".")[2]: k for k in keys if "." in k}
    close = difflib.get_close_matches(key, list(pool), n=1, cutoff=0.6)
    if close:
        target = ALIASES.get(pool[close[0]], pool[close[0]])
        return f"; did you mean {target!r}?"
    close = difflib.get_close_matches(key.rpartition(".")[2], list(leaves), n=1, cutoff=0.8)
    return f"; did you mean {leaves[close[0]]!r}?" if close else ""


def normalise(data: Mapping[str, Any], fields: Mapping[str, type[BaseModel] | None], *,
              problems: list[str] | None = None, spelled: dict[str, str] | None = None) -> dict[str, Any]:
    """Nested, dotted and flat-alias keys -> the nested dict of ``RunConfig``.

    A section given as a dict (or a section model) is merged leaf by leaf with
    dotted keys for the same section, in order, so ``{"zscore": {...}}`` from
    a file and ``zscore.alpha`` from ``--set`` combine; a later value wins.
    An unknown key raises UnknownKey, or is appended to ``problems`` (and
    left out) when a list is given, so that every bad key is reported at
    once. ``spelled`` receives dotted key -> the key as the caller wrote it,
    for messages that name the field the way the user did.
    """
    flat: dict[str, Any] = {}

    def refuse(text: str) -> None:
        if problems is None:
            raise UnknownKey(text)
        problems.append(text)

    for raw, value in data.items():
        key = ALIASES.get(raw, raw)
        head, dot, leaf = key.partition(".")
        section = fields.get(head)
        if head not in fields or (dot and (section is None or leaf not in section.model_fields)):
            refuse(f"{raw}: unknown config key{suggestion(raw, known_keys(fields))}")
        elif section is not None and not dot:
            if isinstance(value, BaseModel):
                value = value.model_dump()
            if not isinstance(value, Mapping):
                refuse(f"{raw}: a section; set its fields ({', '.join(section.model_fields)}) as {raw}.FIELD or a table")
                continue
            for sub, v in value.items():
                if sub not in section.model_fields:
                    refuse(f"{raw}.{sub}: unknown config key{suggestion(f'{raw}.{sub}', known_keys(fields))}")
                else:
                    flat[f"{head}.{sub}"] = v
        else:
            flat[key] = value
            if spelled is not None:
                spelled[key] = raw
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        head, dot, leaf = key.partition(".")
        if dot:
            nested.setdefault(head, {})[leaf] = value
        else:
            nested[key] = value
    return nested
