"""Recordings from Keel's own stored runs (`keel replay --store`): each model turn's calls, the
digests and sizes of the results they got, the model's text of each turn and the question.

Apart from `keel.replay.recordings`, which reads files, so each stays one idea; that module
still offers `read_store` under its old name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from keel.errors import ConfigError
from keel.informative import NOTHING_DIGESTS
from keel.records import (
    ModelResponseReceived,
    ToolCallRequested,
    ToolDispatched,
    ToolResultRecorded,
)
from keel.replay.recorded import Recorded, Recording
from keel.store import RunStore

__all__ = ["read_store"]


def read_store(store: RunStore, run_ids: list[str] | None) -> Iterator[Recording]:
    """Keel's stored runs (oldest first): each model turn's calls and the digests of the
    results they got."""
    if run_ids is None:
        records = store.list_runs(limit=store.count_runs() or 1)
        run_ids = [record.run_id for record in reversed(records)]
    for run_id in run_ids:
        record = store.get_run(run_id)
        if record is None:
            raise ConfigError(f"no run {run_id} in the store at {store.path}")
        events = store.events(run_id)
        answers = {e.call_id: e for e in events if isinstance(e, ToolResultRecorded)}
        effects = {e.call_id: e.effect for e in events if isinstance(e, ToolCallRequested)}
        for e in events:  # recorded before effects were: only side effects were journaled
            if isinstance(e, ToolDispatched) and effects.get(e.call_id) is None:
                effects[e.call_id] = "side_effecting"
        turns = []
        texts = []
        for event in events:
            if isinstance(event, ModelResponseReceived) and event.tool_calls:
                calls = []
                for call in event.tool_calls:
                    try:
                        arguments = json.loads(call.arguments)
                    except (ValueError, RecursionError):
                        arguments = call.arguments
                    effect = effects.get(call.id) or "read_only"
                    answer = answers.get(call.id)
                    calls.append(
                        Recorded(
                            call.name,
                            arguments,
                            answer.digest if answer is not None else None,
                            effect=effect,
                            empty=answer is not None
                            and (not answer.content.strip() or answer.digest in NOTHING_DIGESTS),
                            error=answer is not None and answer.is_error,
                            chars=_chars(answer),
                        )
                    )
                turns.append(tuple(calls))
                texts.append(len(event.text or ""))
        yield Recording(
            id=run_id,
            turns=tuple(turns),
            corpus="keel store",
            model=record.model,
            question_chars=len(record.question) + len(record.config.system_prompt),
            texts=tuple(texts),
        )


def _chars(answer: ToolResultRecorded | None) -> int | None:
    """The whole result's size (a truncated one was stored whole elsewhere); None: no answer."""
    if answer is None:
        return None
    return max(answer.size, len(answer.content))
