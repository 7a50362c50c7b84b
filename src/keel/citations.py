"""Citations (ADR 0053, named so by ADR 0058): what an answer cites, checked against the record.

Pure: text and the run's results in, a `CitationCheck` out; no I/O, no clock, nothing stored
here. (The breaker's "evidence resets", ADR 0003, are another thing: keel._run.breaker.)

Every tool result of a run (or of its conversation) has a citable id, `r1`, `r2`, ... in the
order the results entered the history (keel._run.context). An answer cites ids in brackets
(`[r2]`, `[r2, r3]`) and quotes a result as text in double quotation marks followed by the id
(`"the lease is renewed every ttl/3" [r2]`). The check:

- **ids**: every cited id must name a result of the run; the others are `unknown_ids`.
- **quotes**: a quote checks when its text, white space normalised (every run of white space
  one space, none at the ends), is in the normalised stored text of a result it cites; an
  elided result is checked against its stored text, never its pointer. A quote citing only
  unknown ids fails. Quotation marks without an id after them are not a quote to check.
- **sentences**: a sentence of at least `FACTUAL_WORDS` words that is not a question is
  factual; it is cited when it carries an id. Code blocks and headings are not sentences.
- **sources**: file paths and URLs the answer names are matched to the results whose call
  named them (a path by whole trailing components) or whose text holds them; those no result
  read or listed are `unread_sources`.

A structured answer is checked the same way: each object with a `result_id` is a citation
(`{"claim", "result_id", "quote"}`), its quote checked against that result, and every other
string in the answer is read as text.

The answer is the model's, so the check is linear in it (ADR 0062): quotes are found by a scan
that reads each character a bounded number of times (a backtracking regex took minutes over
200,000 unclosed quotation marks, on the event loop), ids are kept in dicts, the same quote is
looked up once, the lookups of quotes in results stop at `SCAN_BUDGET` characters (the quotes
left are failed as `not_checked`), and at most `MAX_SOURCES` paths and URLs are matched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FACTUAL_WORDS",
    "MAX_SOURCES",
    "SCAN_BUDGET",
    "CitationCheck",
    "FailedQuote",
    "Quote",
    "Source",
    "check_answer",
    "check_output",
    "normalise",
    "summary_line",
]

FACTUAL_WORDS = 4
"""Words a sentence needs to be judged a factual claim (shorter ones are labels, list heads)."""

SCAN_BUDGET = 64 << 20
"""Characters of results (and quotes) one answer's quote lookups may read in all: a real answer
needs a small part of it; one of 100,000 quotes against a large result would read for minutes.
The quotes past it fail as `not_checked`."""
MAX_SOURCES = 200
"""Paths and URLs of one answer matched to results; the ones named after them are not listed."""

_ID = r"r\d+"
_IDS = re.compile(rf"\[\s*({_ID}(?:\s*[,;]\s*{_ID})*)\s*\]")
_IDS_AFTER = re.compile(rf"\s*\[\s*({_ID}(?:\s*[,;]\s*{_ID})*)\s*\]")
"""Ids right after a quote's closing mark, matched anchored there: linear in what it reads."""
_CLOSES = {'"': '"', "\u201c": "\u201d"}
_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_URL = re.compile(r"https?://[^\s<>\"'`\]\)]+")
_PATH = re.compile(
    r"(?<![\w/.:-])(?:[\w.-]+/)+[\w.-]*\w|(?<![\w/.:-])[\w-]+(?:\.[\w-]+)*\.[A-Za-z]\w{0,7}\b"
)
_FILE_SUFFIXES = frozenset(
    [
        "py",
        "pyi",
        "md",
        "rst",
        "txt",
        "toml",
        "json",
        "yaml",
        "yml",
        "cfg",
        "ini",
        "lock",
        "js",
        "ts",
        "tsx",
        "jsx",
        "html",
        "css",
        "rs",
        "go",
        "c",
        "h",
        "cc",
        "cpp",
        "hpp",
        "java",
        "kt",
        "rb",
        "sh",
        "sql",
        "csv",
        "xml",
        "proto",
    ]
)
_WORD = re.compile(r"[^\W\d_]{2,}")


def normalise(text: str) -> str:
    """White space normalised: every run of it one space, none at either end."""
    return " ".join(text.split())


