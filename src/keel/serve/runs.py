"""The runs `keel serve` starts, cancels, decides and follows: one service under every protocol.

Nothing here is the record: a run's state and events live in the store, and every answer a
protocol gives is read from there (`record`, `follow`). What this process holds in memory is
only the handles of the runs it is advancing right now, so that a cancel can stop one at once;
a restart loses none of what a client can ask about (ADR 0040).

- A new question starts a run in this process (`Agent.start`); on a conversation, as a
  follow-up on its newest run (ADR 0038).
- A decision is recorded as `keel approve`/`keel deny` record it; once no call waits, the run
  goes on: in this process on SQLite, through the workers' queue on Postgres when a
  `keel worker` has set it up (else here too).
- A cancel stops a run this process advances (recorded `cancelled`, nothing recorded lost); a
  paused run is taken up and cancelled before it does anything, so it too ends `cancelled`.
- `recover` takes up, at start, the served runs left `running` by a process that died.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from keel import approvals
from keel.agent import Agent, RunHandle
from keel.errors import ConfigError, DecisionExpired, KeelError, LeaseHeld
from keel.records import Decision as RecordedDecision
from keel.records import Event, RunConfig
from keel.result import TERMINAL
from keel.store import RunRecord, RunStore
from keel.store.locate import is_url

__all__ = [
    "SERVED",
    "Decision",
    "NotCancelable",
    "RunService",
    "check_decisions",
    "mismatch",
    "stopped",
    "waiting",
]

SERVED = "served_by"
"""The setting every run `keel serve` starts carries (so a restart knows which to take up)."""
POLL_SECONDS = 0.1
"""How often a follower reads the store for a run's new events."""
STOP_SECONDS = 10.0
"""How long a shutdown waits for the running runs to reach the end of their step."""
OPEN_SECONDS = 10.0
"""How long a new run may take to be recorded before the request gives up on it."""


@dataclass(frozen=True, slots=True)
class Decision:
    """A person's (or an agent's) word on one pending call."""

    call_id: str
    approved: bool
    reason: str = ""
    arguments: dict[str, Any] | None = None
    """Approved with these arguments instead of the model's (ADR 0052)."""
    for_run: bool = False
    """Approved for the rest of the run: later calls of the tool need no approval."""
    answer: str | None = None
    """Answered instead: this text is the call's result, the tool is not run."""
    call_key: str | None = None
    """The key of the call the decider saw: refused when the pending call's differs."""

    def record(self, by: str) -> RecordedDecision:
        """The decision as the store records it."""
        if self.answer is not None:
            return RecordedDecision(False, by, answer=self.answer)
        if not self.approved:
            return RecordedDecision(False, by, self.reason or "denied by the A2A client")
        return RecordedDecision(True, by, arguments=self.arguments, for_run=self.for_run)


class NotCancelable(Exception):
    """The run cannot be cancelled from here: it has ended, or another process advances it."""


