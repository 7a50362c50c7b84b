"""The scenario format: what an evaluation runs and what it must end with.

A scenario is one TOML or JSON file. It names a question, a scripted model (the format of
`keel.ScriptedTransport`, ignored when `keel eval --model` picks a real one), the tools and their
settings, pages for the loopback page server, files for the file tools, the run's limits, and
the expected outcome. ``{base}`` anywhere in the question or the script becomes the page
server's base URL, which is only known once it has started on a free port::

    question = "Has the job at {base}/job finished?"
    [limits]
    loop_threshold = 5
    [[pages]]
    path = "/job"
    kind = "progress"          # also: static, changing, settling, large, document, slow,
                               # error, script, redirect, searxng
    steps = 1                  # done on the first poll
    [script]
    turns = [
      { tool_calls = [{ name = "observe_page", arguments = { url = "{base}/job" } }] },
      { text = "The job finished." },
    ]
    [expect]
    status = "completed"
    synthesized = false   # false: plain answer; "repeated_tool"/"budget"/"deadline"/"context"
    page_hits = { "/job" = 1 }

Counts in ``[expect]`` are a number (exactly) or ``{ min = N, max = M }``. `loading.py` reads
and validates files; a typo fails before anything runs, with the file and the field named.

Long runs (issue 44) add generated documents with facts planted in them (``[[documents]]``, a
folder for the file tools; pages of kind ``document``) and ``[refusals]``, turns the scripted
provider refuses as too long (keel/evals/refusals.py).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator

from keel.errors import FailureKind
from keel.evals.documents import document_text
from keel.evals.facts import RepoFact
from keel.evals.page_specs import (
    Page,
    Planted,
)
from keel.evals.refusals import Wire
from keel.limits import RENAMED, Limits, current_names
from keel.records import Event, UnknownEvent

__all__ = [
    "BROWSER_TOOLS",
    "EVENT_TYPES",
    "FILE_TOOLS",
    "KNOWN_TOOLS",
    "SEARCH_TOOLS",
    "SUFFIXES",
    "WEB_TOOLS",
    "WRITE_TOOLS",
    "ApprovalsSpec",
    "Bounds",
    "Count",
    "Decision",
    "Documents",
    "Expect",
    "PlantedIn",
    "Refusals",
    "RunEnd",
    "Scenario",
    "ScenarioSpec",
    "ToolsSpec",
]

WEB_TOOLS = ("fetch", "observe_page")
FILE_TOOLS = ("list_files", "read_file", "search_files")
BROWSER_TOOLS = ("browser_observe", "browser_act")
SEARCH_TOOLS = ("web_search",)
"""Over the backend `[tools] search` names."""
WRITE_TOOLS = ("write_file",)
"""Side-effecting, under the same folder as the file tools; it asks no approval in a scenario
unless `[approvals] require` names it."""
KNOWN_TOOLS = WEB_TOOLS + SEARCH_TOOLS + FILE_TOOLS + WRITE_TOOLS + BROWSER_TOOLS
EVENT_TYPES = tuple(
    sorted(str(cls.type) for cls in typing.get_args(Event) if cls is not UnknownEvent)
)
"""The event types `[expect] events` may count."""
SUFFIXES = (".toml", ".json")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- generated documents and refusals (long runs) --------------------------------------------


class PlantedIn(Planted):
    """A fact planted in one document of a generated folder."""

    document: int = Field(default=1, ge=1)
    """Which document: 1 the first."""


class Documents(_Strict):
    """A generated folder of documents for the file tools (keel/evals/documents.py)."""

    path: str = Field(min_length=1)
    """Each document's path, relative; ``{n}`` is its number, 01, 02, ..."""
    count: int = Field(default=1, ge=1, le=1000)
    size_kb: int = Field(ge=1, le=10_000)
    seed: int = 0
    """Document n is written from seed ``seed * 1000 + n``: each one different, every run alike."""
    title: str = "Report {n}"
    facts: list[PlantedIn] = []

    @model_validator(mode="after")
    def _consistent(self) -> Documents:
        if self.count > 1 and "{n}" not in self.path:
            raise ValueError("path: several documents need {n} in their path")
        late = [f.document for f in self.facts if f.document > self.count]
        if late:
            raise ValueError(f"facts: document {late[0]} of {self.count}")
        return self

    def files(self) -> dict[str, str]:
        """Every document, by its relative path."""
        width = max(2, len(str(self.count)))
        made = {}
        for n in range(1, self.count + 1):
            number = str(n).zfill(width)
            facts = [(f.text, f.at) for f in self.facts if f.document == n]
            made[self.path.replace("{n}", number)] = document_text(
                self.size_kb * 1024,
                seed=self.seed * 1000 + n,
                title=self.title.replace("{n}", number),
                facts=facts,
            )
        return made


class Refusals(_Strict):
    """The scripted provider refuses turns as longer than the window, in each wire's words, at
    turns picked at random with `seed` (keel/evals/refusals.py)."""

    wordings: list[Wire] = Field(min_length=1)
    """One refusal for each: "openai", "anthropic" or "llama.cpp"."""
    seed: int = 0
    after: int = Field(default=0, ge=0)
    """The first turn that may be refused (0-based): a provider refuses a request longer than
    its window, so a scenario lets the context fill before its refusals come."""


