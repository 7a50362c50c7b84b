"""The built-in evaluation suites, by name: in a module of their own so that `keel eval --help`
names them without importing the scenario loader (ADR 0042)."""

__all__ = ["BENCHMARK_SUITES", "DEFAULT_SUITE", "RENAMED_SUITES", "SUITES"]

SUITES = {
    "rules": "scenarios",
    "repo-questions": "repo_questions",
    "citations": "citations",
    "loop-tiers": "loop_tiers",
    "repo-questions-20": "repo_questions_20",
    "long-runs": "long_runs",
    "web-research": "web_research",
}
"""Built-in suites and their folders: `rules` (the default) checks the runtime's rules with
scripted models and pages; `repo-questions` asks a real model five questions about the
repository it runs in and grades the answers against the code (`keel.evals.facts`);
`citations` checks answers against the record (ADR 0053) with scripted models: a wrong quote,
an unknown id, a quote from a result that was elided; `loop-tiers` shows each repeat tier
and the nudge at work (ADR 0050) with scripted models;
`web-research` answers a question from a corpus with `web_search` then `fetch` or
`read_file`, citing what it read (ADR 0061); `repo-questions-20` asks twenty of many shapes,
written before any model was measured on them (issue 39, `keel.evals.code_facts`); `long-runs`
reads documents many times a 4k, 8k or 32k window with scripted models, one turn refused as too
long in a provider's words, and asks at the end for facts read at the start (issue 44, ADR
0060)."""
DEFAULT_SUITE = "rules"
RENAMED_SUITES = {"evidence": "citations"}
"""Former suite names, still accepted with a note (ADR 0058)."""
BENCHMARK_SUITES = {"swe-qa": "keel.evals.swe_qa"}
"""Suites whose questions come from outside, named with --questions, not from a folder of
scenarios: `swe-qa` runs SWE-QA's questions (question and reference answer, written by the
benchmark's authors) over their repository, scored from its code (issue 51, ADR 0068)."""
