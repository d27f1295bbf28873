"""The server's credentials: the join token agents present and the operator's admin token.

Read once at start-up from the settings (never logged); a generated admin
token is written to ``OUT/admin.token`` only once the output folder has been
checked, so a refused start writes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from hermes.server.auth import MIN_TOKEN_CHARS, AuthConfigError, bearer, new_secret, read_secret, token_matches
from hermes.server.settings import ServerSettings


class Credentials:
    """The join token and the admin token of one server (never logged)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.insecure = settings.insecure
        self.join = read_secret(settings.join_token, settings.join_token_file, "join_token")
        # Every join credential, each with its own cap of registered names (join_token_max_workers):
        # the join token file may list one per line, so each site can be given its own.
        self.joins: tuple[str, ...] = (self.join,) if self.join else ()
        if settings.join_token_file and self.join:
            self.joins = tuple(dict.fromkeys(_more_tokens(settings.join_token_file)))
        if self.join is None and not self.insecure:
            raise AuthConfigError(
                "no join token: set HERMES_JOIN_TOKEN (or --join-token-file FILE) to a long random string, "
                "e.g. `openssl rand -hex 32`, and give it to the agents; or pass --insecure to let anyone "
                "who reaches the server join (trusted networks only)")
        self.admin = read_secret(settings.admin_token, settings.admin_token_file, "admin_token")
        self.protect_reads = settings.protect_reads
        self.admin_file: Path | None = None
        # Generated under --insecure too: a missing join token must not leave
        # the run's stop switch open to anyone who can reach the port.
        if self.admin is None and settings.out_dir:
            # The operator's credential for /v1/stop, written by save() once OUT has been checked.
            self.admin = new_secret()
            self.admin_file = Path(settings.out_dir) / "admin.token"
        if self.protect_reads and self.join is None and self.admin is None:
            raise AuthConfigError("protect_reads needs a join token or an admin token to check reads against; "
                                  "set HERMES_JOIN_TOKEN or HERMES_ADMIN_TOKEN")

    def save(self) -> None:
        """Write a generated admin token to OUT/admin.token, readable by the server's user only."""
        if self.admin_file is None or self.admin is None:
            return
        self.admin_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.admin_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.admin + "\n")

    def may_read(self, authorization: str) -> bool:
        """Without protect_reads anyone may read; with it, a cluster member (join token) or the operator."""
        if not self.protect_reads:
            return True
        given = bearer(authorization)
        return any(secret is not None and token_matches(given, secret) for secret in (*self.joins, self.admin))

    def join_slot(self, authorization: str) -> int | None:
        """Which join credential this Authorization header presents (its index), None for none of them."""
        given = bearer(authorization)
        found = None
        for i, secret in enumerate(self.joins):  # every one compared: no early exit to time
            if token_matches(given, secret) and found is None:
                found = i
        return found


def _more_tokens(file: str) -> list[str]:
    """Every non-empty line of a join token file (read_secret checked the first; the others get the same check)."""
    lines = [ln.strip() for ln in Path(file).read_text().splitlines() if ln.strip()]
    for i, line in enumerate(lines[1:], start=2):
        if len(line) < MIN_TOKEN_CHARS:
            raise AuthConfigError(f"join_token_file {file!r} line {i}: a join token must be at least "
                                  f"{MIN_TOKEN_CHARS} characters")
    return lines