# --- tools, limits, expectations ------------------------------------------------------------


class ToolsSpec(_Strict):
    names: list[str] | None = None
    """Tools the agent gets; default: fetch and observe_page, plus the file tools with files."""
    timeout: float = Field(default=20.0, gt=0)
    """Seconds one web or browser call may take."""
    max_download_bytes: int = Field(default=5_000_000, ge=1)
    browser_executable: str | None = None
    """Chromium for the browser tools; default: found on PATH."""
    search: str | None = Field(default=None, pattern=r"^(searxng|local):")
    """`web_search`'s backend: ``searxng:{base}/PATH`` (a `searxng` page of the scenario) or
    ``local:FOLDER`` (a folder of the scenario's `files`, indexed before the run)."""

    @model_validator(mode="after")
    def _known(self) -> ToolsSpec:
        unknown = sorted(set(self.names or ()) - set(KNOWN_TOOLS))
        if unknown:
            raise ValueError(
                f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(KNOWN_TOOLS)}"
            )
        if ("web_search" in (self.names or ())) != (self.search is not None):
            raise ValueError("web_search and search go together: name both or neither")
        return self


def _former_names(cls: type[BaseModel], data: Any) -> Any:
    """A limit's former name (ADR 0058) read as its current one, with a note."""
    if not isinstance(data, dict):
        return data
    from keel.run_options import note_renamed

    for old in RENAMED.keys() & data.keys():
        note_renamed(f"[limits] {old}", f"[limits] {RENAMED[old]}")
    return current_names(data)


def _limits_model() -> type[BaseModel]:
    """The [limits] table mirrors keel.Limits field by field, so the two cannot drift."""
    hints = typing.get_type_hints(Limits)
    fields: dict[str, Any] = {
        f.name: (hints[f.name], f.default) for f in dataclasses.fields(Limits)
    }
    former: Any = model_validator(mode="before")(classmethod(_former_names))  # type: ignore[arg-type]
    model: type[BaseModel] = pydantic.create_model(
        "LimitsSpec",
        __config__=ConfigDict(extra="forbid", frozen=True),
        __validators__={"_former_names": former},
        **fields,
    )
    return model


if TYPE_CHECKING:
    LimitsSpec = BaseModel
else:
    LimitsSpec = _limits_model()


class Bounds(_Strict):
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)

    def check(self, value: int) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def __str__(self) -> str:
        if self.min is not None and self.max is not None:
            return f"between {self.min} and {self.max}"
        if self.min is not None:
            return f"at least {self.min}"
        return f"at most {self.max}" if self.max is not None else "any number"


Count = Annotated[int, Field(ge=0)] | Bounds
"""A number (exactly that) or { min, max }."""

RunEnd = Literal["completed", "failed", "awaiting_approval", "cancelled"]


class ChildExpect(_Strict):
    """How every child run of one agent must end (sub-agents)."""

    status: RunEnd = "completed"
    synthesized: Literal["repeated_tool", "budget", "deadline", "context", False] | None = None
    count: Count | None = None
    """How many children of this agent the run must have had."""


class Expect(_Strict):
    status: RunEnd
    failure: FailureKind | None = None
    """With status "failed": the failure kind the run must end with."""
    synthesized: Literal["repeated_tool", "budget", "deadline", "context", False] | None = None
    """With status "completed": the synthesis reason, or false for a plain answer."""
    model_calls: Count | None = None
    tool_calls: Count | None = None
    evidence_resets: Count | None = None
    """`evidence_reset` events: observations that restarted their counter."""
    results_elided: Count | None = None
    """`result_elided` events: results the context builder replaced by pointers."""
    approvals_requested: Count | None = None
    """`approval_requested` events: calls a person was asked about."""
    events: dict[str, Count] = {}
    """Events of the run by type (`context_shrunk`, `result_clamped`, `model_error`, ...)."""
    largest_request: Count | None = None
    """Tokens of the largest request sent, as Keel counted them: `{ max = 4096 }` says that no
    request passed a 4k model's window."""
    resumes: Count | None = None
    """How often the run was resumed (in a fresh agent, as a new process would)."""
    page_hits: dict[str, Count] = {}
    """Requests the page server saw per path; 0 shows that nothing was dispatched there."""
    answer_contains: list[str] = []
    """Texts the answer must contain (case-insensitive)."""
    answer_excludes: list[str] = []
    nudges: Count | None = None
    """Requests that carried the nudge (`limits.nudge`, docs/adr/0050), counted with the
    scripted model: the note is never stored, so only its requests show it."""
    unused_turns: int = Field(default=0, ge=0)
    """Scripted turns the run must leave unused: what the model would have done next had the
    rule under test not stopped it (the twin that breaks the rule uses them)."""
    children: dict[str, ChildExpect] = {}
    """By agent name: how that agent's child runs must end."""
    cited: bool | None = None
    """True: the answer must cite results, every quote and id checking against the run's
    results (ADR 0053); false: it must not pass that check."""
    quotes_checked: Count | None = None
    """Quotes of the answer found in the results they cite."""
    quotes_failed: Count | None = None
    unknown_ids: Count | None = None
    partial: bool | None = None
    """Whether the result says `partial` (a structured synthesis, or `--citations require`'s
    answer that still failed)."""

    @model_validator(mode="after")
    def _consistent(self) -> Expect:
        unknown = sorted(set(self.events) - set(EVENT_TYPES))
        if unknown:
            raise ValueError(
                f"events: no event type {unknown[0]!r}; the types: {', '.join(EVENT_TYPES)}"
            )
        if self.failure is not None and self.status != "failed":
            raise ValueError('failure is only checked with status = "failed"')
        if self.synthesized is not None and self.status != "completed":
            raise ValueError('synthesized is only checked with status = "completed"')
        return self


