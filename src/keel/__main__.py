"""`python -m keel` runs the command line."""

from keel.cli import main

main()
