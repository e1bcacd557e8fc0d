"""Our copy of kopf's peering rule (`runtime.peering.outranked`) decides as kopf itself does, on the installed kopf
(1.45.2 when this was written): the same table of peer sets goes through kopf's own `process_peering_event`, whose
verdict is the pause toggle it leaves on or off. If a kopf upgrade changes the rule, this test says so."""

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kopf._cogs.aiokits.aiotoggles import Toggle
from kopf._cogs.configs.configuration import OperatorSettings
from kopf._cogs.structs.references import Resource
from kopf._core.engines.peering import Identity, process_peering_event

from finetune_operator.runtime import outranked
from finetune_operator.runtime.peering import PeeringGate

ME = "me"
NAME = "finetune-operator"
PEERINGS = Resource(group="kopf.dev", version="v1", plural="clusterkopfpeerings")


def peer(
    priority: int | None = 0, ago: float | None = 10, lifetime: int | None = None, z: bool = False
) -> dict[str, Any]:
    """A peer's entry as kopf writes it: priority, lifetime (s) and lastseen (ISO time), any of them missing."""
    entry: dict[str, Any] = {}
    if priority is not None:
        entry["priority"] = priority
    if lifetime is not None:
        entry["lifetime"] = lifetime
    if ago is not None:
        seen = datetime.now(UTC) - timedelta(seconds=ago)
        entry["lastseen"] = seen.isoformat().replace("+00:00", "Z") if z else seen.isoformat()
    return entry


# (case, our priority, the peering object's status: identity -> entry)
CASES: list[tuple[str, int, dict[str, dict[str, Any]]]] = [
    ("no peers at all", 0, {}),
    ("only ourselves", 0, {ME: peer(0)}),
    ("a live peer of higher priority", 0, {ME: peer(0), "b": peer(10)}),
    ("a live peer of the same priority", 5, {ME: peer(5), "b": peer(5)}),
    ("a live peer of lower priority", 5, {ME: peer(5), "b": peer(1)}),
    ("a higher peer past its default 60 s lifetime", 0, {"b": peer(10, ago=120)}),
    ("a higher peer within its default lifetime", 0, {"b": peer(10, ago=45)}),
    ("a higher peer within a long lifetime", 0, {"b": peer(10, ago=120, lifetime=300)}),
    ("a higher peer past a short lifetime", 0, {"b": peer(10, ago=20, lifetime=10)}),
    ("a peer with no lastseen counts as just seen", 0, {"b": peer(10, ago=None)}),
    ("a peer with no priority has priority 0, ours is 0", 0, {"b": peer(None)}),
    ("a peer with no priority has priority 0, ours is 1", 1, {"b": peer(None)}),
    ("negative priorities", -5, {"b": peer(-3)}),
    ("lastseen written with Z", 0, {"b": peer(1, z=True)}),
    ("a dead higher peer and a live lower one", 3, {"b": peer(9, ago=200), "c": peer(2)}),
    ("a dead lower peer and a live same one", 3, {"b": peer(1, ago=200), "c": peer(3, ago=5, lifetime=30)}),
    ("our own stale entry of high priority is not a peer", 0, {ME: peer(99, ago=1)}),
]


async def kopf_pauses(priority: int, status: dict[str, dict[str, Any]], paused_before: bool) -> bool:
    """kopf's verdict: run one peering event through kopf and read its pause toggle."""
    settings = OperatorSettings()
    settings.peering.name = NAME
    settings.peering.priority = priority
    toggle = Toggle(paused_before)
    woken = asyncio.Event()
    woken.set()  # kopf then does not sleep until the blocking peers expire (nor touch the object after)
    event: Any = {"type": "MODIFIED", "object": {"metadata": {"name": NAME}, "status": status}}
    await process_peering_event(
        raw_event=event,
        namespace=None,
        resource=PEERINGS,
        identity=Identity(ME),
        settings=settings,
        autoclean=False,
        stream_pressure=woken,
        conflicts_found=toggle,
    )
    return toggle.is_on()


@pytest.mark.parametrize(("case", "priority", "status"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("paused_before", [False, True], ids=["running", "paused"])
def test_our_rule_decides_as_kopfs(
    case: str, priority: int, status: dict[str, dict[str, Any]], paused_before: bool
) -> None:
    ours = outranked(status, ME, priority, datetime.now(UTC))
    assert ours == asyncio.run(kopf_pauses(priority, status, paused_before)), case


def test_the_table_has_both_verdicts() -> None:
    verdicts = {outranked(status, ME, priority, datetime.now(UTC)) for _, priority, status in CASES}
    assert verdicts == {True, False}


async def _gate(peering_name: str | None, status: dict[str, Any]) -> tuple[list[bool], int]:
    fetched: list[tuple[str, str | None]] = []

    async def fetch(name: str, namespace: str | None) -> dict[str, Any] | None:
        fetched.append((name, namespace))
        return {"status": status}

    gate = PeeringGate(peering_name=peering_name, identity=ME, priority=0, clusterwide=True, fetch=fetch)
    answers = [await gate.active("ns-a"), await gate.active("ns-b")]
    return answers, len(fetched)


def test_the_gate_applies_the_rule_and_caches_the_answer() -> None:
    assert asyncio.run(_gate(NAME, {"b": peer(10)})) == ([False, False], 1)  # clusterwide: one scope, one GET
    assert asyncio.run(_gate(NAME, {"b": peer(-1)})) == ([True, True], 1)
    assert asyncio.run(_gate(None, {"b": peer(10)})) == ([True, True], 0)  # standalone never asks
