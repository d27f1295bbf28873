"""Names owned by keys, the join-token cap, name rules, strict protocol version, the agent's key file (issue 29)."""

from __future__ import annotations

import os
import stat

import pytest
from pydantic import ValidationError

from hermes.client import name_key
from hermes.common.clock import ManualClock
from hermes.common.control_messages import RegisterRequest
from hermes.server.registry import JoinCapReached, NameInUse, NameOwned, Registry

KEY, OTHER = "k" * 43, "o" * 43
A, B = "a" * 16, "b" * 16


def _registry(max_workers: int = 300) -> tuple[Registry, ManualClock]:
    clock = ManualClock()
    return Registry(max_workers, clock=clock), clock


def test_a_name_belongs_to_the_key_that_registered_it_first() -> None:
    reg, clock = _registry()
    first, _ = reg.register("edge", name_key=KEY, hints={"instance": A})
    # The takeover: no instance hint, no key (or another key): refused, the id not handed over.
    for key in (None, OTHER):
        with pytest.raises(NameOwned, match="belongs to the agent that registered it first"):
            reg.register("edge", name_key=key, hints={})
    assert reg.get(first.id).token == first.token and reg.get(first.id).hints["instance"] == A
    # Refused even once the holder is lost: the name is the key's, not the live process's.
    first.state = "lost"
    with pytest.raises(NameOwned):
        reg.register("edge", name_key=OTHER, hints={"instance": B})
    # The restarted honest agent (same key, new process) takes it back: same id, new token.
    old_token = first.token
    rec, rejoined = reg.register("edge", name_key=KEY, hints={"instance": B})
    assert rejoined and rec.id == first.id and rec.token != old_token


def test_the_owner_survives_a_checkpoint_and_old_checkpoints_are_claimed_by_the_first_key() -> None:
    reg, _ = _registry()
    owned, _ = reg.register("edge", name_key=KEY)
    reg.register("tool", name_key=None)
    idents = reg.identities()
    assert "k" * 43 not in repr(idents)  # the key itself is never kept
    fresh, _ = _registry()
    fresh.restore(idents)
    with pytest.raises(NameOwned):
        fresh.register("edge", name_key=OTHER)
    assert fresh.register("edge", name_key=KEY)[0].id == owned.id
    # A checkpoint of an older server kept no owner: the first key to come back claims it.
    older = [{k: v for k, v in i.items() if k not in ("name_key_hash", "join_slot")} for i in idents]
    old, _ = _registry()
    old.restore(older)
    assert old.register("edge", name_key=OTHER)[1]
    with pytest.raises(NameOwned):
        old.register("edge", name_key=KEY)


def test_a_key_does_not_take_a_keyless_name_another_live_process_uses() -> None:
    reg, clock = _registry()
    rec, _ = reg.register("tool", takeover_after=3.0, hints={"instance": A})
    with pytest.raises(NameInUse):
        reg.register("tool", takeover_after=3.0, name_key=KEY, hints={"instance": B})
    clock.advance(5.0)  # the holder went silent: taken over, and from now on the key's
    assert reg.register("tool", takeover_after=3.0, name_key=KEY, hints={"instance": B})[0].id == rec.id
    with pytest.raises(NameOwned):
        reg.register("tool", takeover_after=3.0, hints={"instance": A})


def test_names_per_join_token_are_capped_and_rejoins_do_not_count() -> None:
    reg, _ = _registry()
    for i in range(4):
        reg.register(f"s{i}", name_key=KEY, join_slot=0, join_cap=4)
    with pytest.raises(JoinCapReached, match="already registered 4 worker names"):
        reg.register("s4", name_key=KEY, join_slot=0, join_cap=4)
    # A rejoin of a name is no new name; another token has its own cap.
    assert reg.register("s0", name_key=KEY, join_slot=0, join_cap=4)[1]
    assert not reg.register("site-b", name_key=OTHER, join_slot=1, join_cap=4)[1]
    assert len(reg.all()) == 5


@pytest.mark.parametrize("name", [".", "..", "-rf", ".hidden", "w0001", "w12345"])
def test_names_that_look_like_paths_options_or_ids_are_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="looks like"):
        RegisterRequest(name=name)


@pytest.mark.parametrize("name", ["edge-1", "w", "w12", "worker0001", "pi@lab", "a.b"])
def test_ordinary_names_pass(name: str) -> None:
    assert RegisterRequest(name=name).name == name


@pytest.mark.parametrize("bad", [False, True, "1", 1.0])
def test_protocol_version_is_a_strict_int(bad: object) -> None:
    with pytest.raises(ValidationError):
        RegisterRequest.model_validate({"name": "edge", "protocol_version": bad})


def test_the_agent_keeps_its_name_key_across_restarts(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(name_key.ENV, str(tmp_path))
    first = name_key.name_key("http://10.0.0.1:8000", "edge")
    path = name_key.key_path("http://10.0.0.1:8000/", "edge")
    assert path is not None and path.is_file() and path.read_text().strip() == first
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert name_key.name_key("http://10.0.0.1:8000", "edge") == first  # a restart reads it back
    assert name_key.name_key("http://10.0.0.2:8000", "edge") != first  # another server, another key
    assert not list(path.parent.glob("*.tmp"))
    path.write_text("short\n")
    with pytest.raises(ValueError, match="damaged"):
        name_key.name_key("http://10.0.0.1:8000", "edge")


def test_without_persistence_each_process_has_a_fresh_key(monkeypatch) -> None:
    monkeypatch.setenv(name_key.ENV, "off")
    assert name_key.key_path("http://h:1", "edge") is None
    assert name_key.name_key("http://h:1", "edge") != name_key.name_key("http://h:1", "edge")