class AgentSpec(_Strict):
    """A child agent the scenario's agent may delegate to (`Agent.as_tool`, ADR 0046)."""

    description: str = Field(min_length=1)
    script: dict[str, Any]
    """The child's scripted model; every child of this agent reads it from its start."""
    tools: list[str] = []
    """Which of the scenario's tools the child gets (by name); default: none."""
    limits: LimitsSpec = LimitsSpec()


class Decision(_Strict):
    """What the evaluator decides at one pause, for every call waiting there."""

    decision: Literal["approve", "deny"]
    reason: str | None = None
    by: str = "evaluator"


class ApprovalsSpec(_Strict):
    require: list[str] = []
    """Tools whose every call needs approval in this scenario."""
    decisions: list[Decision] = []
    """Applied in order, one per pause; after each, the run is resumed in a fresh agent (a new
    transport reading the script anew, the same store), as `keel resume` in a new process."""


class ScenarioSpec(_Strict):
    """One scenario file, as written."""

    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    """Default: the file name without its suffix."""
    description: str = ""
    question: str = Field(min_length=1)
    script: dict[str, Any] | None = None
    """A scripted model (`keel.ScriptedTransport` format); required unless --model is given."""
    tools: ToolsSpec = ToolsSpec()
    files: dict[str, str] = {}
    """Files (relative path: text) written to a temporary folder the file tools are rooted at."""
    fact: RepoFact | None = None
    """A repo question (the repo-questions suite): the file tools, and the web tools, as
    `keel run` gives them, read the repository under evaluation (`keel eval --repo`, default
    the current folder), and the answer must name this fact, read from the code when the
    evaluation runs, and invent nothing (`keel.evals.facts`)."""
    documents: list[Documents] = []
    """Generated folders of documents for the file tools, beside `files`."""
    pages: list[Page] = []
    limits: LimitsSpec = LimitsSpec()
    refusals: Refusals | None = None
    """The scripted provider refuses turns as over the window (`limits.context_window`)."""
    agents: dict[str, AgentSpec] = {}
    """Child agents, offered to the scenario's agent as tools named after them."""
    approvals: ApprovalsSpec = ApprovalsSpec()
    expect: Expect
    expect_live: Expect | None = None
    """Checked instead of `expect` with a real model (--model); without it, a live run passes
    when it ends with an answer, a classified failure or a pause."""
    timeout: float = Field(default=120.0, gt=0)
    """Seconds the evaluation waits for one run before calling it stuck."""

    @model_validator(mode="after")
    def _consistent(self) -> ScenarioSpec:
        paths = [p.path for p in self.pages]
        dupes = sorted({p for p in paths if paths.count(p) > 1})
        if dupes:
            raise ValueError(f"pages: path {dupes[0]} is served twice")
        for label, key in (("expect", self.expect), ("expect_live", self.expect_live)):
            stray = sorted(set(key.page_hits) - set(paths)) if key is not None else []
            if stray:
                raise ValueError(f"{label}.page_hits: {stray[0]} is not one of the pages served")
        if self.fact is not None and (self.files or self.documents):
            raise ValueError("files: a repo question (fact) reads the repository, not files")
        for rel in self.files:
            if not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise ValueError(f"files: {rel!r} must be a relative path inside the folder")
        for made in self.documents:
            rel = made.path.replace("{n}", "1")
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise ValueError(f"documents: {made.path!r} must be a relative path in the folder")
        if self.refusals is not None:
            if getattr(self.limits, "context_window", None) is None:
                raise ValueError("refusals: name the window they refuse at (limits.context_window)")
            turns = len((self.script or {}).get("turns", []))
            wanted = len(self.refusals.wordings)
            if self.script is not None and wanted > turns - self.refusals.after:
                raise ValueError(
                    f"refusals: {wanted} refusal(s) need as many turns from turn "
                    f"{self.refusals.after} on; the script has {turns}"
                )
        return self

    def all_files(self) -> dict[str, str]:
        """`files` and every generated document, by relative path."""
        made: dict[str, str] = {}
        for documents in self.documents:
            made.update(documents.files())
        return {**made, **self.files}


@dataclass(frozen=True, slots=True)
class Scenario:
    """A loaded, validated scenario."""

    name: str
    source: str
    """The file it came from."""
    spec: ScenarioSpec
    limits: Limits
