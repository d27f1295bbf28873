"""Nested config sections: inputs in every spelling, unknown keys, the generated config table (docs/configuration.md), the migration tool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes.common.config import SECTIONS, ConfigError, RunConfig, build_config, load_config_file
from hermes.common.config_doc import DOC, END, START, table
from hermes.common.config_doc import main as config_doc_main
from hermes.common.config_keys import ALIASES

ROOT = Path(__file__).resolve().parents[2]


def test_docs_config_table_is_the_generated_one():
    text = (ROOT / DOC).read_text()
    assert START in text and END in text, f"{DOC} lost its {START} ... {END} markers"
    inside = text.split(START, 1)[1].split(END, 1)[0]
    assert inside == "\n" + table(), f"run `python -m hermes.common.config_doc --write {DOC}`"


def test_config_doc_write_replaces_only_the_table(tmp_path, capsys):
    doc = tmp_path / "configuration.md"
    doc.write_text(f"head\n{START}\nstale\n{END}\ntail\n")
    assert config_doc_main(["--write", str(doc)]) == 0
    assert doc.read_text() == f"head\n{START}\n{table()}{END}\ntail\n"
    bare = tmp_path / "bare.md"
    bare.write_text("no markers here\n")
    assert config_doc_main(["--write", str(bare)]) == 2
    assert bare.read_text() == "no markers here\n"
    assert "no <!-- config-table:start -->" in capsys.readouterr().err


def test_every_field_has_a_description():
    for name, info in RunConfig.model_fields.items():
        assert info.description, name
        section = SECTIONS[name]
        for field, sub in (section.model_fields.items() if section else ()):
            assert sub.description, f"{name}.{field}"


@pytest.mark.parametrize("flat,dotted", sorted(ALIASES.items()))
def test_every_alias_names_a_section_field(flat, dotted):
    head, _, leaf = dotted.partition(".")
    section = SECTIONS[head]
    assert section is not None and leaf in section.model_fields


def test_flat_dotted_and_nested_keys_are_the_same_setting():
    a = build_config("hermes", gate_alpha=-1.0, gate_lambda=3)
    b = build_config("hermes", **{"zscore.alpha": -1.0, "zscore.lam": 3})
    c = build_config("hermes", zscore={"alpha": -1.0, "lam": 3})
    assert a == b == c
    assert (a.zscore.alpha, a.zscore.lam, a.zscore.beta) == (-1.0, 3, 0.1)


def test_an_override_merges_with_the_presets_section_leaf_by_leaf():
    cfg = build_config("omnilearn-bsp", pcontrol={"alpha": 0.5})
    assert (cfg.pcontrol.alpha, cfg.pcontrol.deadband, cfg.pcontrol.throughput_cap) == (0.5, 0.1, False)


def test_nested_toml_tables(tmp_path):
    p = tmp_path / "run.toml"
    p.write_text('preset = "hermes"\n\n[zscore]\nalpha = -2.0\nwindow = 6\n')
    cfg = build_config(**load_config_file(p))
    assert (cfg.zscore.alpha, cfg.zscore.window) == (-2.0, 6)


@pytest.mark.parametrize("key,hint", [
    ("learning_rate", "did you mean 'lr'?"),
    ("gate_alpah", "did you mean 'zscore.alpha'?"),
    ("zscore.alpah", "did you mean 'zscore.alpha'?"),
    ("alpha", "did you mean 'zscore.alpha'?"),
    ("batchsize", "did you mean 'batch_size'?"),
])
def test_unknown_key_suggests_the_closest_known_one(key, hint):
    with pytest.raises(ConfigError, match=f"^{key}: unknown config key; {hint}"):
        build_config(**{key: 1})


def test_unknown_field_in_a_section_table():
    with pytest.raises(ConfigError, match=r"zscore\.lambda: unknown config key; did you mean 'zscore\.lam'\?"):
        build_config(zscore={"lambda": 3})


def test_errors_use_the_callers_spelling():
    with pytest.raises(ConfigError, match="^gate_beta:"):
        build_config(gate_beta=-1)
    with pytest.raises(ConfigError, match=r"^zscore\.beta:"):
        build_config(**{"zscore.beta": -1})


def test_dump_is_nested_and_round_trips_through_json():
    cfg = build_config("dynamic-batching", b_max=64, world_size=None)
    dump = json.loads(json.dumps(cfg.model_dump()))
    assert dump["batch_bounds"]["b_max"] == 64 and "b_max" not in dump
    assert RunConfig(**dump) == cfg


def test_dotted_get_and_no_flat_attribute_names():
    # The flat names are input aliases only (config_keys.ALIASES); attribute access is by the nested name.
    cfg = build_config("hermes")
    assert cfg.get("zscore.alpha") == cfg.zscore.alpha == -1.3
    with pytest.raises(AttributeError):
        cfg.gate_alpha  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(AttributeError):
        cfg.no_such_field  # type: ignore[attr-defined]  # noqa: B018