@dataclass(frozen=True, slots=True)
class Source:
    """One citable result: its id and what the record holds of it."""

    ref: str
    name: str
    call_key: str
    text: str
    """The stored text (what the model was shown before any elision), never a pointer."""
    elided: bool = False
    call_id: str = ""
    """The call it answered (an earlier run's as `<run id>/<call id>`): where a quote links."""


@dataclass(frozen=True, slots=True)
class Quote:
    text: str
    refs: tuple[str, ...]
    found_in: str | None
    """The id of the result the quote was found in; None: it is in none it cites."""
    checked: bool = True
    """False: the answer's lookups had used up SCAN_BUDGET before this one (not looked up)."""

    @property
    def ok(self) -> bool:
        return self.found_in is not None


@dataclass(frozen=True, slots=True)
class FailedQuote:
    quote: str
    refs: tuple[str, ...]
    reason: str
    """"not_in_result", "unknown_id" or "not_checked" (past SCAN_BUDGET)."""

    def to_dict(self) -> dict[str, Any]:
        return {"quote": self.quote, "ids": list(self.refs), "reason": self.reason}


@dataclass(frozen=True, slots=True)
class CitationCheck:
    """The outcome of checking one answer."""

    cited: tuple[str, ...] = ()
    """Known ids the answer cites, in the order it first cites them."""
    unknown_ids: tuple[str, ...] = ()
    quotes: tuple[Quote, ...] = ()
    sentences: int = 0
    """Factual sentences (and structured claims) in the answer."""
    uncited_sentences: int = 0
    sources: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Each path or URL the answer names, with the ids of the results that read or list it."""
    calls: Mapping[str, str] = field(default_factory=dict)
    """The call id of each cited result, by its id."""

    @property
    def quotes_checked(self) -> int:
        """Quotes found in a result they cite."""
        return sum(1 for q in self.quotes if q.ok)

    @property
    def quotes_failed(self) -> tuple[FailedQuote, ...]:
        known = set(self.cited)
        return tuple(
            FailedQuote(q.text, q.refs, _reason(q, known)) for q in self.quotes if not q.ok
        )

    @property
    def unread_sources(self) -> tuple[str, ...]:
        return tuple(name for name, refs in self.sources.items() if not refs)

    @property
    def passed(self) -> bool:
        """No failed quote and no unknown id: what `require` insists on."""
        return not self.unknown_ids and all(q.ok for q in self.quotes)

    def failures(self) -> list[str]:
        """What failed, one line each: the gaps of an answer kept although it failed."""
        lines = [f"cited id {ref} names no result of this run" for ref in self.unknown_ids]
        for failed in self.quotes_failed:
            ids = ", ".join(failed.refs)
            where = {
                "not_in_result": "is in no result it cites",
                "not_checked": "was not checked: the answer quotes too much to check it all",
            }.get(failed.reason, "cites no result of this run")
            lines.append(f'the quote "{_short(failed.quote)}" [{ids}] {where}')
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The `evidence` object of `keel run --json`, `keel show --json` and `run_completed`."""
        return {
            "cited": list(self.cited),
            "quotes_checked": self.quotes_checked,
            "quotes_failed": [f.to_dict() for f in self.quotes_failed],
            "uncited_sentences": self.uncited_sentences,
            "unknown_ids": list(self.unknown_ids),
            "sentences": self.sentences,
            "quotes": [
                {"quote": q.text, "ids": list(q.refs), "found_in": q.found_in} for q in self.quotes
            ],
            "sources": {name: list(refs) for name, refs in self.sources.items()},
            "unread_sources": list(self.unread_sources),
            "results": dict(self.calls),
            "passed": self.passed,
        }


def check_answer(text: str | None, sources: Sequence[Source]) -> CitationCheck:
    """Check a free-text answer against the run's results."""
    return _Checker(sources).text(text or "").done()


def check_output(output: Any, sources: Sequence[Source], gaps: Iterable[str] = ()) -> CitationCheck:
    """Check a structured answer (JSON): citation objects and every other string in it."""
    checker = _Checker(sources)
    checker.json(output)
    for gap in gaps:
        checker.ids(gap)  # a gap is not a claim: only its ids are checked
    return checker.done()


def _reason(quote: Quote, known: set[str]) -> str:
    if not quote.checked:
        return "not_checked"
    return "not_in_result" if any(r in known for r in quote.refs) else "unknown_id"


