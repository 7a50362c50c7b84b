"""How a run is shown to a person: the timeline of `keel show`, the one-line summary, progress
lines while a run goes, and terminal-safe text. Presenters read records; they never drive a run."""
