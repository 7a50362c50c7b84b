"""A deterministic model read from a script: Keel's own tests and users' agent tests run on it.

``--model script:FILE`` loads a JSON file of the form::

    {"turns": [TURN, ...], "on_synthesis": TURN?, "latency_ms": N?, "stream_ms": N?,
     "model": SPEC?}

    TURN = {"text": "..."}                                  an answer
         | {"tool_calls": [{"name": "...", "arguments": {...} | "raw text"}], "text"?: "..."}
         | {"empty": true}                                  no text, no tool calls
         | {"error": {"status": 429, "message": "...", "retry_after"?: seconds}}
         | {"repeat": N, "turn": TURN}                      N copies (nesting allowed)

An error whose message is a provider's context-length wording (``"prompt is too long: 9000
tokens > 8192 maximum"``, keel/transports/overflow.py) is raised as a ContextOverflow, as the
provider's would be. Turns are consumed one per model call *attempt*, so retries are scripted
too. ``on_synthesis``,
when given, answers every synthesis-only request (tool_choice "none") without consuming a turn.
``model``, when given, names the model the script stands in for (``openai:gpt-4o``): its calls
are priced as that model's (keel/pricing.py), so a test can exercise a cost limit; without it a
scripted call costs nothing. A script that runs out fails loudly (a non-retryable
ProviderError), and ``assert_consumed`` fails a test that left turns unused: a scripted test
must say exactly what the model does.

The whole script is validated and turned into ready answers at load time, so a call costs an
index step and a few small objects: benchmarks run hundreds of scripted runs at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from keel.canonical import canonical_json
from keel.errors import ConfigError, ProviderError
from keel.messages import ModelRequest, ModelResponse, ToolCall, Usage
from keel.transports.base import Resumable
from keel.transports.overflow import as_overflow
from keel.transports.policy import is_retryable
from keel.transports.streaming import OnText

_WORDS = re.compile(r"\s*\S+|\s+")

__all__ = ["MAX_SCRIPT_BYTES", "MAX_TURNS", "SCRIPTED_STOP_REASONS", "ScriptedTransport"]

SCRIPTED_STOP_REASONS = ("stop", "tool_calls")
"""The stop reason of a scripted answer without calls, and with: Chat Completions' words, so
a scripted run's traces carry a finish reason (``gen_ai.response.finish_reasons``) too."""

MAX_TURNS = 100_000
"""Expanded turns a script may hold; guards against a nested ``repeat`` eating the memory."""

MAX_SCRIPT_BYTES = 16 * 1024 * 1024
"""The largest script file read (16 MiB, hundreds of thousands of turns): ``script:/dev/zero``
once read until the memory was gone."""


# --- the script's schema --------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _ScriptedCall(_Strict):
    name: str = Field(min_length=1)
    arguments: Any = Field(default_factory=dict)
    """An object, or a string: the raw text the model "wrote", possibly not valid JSON."""

    @field_validator("arguments")
    @classmethod
    def _json_object_or_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        if not isinstance(value, dict):
            raise PydanticCustomError(
                "arguments", "arguments must be an object, or a string of raw JSON text"
            )
        try:
            canonical_json(value)
        except (TypeError, ValueError, RecursionError) as exc:
            raise PydanticCustomError(
                "arguments", "arguments are not JSON: {e}", {"e": str(exc)}
            ) from None
        return value


class _Reply(_Strict):
    text: str | None = None
    tool_calls: list[_ScriptedCall] = []


class _Empty(_Strict):
    empty: Literal[True]


class _ErrorSpec(_Strict):
    status: int = Field(ge=400, le=599)
    message: str = "scripted error"
    retry_after: float | None = Field(default=None, ge=0)


class _Error(_Strict):
    error: _ErrorSpec


class _Repeat(_Strict):
    repeat: int = Field(ge=1)
    turn: _Turn


def _turn_shape(value: Any) -> str | None:
    """Pick the turn's shape from its keys; None (an error) when no shape or several fit."""
    if not isinstance(value, dict):
        return None
    shapes = [
        tag
        for tag, keys in (
            ("~reply", ("text", "tool_calls")),
            ("~empty", ("empty",)),
            ("~error", ("error",)),
            ("~repeat", ("repeat", "turn")),
        )
        if any(key in value for key in keys)
    ]
    return shapes[0] if len(shapes) == 1 else None


_Turn = Annotated[
    Annotated[_Reply, Tag("~reply")]
    | Annotated[_Empty, Tag("~empty")]
    | Annotated[_Error, Tag("~error")]
    | Annotated[_Repeat, Tag("~repeat")],
    Discriminator(
        _turn_shape,
        custom_error_type="turn_shape",
        custom_error_message='a turn is an object with exactly one of "text"/"tool_calls", '
        '"empty", "error" or "repeat"',
    ),
]

