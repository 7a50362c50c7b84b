"""Whether a tool's result says anything a repeat tier may count (ADR 0064).

A `same_result` chain means "this tool keeps telling me the same thing". A result that tells
nothing can't do that: an empty output, an exit status alone (mini-swe-agent's
`<returncode>0</returncode><output></output>`, SWE-agent's "Your command ran successfully and
did not produce any output."), a tool's fixed success line ("The file PATH has been updated
successfully.", "File created successfully at: PATH") or a bare acknowledgement ("ok",
"done"). Different `sed -i` edits each answered by the empty wrapper are progress, not a loop.

    says_nothing(text)      every line of the text is blank or one of the forms above
    NOTHING_DIGESTS         sha256 hex digests of the bare acknowledgements, for callers that
                            only hold a result's digest (the breaker, in the live loop)

The forms are matched on the whole text, line by line: a line that holds anything else (a
listing, an error, a test's outcome, a file's lines) makes the result informative. Only a
success status counts as saying nothing: a command that failed and printed nothing
("<returncode>1</returncode><output></output>", a `grep` that found nothing) did tell the
model something, that it failed, and the same failure under ever new arguments is a loop.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["ACKNOWLEDGEMENTS", "NOTHING_DIGESTS", "says_nothing"]

ACKNOWLEDGEMENTS = (
    "ok",
    "okay",
    "done",
    "success",
    "succeeded",
    "successful",
    "sent",
    "saved",
    "updated",
    "created",
    "written",
    "deleted",
    "removed",
    "true",
    "null",
    "none",
    "{}",
    "[]",
    "no output",
    "(no output)",
    "(no content)",
    "(empty)",
)
"""Whole results that acknowledge and say nothing else (compared without case, white space at
the ends or a final period or exclamation mark)."""

_EXIT = r"(?:exit(?:ed)?(?: with)? (?:code|status)|return ?code)[: =]*0\.?"
_LINES = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        # mini-swe-agent's observation with nothing printed, on one line or several
        r"<returncode>0</returncode>\s*<output>\s*</output>",
        r"<returncode>0</returncode>",
        r"<output>\s*</output>",
        r"<output>",
        r"</output>",
        # SWE-agent 0.x and 1.x when a command prints nothing
        r"your command ran successfully and did not produce any output\.?",
        # OpenHands' command metadata lines
        r"\[(?:the )?command (?:completed|finished) with exit code 0\.?\]",
        r"\[current working directory: [^\]]*\]",
        r"\[python interpreter: [^\]]*\]",
        # a success status alone, as many runtimes print it
        rf"\(?{_EXIT}\)?",
        r"process (?:exited|finished) with (?:exit )?code 0\.?",
        # fixed success lines that name only the file
        r"the file \S.* has been (?:updated|created|written|edited|saved)(?: successfully)?\.?",
        r"file (?:created|updated|written|saved|deleted) successfully(?: at)?:? \S.*",
        r"successfully (?:wrote|written|created|updated|saved|edited|deleted) (?:to )?\S.*",
        r"wrote \d+ (?:bytes|characters|lines) to \S.*",
    )
)


def says_nothing(text: str) -> bool:
    """True when the result carries no information a repeat could be about."""
    stripped = text.strip()
    if not stripped:
        return True
    if len(stripped) <= 40 and stripped.rstrip(".!").strip().lower() in ACKNOWLEDGEMENTS:
        return True
    if len(stripped) > 4096:  # a fixed line is short; a long result says something
        return False
    for line in stripped.splitlines():
        line = line.strip()
        if line and not any(pattern.fullmatch(line) for pattern in _LINES):
            return False
    return True


def _variants(word: str) -> set[str]:
    cased = {word, word.lower(), word.upper(), word.capitalize()}
    return {c + end for c in cased for end in ("", ".", "!", "\n", ".\n")}


NOTHING_DIGESTS = frozenset(
    hashlib.sha256(v.encode("utf-8")).hexdigest()
    for word in ACKNOWLEDGEMENTS
    for v in _variants(word)
)
"""The digests `keel.messages.digest_text` gives the acknowledgements as tools commonly write
them (any of four casings, with or without a final period, "!" or newline): the live loop
hands the breaker a result's digest, not its text."""
