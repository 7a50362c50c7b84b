"""The calls a provider ran on its own servers in a model turn (ADR 0067), in the run's record.

They were made before Keel saw them: nothing here approves, refuses or re-runs them. Each is
recorded as a `HostedToolCalled` event right after the turn's response (the ledger counts it
as a tool call and adds its price per call to the spend) and counted by the breaker as the
loop counts a call of its own: its key (the tool and what it was asked) by the identical-call
counter, and its result (the sources it found, in order) by the repeat tiers, so the same
search reworded that finds the same pages is a repeat (`same_result`), and a turn at T-1 is
followed by the synthesis turn. A fork counts them again from the events (`count_hosted`),
with the same code.
"""

from __future__ import annotations

from keel._run.breaker import IdenticalCallBreaker, Restart
from keel._run.parts import StepParts
from keel.canonical import call_key
from keel.hosted import HostedCall, hosted_calls
from keel.messages import ModelResponse, digest_text
from keel.pricing import Price
from keel.records import HostedToolCalled

__all__ = ["count_hosted", "hosted_event", "record_hosted"]


def record_hosted(parts: StepParts, response: ModelResponse) -> None:
    """Record and count the hosted calls of the response just recorded."""
    for call in hosted_calls(response.provider_details):
        event = hosted_event(parts.state.step, call, parts.price)
        parts.recorder.emit(event)  # spend and the tool-call count: the ledger
        for restart in count_hosted(parts.breaker, event):
            parts.recorder.restarted(restart)


def hosted_event(step: int, call: HostedCall, price: Price | None) -> HostedToolCalled:
    """The event of one hosted call; its cost is the provider's price per call of its kind
    (nothing for a call that failed, which is not billed), None without a known price."""
    cost = None if price is None else price.hosted(call.name) if call.billed else 0.0
    return HostedToolCalled(
        step=step,
        call_id=call.id,
        name=call.name,
        input=call.input,
        sources=call.sources,
        error=call.error,
        cost=cost,
    )


def count_hosted(breaker: IdenticalCallBreaker, event: HostedToolCalled) -> list[Restart]:
    """Count one hosted call as the batch counts a call and settles its result."""
    key = call_key(event.name, {"input": event.input})
    restarts = breaker.record([key])
    digest = digest_text("\n".join(event.sources))
    failed = event.error is not None
    if not failed:
        restart = breaker.settle(key, digest, observation=False, side_effect=False)
        if restart is not None:
            restarts.append(restart)
    breaker.answered(
        key,
        event.name,
        digest_text(event.error) if event.error else digest,
        error=failed,
        empty=not event.sources,
        side_effect=False,
    )
    return restarts