class _Checker:
    def __init__(self, sources: Sequence[Source]) -> None:
        self.by_ref = {s.ref: s for s in sources}
        self._normalised: dict[str, str] = {}
        self._arguments: dict[str, list[str] | str] = {}
        self.cited: dict[str, None] = {}  # dicts: ordered, and `in` is not a scan
        self.unknown: dict[str, None] = {}
        self.quotes: list[Quote] = []
        self._looked_up: dict[tuple[str, tuple[str, ...]], str | None] = {}
        self._budget = SCAN_BUDGET
        self.sentences = 0
        self.uncited = 0
        self.named: dict[str, None] = {}

    def done(self) -> CitationCheck:
        sources = {name: self._readers(name) for name in self.named}
        calls = {ref: self.by_ref[ref].call_id for ref in self.cited}
        return CitationCheck(
            tuple(self.cited),
            tuple(self.unknown),
            tuple(self.quotes),
            self.sentences,
            self.uncited,
            sources,
            calls,
        )

    # -- free text --------------------------------------------------------------------------

    def text(self, text: str) -> _Checker:
        self.ids(text)
        for quoted, ids in _quotes(text):
            self.quote(quoted, _split_ids(ids))
        self._sentences(text)
        self._names(text)
        return self

    def ids(self, text: str) -> list[str]:
        found: list[str] = []
        for match in _IDS.finditer(text):
            for ref in _split_ids(match.group(1)):
                self.cite(ref)
                found.append(ref)
        return found

    def cite(self, ref: str) -> bool:
        known = ref in self.by_ref
        (self.cited if known else self.unknown).setdefault(ref, None)
        return known

    def quote(self, quoted: str, refs: tuple[str, ...]) -> None:
        wanted = normalise(quoted)
        if not wanted:
            return  # quotation marks around nothing but white space quote nothing
        key = (wanted, refs)
        if key not in self._looked_up:
            if self._budget <= 0:
                self.quotes.append(Quote(wanted, refs, None, checked=False))
                return
            self._looked_up[key] = self._find(wanted, refs)
        self.quotes.append(Quote(wanted, refs, self._looked_up[key]))

    def _find(self, wanted: str, refs: tuple[str, ...]) -> str | None:
        for ref in refs:
            if ref in self.by_ref:
                text = self._text(ref)
                self._budget -= len(text) + len(wanted)
                if wanted in text:
                    return ref
        return None

    def _text(self, ref: str) -> str:
        text = self._normalised.get(ref)
        if text is None:
            text = self._normalised[ref] = normalise(self.by_ref[ref].text)
        return text

    def _sentences(self, text: str) -> None:
        for sentence in _split_sentences(text):
            if _factual(sentence):
                self.sentences += 1
                if not _IDS.search(sentence):
                    self.uncited += 1

    def _names(self, text: str) -> None:
        prose = _FENCE.sub(" ", text)
        for url in _URL.findall(prose):
            self._name(url.rstrip(".,;:!?'\""))
        for path in _PATH.findall(_URL.sub(" ", prose)):
            path = path.rstrip(".")
            if _is_path(path):
                self._name(path)

    def _name(self, name: str) -> None:
        if len(self.named) < MAX_SOURCES:
            self.named.setdefault(name, None)

    # -- structured answers -----------------------------------------------------------------

    def json(self, value: Any) -> None:
        if isinstance(value, str):
            self.text(value)
        elif isinstance(value, list):
            for item in value:
                self.json(item)
        elif isinstance(value, dict):
            if "result_id" in value:
                self._citation(value)
            else:
                for item in value.values():
                    self.json(item)

    def _citation(self, value: dict[str, Any]) -> None:
        """`{"claim", "result_id", "quote"}`: a claim, cited by its result, maybe quoted."""
        raw = value.get("result_id")
        refs = _split_ids(str(raw).strip().strip("[]")) if raw not in (None, "") else ()
        refs = tuple(r for r in refs if re.fullmatch(_ID, r))
        for ref in refs:
            self.cite(ref)
        self.sentences += 1
        if not refs:
            self.uncited += 1
        quote = value.get("quote")
        if isinstance(quote, str) and quote.strip():
            self.quote(quote, refs)
        for key, item in value.items():
            if key not in ("result_id", "quote"):
                if isinstance(item, str):
                    self.ids(item)
                    self._names(item)
                else:
                    self.json(item)

    # -- sources ----------------------------------------------------------------------------

    def _readers(self, name: str) -> tuple[str, ...]:
        """The results whose call named `name`, else those whose text holds it."""
        called = tuple(r for r in self.by_ref if _names_in_call(name, self._called_with(r)))
        if called:
            return called
        return tuple(r for r, s in self.by_ref.items() if name in s.text)

    def _called_with(self, ref: str) -> list[str] | str:
        """The strings of the result's call arguments (the raw text when it is not JSON),
        read once per result however many names are matched against it."""
        found = self._arguments.get(ref)
        if found is None:
            _, _, raw = self.by_ref[ref].call_key.partition(" ")
            try:
                found = list(_strings(json.loads(raw)))
            except (ValueError, RecursionError):
                found = raw
            self._arguments[ref] = found
        return found


