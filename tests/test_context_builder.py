"""The context builder (ADR 0004): pairs intact, counts cached, stable elision, controls last."""

from __future__ import annotations

import itertools

import keel
from keel._run.context import ContextBuilder
from keel.messages import AssistantMessage, ToolCall, ToolResult, UserMessage, digest_text
from keel.records import ResultElided
from keel.tokens import EstimatingCounter, item_tokens
from support import call, run_script


class CountingCounter(EstimatingCounter):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return super().count(text)


def add_turn(builder: ContextBuilder, n: int, size: int) -> None:
    c = ToolCall.from_arguments(f"call_{n}", "read", {"n": n})
    builder.append(AssistantMessage(None, (c,)))
    text = f"{n}:" + "w" * size
    builder.append(ToolResult(c.id, c.name, c.key, text, size=len(text), digest=digest_text(text)))


def test_frozen_prefix_is_identical_on_every_turn() -> None:
    tools = (keel.ToolDefinition("read", "Read.", {"type": "object"}),)
    builder = ContextBuilder("system text", tools, EstimatingCounter(), budget=10_000)
    builder.append(UserMessage("q"))
    first, _ = builder.build()
    add_turn(builder, 1, 100)
    second, _ = builder.build("none", ("control",))
    assert first.system == second.system and first.tools == second.tools


def test_token_counts_are_cached_per_item() -> None:
    counter = CountingCounter()
    builder = ContextBuilder("s", (), counter, budget=1_000_000)
    builder.append(UserMessage("q"))
    for n in range(50):
        add_turn(builder, n, 100)
    before = counter.calls
    builder.build()
    builder.build()
    assert counter.calls == before  # building re-counts nothing
    add_turn(builder, 50, 100)
    assert counter.calls - before <= 4  # only the new items were counted


def test_oldest_large_results_elided_first_and_stay_elided() -> None:
    builder = ContextBuilder("s", (), EstimatingCounter(), budget=2_000)
    builder.append(UserMessage("q"))
    for n in range(6):
        add_turn(builder, n, 2_000)
    request, newly = builder.build()
    assert [r.call_id for r in newly] == [f"call_{n}" for n in range(len(newly))]
    assert 1 <= len(newly) < 6
    assert request.estimated_input_tokens <= 2_000
    results = [i for i in request.items if isinstance(i, ToolResult)]
    assert [r.elided for r in results] == [True] * len(newly) + [False] * (6 - len(newly))
    pointer = results[0]
    assert "elided to save context" in pointer.content and "read" in pointer.content
    assert pointer.digest[:16] in pointer.content and str(pointer.size) in pointer.content

    again, newly_again = builder.build()
    assert newly_again == [] and again.items == request.items
    add_turn(builder, 6, 10)
    later, _ = builder.build()
    assert later.items[: len(request.items)] == request.items  # a stable prefix


def test_latest_results_are_never_elided() -> None:
    builder = ContextBuilder("s", (), EstimatingCounter(), budget=500)
    builder.append(UserMessage("q"))
    add_turn(builder, 0, 5_000)
    request, newly = builder.build()
    assert newly == []
    assert not request.items[-1].elided  # type: ignore[union-attr]


def test_volatile_controls_go_last_and_only_in_the_request() -> None:
    builder = ContextBuilder("s", (), EstimatingCounter(), budget=10_000)
    builder.append(UserMessage("q"))
    with_control, _ = builder.build("none", ("say what is missing",))
    without, _ = builder.build()
    assert with_control.volatile == ("say what is missing",)
    assert without.volatile == () and without.items == with_control.items
    assert with_control.estimated_input_tokens > without.estimated_input_tokens


def test_restored_elisions_are_shown_as_pointers() -> None:
    builder = ContextBuilder("s", (), EstimatingCounter(), budget=100_000, elided={"call_1"})
    builder.append(UserMessage("q"))
    add_turn(builder, 1, 3_000)
    add_turn(builder, 2, 10)
    request, newly = builder.build()
    assert newly == []
    assert request.items[2].elided and not request.items[4].elided  # type: ignore[union-attr]


@keel.tool
def page(n: int) -> str:
    """Read page n."""
    return f"page {n} " + "lorem ipsum " * 800


