"""The RunStore contract (`store/protocol.py`), run against both stores: the SQLite file and a
real Postgres database (a throwaway cluster the tests start: `tests/postgres.py`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

import keel
from keel._run.breaker import tier_of
from keel.errors import AlreadyDecided, ConfigError, LeaseHeld, LeaseLost, StoreError
from keel.records import (
    ApprovalDecided,
    KeyCounter,
    RunConfig,
    RunStarted,
    RunState,
    ToolResultRecorded,
)
from keel.store import Checkpoint, RunStore, new_lease_owner, open_store
from postgres import sql
from support import call, run_script

Opener = Callable[..., RunStore]


@pytest.fixture
def opened(store_target: str | Path) -> Iterator[Opener]:
    """Opens stores on the target (as many as a test wants: one per 'process'); closes them."""
    stores: list[RunStore] = []

    def open_one(*, read_only: bool = False) -> RunStore:
        store = open_store(store_target, read_only=read_only)
        stores.append(store)
        return store

    yield open_one
    for store in stores:
        store.close()


CONFIG = RunConfig(model="script", system_prompt="be brief")


async def started(store: RunStore, run_id: str = "run_1", lease: str | None = None) -> RunState:
    state = RunState()
    await store.create_run(run_id, "What is a lease?", "script", CONFIG, state, lease=lease,
                           lease_ttl=30)  # fmt: skip
    return state


def step(state: RunState, run_id: str = "run_1", lease: str | None = None, **extra: object):  # type: ignore[no-untyped-def]
    state.step += 1
    seq = state.next_seq
    state.next_seq += 1
    event = RunStarted(question="q", model="m", seq=seq, at=1.0, step=state.step)
    return Checkpoint(run_id=run_id, state=state.copy(), events=[event], lease=lease,
                      lease_ttl=30, **extra)  # type: ignore[arg-type]  # fmt: skip


async def test_a_step_is_saved_whole_with_counters_elisions_and_kept_texts(opened: Opener) -> None:
    store = opened()
    state = await started(store)
    result = ToolResultRecorded(call_id="c1", call_key="k", name="read", content="text", seq=1,
                                at=2.0, step=1)  # fmt: skip
    cp = step(state, counters={"k": KeyCounter(2, 1, "d")}, elisions=[("c1", 1)],
              blobs=[("d", "whole text")])  # fmt: skip
    cp.events.append(result)
    state.next_seq += 1
    cp.state.next_seq = state.next_seq
    await store.save_step(cp)
    other = opened()  # another process sees all of it
    events = other.events("run_1")
    assert [e.seq for e in events] == [0, 1]
    assert isinstance(events[1], ToolResultRecorded) and events[1].elided
    assert other.counters("run_1") == {"k": KeyCounter(2, 1, "d")}
    assert other.elided("run_1") == {"c1"} and other.blob("d") == "whole text"
    record = other.get_run("run_1")
    assert record is not None and record.state.step == 1 and record.config == CONFIG


async def test_a_fork_is_created_with_its_prefix_counters_and_elisions_at_once(
    opened: Opener,
) -> None:
    store = opened()
    state = RunState(step=1, next_seq=2)
    events = [
        RunStarted(question="q", model="m", seq=0, at=1.0),
        ToolResultRecorded(call_id="k1_0", call_key="k", name="read", content="text", seq=1,
                           at=2.0, step=1),
    ]  # fmt: skip
    owner = new_lease_owner()
    await store.create_run("run_f", "q", "m", CONFIG, state, lease=owner, lease_ttl=30,
                           events=events, counters={"k": KeyCounter(3, 1, "d", 2, 0)},
                           elisions=[("k1_0", 1)])  # fmt: skip
    other = opened()  # another process sees the whole prefix
    assert other.counters("run_f") == {"k": KeyCounter(3, 1, "d", 2, 0)}
    assert other.elided("run_f") == {"k1_0"}
    read = other.events("run_f")
    assert [e.seq for e in read] == [0, 1]
    assert isinstance(read[1], ToolResultRecorded) and read[1].elided
    record = other.get_run("run_f")
    assert record is not None and record.status == "running" and record.state.step == 1
    with pytest.raises(LeaseHeld):  # the creator holds it: the fork's loop takes it over
        await other.acquire_lease("run_f", new_lease_owner(), 30)


async def test_a_failed_step_is_rolled_back_whole(opened: Opener) -> None:
    store = opened()
    state = await started(store)
    await store.save_step(step(state))
    bad = step(state, counters={"k": KeyCounter(1)}, blobs=[("d", "x")])
    bad.events[0].seq = 0  # collides with the saved event: the whole step must be refused
    with pytest.raises(StoreError, match="step 2 could not be saved"):
        await store.save_step(bad)
    assert store.get_run("run_1").state.step == 1  # type: ignore[union-attr]
    assert store.counters("run_1") == {} and store.blob("d") is None


async def test_a_taken_over_holder_gets_lease_lost_and_writes_nothing(
    opened: Opener, store_target: str | Path
) -> None:
    store, owner = opened(), new_lease_owner()
    state = await started(store, lease=owner)
    await store.save_step(step(state, lease=owner))
    sql(store_target, "UPDATE runs SET lease_owner = 'elsewhere:1:x', lease_until = 1e12")
    with pytest.raises(LeaseLost):
        await store.save_step(step(state, lease=owner))
    with pytest.raises(LeaseLost):
        await store.renew_lease("run_1", owner, 30)
    assert len(store.events("run_1")) == 1


async def test_a_live_lease_is_held_and_an_expired_one_is_taken_over(
    opened: Opener, store_target: str | Path
) -> None:
    first, second = opened(), opened()
    await started(first, lease="elsewhere:1:a")
    with pytest.raises(LeaseHeld, match="being advanced by another process"):
        await second.acquire_lease("run_1", "elsewhere:2:b", 30)
    sql(store_target, "UPDATE runs SET lease_until = 1")  # the holder died; its lease ran out
    await second.acquire_lease("run_1", "elsewhere:2:b", 30)
    with pytest.raises(LeaseLost):
        await first.renew_lease("run_1", "elsewhere:1:a", 30)


async def test_decisions_are_recorded_only_for_pending_calls(opened: Opener) -> None:
    store = opened()
    out = await run_script({"turns": [call("publish", text="hi")]}, [PUBLISH], store=store)
    run_id = out.result.run_id
    (pending,) = out.result.pending_approvals
    with pytest.raises(ConfigError, match="no call nope awaiting a decision"):
        opened().decide(run_id, "nope", approved=True, by="ana")
    event = opened().decide(run_id, pending.call_id, approved=False, by="ana", reason="no")
    assert event.seq == out.events[-1].seq + 1
    record = store.get_run(run_id)
    assert record is not None and record.state.decisions[pending.call_id].by == "ana"


async def test_a_decision_is_final_and_deciding_again_says_who_decided_what_and_when(
    opened: Opener,
) -> None:
    store = opened()
    out = await run_script({"turns": [call("publish", text="hi")]}, [PUBLISH], store=store)
    run_id = out.result.run_id
    (pending,) = out.result.pending_approvals
    denial = opened().decide(run_id, pending.call_id, approved=False, by="alice", reason="no")
    for approved in (True, False):  # an approval after it, or the same denial again
        with pytest.raises(AlreadyDecided, match=r"already denied by alice at .+ UTC: no"):
            opened().decide(run_id, pending.call_id, approved=approved, by="mallory")
    record = store.get_run(run_id)
    assert record is not None
    decision = record.state.decisions[pending.call_id]
    assert (decision.approved, decision.by, decision.at) == (False, "alice", denial.at)
    decided = [e for e in store.events(run_id) if isinstance(e, ApprovalDecided)]
    assert [(e.by, e.approved) for e in decided] == [("alice", False)]


async def test_racing_decisions_on_one_call_exactly_one_wins_and_the_others_are_told(
    opened: Opener,
) -> None:
    """Six people (each with a store of their own, as six processes would have) decide the same
    call at the same moment, approving and denying: one transaction settles it."""
    store = opened()
    out = await run_script({"turns": [call("publish", text="hi")]}, [PUBLISH], store=store)
    run_id = out.result.run_id
    (pending,) = out.result.pending_approvals
    deciders = [opened() for _ in range(6)]
    start = threading.Barrier(len(deciders))

    def decide(n: int) -> str | None:
        start.wait()
        try:
            deciders[n].decide(
                run_id, pending.call_id, approved=n % 2 == 0, by=f"person{n}", reason="race"
            )
        except AlreadyDecided as lost:
            return str(lost)
        return None

    with ThreadPoolExecutor(len(deciders)) as pool:
        said = list(pool.map(decide, range(len(deciders))))
    winners = [n for n, message in enumerate(said) if message is None]
    assert len(winners) == 1, f"{len(winners)} deciders were told they succeeded"
    (winner,) = winners
    verdict = "approved" if winner % 2 == 0 else "denied"
    for message in filter(None, said):
        assert f"already {verdict} by person{winner}" in message
    record = store.get_run(run_id)
    assert record is not None and record.state.decisions[pending.call_id].by == f"person{winner}"
    decided = [e for e in store.events(run_id) if isinstance(e, ApprovalDecided)]
    assert [e.by for e in decided] == [f"person{winner}"]


@keel.tool(effect="side_effecting", requires_approval=True)
def publish(text: str) -> str:
    """Publish text."""
    return f"published {text}"


PUBLISH = publish


async def test_a_paused_run_resumes_in_another_agent_on_either_store(opened: Opener) -> None:
    @keel.tool
    def note(topic: str) -> str:
        """Read a note."""
        return f"note on {topic}"

    script = {"turns": [call("note", topic="a"), call("publish", text="x"), {"text": "done"}]}
    first = await run_script(script, [note, publish], store=opened())
    assert first.result.status == "awaiting_approval"
    store = opened()
    keel.Agent(first.transport, store=store).approve(first.result.run_id, None, by="ana")
    agent = keel.Agent(first.transport, tools=[note, publish], store=store)
    result = await agent.aresume(first.result.run_id)
    assert result.status == "completed" and result.answer == "done"
    counters = store.counters(result.run_id)
    identical = {k: c.count for k, c in counters.items() if tier_of(k) is None}  # not a tier's
    assert identical == {
        'note {"topic":"a"}': 1,
        'publish {"text":"x"}': 1,
    }


async def test_runs_are_listed_newest_first_and_by_status(opened: Opener) -> None:
    store = opened()
    for n in range(3):
        await started(store, f"run_{n}")
        await asyncio.sleep(0.01)
    state = RunState(status="completed")
    await store.save_step(Checkpoint(run_id="run_1", state=state))
    assert [r.run_id for r in store.list_runs()] == ["run_2", "run_1", "run_0"]
    assert [r.run_id for r in store.list_runs(10, "completed")] == ["run_1"]
    assert [r.run_id for r in store.list_runs(1, "running")] == ["run_2"]


async def test_the_web_view_pages_counts_and_follows_runs_through_a_read_only_store(
    opened: Opener,
) -> None:
    """What `keel ui` reads (ADR 0025): pages of runs by status with `offset`, their count, and
    a run's events after a seq, written by another process while a read-only store looks on."""
    store = opened()
    for n in range(5):
        await started(store, f"run_{n}")
        await asyncio.sleep(0.01)
    for run_id in ("run_1", "run_3"):
        await store.save_step(Checkpoint(run_id=run_id, state=RunState(status="completed")))
    reader = opened(read_only=True)
    assert reader.count_runs() == 5 and reader.count_runs("completed") == 2
    assert reader.count_runs("awaiting_approval") == 0
    assert [r.run_id for r in reader.list_runs(2, offset=2)] == ["run_2", "run_1"]
    assert [r.run_id for r in reader.list_runs(1, "completed", offset=1)] == ["run_1"]
    state = await started(store, "run_live")
    await store.save_step(step(state, "run_live"))
    seen = reader.events("run_live")
    for _ in range(2):
        await store.save_step(step(state, "run_live"))
    new = reader.events("run_live", seen[-1].seq)
    assert [e.seq for e in new] == [seen[-1].seq + 1, seen[-1].seq + 2]
    assert reader.events("run_live", new[-1].seq) == []


