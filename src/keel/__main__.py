"""`python -m keel` runs the command line."""

from keel.cli.app import main

main()