async def test_call_result_pairs_stay_intact_in_every_request() -> None:
    turns = [call("page", n=i) for i in range(12)] + [{"text": "done"}]
    out = await run_script({"turns": turns}, [page], context_tokens=4_000)
    assert out.of_type(ResultElided)
    for request in out.requests:
        open_calls: set[str] = set()
        for item in request.items:
            if isinstance(item, AssistantMessage):
                assert not open_calls, "a call was left without its result"
                open_calls = {c.id for c in item.tool_calls}
            elif isinstance(item, ToolResult):
                assert item.call_id in open_calls, "a result without its call"
                open_calls.discard(item.call_id)


def prompt_cache_run(turns: int, budget: int, elide_to: float) -> list[keel.ModelRequest]:
    """Requests of a run of `turns` turns of 20 KB results, as the builder makes them."""
    builder = ContextBuilder("s", (), EstimatingCounter(), budget=budget, elide_to=elide_to)
    builder.append(UserMessage("q"))
    requests = []
    for n in range(turns):
        requests.append(builder.build()[0])
        add_turn(builder, n, 20_000)
    return requests


def repeated_share(requests: list[keel.ModelRequest]) -> float:
    repeated = sum(r.repeated_prefix_tokens for r in requests)
    return repeated / sum(r.estimated_input_tokens for r in requests)


def test_elision_goes_down_to_the_low_water_mark_in_one_batch() -> None:
    builder = ContextBuilder("s", (), EstimatingCounter(), budget=20_000, elide_to=0.5)
    builder.append(UserMessage("q"))
    for n in range(3):
        add_turn(builder, n, 20_000)  # ~5,600 tokens each: 16,700 in all, under the budget
    assert builder.build()[1] == []
    add_turn(builder, 3, 20_000)  # 22,300: over the budget
    request, newly = builder.build()
    assert [r.call_id for r in newly] == ["call_0", "call_1", "call_2"]  # a batch, oldest first
    assert request.estimated_input_tokens <= 10_000  # down to the low-water mark
    add_turn(builder, 4, 20_000)
    add_turn(builder, 5, 20_000)
    assert builder.build()[1] == []  # room for turns before the next batch


def test_turns_between_batches_repeat_the_whole_previous_request() -> None:
    requests = prompt_cache_run(12, 20_000, 0.5)
    for before, after in itertools.pairwise(requests):
        if after.settled_items == before.settled_items:  # no elision in between
            assert after.items[: len(before.items)] == before.items
            assert after.repeated_prefix_tokens == before.estimated_input_tokens


def test_nothing_before_the_first_elided_result_changes_and_only_that_counts_as_repeated() -> None:
    requests = prompt_cache_run(12, 20_000, 0.5)
    assert requests[0].repeated_prefix_tokens == 0  # no previous request
    batches = 0
    for before, after in itertools.pairwise(requests):
        if after.settled_items == before.settled_items:
            continue
        batches += 1
        pairs = zip(before.items, after.items, strict=False)
        first = next(i for i, (a, b) in enumerate(pairs) if a != b)
        assert after.items[first].elided  # type: ignore[union-attr]
        assert after.items[:first] == before.items[:first]
        counter = EstimatingCounter()
        kept = counter.count("s") + sum(item_tokens(counter, i) for i in after.items[:first])
        assert after.repeated_prefix_tokens == kept
        assert after.settled_items > first  # the batch ends the settled part
    assert batches >= 2


def test_settled_items_end_at_the_last_elided_result_and_are_rebuilt_on_resume() -> None:
    live = ContextBuilder("s", (), EstimatingCounter(), budget=20_000)
    live.append(UserMessage("q"))
    for n in range(6):
        add_turn(live, n, 20_000)
    request, newly = live.build()
    last = max(i for i, item in enumerate(request.items) if getattr(item, "elided", False))
    assert request.settled_items == last + 1
    resumed = ContextBuilder(
        "s", (), EstimatingCounter(), budget=20_000, elided={r.call_id for r in newly}
    )
    resumed.extend(live._entries[i].item for i in range(len(request.items)))
    again, _ = resumed.build()
    assert again == request  # equal, settled items included; only the repeated count differs
    assert again.repeated_prefix_tokens == 0


def test_eliding_in_batches_keeps_most_of_each_request_a_repeated_prefix() -> None:
    """100 turns of 20 KB at a 30,000-token budget (the issue's case): in batches most input
    repeats the previous request; one result at a time, almost none does."""
    batch = repeated_share(prompt_cache_run(100, 30_000, 0.5))
    one_at_a_time = repeated_share(prompt_cache_run(100, 30_000, 1.0))
    assert batch >= 0.6 and one_at_a_time <= 0.2, (batch, one_at_a_time)