async def test_texts_holding_nul_characters_are_kept_exactly(opened: Opener) -> None:
    store = opened()
    state = await started(store)
    text = "before\x00after \x01json:not a marker"
    cp = step(state, blobs=[("d", text)])
    cp.events.append(ToolResultRecorded(call_id="c", call_key="k", name="n", content=text,
                                        seq=state.next_seq, at=1.0))  # fmt: skip
    cp.state.next_seq += 1
    await store.save_step(cp)
    assert store.blob("d") == text
    assert store.events("run_1")[-1].content == text  # type: ignore[union-attr]


async def test_a_newer_schema_is_refused_by_name(opened: Opener, store_target: str | Path) -> None:
    opened().close()
    if isinstance(store_target, Path):
        sql(store_target, "PRAGMA user_version = 99")
    else:
        with psycopg.connect(store_target, autocommit=True) as conn:
            conn.execute("UPDATE keel.schema_version SET version = 99")
    for read_only in (False, True):
        with pytest.raises(StoreError, match=r"written by a newer Keel \(schema 99"):
            opened(read_only=read_only)


async def test_a_read_only_store_refuses_writes(opened: Opener) -> None:
    await started(opened())
    reader = opened(read_only=True)
    assert reader.get_run("run_1") is not None
    with pytest.raises(ConfigError, match="read-only"):
        reader.decide("run_1", "c", approved=True, by="ana")