class RunService:
    """Starts and follows the runs of one agent on its store (`agent.store`)."""

    def __init__(self, agent: Agent, target: str, *, by: str = "an A2A client") -> None:
        self.agent = agent
        self.target = target
        """The store as named (a path or a postgresql:// URL), for the workers' queue."""
        self.by = by
        self.handles: dict[str, RunHandle] = {}
        self.agent.run_config[SERVED] = "keel serve"

    @property
    def store(self) -> RunStore:
        return self.agent.store

    def record(self, run_id: str) -> RunRecord | None:
        return self.store.get_run(run_id)

    def events(self, run_id: str, after: int = -1) -> list[Event]:
        return self.store.events(run_id, after)

    # -- starting, deciding, cancelling ----------------------------------------------------------

    async def start(self, question: str, conversation: str | None = None) -> RunRecord:
        """A new run of `question` (on `conversation`, a follow-up), once it is recorded.
        ConfigError: an empty question, an unknown conversation, one whose newest run has not
        ended."""
        if not question.strip():
            raise ConfigError("the message holds no question: send it as a text part")
        handle = self.agent.start(question, conversation=conversation)
        self._keep(handle)
        return await self._opened(handle)

    async def decide(self, run_id: str, decisions: Sequence[Decision]) -> None:
        """Record `decisions` on a paused run's calls, then let the run go on once none is
        left waiting. ConfigError: a call that is not pending; AlreadyDecided: one decided
        before (decisions are final)."""
        if not decisions:
            raise ConfigError("no decisions: the run waits for approve/deny on its calls")
        record = self._known(run_id)
        if not is_url(self.target) and (why := self.foreign(record)):
            raise ConfigError(
                f"run {run_id} cannot go on here: {why}; decide with `keel approve`/`keel deny` "
                "and continue it with `keel resume`"
            )
        check_decisions(record, decisions)  # all or nothing: none is recorded unless all can be
        try:
            await asyncio.to_thread(self._record, run_id, decisions)  # off the loop
        except DecisionExpired:  # the denial it turned into is recorded: the run goes on from it
            await self._go_on(run_id, record)
            raise
        await self._go_on(run_id, record)

    async def _go_on(self, run_id: str, record: RunRecord) -> None:
        """Let the run go on once no call waits for a decision: here, or on Postgres through
        the workers' queue."""
        if approvals.pending(self.store, run_id):
            return
        if is_url(self.target) and (
            await asyncio.to_thread(self._queued, run_id) or self.foreign(record)
        ):
            return  # the workers' queue has it, or will once a worker sets it up
        self._keep(self.agent.start_resume(run_id))

    def _record(self, run_id: str, decisions: Sequence[Decision]) -> None:
        """Every decision checked (the calls seen, edited arguments against their schema, in a
        bounded thread: keel/approvals.py), then recorded; run in a thread of the server's."""
        for decision in decisions:
            approvals.check(
                self.store,
                run_id,
                decision.call_id,
                decision.record(self.by),
                expect_key=decision.call_key,
                validate=self.agent._validate_arguments,
            )
        for decision in decisions:
            approvals.decide(
                self.store,
                run_id,
                decision.call_id,
                decision.record(self.by),
                expect_key=decision.call_key,
            )

    def _queued(self, run_id: str) -> bool:
        """On Postgres: handed to the workers' queue (False: no worker has set it up)."""
        from keel.pool.dispatch import hand_on_decided

        return hand_on_decided(self.target, run_id).queued

    async def cancel(self, run_id: str) -> RunRecord:
        """Cancel the run for real: recorded `cancelled`, nothing recorded lost."""
        record = self._known(run_id)
        if record.status in TERMINAL:
            raise NotCancelable(f"run {run_id} has already ended ({record.status})")
        # the whole tree, durably (keel/store/cancels.py): a paused or queued run, or one a
        # dead process left, ends `cancelled` at once; a live one is stopped by its process
        await asyncio.to_thread(self.store.request_cancel, run_id)
        handle = self.handles.get(run_id)
        if handle is not None:
            handle.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await handle
        waited = 0.0
        while (record := self._known(run_id)).status not in TERMINAL and waited < STOP_SECONDS:
            await asyncio.sleep(POLL_SECONDS)  # another process advances it: it stops it
            waited += POLL_SECONDS
        if record.status not in TERMINAL:
            raise NotCancelable(f"another process is advancing run {run_id} and has not stopped")
        return record

    def recover(self) -> list[str]:
        """Take up the runs this server started that are left `running` or decided with no
        process advancing them (it was killed): each goes on from its last saved step."""
        taken = []
        left = [
            *self.store.list_runs(self.store.count_runs("running"), status="running"),
            *(
                r
                for r in self.store.list_runs(
                    self.store.count_runs("awaiting_approval"), status="awaiting_approval"
                )
                if not waiting(r)  # decided, but the server died before it went on
            ),
        ]
        for record in left:
            if record.config.settings.get(SERVED) is None or self.foreign(record):
                continue
            try:
                self._keep(self.agent.start_resume(record.run_id))
            except (LeaseHeld, ConfigError):
                continue  # a live process advances it, or it cannot be taken up: left as it is
            taken.append(record.run_id)
        return taken

    def close(self) -> None:
        """Leave every run this process advances for a later `keel serve` (or `keel resume`)
        to continue: each stops after its current step, saved and its lease released."""
        for handle in list(self.handles.values()):
            handle.stop()

    async def wait_stopped(self, timeout: float = STOP_SECONDS) -> None:
        """Wait for the runs `close` stopped, `timeout` at most: one still inside a step then
        is cancelled as the process ends (recorded `cancelled`, an interruption that
        `keel resume` continues)."""
        waiting = [asyncio.ensure_future(_settled(h)) for h in self.handles.values()]
        if waiting:
            await asyncio.wait(waiting, timeout=timeout)

    def foreign(self, record: RunRecord) -> str | None:
        """Why this server's agent cannot continue `record`, or None: it can (`mismatch`)."""
        return mismatch(self.agent, record)

    # -- following -------------------------------------------------------------------------------

    async def follow(
        self, run_id: str, after: int = -1
    ) -> AsyncIterator[tuple[list[Event], RunRecord]]:
        """The run's events after seq `after` as they are recorded, each batch with the record
        read before it (its state at least as new as the events). Ends once the run has
        stopped advancing (ended, paused, or cancelled) and every event up to that was given."""
        while True:  # read off the event loop: the runs advance on it meanwhile
            record = await asyncio.to_thread(self._known, run_id)
            batch = await asyncio.to_thread(self.events, run_id, after)
            if batch:
                after = batch[-1].seq
            yield batch, record
            if stopped(record) and after >= record.state.next_seq - 1:
                return
            if not batch:
                await asyncio.sleep(POLL_SECONDS)

    # -- helpers ---------------------------------------------------------------------------------

    def _known(self, run_id: str) -> RunRecord:
        record = self.record(run_id)
        if record is None:
            raise ConfigError(f"no run {run_id} in {self.store.path}")
        return record

    def _keep(self, handle: RunHandle) -> None:
        self.handles[handle.run_id] = handle
        task = asyncio.ensure_future(_settled(handle))
        task.add_done_callback(lambda _: self._forget(handle))

    def _forget(self, handle: RunHandle) -> None:
        if self.handles.get(handle.run_id) is handle:
            del self.handles[handle.run_id]

    async def _opened(self, handle: RunHandle) -> RunRecord:
        deadline = asyncio.get_running_loop().time() + OPEN_SECONDS
        while True:
            record = self.record(handle.run_id)
            if record is not None:
                return record
            if handle._task.done():  # it ended before it was recorded: say why
                handle._task.result()
                raise KeelError(f"run {handle.run_id} ended before it was recorded")
            if asyncio.get_running_loop().time() > deadline:
                raise KeelError(f"run {handle.run_id} was not recorded in {OPEN_SECONDS:.0f} s")
            await asyncio.sleep(0.02)


