"""Run configuration: presets, overrides, errors that name the field, config files."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import ValidationError

from hermes.common.config import (
    DEFAULT_PRESET,
    PRESETS,
    ConfigError,
    RunConfig,
    build_config,
    load_config_file,
)

# ---------------------------------------------------------------------------
# presets and overrides


def test_default_preset_is_hermes():
    cfg = build_config()
    assert DEFAULT_PRESET == "hermes"
    assert (cfg.preset, cfg.sync, cfg.aggregation, cfg.gate, cfg.allocation) == (
        "hermes", "hermes", "loss", "zscore", "dual-search")
    # Hermes Table I: w=10, alpha=-1.3, beta=0.1, lambda=5, eta=0.1; the default adds local momentum 0.9
    # (a measured deviation; 'hermes-paper' trains with plain SGD as Table I does).
    assert (cfg.zscore.window, cfg.zscore.alpha, cfg.zscore.beta, cfg.zscore.lam) == (10, -1.3, 0.1, 5)
    assert (cfg.model, cfg.dataset, cfg.lr, cfg.momentum, cfg.batch_size) == ("cnn", "digits", 0.1, 0.9, 32)
    assert (cfg.loss.reference, cfg.overlap_push, cfg.zscore.resync_factor) == ("pull", True, 4.0)
    assert build_config("hermes-paper").momentum == 0.0


def test_asp_preset():
    cfg = build_config("asp")
    assert (cfg.preset, cfg.sync, cfg.aggregation, cfg.asp.max_staleness, cfg.gate) == ("asp", "asp", "mean", None, "always")
    assert (cfg.lr, cfg.momentum, cfg.allocation) == (0.05, 0.0, "uniform")


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"sync": "bsp", "aggregation": "loss"}, "aggregation 'loss'"),
        ({"sync": "bsp", "gate": "zscore", "aggregation": "samples"}, "gate 'zscore'"),
        ({"sync": "ssp", "gate": "zscore", "aggregation": "samples"}, "gate 'zscore'"),
        ({"sync": "ebsp", "gate": "zscore", "aggregation": "samples"}, "gate 'zscore'"),
        ({"batch_size": 48}, "batch_size=48"),
        ({"mbs_min": 64, "batch_size": 32}, "outside [mbs_min, mbs_max]"),
    ],
)
def test_incoherent_combinations_are_refused_with_a_reason(overrides, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        build_config("hermes", **overrides)


def test_collective_min_world_size_cannot_exceed_the_world():
    with pytest.raises(ConfigError, match="collective_min_world_size 3 exceeds world_size 2"):
        build_config("task-allocation", topology="collective", world_size=2, collective_min_world_size=3)
    cfg = build_config("task-allocation", topology="collective", world_size=3)
    assert (cfg.collective.regroup, cfg.collective.regroup_seconds, cfg.collective.min_world_size) == (True, 5.0, 1)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_and_applies_its_choices(name):
    cfg = build_config(name)
    assert cfg.preset == name
    for key, value in PRESETS[name].items():
        assert cfg.get(key) == value


def test_bsp_preset():
    cfg = build_config("bsp")
    assert (cfg.sync, cfg.aggregation) == ("bsp", "samples")


def test_overrides_win_over_preset():
    cfg = build_config("bsp", aggregation="mean", lr=0.2, batch_size=8, model="mlp")
    assert (cfg.preset, cfg.sync, cfg.aggregation, cfg.lr, cfg.batch_size, cfg.model) == (
        "bsp", "bsp", "mean", 0.2, 8, "mlp")


def test_none_overrides_are_ignored():
    assert build_config("bsp", aggregation=None).aggregation == "samples"


def test_asp_max_staleness():
    assert build_config("asp", max_staleness=3).asp.max_staleness == 3
    assert build_config("asp", max_staleness=0).asp.max_staleness == 0


def test_config_is_frozen():
    cfg = build_config()
    with pytest.raises(ValidationError):
        cfg.lr = 1.0


def test_model_dump_round_trips():
    cfg = build_config("bsp", lr=0.3, model_kwargs={"hidden": [16]})
    again = RunConfig(**cfg.model_dump())
    assert again == cfg
    assert json.loads(json.dumps(cfg.model_dump())) == cfg.model_dump()


# ---------------------------------------------------------------------------
# errors name the field


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"lr": -0.1}, "lr"),
        ({"lr": 0}, "lr"),
        ({"batch_size": 0}, "batch_size"),
        ({"momentum": 1.0}, "momentum"),
        ({"test_fraction": 1.5}, "test_fraction"),
        ({"cycle_samples": -4}, "cycle_samples"),
        ({"shard_size": 0}, "shard_size"),
        ({"eval_interval_seconds": 0}, "eval_interval_seconds"),
        ({"aggregation": "geomedian"}, "aggregation"),
        ({"precision": "fp8"}, "precision"),
        ({"wire_dtype": "int8"}, "wire_dtype"),
        ({"sync": "xyz"}, "sync"),
        ({"model": "gpt5"}, "model"),
        ({"dataset": "imagenet"}, "dataset"),
        ({"max_staleness": -1}, "max_staleness"),
        ({"collective_regroup_seconds": 0}, "collective_regroup_seconds"),
        ({"collective_min_world_size": 0}, "collective_min_world_size"),
        ({"collective_regroup": "sometimes"}, "collective_regroup"),
        ({"batch_size": "many"}, "batch_size"),
        ({"learning_rate": 0.1}, "learning_rate"),  # unknown field: extra="forbid"
    ],
)
def test_config_error_names_the_field(overrides, field):
    with pytest.raises(ConfigError) as ei:
        build_config(**overrides)
    assert str(ei.value).startswith(f"{field}:") or f"; {field}:" in str(ei.value), str(ei.value)


def test_config_error_names_every_bad_field():
    with pytest.raises(ConfigError) as ei:
        build_config(lr=-1, batch_size=0, foo=1)
    msg = str(ei.value)
    for field in ("lr:", "batch_size:", "foo:"):
        assert field in msg


def test_unknown_sync_lists_known():
    with pytest.raises(ConfigError, match=r"unknown sync strategy 'xyz'.*asp.*bsp"):
        build_config(sync="xyz")


def test_unknown_preset():
    with pytest.raises(ConfigError) as ei:
        build_config("hermes-ultra")
    assert str(ei.value) == "preset: unknown preset 'hermes-ultra'; did you mean 'hermes-paper'?"
    with pytest.raises(ConfigError) as ei:
        build_config("zzz")
    msg = str(ei.value)  # nothing close: every known name
    assert msg.startswith("preset: unknown preset 'zzz'; known: ") and "asp" in msg and "hermes-paper" in msg
    with pytest.raises(ConfigError) as ei:
        build_config("hermes-fast")
    assert str(ei.value) == ("preset: unknown preset 'hermes-fast'; it is now 'hermes' (since 2026-11-27; the "
                             "paper's configuration is 'hermes-paper')")


def test_max_staleness_refused_with_bsp():
    with pytest.raises(ConfigError, match="max_staleness applies to sync 'asp' only"):
        build_config("bsp", max_staleness=2)
    with pytest.raises(ConfigError, match="max_staleness"):
        build_config("asp", sync="bsp", max_staleness=0)


def test_file_datasets_need_a_root():
    with pytest.raises(ConfigError, match="dataset_root"):
        build_config(dataset="mnist")
    assert build_config(dataset="mnist", dataset_root="/data").dataset_root == "/data"


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# ---------------------------------------------------------------------------
# files


def test_toml_file(tmp_path):
    p = tmp_path / "run.toml"
    p.write_text('preset = "bsp"\nlr = 0.125\nbatch_size = 16\n\n[model_kwargs]\nwidth = 2\n')
    data = load_config_file(p)
    assert data == {"preset": "bsp", "lr": 0.125, "batch_size": 16, "model_kwargs": {"width": 2}}
    cfg = build_config(**data)
    assert (cfg.sync, cfg.lr, cfg.batch_size) == ("bsp", 0.125, 16)


def test_json_file(tmp_path):
    p = tmp_path / "run.json"
    p.write_text(json.dumps({"lr": 0.5, "aggregation": "samples", "max_staleness": 4}))
    cfg = build_config("asp", **load_config_file(str(p)))
    assert (cfg.lr, cfg.aggregation, cfg.asp.max_staleness) == (0.5, "samples", 4)


@pytest.mark.parametrize(
    "name,text,match",
    [
        ("bad.toml", "lr = = 1", "not valid TOML"),
        ("bad.json", "{lr: 1}", "not valid JSON"),
        ("list.json", "[1, 2]", "top level"),
        ("bin.json", None, "not valid JSON"),
    ],
)
def test_bad_config_files(tmp_path, name, text, match):
    p = tmp_path / name
    if text is None:
        p.write_bytes(b"\xff\xfe\x00garbage")
    else:
        p.write_text(text)
    with pytest.raises(ConfigError, match=match) as ei:
        load_config_file(p)
    assert str(p) in str(ei.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file"):
        load_config_file(tmp_path / "nope.toml")


def test_bad_value_in_file_names_field(tmp_path):
    p = tmp_path / "run.toml"
    p.write_text("batch_size = -3\n")
    with pytest.raises(ConfigError, match="^batch_size:"):
        build_config(**load_config_file(p))


# ---------------------------------------------------------------------------
# server settings and CLI overrides layer on top


def test_server_settings_layering(tmp_path, monkeypatch):
    from hermes.server.settings import ServerSettings

    p = tmp_path / "run.toml"
    p.write_text('preset = "bsp"\nlr = 0.125\nbatch_size = 16\n')
    cfg = ServerSettings(config=str(p), run={"lr": 0.25}).run_config()
    assert (cfg.preset, cfg.sync, cfg.lr, cfg.batch_size) == ("bsp", "bsp", 0.25, 16)  # --set beats the file
    cfg = ServerSettings(config=str(p), preset="asp").run_config()
    assert (cfg.preset, cfg.sync) == ("asp", "asp")  # --preset beats the file's preset
    monkeypatch.setenv("HERMES_RUN", json.dumps({"batch_size": 64}))
    assert ServerSettings().run_config().batch_size == 64
    with pytest.raises(ConfigError, match="^lr:"):
        ServerSettings(run={"lr": -1}).run_config()


def test_cli_set_parsing():
    from hermes.server.settings import parse_set

    got = parse_set(["lr=0.1", "model=mlp", 'model_kwargs={"hidden": [64]}', "max_staleness=null", "x=a=b"])
    assert got == {"lr": 0.1, "model": "mlp", "model_kwargs": {"hidden": [64]}, "max_staleness": None, "x": "a=b"}
    for bad in ("lr", "=3"):
        with pytest.raises(ConfigError, match="KEY=VALUE"):
            parse_set([bad])


# ---------------------------------------------------------------------------
# target accuracy: the server stops the run itself once an evaluation reaches it


def test_target_accuracy_defaults_to_none_and_takes_a_fraction():
    assert build_config("asp").target_accuracy is None
    assert build_config("asp", target_accuracy=0.9).target_accuracy == 0.9
    assert build_config("hermes", target_accuracy=1).target_accuracy == 1.0


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.0001, 90, float("nan"), float("inf")])
def test_target_accuracy_out_of_range_is_refused_naming_the_field(bad):
    with pytest.raises(ConfigError, match=r"^target_accuracy: .*target_accuracy=.*\(0, 1\]"):
        build_config("asp", target_accuracy=bad)


def test_target_accuracy_not_a_number_names_the_field():
    with pytest.raises(ConfigError, match="^target_accuracy:"):
        build_config("asp", target_accuracy="high")


def test_target_accuracy_from_file_env_and_flag(tmp_path, monkeypatch):
    from hermes.server.cli import build_parser
    from hermes.server.settings import ServerSettings

    p = tmp_path / "run.toml"
    p.write_text("target_accuracy = 0.8\n")
    assert ServerSettings(config=str(p)).run_config().target_accuracy == 0.8
    monkeypatch.setenv("HERMES_RUN", json.dumps({"target_accuracy": 0.7}))
    assert ServerSettings(config=str(p)).run_config().target_accuracy == 0.7  # HERMES_RUN / --set beat the file
    monkeypatch.setenv("HERMES_TARGET_ACCURACY", "0.95")
    assert ServerSettings(config=str(p)).run_config().target_accuracy == 0.95  # the setting beats both
    monkeypatch.setenv("HERMES_TARGET_ACCURACY", "95")
    with pytest.raises(ConfigError, match="^target_accuracy:"):
        ServerSettings().run_config()
    args = build_parser().parse_args(["--target-accuracy", "0.85"])
    assert args.target_accuracy == 0.85
    assert build_parser().parse_args([]).target_accuracy is None


def test_hermes_server_refuses_a_bad_target_with_exit_2(capsys, monkeypatch):
    from hermes.server.cli import main

    monkeypatch.delenv("HERMES_TARGET_ACCURACY", raising=False)
    monkeypatch.delenv("HERMES_RUN", raising=False)
    assert main(["--insecure", "--target-accuracy", "1.5"]) == 2
    assert "target_accuracy" in capsys.readouterr().err


def test_settings_merge_a_files_section_with_hermes_run_leaf_by_leaf(tmp_path):
    from hermes.server.settings import ServerSettings

    p = tmp_path / "run.json"
    p.write_text(json.dumps({"zscore": {"alpha": -1.0, "beta": 0.2}, "model_kwargs": {"width": 8}}))
    cfg = ServerSettings(config=str(p), run={"zscore": {"beta": 0.3}}, preset="hermes").run_config()
    # The file's alpha survives HERMES_RUN's zscore table; its beta is overridden.
    assert (cfg.zscore.alpha, cfg.zscore.beta) == (-1.0, 0.3)
    assert cfg.model_kwargs == {"width": 8}
