"""Provider-hosted tools (ADR 0067): tools a provider runs on its own servers inside one model
call, declared by the user, never run, approved or re-run by Keel.

A `HostedTool` is what the user declares (``keel run --hosted-tool web_search``,
``hosted_tools = [...]`` in keel.toml, ``Agent(hosted_tools=...)``); the transport of a provider
that offers the kind sends it with the request. What the provider did comes back inside the
response, and the transport keeps it, exactly as received, in the turn's ``provider_details``
(the provider needs those blocks again on the next turn). `hosted_calls` and `citations` read
them from there, in neutral form, for the run's events, its spend and its answer: so a
resumed run, a fork and a replay of a recording see the same calls as the run that made them.

Everything read here came from the provider and, through it, from pages anyone may have
written: each string is cut to a bound, and the calls are records, never instructions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from keel.errors import ConfigError

__all__ = [
    "ANTHROPIC_CONTENT",
    "HOSTED_KINDS",
    "OPENAI_OUTPUT",
    "Citation",
    "HostedCall",
    "HostedTool",
    "citations",
    "hosted_calls",
    "hosted_tools_from",
]

HOSTED_KINDS: dict[str, tuple[str, ...]] = {
    "openai": ("web_search", "file_search"),
    "anthropic": ("web_search", "web_fetch"),
}
"""The hosted tools each provider's transport passes through (spec scheme's provider)."""
ANTHROPIC_CONTENT = "anthropic_content"
"""The `provider_details` key of an Anthropic turn that used server tools: its content blocks
as received, but for ``tool_use`` blocks, which stand as ``{"type": "tool_use", "id": ...}``
markers (Keel's own calls are authoritative)."""
OPENAI_OUTPUT = "openai_responses"
"""The Responses transport's `provider_details` key (its output layout)."""

_MAX_TEXT = 2_000
_MAX_SOURCES = 50
_MAX_CALLS = 200
_OPTION = re.compile(r"^(max_uses|domains|stores)=(.+)$")


@dataclass(frozen=True, slots=True)
class HostedTool:
    """One provider-hosted tool the user declared, with the options Keel carries."""

    kind: str
    """``web_search``, ``web_fetch`` (Anthropic) or ``file_search`` (OpenAI)."""
    max_uses: int | None = None
    """Anthropic's per-request cap on the tool's uses; OpenAI takes none per tool."""
    domains: tuple[str, ...] = ()
    """Only these domains (``allowed_domains``); empty: any."""
    stores: tuple[str, ...] = ()
    """``file_search``'s vector store ids (required for it)."""

    def __post_init__(self) -> None:
        known = sorted({k for kinds in HOSTED_KINDS.values() for k in kinds})
        if self.kind not in known:
            raise ConfigError(f"hosted tool {self.kind!r}: one of {', '.join(known)}")
        if self.max_uses is not None and self.max_uses < 1:
            raise ConfigError(f"hosted tool {self.kind}: max_uses must be at least 1")
        if self.kind == "file_search" and not self.stores:
            raise ConfigError("hosted tool file_search needs its vector stores: "
                              "file_search:stores=vs_1+vs_2")  # fmt: skip
        if self.stores and self.kind != "file_search":
            raise ConfigError(f"hosted tool {self.kind}: stores= is file_search's")

    @classmethod
    def parse(cls, text: str) -> HostedTool:
        """``KIND`` or ``KIND:OPTION:OPTION`` where an option is ``max_uses=N``,
        ``domains=a.org+b.com`` or ``stores=vs_1+vs_2`` (no commas: a list of tools in an
        environment variable is comma-separated)."""
        kind, _, rest = text.strip().partition(":")
        fields: dict[str, Any] = {}
        for option in filter(None, (o.strip() for o in rest.split(":"))):
            found = _OPTION.match(option)
            if found is None:
                raise ConfigError(
                    f"hosted tool {text!r}: {option!r} is not max_uses=N, domains=A+B "
                    "or stores=ID+ID"
                )
            name, value = found.groups()
            if name == "max_uses":
                if not value.isdigit():
                    raise ConfigError(f"hosted tool {text!r}: max_uses is a whole number")
                fields[name] = int(value)
            else:
                fields[name] = tuple(v for v in value.split("+") if v)
        return cls(kind.strip(), **fields)

    @property
    def spec(self) -> str:
        """The text `parse` reads back (what a run saves)."""
        options = []
        if self.max_uses is not None:
            options.append(f"max_uses={self.max_uses}")
        if self.domains:
            options.append("domains=" + "+".join(self.domains))
        if self.stores:
            options.append("stores=" + "+".join(self.stores))
        return ":".join((self.kind, *options))


def hosted_tools_from(values: Iterable[HostedTool | str]) -> tuple[HostedTool, ...]:
    """Declared tools from specs or objects; one kind at most once."""
    tools = tuple(v if isinstance(v, HostedTool) else HostedTool.parse(v) for v in values)
    kinds = [t.kind for t in tools]
    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    if twice:
        raise ConfigError(f"hosted tool {', '.join(twice)} is declared twice")
    return tools


def check_kinds(tools: Iterable[HostedTool], provider: str) -> tuple[HostedTool, ...]:
    """`tools`, when `provider` hosts every kind of them; else a ConfigError naming who does."""
    tools = tuple(tools)
    offered = HOSTED_KINDS.get(provider, ())
    for tool in tools:
        if tool.kind not in offered:
            hosts = [p for p, kinds in HOSTED_KINDS.items() if tool.kind in kinds]
            raise ConfigError(
                f"hosted tool {tool.kind}: {provider} does not host it "
                f"(hosted by: {', '.join(f'{p}:' for p in hosts)} models)"
            )
    return tools


@dataclass(frozen=True, slots=True)
class HostedCall:
    """One call a provider ran on its servers in a model turn, as its answer reported it."""

    id: str
    name: str
    """The hosted tool: ``web_search``, ``web_fetch``, ``file_search``."""
    input: str
    """The query (or queries, one per line), or the URL fetched."""
    sources: tuple[str, ...] = ()
    """The URLs (or file names) it found or read, in the provider's order."""
    error: str | None = None
    """The provider's error code when the call failed (a failed search is not billed)."""

    @property
    def billed(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class Citation:
    """A source the answer's text cites, as the provider marked it."""

    url: str
    title: str = ""
    cited_text: str = ""


def hosted_calls(details: Mapping[str, Any]) -> tuple[HostedCall, ...]:
    """The hosted calls of a turn, read from its `provider_details` (empty for a turn that
    made none, or a provider without hosted tools)."""
    content = details.get(ANTHROPIC_CONTENT)
    if isinstance(content, list):
        return _anthropic_calls(content)
    layout = details.get(OPENAI_OUTPUT)
    output = layout.get("output") if isinstance(layout, Mapping) else None
    if isinstance(output, list):
        return tuple(_openai_calls(output))
    return ()


def citations(details: Mapping[str, Any]) -> tuple[Citation, ...]:
    """The URLs a turn's text cites, each once, in order of first citation."""
    found: dict[str, Citation] = {}
    for entry in _citation_entries(details):
        url = _text(entry.get("url"))
        if url and url not in found and len(found) < _MAX_SOURCES:
            found[url] = Citation(url, _text(entry.get("title")), _text(entry.get("cited_text")))
    return tuple(found.values())


def _citation_entries(details: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    content = details.get(ANTHROPIC_CONTENT)
    layout = details.get(OPENAI_OUTPUT)
    output = layout.get("output") if isinstance(layout, Mapping) else None
    blocks = content if isinstance(content, list) else output if isinstance(output, list) else []
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        key = "citations" if block.get("type") == "text" else "annotations"
        for entry in block.get(key) or ():
            if isinstance(entry, Mapping) and entry.get("type") in _CITATION_TYPES:
                yield entry


_CITATION_TYPES = frozenset({"web_search_result_location", "char_location", "url_citation"})


def _anthropic_calls(content: list[Any]) -> tuple[HostedCall, ...]:
    uses: dict[str, Mapping[str, Any]] = {}
    calls: list[HostedCall] = []
    for block in content:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "server_tool_use" and isinstance(block.get("id"), str):
            uses[block["id"]] = block
        elif kind in ("web_search_tool_result", "web_fetch_tool_result"):
            use = uses.pop(_text(block.get("tool_use_id")), None)
            if use is not None and len(calls) < _MAX_CALLS:
                calls.append(_anthropic_call(use, block.get("content")))
    return tuple(calls)


def _anthropic_call(use: Mapping[str, Any], result: Any) -> HostedCall:
    given = _mapping(use.get("input"))
    asked = _text(given.get("query") or given.get("url"))
    sources: list[str] = []
    error = None
    if isinstance(result, list):  # web search: the results
        sources = [_text(r.get("url")) for r in result if isinstance(r, Mapping)]
    elif isinstance(result, Mapping) and str(result.get("type", "")).endswith("_error"):
        error = _text(result.get("error_code")) or "error"
    elif isinstance(result, Mapping):  # web fetch: the page read
        sources = [_text(result.get("url"))]
    return HostedCall(_text(use.get("id")), _text(use.get("name")), asked, _bounded(sources), error)


def _openai_calls(output: list[Any]) -> Iterable[HostedCall]:
    for item in output[:_MAX_CALLS]:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        failed = _text(item.get("status")) if item.get("status") in ("failed",) else None
        if kind == "web_search_call":
            action = _mapping(item.get("action"))
            queries = action.get("queries") or [action.get("query") or action.get("url") or ""]
            sources = [_text(s.get("url")) for s in action.get("sources") or ()
                       if isinstance(s, Mapping)]  # fmt: skip
            asked = "\n".join(_text(q) for q in queries if q)
            yield HostedCall(_text(item.get("id")), "web_search", asked, _bounded(sources), failed)
        elif kind == "file_search_call":
            asked = "\n".join(_text(q) for q in item.get("queries") or ())
            files = [_text(r.get("filename") or r.get("file_id")) for r in item.get("results") or ()
                     if isinstance(r, Mapping)]  # fmt: skip
            yield HostedCall(_text(item.get("id")), "file_search", asked, _bounded(files), failed)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _bounded(values: list[str]) -> tuple[str, ...]:
    return tuple(v for v in values if v)[:_MAX_SOURCES]


def _text(value: Any) -> str:
    return value[:_MAX_TEXT] if isinstance(value, str) else ""
