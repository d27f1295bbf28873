"""Server settings: CLI flags, ``HERMES_*`` environment variables or a config file.

``uvicorn --factory hermes.server.app:create_app`` builds the app from the
environment alone, so every setting has an env-var name (``HERMES_PRESET``,
``HERMES_DATA_PORT``, ``HERMES_CONFIG`` ...).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hermes.common.config import RunConfig, build_config, load_config_file
from hermes.common.wire import DEFAULT_MAX_MESSAGE_BYTES


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HERMES_", frozen=True, extra="ignore")

    # Control-plane address agents are told about is the one they used; the
    # data plane binds separately and advertises ``advertise_host``.
    data_host: str = "0.0.0.0"
    data_port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port")
    advertise_host: str = Field(default="127.0.0.1", description="host agents use to reach the data plane")
    preset: str | None = None
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

    def run_config(self) -> RunConfig:
        overrides: dict[str, Any] = {}
        if self.config:
            overrides.update(load_config_file(self.config))
        overrides.update(self.run)
        # Pop unconditionally: a file's preset left in overrides would collide
        # with --preset (TypeError: multiple values for 'preset').
        file_preset = overrides.pop("preset", None)
        preset = self.preset or file_preset
        return build_config(preset, **overrides)
