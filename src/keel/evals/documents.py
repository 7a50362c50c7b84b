"""Generated documents with facts planted in them: what long runs read (issue 44).

A long-run scenario reads many documents whose text together is several times the model's
window, and is asked at its end for a fact it read near its start. The documents are prose
made from a seeded choice of words (so each one is different, yet the same on every run), in
numbered sections of paragraphs; a planted fact is a paragraph of its own, at a given share of
the way through. Nothing in the filler names a fact: its sentences are built from the lists
below, none of which mentions a code word, a date or a figure of money.

    text = document_text(12_000, seed=3, title="Report 01",
                         facts=[("The code word for the audit is HALIBUT.", 0.0)])

`document_text` is plain text (a paragraph a line, `##` headings: what the file tools read),
`document_html` the same document as a page (what `fetch` turns back into text). Pure: no I/O.
"""

from __future__ import annotations

import html
import random
from collections.abc import Sequence

__all__ = ["document_blocks", "document_html", "document_text"]

_SUBJECTS = (
    "The survey team",
    "The steering group",
    "Field staff",
    "The review panel",
    "The site office",
    "The planning desk",
    "Each working party",
    "The records clerk",
    "The maintenance crew",
    "The regional board",
)
_VERBS = (
    "reviewed",
    "noted",
    "compared",
    "set aside",
    "walked through",
    "summarised",
    "checked again",
    "described",
    "questioned",
    "kept on file",
)
_OBJECTS = (
    "the drainage plan for the east wing",
    "the schedule of the spring inspections",
    "the minutes of the previous meeting",
    "the survey of the old storage sheds",
    "the layout of the visitor car park",
    "the list of repairs to the north fence",
    "the notes on the lighting of the main hall",
    "the draft of the cleaning rota",
    "the readings taken along the river path",
    "the plan for the delivery entrance",
)
_TAILS = (
    "without changing its conclusions",
    "and asked for a clearer copy",
    "before the next round of visits",
    "as the previous report had suggested",
    "in the order the sections were written",
    "with the help of the local office",
    "and found nothing new to add",
    "at the request of the board",
    "while the weather allowed it",
    "so that the sections agree with one another",
)


def _sentence(rng: random.Random) -> str:
    return (
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}."
    )


def _paragraph(rng: random.Random, number: int) -> str:
    sentences = [_sentence(rng) for _ in range(rng.randint(3, 6))]
    return f"Paragraph {number}. " + " ".join(sentences)


def document_blocks(
    size: int, seed: int, facts: Sequence[tuple[str, float]] = ()
) -> list[tuple[str, str]]:
    """The document's blocks in order, each ("heading" | "paragraph" | "fact", text), about
    `size` characters of text in all. Each fact (its text, and where: 0 the first paragraph,
    1 the last, between them by share) is a block of its own; facts at one place keep their
    order."""
    rng = random.Random(seed)
    paragraphs: list[str] = []
    total = 0
    while total < size or not paragraphs:
        paragraphs.append(_paragraph(rng, len(paragraphs) + 1))
        total += len(paragraphs[-1]) + 2
    before: dict[int, list[str]] = {}
    for text, at in facts:
        index = round(min(max(at, 0.0), 1.0) * (len(paragraphs) - 1))
        before.setdefault(index, []).append(text)
    blocks: list[tuple[str, str]] = []
    for index, paragraph in enumerate(paragraphs):
        if index % 5 == 0:
            blocks.append(("heading", f"Section {index // 5 + 1}"))
        blocks.extend(("fact", text) for text in before.get(index, ()))
        blocks.append(("paragraph", paragraph))
    return blocks


def document_text(
    size: int, *, seed: int, title: str, facts: Sequence[tuple[str, float]] = ()
) -> str:
    """The document as plain text: its title, `##` section headings, a paragraph a line."""
    lines = [f"# {title}", ""]
    for kind, text in document_blocks(size, seed, facts):
        lines += [f"## {text}" if kind == "heading" else text, ""]
    return "\n".join(lines)


def document_html(
    size: int, *, seed: int, title: str, facts: Sequence[tuple[str, float]] = ()
) -> str:
    """The document as an HTML page: the same blocks as `document_text`."""
    parts = [f"<html><head><title>{html.escape(title)}</title></head><body>"]
    parts.append(f"<h1>{html.escape(title)}</h1>")
    for kind, text in document_blocks(size, seed, facts):
        tag = "h2" if kind == "heading" else "p"
        parts.append(f"<{tag}>{html.escape(text)}</{tag}>")
    parts.append("</body></html>")
    return "".join(parts)
