"""The pages of a scenario (`[[pages]]`): what the loopback page server serves at each path,
one model per kind, told apart by `kind` (``static`` when it is left out). `keel.evals.pageserver`
serves them; `keel.evals.scenario` reads them as part of a scenario file.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

__all__ = [
    "ChangingPage",
    "DocumentPage",
    "ErrorPage",
    "LargePage",
    "Page",
    "Planted",
    "ProgressPage",
    "RedirectPage",
    "ScriptPage",
    "SearchResult",
    "SearxngPage",
    "SettlingPage",
    "SlowPage",
    "StaticPage",
    "Strict",
]


class Strict(BaseModel):
    """A scenario's tables: unknown fields refused (a typo fails before anything runs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _PageBase(Strict):
    path: str = Field(pattern=r"^/")


class StaticPage(_PageBase):
    kind: Literal["static"] = "static"
    body: str
    content_type: str = "text/html; charset=utf-8"
    status: int = Field(default=200, ge=200, le=599)


class ChangingPage(_PageBase):
    """Differs on every request."""

    kind: Literal["changing"]
    template: str = "<p>version {n}</p>"


class ProgressPage(_PageBase):
    kind: Literal["progress"]
    steps: int = Field(default=4, ge=1)
    done: str = "finished"


class SettlingPage(_PageBase):
    kind: Literal["settling"]
    settle_after: int = Field(ge=1)
    template: str = "<p>status: pending, check {n}</p>"


class LargePage(_PageBase):
    kind: Literal["large"]
    size_kb: int = Field(ge=1, le=50_000)
    topic: str
    title: str = "Design document"


class Planted(Strict):
    """A fact planted in a generated document: a paragraph of its own (keel/evals/documents.py)."""

    text: str = Field(min_length=1)
    at: float = Field(default=0.0, ge=0.0, le=1.0)
    """Where: 0 the first paragraph, 1 the last, between them by share."""


class DocumentPage(_PageBase):
    """A generated document (seeded prose in numbered sections) with facts planted in it."""

    kind: Literal["document"]
    size_kb: int = Field(ge=1, le=50_000)
    seed: int = 0
    title: str = "Report"
    facts: list[Planted] = []


class SlowPage(_PageBase):
    kind: Literal["slow"]
    seconds: float = Field(gt=0, le=600)
    body: str = "slow"


class ErrorPage(_PageBase):
    kind: Literal["error"]
    status: int = Field(default=500, ge=400, le=599)
    body: str = "internal server error"


class ScriptPage(_PageBase):
    """Visible text written only by JavaScript (for the browser tools)."""

    kind: Literal["script"]
    interval_ms: int = Field(default=100, ge=0)
    ticks: int | None = Field(default=None, ge=1)
    text: str = "ticks:"
    title: str = "Live status"


class SearchResult(Strict):
    url: str
    """May use ``{base}``."""
    title: str
    content: str = ""


class SearxngPage(_PageBase):
    """A SearXNG instance's ``/search``: its JSON answer over `results`, those whose title or
    content holds a word of the query (`web_search` with ``search = "searxng:{base}"``)."""

    kind: Literal["searxng"]
    results: list[SearchResult]


class RedirectPage(_PageBase):
    kind: Literal["redirect"]
    location: str
    """May use ``{base}``."""
    status: int = Field(default=302, ge=300, le=399)


def _page_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        kind = value.get("kind", "static")
        return f"~{kind}" if isinstance(kind, str) else None
    return f"~{getattr(value, 'kind', '')}" if isinstance(value, _PageBase) else None


_PAGE_KINDS = (
    StaticPage,
    ChangingPage,
    ProgressPage,
    SettlingPage,
    LargePage,
    DocumentPage,
    SlowPage,
    ErrorPage,
    ScriptPage,
    RedirectPage,
    SearxngPage,
)
_KIND_NAMES = ", ".join(typing.get_args(m.model_fields["kind"].annotation)[0] for m in _PAGE_KINDS)

Page = Annotated[
    Annotated[StaticPage, Tag("~static")]
    | Annotated[ChangingPage, Tag("~changing")]
    | Annotated[ProgressPage, Tag("~progress")]
    | Annotated[SettlingPage, Tag("~settling")]
    | Annotated[LargePage, Tag("~large")]
    | Annotated[DocumentPage, Tag("~document")]
    | Annotated[SlowPage, Tag("~slow")]
    | Annotated[ErrorPage, Tag("~error")]
    | Annotated[ScriptPage, Tag("~script")]
    | Annotated[RedirectPage, Tag("~redirect")]
    | Annotated[SearxngPage, Tag("~searxng")],
    Discriminator(
        _page_kind,
        custom_error_type="page_kind",
        custom_error_message=f"a page's kind is one of {_KIND_NAMES}",
    ),
]
