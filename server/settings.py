"""Server settings: CLI flags, ``HERMES_*`` environment variables or a config file.

One mechanism for every flag: ``hermes-server`` passes the flags it was
given, and pydantic-settings fills the rest from ``HERMES_<FIELD>`` (nested
sections as ``HERMES_SCREENING__NORM_FACTOR``), then from the defaults here.
``uvicorn --factory hermes.server.app:create_app`` builds the app from the
environment alone. No torch is imported here: ``hermes-server`` checks its
settings, its ports and its output folder before it loads the engine.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hermes.common.cli_env import ENV_NESTED, ENV_PREFIX
from hermes.common.config import PRESETS, SECTIONS, ConfigError, RunConfig, build_config, load_config_file
from hermes.common.presets import unknown_preset
from hermes.server.screening_params import ScreeningSettings

# = hermes.common.wire.DEFAULT_MAX_MESSAGE_BYTES, not imported from there: the wire imports torch
# (tests/unit/test_server_cli.py checks the two agree).
DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024


def server_version() -> str:
    """The installed hermes-edge's version (``hermes-server --version``, the OpenAPI document)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hermes-edge")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return "0+unknown"


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED, frozen=True,
                                      extra="ignore")

    # The control plane (hermes-server binds it; under the uvicorn factory uvicorn's own flags do).
    host: str = Field(default="0.0.0.0", description="control-plane bind address")
    port: int = Field(default=8000, ge=0, le=65535, description="control-plane HTTP port")
    # Control-plane address agents are told about is the one they used; the
    # data plane binds separately and advertises ``advertise_host``. Unset, it
    # binds where the control plane does: --host 127.0.0.1 keeps both on loopback.
    data_host: str = Field(default="0.0.0.0", description="data-plane bind address (default: host)")
    data_port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port")
    advertise_host: str = Field(default="127.0.0.1", description="host agents use to reach the data plane")
    preset: str | None = None
    # A shortcut for the run config's target_accuracy (HERMES_TARGET_ACCURACY,
    # --target-accuracy); beats the config file and HERMES_RUN / --set.
    target_accuracy: float | None = Field(default=None, description="stop the run at this test accuracy")
    # Shortcuts for run-config keys (HERMES_TASK, --task ...); like target_accuracy they beat the file and --set.
    task: str | None = Field(default=None, description="the task: MODULE:ATTR, FILE.py:ATTR or an installed name")
    target: str | None = Field(default=None, description="stop the run once an evaluation reaches METRIC=VALUE")
    max_epochs: float | None = Field(default=None, description="stop after this many epochs of training shards")
    max_updates: int | None = Field(default=None, description="stop after this many model updates")
    max_seconds: float | None = Field(default=None, description="stop this many seconds into the run")
    exit_when_done: bool = Field(default=False, description="end the server process once the run stopped "
                                 "(target, budget or /v1/stop), after its agents left and its files are written")
    config: str | None = Field(default=None, description="JSON or TOML file of run-config overrides")
    run: dict[str, Any] = Field(default_factory=dict, description="run-config overrides (HERMES_RUN as JSON)")
    out_dir: str | None = Field(default=None, description="where events.jsonl, server_summary.json and the model "
                                "files go (hermes-server: runs/<UTC time>-<preset> when unset)")
    overwrite: bool = Field(default=False, description="start a new run in an out_dir (or checkpoint_dir) that "
                            "holds another run's outputs, replacing them")
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, gt=1024)
    max_workers: int = Field(default=256, gt=0)
    # topology "collective": port of the rendezvous store (MASTER_PORT) on data_host; 0 picks a free one.
    collective_port: int = Field(default=0, ge=0, le=65535)
    # Kafka data plane for shard records; unset = records over ZeroMQ only.
    kafka_bootstrap: str | None = Field(default=None, description="HOST:PORT of a Kafka broker (HERMES_KAFKA_BOOTSTRAP)")
    kafka_partitions: int = Field(default=4, gt=0, le=1024, description="partitions per shard topic")
    kafka_retries: int = Field(default=5, ge=0, le=100, description="broker connection retries (exponential backoff)")
    # Security (hermes.server.auth). Without a join token the server refuses
    # to start unless ``insecure`` says so explicitly.
    join_token: str | None = Field(default=None, repr=False, description="secret agents present to register")
    join_token_file: str | None = Field(default=None, description="file whose first line is the join token (further "
                                        "lines: more join tokens, each with its own join_token_max_workers)")
    admin_token: str | None = Field(default=None, repr=False, description="bearer token for /v1/stop")
    admin_token_file: str | None = Field(default=None, description="file whose first line is the admin token")
    insecure: bool = Field(default=False, description="run without a join token (trusted networks only)")
    protect_reads: bool = Field(default=False, description="the read endpoints (/v1/status, /v1/workers, "
                                "/v1/config, /v1/summary, /v1/history, /metrics) need the join or the admin token; "
                                "the /ui page itself loads and asks for it")
    register_rate: float = Field(default=2.0, ge=0, description="registrations per second per client address (0 = no limit)")
    register_burst: int = Field(default=32, ge=1, description="registrations a client address may make at once")
    join_token_max_workers: int = Field(default=64, ge=0, description="worker names one join token may register "
                                        "(0 = no cap; rejoins of a name do not count)")
    resume_truncate_corrupt: bool = Field(default=False, description="resume past a damaged journal record, skipping "
                                          "it and replaying the verified records after it")
    replay_window_seconds: float = Field(default=300.0, gt=0, description="how far a signed message's timestamp may be from the server clock")
    http_read_timeout_seconds: float = Field(default=10.0, gt=0, description="longest wait for each chunk of an HTTP request body before a 408")
    # Fault tolerance: heartbeats (hermes.server.heartbeat), checkpoints (hermes.server.checkpoint).
    heartbeat_interval_seconds: float = Field(default=5.0, gt=0, description="how often agents send a heartbeat")
    heartbeat_timeout_seconds: float = Field(default=30.0, ge=0, description="silence after which a worker is lost (0 = never)")
    checkpoint_dir: str | None = Field(default=None, description="where checkpoints go (HERMES_CHECKPOINT_DIR)")
    checkpoint_interval_seconds: float = Field(default=60.0, gt=0, description="seconds between periodic checkpoints")
    resume: bool = Field(default=False, description="continue from the last checkpoint in checkpoint_dir")
    durable_acks: bool = Field(default=True, description="journal every applied update (fsync) before acknowledging it")
    # Seeing the run: TensorBoard event files (hermes.server.tensorboard); the /ui page is always on.
    tensorboard_dir: str | None = Field(default=None, description="write TensorBoard scalars here (HERMES_TENSORBOARD_DIR)")
    # Update screening (hermes.server.engine.screening); HERMES_SCREENING as JSON or HERMES_SCREENING__NORM_FACTOR.
    screening: ScreeningSettings = Field(default_factory=ScreeningSettings)
    # TLS of the control plane (hermes-server; the uvicorn factory takes uvicorn's --ssl-* flags).
    ssl_certfile: str | None = Field(default=None, description="TLS certificate of the control plane")
    ssl_keyfile: str | None = Field(default=None, description="private key of ssl_certfile")
    ssl_ca_certfile: str | None = Field(default=None, description="CA bundle agents' client certificates must chain to")
    # The console (hermes.server.console).
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="log level")
    access_log: bool = Field(default=False, description="log every HTTP request; by default heartbeats and "
                             "status polls that succeed are not logged")
    progress_interval_seconds: float = Field(default=10.0, ge=0, description="seconds between progress lines "
                                             "(version, metrics, workers, samples/s, barrier); 0 = none")

    @model_validator(mode="before")
    @classmethod
    def _data_host(cls, data: Any) -> Any:
        """The data plane binds where the control plane does unless told otherwise."""
        if isinstance(data, dict) and data.get("data_host") is None and data.get("host") is not None:
            return {**data, "data_host": data["host"]}
        return data

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    @field_validator("preset")
    @classmethod
    def _preset(cls, v: str | None) -> str | None:
        if v is not None and v not in PRESETS:
            raise ValueError(unknown_preset(v))
        return v

    @field_validator("kafka_bootstrap")
    @classmethod
    def _bootstrap(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        for server in v.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"kafka_bootstrap {v!r}: expected HOST:PORT[,HOST:PORT...]")
        return v.strip()

    @model_validator(mode="after")
    def _relations(self) -> ServerSettings:
        if self.heartbeat_timeout_seconds and self.heartbeat_timeout_seconds < 2 * self.heartbeat_interval_seconds:
            raise ValueError(f"heartbeat_timeout_seconds ({self.heartbeat_timeout_seconds}) must be at least twice "
                             f"heartbeat_interval_seconds ({self.heartbeat_interval_seconds}) or 0")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("resume needs checkpoint_dir (the directory to resume from)")
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite exclude each other: resume continues the run, overwrite "
                             "replaces it")
        return self

    def run_config(self) -> RunConfig:
        overrides: dict[str, Any] = {}
        # Sections as dotted keys, so a file's [zscore] table and HERMES_RUN's zscore merge leaf by leaf.
        if self.config:
            overrides.update(_dotted(load_config_file(self.config)))
        overrides.update(_dotted(self.run))
        if self.target_accuracy is not None:
            overrides["target_accuracy"] = self.target_accuracy
        for key in ("task", "target", "max_epochs", "max_updates", "max_seconds"):
            if getattr(self, key) is not None:
                overrides[key] = getattr(self, key)
        # Pop unconditionally: a file's preset left in overrides would collide
        # with --preset (TypeError: multiple values for 'preset').
        file_preset = overrides.pop("preset", None)
        preset = self.preset or file_preset
        return build_config(preset, **overrides)


def _dotted(data: dict[str, Any]) -> dict[str, Any]:
    """``{"zscore": {"alpha": a}}`` -> ``{"zscore.alpha": a}`` for the config's sections; other keys as given."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and SECTIONS.get(key) is not None:
            out.update({f"{key}.{sub}": v for sub, v in value.items()})
        else:
            out[key] = value
    return out


def parse_set(items: list[str]) -> dict[str, Any]:
    """``--set lr=0.1 --set model_kwargs='{"hidden": [64]}'``: values are JSON when they parse."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out