_Repeat.model_rebuild()


class _Script(_Strict):
    turns: list[_Turn]
    on_synthesis: _Turn | None = None
    latency_ms: float = Field(default=0, ge=0)
    model: str | None = Field(default=None, min_length=1)
    stream_ms: float | None = Field(default=None, ge=0)


def _path(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as a JSON path, ``turns[3].tool_calls[0]``, without union tags."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not part.startswith("~"):  # the tags of _turn_shape are not JSON keys
            path += f".{part}" if path else part
    return path or "(top level)"


def _describe(error: ErrorDetails) -> str:
    """One problem, as ``turns[3].tool_calls[0]: missing "name"``."""
    loc = error["loc"]
    if error["type"] in ("missing", "extra_forbidden") and loc and isinstance(loc[-1], str):
        what = "missing" if error["type"] == "missing" else "unknown key"
        return f'{_path(loc[:-1])}: {what} "{loc[-1]}"'
    if error["type"] in ("model_type", "dict_type"):
        return f"{_path(loc)}: expected an object"
    return f"{_path(loc)}: {error['msg']}"


# --- ready answers --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Answer:
    """One turn, built once: a response to stamp fresh ids on, or an error to raise."""

    where: str
    """The turn's JSON path, for `assert_consumed` messages."""
    summary: str
    text: str | None = None
    calls: tuple[ToolCall, ...] = ()
    """Template calls; each answer copies them with new ids."""
    output_tokens: int = 1
    error: _ErrorSpec | None = None


def _reply_answer(where: str, turn: _Reply | _Empty) -> _Answer:
    if isinstance(turn, _Empty):
        return _Answer(where, "empty")
    calls = tuple(
        ToolCall.from_raw("", c.name, c.arguments)
        if isinstance(c.arguments, str)
        else ToolCall.from_arguments("", c.name, c.arguments)
        for c in turn.tool_calls
    )
    size = len(turn.text or "") + sum(len(c.raw_arguments) for c in calls)
    summary = " + ".join(
        ([f"text {turn.text[:40]!r}"] if turn.text is not None else [])
        + ([f"tool_calls {', '.join(c.name for c in calls)}"] if calls else [])
    )
    return _Answer(where, summary or "reply", turn.text, calls, max(1, size // 4))


def _expand(turn: _Turn, where: str) -> list[_Answer]:
    """The turn's answers, built once; a repeat copies references, not answers."""
    if isinstance(turn, _Repeat):
        once = _expand(turn.turn, f"{where}.turn")
        if len(once) * turn.repeat > MAX_TURNS:
            raise ConfigError(f"{where}: the script expands past {MAX_TURNS} turns")
        return once * turn.repeat
    if isinstance(turn, _Error):
        return [_Answer(where, f"error {turn.error.status}", error=turn.error)]
    return [_reply_answer(where, turn)]


def _read_script(path: str | Path) -> str:
    """The text of a script file: a regular file of at most `MAX_SCRIPT_BYTES`, else ConfigError.

    Opened without blocking, so a FIFO is refused instead of waiting for a writer, and read with
    a bound, so a file that grows (or a ``/proc`` file that claims to be empty) cannot overrun.
    """
    limit = f"larger than the {MAX_SCRIPT_BYTES // (1024 * 1024)} MiB a script may have"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ConfigError(f"script {path}: not a regular file; a script is a JSON file")
            if info.st_size > MAX_SCRIPT_BYTES:
                raise ConfigError(f"script {path}: {info.st_size} bytes, {limit}")
            data = file.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"script {path}: cannot read it: {exc}") from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise ConfigError(f"script {path}: {limit}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"script {path}: cannot read it: {exc}") from None


# --- the transport --------------------------------------------------------------------------


class ScriptedTransport(Resumable):
    """Answers each model call with the script's next turn; see the module docstring.

    `Resumable`: a resumed run continues at the turn its script stood at. It steers nothing:
    a script's turns are what its author wrote (the embedded model's first-call steering lives
    with that model, keel.transports.local.steering)."""

    def __init__(self, script: _Script, *, source: str, record: bool = False) -> None:
        """Use `from_file` or `from_dict`: they validate the script and name its source."""
        self.name = f"script:{source}"
        answers: list[_Answer] = []
        try:
            for i, turn in enumerate(script.turns):
                answers += _expand(turn, f"turns[{i}]")
                if len(answers) > MAX_TURNS:
                    raise ConfigError(f"turns: the script expands past {MAX_TURNS} turns")
        except ConfigError as exc:
            raise ConfigError(f"script {source}: {exc}") from None
        if isinstance(script.on_synthesis, _Repeat):
            raise ConfigError(f"script {source}: on_synthesis: a repeat is not allowed here")
        self._answers = answers
        self._on_synthesis = (
            None if script.on_synthesis is None else _expand(script.on_synthesis, "on_synthesis")[0]
        )
        self._latency = script.latency_ms / 1000
        self._priced_as = script.model
        self._token_delay = None if script.stream_ms is None else script.stream_ms / 1000
        self.streams = self._token_delay is not None
        """With ``stream_ms``, a listener hears each answer word by word, that many
        milliseconds apart (ADR 0039); without, the script does not stream."""
        self._consumed = 0
        self._ids = 0
        self._requests: list[ModelRequest] | None = [] if record else None

    @classmethod
    def from_dict(
        cls, data: Any, source: str = "<dict>", *, record: bool = False
    ) -> ScriptedTransport:
        """Build from the parsed script; any problem is a ConfigError naming its JSON path."""
        try:
            script = _Script.model_validate(data)
        except ValidationError as exc:
            problems = "\n  ".join(_describe(e) for e in exc.errors())
            raise ConfigError(f"script {source}: {problems}") from None
        return cls(script, source=source, record=record)

    @classmethod
    def from_file(cls, path: str | Path, *, record: bool = False) -> ScriptedTransport:
        """Read, validate and build a script file (``--model script:FILE``)."""
        text = _read_script(path)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"script {path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from None
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"script {path}: not valid JSON: {exc}") from None
        return cls.from_dict(data, str(path), record=record)

    def priced_as(self) -> str:
        """The model the script stands in for, when it names one; else its own (free) name."""
        return self._priced_as or self.name

    @property
    def consumed(self) -> int:
        """Turns used so far; synthesis turns answered by ``on_synthesis`` do not count."""
        return self._consumed

    @property
    def remaining(self) -> int:
        return len(self._answers) - self._consumed

    @property
    def requests(self) -> list[ModelRequest]:
        """Every request received, in order (only with ``record=True``)."""
        if self._requests is None:
            raise ConfigError("construct the ScriptedTransport with record=True to keep requests")
        return self._requests

    def snapshot(self) -> dict[str, Any]:
        """Where the script stands, saved with each step so a resumed run continues here."""
        return {"consumed": self._consumed, "ids": self._ids}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue a resumed run where its script stood (a new process reads the file anew)."""
        self._consumed = int(state.get("consumed", 0))
        self._ids = int(state.get("ids", 0))

    def assert_consumed(self) -> None:
        """Fail (AssertionError) if any turn was left unused: the agent stopped early."""
        left = self._answers[self._consumed :]
        if left:
            listed = "\n  ".join(
                f"#{self._consumed + i + 1} {a.where}: {a.summary}" for i, a in enumerate(left[:10])
            )
            more = f"\n  ... and {len(left) - 10} more" if len(left) > 10 else ""
            raise AssertionError(
                f"{self.name}: {len(left)} of {len(self._answers)} turns were not used:"
                f"\n  {listed}{more}"
            )

    async def request(self, request: ModelRequest) -> ModelResponse:
        """One attempt: take the next turn (or ``on_synthesis``), wait the latency, answer."""
        if self._requests is not None:
            self._requests.append(request)
        answer = self._on_synthesis if request.tool_choice == "none" else None
        if answer is None:
            # Taken before the sleep, so concurrent calls get turns in the order they arrived.
            if self._consumed >= len(self._answers):
                raise ProviderError(
                    f"{self.name}: the script has no turn left: {self._consumed} turns were "
                    "consumed and the agent made another model call; add a turn to the script "
                    "or find out why the agent called the model again",
                    retryable=False,
                )
            answer = self._answers[self._consumed]
            self._consumed += 1
        if self._latency:
            await asyncio.sleep(self._latency)
        if answer.error is not None:
            status = answer.error.status
            raise as_overflow(  # a provider's overflow wording makes it a ContextOverflow
                ProviderError(
                    f"{self.name}: scripted error {status}: {answer.error.message}",
                    status=status,
                    retryable=is_retryable(status),
                    retry_after=answer.error.retry_after,
                )
            )
        return ModelResponse(
            text=answer.text,
            tool_calls=tuple(self._stamp(call) for call in answer.calls),
            usage=Usage(request.estimated_input_tokens, answer.output_tokens),
            stop_reason=SCRIPTED_STOP_REASONS[bool(answer.calls)],
        )

    async def request_streaming(self, request: ModelRequest, on_text: OnText) -> ModelResponse:
        """`request`, its text handed out a word at a time, ``stream_ms`` apart."""
        response = await self.request(request)
        for n, piece in enumerate(_WORDS.findall(response.text or "")):
            if n and self._token_delay:
                await asyncio.sleep(self._token_delay)
            on_text(piece)
        return response

    def _stamp(self, call: ToolCall) -> ToolCall:
        self._ids += 1
        return ToolCall(
            f"call_{self._ids}",
            call.name,
            call.raw_arguments,
            call.arguments,
            call.parse_error,
            call.key,
        )
