"""The page server ships with evaluations (`keel.evals.pageserver`); tests import it from here."""

from keel.evals.pageserver import *  # noqa: F403
