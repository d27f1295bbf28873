"""Server settings: CLI flags, ``HERMES_*`` environment variables or a config file.

``uvicorn --factory hermes.server.app:create_app`` builds the app from the
environment alone, so every setting has an env-var name (``HERMES_PRESET``,
``HERMES_DATA_PORT``, ``HERMES_CONFIG`` ...).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hermes.common.config import SECTIONS, RunConfig, build_config, load_config_file
from hermes.common.wire import DEFAULT_MAX_MESSAGE_BYTES
from hermes.server.engine.screening import ScreeningSettings


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HERMES_", frozen=True, extra="ignore")

    # Control-plane address agents are told about is the one they used; the
    # data plane binds separately and advertises ``advertise_host``.
    data_host: str = "0.0.0.0"
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
    out_dir: str | None = Field(default=None, description="where events.jsonl and summary.json go")
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, gt=1024)
    max_workers: int = Field(default=256, gt=0)
    # topology "collective": port of the rendezvous store (MASTER_PORT) on data_host; 0 picks a free one.
    collective_port: int = Field(default=0, ge=0, le=65535)
    eval_threads: int = Field(default=1, gt=0)
    # Kafka data plane for shard records; unset = records over ZeroMQ only.
    kafka_bootstrap: str | None = Field(default=None, description="HOST:PORT of a Kafka broker (HERMES_KAFKA_BOOTSTRAP)")
    kafka_partitions: int = Field(default=4, gt=0, le=1024, description="partitions per shard topic")
    kafka_retries: int = Field(default=5, ge=0, le=100, description="broker connection retries (exponential backoff)")
    # Security (hermes.server.auth). Without a join token the server refuses
    # to start unless ``insecure`` says so explicitly.
    join_token: str | None = Field(default=None, repr=False, description="secret agents present to register")
    join_token_file: str | None = Field(default=None, description="file whose first line is the join token")
    admin_token: str | None = Field(default=None, repr=False, description="bearer token for /v1/stop")
    admin_token_file: str | None = Field(default=None, description="file whose first line is the admin token")
    insecure: bool = Field(default=False, description="run without a join token (trusted networks only)")
    protect_reads: bool = Field(default=False, description="the read endpoints (/v1/status, /v1/workers, "
                                "/v1/config, /v1/summary, /v1/history, /metrics) need the join or the admin token; "
                                "the /ui page itself loads and asks for it")
    register_rate: float = Field(default=2.0, ge=0, description="registrations per second per client address (0 = no limit)")
    register_burst: int = Field(default=32, ge=1, description="registrations a client address may make at once")
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
    # Update screening (hermes.server.engine.screening); HERMES_SCREENING as JSON.
    screening: ScreeningSettings = Field(default_factory=ScreeningSettings)

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