def summary_line(evidence: Mapping[str, Any]) -> str:
    """One line for `keel show` and the timeline, from the stored `evidence` object."""
    failed = evidence.get("quotes_failed") or []
    unknown = evidence.get("unknown_ids") or []
    cited = evidence.get("cited") or []
    parts = [
        f"{len(cited)} result(s) cited",
        f"{evidence.get('quotes_checked', 0)} quote(s) checked",
        f"{len(failed)} failed",
        f"{evidence.get('uncited_sentences', 0)} of {evidence.get('sentences', 0)} "
        "sentence(s) uncited",
    ]
    if unknown:
        parts.append("unknown ids " + ", ".join(str(u) for u in unknown))
    unread = evidence.get("unread_sources") or []
    if unread:
        parts.append("named but not read: " + ", ".join(str(u) for u in unread[:5]))
    return " · ".join(parts)


def _split_ids(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in re.split(r"[,;]", text) if part.strip())


def _split_sentences(text: str) -> list[str]:
    prose = _FENCE.sub("\n", text)
    out: list[str] = []
    for line in prose.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "|")):
            continue  # a heading or a table row is not a sentence
        line = re.sub(r"^(?:[-*+]|\d+[.)])\s+", "", line)
        out.extend(s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"\u201c(`\[])", line) if s)
    return out


def _factual(sentence: str) -> bool:
    stripped = sentence.strip()
    if stripped.endswith("?") or stripped.endswith(":"):
        return False
    return len(_WORD.findall(_IDS.sub(" ", stripped))) >= FACTUAL_WORDS


def _is_path(candidate: str) -> bool:
    """A file name with a known suffix (`loop.py`, `src/keel/loop.py`), or three or more
    components of words (`src/keel/_run`); not `ttl/3` or `and/or`."""
    parts = [p for p in candidate.split("/") if p]
    if not parts:
        return False
    stem, dot, suffix = parts[-1].rpartition(".")
    if dot and suffix.lower() in _FILE_SUFFIXES and re.search(r"[A-Za-z]", stem):
        return True
    return len(parts) >= 3 and all(re.search(r"[A-Za-z]", p) for p in parts)


def _quotes(text: str) -> Iterator[tuple[str, str]]:
    """(quoted text, ids) of each quote: what the regex
    ``(?:"([^"]+)"|“([^”]+)”)\\s*\\[ids\\]`` finds, in one pass. Each next
    opening or closing mark is looked for only past the last one found, and the ids after a
    closing mark are read once, so no character is read more than a few times."""
    ahead: dict[str, int] = {}  # the next position of each mark at or past `at`; -1: none

    def after(mark: str, at: int) -> int:
        known = ahead.get(mark)
        if known is None or (0 <= known < at):
            known = ahead[mark] = text.find(mark, at)
        return known

    ids_at: tuple[int, re.Match[str] | None] = (-1, None)
    at = 0
    while True:
        opens = [p for p in (after(m, at) for m in _CLOSES) if p >= 0]
        if not opens:
            return
        start = min(opens)
        close = after(_CLOSES[text[start]], start + 1)
        if close < 0 or close == start + 1:  # no closing mark, or nothing between
            at = start + 1
            continue
        if ids_at[0] != close:
            ids_at = (close, _IDS_AFTER.match(text, close + 1))
        ids = ids_at[1]
        if ids is None:
            at = start + 1
            continue
        yield text[start + 1 : close], ids.group(1)
        at = ids.end()


def _names_in_call(name: str, arguments: list[str] | str) -> bool:
    if isinstance(arguments, str):
        return name in arguments
    for value in arguments:
        if value == name or value.rstrip("/") == name.rstrip("/"):
            return True
        if "://" in name:
            continue
        a, n = value.strip("./").split("/"), name.strip("./").split("/")
        if a and n and (a[-len(n) :] == n or n[-len(a) :] == a) and a[-1] == n[-1]:
            return True  # the same file, named from a different directory
    return False


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
