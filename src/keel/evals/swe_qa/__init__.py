"""SWE-QA: repository questions written by others, scored from the code (issue 51, ADR 0068)."""
