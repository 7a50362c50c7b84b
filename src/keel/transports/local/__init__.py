"""The embedded model, everything that is about it in one package (issue 31): the run core and
the other transports hold none of it.

    transport.py    `LocalTransport`: llama.cpp in this process, the shell around the rest
    weights.py      the shipped GGUF file: its parts, joined and verified once
    llama.py        llama.cpp's side: loading it, a generation's counts, its errors as Keel's,
                    the tokenizer, and the hooks that let a generation be cancelled
    qwen_format.py  Qwen2.5's chat format with tools (pure): the prompt, and calls read back
    grammar.py      the grammar a turn is sampled under (pure), applied by constrained.py
    constrained.py  the grammar as a logits mask
    grounding.py    code spans copied from the run's own text
    answers.py      short answers: no repeated runs, synthesis answers cut at thirty lines
    stream.py       text pieces handed to the event loop as they are sampled
    steering.py     the call a required first turn is steered to, from the question's words
                    (offered to the run through `keel.transports.base.SteersFirstCall`)

Importing the package loads none of them (and not numpy): its names are imported on first use
(keel/_lazy.py), so ``from keel.transports.local import LocalTransport`` costs what it did.
"""

import typing as _typing

from keel import _lazy

if _typing.TYPE_CHECKING:
    from keel.transports.local.transport import (
        DEFAULT_NAME,
        SAMPLING,
        Generation,
        LlamaTokenCounter,
        LocalTransport,
        ProgressCallback,
        map_error,
    )

_WHERE: dict[str, str] = {
    "DEFAULT_NAME": "keel.transports.local.transport",
    "Generation": "keel.transports.local.transport",
    "LlamaTokenCounter": "keel.transports.local.transport",
    "LocalTransport": "keel.transports.local.transport",
    "ProgressCallback": "keel.transports.local.transport",
    "SAMPLING": "keel.transports.local.transport",
    "map_error": "keel.transports.local.transport",
}

__all__ = [
    "DEFAULT_NAME",
    "SAMPLING",
    "Generation",
    "LlamaTokenCounter",
    "LocalTransport",
    "ProgressCallback",
    "map_error",
]

__getattr__, __dir__ = _lazy.exports(__name__, _WHERE)