def mismatch(agent: Agent, record: RunRecord) -> str | None:
    """Why `agent` cannot continue `record`, or None: it can. Another model, tools it does not
    have, or another folder (`--repo`): a run approved to write in one folder must never write
    in another's, nor a run started on one model go on with another's answers. Nor under a
    looser policy than the run was started with (ADR 0062): tools pre-approved, hosts let
    through, or writes offered that the run did not have. A server that allows less may go
    on: it asks more, never less."""
    mine = agent.config()
    if record.config.model != mine.model:
        return f"it runs on {record.config.model}, this server on {mine.model}"
    missing = set(record.config.tools) - set(mine.tools)
    if missing:
        return f"it uses tools this server does not offer ({', '.join(sorted(missing))})"
    theirs, ours = record.config.settings.get("repo"), mine.settings.get("repo")
    if theirs != ours:
        return f"it works in {theirs or 'no named folder'}, this server in {ours or 'none named'}"
    return _looser(record.config, mine)


def _looser(started: RunConfig, mine: RunConfig) -> str | None:
    """What this server's policy allows that the run's did not, or None."""
    approved = set(mine.approve_tools) - set(started.approve_tools)
    if approved:
        names = ", ".join(sorted(approved))
        return f"this server pre-approves {names}, which the run did not (--approve-tools)"
    hosts = _strings(mine.settings.get("allow_hosts")) - _strings(
        started.settings.get("allow_hosts")
    )
    if hosts:
        names = ", ".join(sorted(hosts))
        return f"this server lets fetch reach {names}, which the run did not allow (--allow-host)"
    if mine.settings.get("allow_writes") and not started.settings.get("allow_writes"):
        return "this server offers write_file, which the run did not have (--allow-writes)"
    return None


def _strings(value: object) -> set[str]:
    return {str(v) for v in value} if isinstance(value, list) else set()


def check_decisions(record: RunRecord, decisions: Sequence[Decision]) -> None:
    """Refuse (ConfigError) a set of decisions of which any cannot be recorded, naming every
    one that cannot, before any is: one recorded and the next refused would leave the run with
    no call waiting and nobody to take it on."""
    pending = {p.call_id for p in record.state.pending}
    problems: list[str] = []
    seen: set[str] = set()
    for decision in decisions:
        call = decision.call_id
        if call in seen:
            problems.append(f"{call} is decided twice in this message")
        elif call not in pending:
            problems.append(f"{call} is not a call of run {record.run_id} that waits for approval")
        elif (earlier := record.state.decisions.get(call)) is not None:
            what = "approved" if earlier.approved else "denied"
            problems.append(f"{call} was {what} already by {earlier.by} (decisions are final)")
        seen.add(call)
    if problems:
        waiting_now = sorted(pending - set(record.state.decisions))
        raise ConfigError(
            f"nothing recorded: {'; '.join(problems)}. Calls waiting: "
            f"{', '.join(waiting_now) or 'none'}"
        )


def waiting(record: RunRecord) -> bool:
    """Paused with a call still undecided (a paused run whose calls are all decided is about
    to go on)."""
    decided = record.state.decisions
    return record.status == "awaiting_approval" and any(
        p.call_id not in decided for p in record.state.pending
    )


def stopped(record: RunRecord) -> bool:
    """The run will not advance by itself: it has ended, or waits for a decision."""
    return record.status in TERMINAL or waiting(record)


async def _settled(handle: RunHandle) -> None:
    """Wait for a run to end without letting its outcome escape as an unhandled error: the
    outcome is in the store."""
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await handle
