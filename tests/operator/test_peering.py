"""Active/standby replicas: priorities, kopf's pause rule, the command line."""

from __future__ import annotations

import datetime as dt
import random

from etl_operator.__main__ import exact_namespaces, operator_settings, parse_args, peering_of
from etl_operator.peering import Peering, active_namespaces, default_priority, is_active

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def peer(priority: int, seen_ago: float = 1, lifetime: int = 60, now: dt.datetime = NOW) -> dict:
    seen = now - dt.timedelta(seconds=seen_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


def test_highest_live_priority_is_active_and_ties_pause_both():
    status = {"a": peer(10), "b": peer(20)}
    assert not is_active(status, "a", 10, NOW)
    assert is_active(status, "b", 20, NOW)
    assert not is_active({"a": peer(5), "b": peer(5)}, "a", 5, NOW)  # kopf pauses both
    # b died without goodbye: a takes over once b's lifetime has passed.
    assert is_active({"a": peer(10), "b": peer(20, seen_ago=61)}, "a", 10, NOW)
    assert is_active({}, "a", 1, NOW)  # alone (own entry not written yet)
    assert not is_active(None, "a", 1, NOW)  # no peering object: kopf waits


def test_active_namespaces():
    me = Peering(name="sluice", identity="a", priority=10, clusterwide=False)
    now = dt.datetime.now(dt.UTC)
    statuses = {"ns1": {"b": peer(20, now=now)}, "ns2": {"b": peer(5, now=now)}}
    calls: list[tuple[str | None, str]] = []

    def read(ns: str | None, name: str) -> dict | None:
        calls.append((ns, name))
        return statuses.get(ns or "")

    assert active_namespaces(me, {"ns1", "ns2", "ns3"}, read) == {"ns2"}
    assert ("ns1", "sluice") in calls
    assert active_namespaces(None, {"x"}, read) == {"x"}


def test_priorities_default_to_random_and_distinct():
    rng = random.Random(1)
    values = {default_priority(rng) for _ in range(1000)}
    assert len(values) == 1000 and all(v > 0 for v in values)


def test_command_line_peering_and_priority(monkeypatch):
    monkeypatch.setenv("POD_ID", "op-1")
    monkeypatch.delenv("SLUICE_PRIORITY", raising=False)
    monkeypatch.delenv("SLUICE_PEERING", raising=False)
    assert peering_of(parse_args(["-n", "ns"]), clusterwide=False) is None
    assert peering_of(parse_args(["--peering", "p", "--standalone"]), clusterwide=False) is None
    fixed = peering_of(parse_args(["--peering", "p", "--priority", "7"]), clusterwide=False)
    assert fixed == Peering(name="p", identity="op-1", priority=7, clusterwide=False)
    a = peering_of(parse_args(["--peering", "p"]), clusterwide=True)
    b = peering_of(parse_args(["--peering", "p"]), clusterwide=True)
    assert a is not None and b is not None and a.priority != b.priority and a.clusterwide
    monkeypatch.setenv("SLUICE_PRIORITY", "42")
    env = peering_of(parse_args(["--peering", "p", "--peering-lifetime", "15"]), False)
    assert env is not None and env.priority == 42 and env.lifetime == 15


def test_namespaced_operator_does_not_scan_namespaces():
    args = parse_args(["-n", "team-a", "--peering-lifetime", "20"])
    settings = operator_settings(args, ["team-a"], clusterwide=False)
    assert settings.scanning.disabled and settings.peering.lifetime == 20
    assert not operator_settings(args, [], clusterwide=True).scanning.disabled
    assert not operator_settings(args, ["team-*"], clusterwide=False).scanning.disabled
    assert exact_namespaces(["a", "b"]) and not exact_namespaces(["!a"])
    assert not exact_namespaces([])
