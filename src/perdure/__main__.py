"""`python -m perdure` runs the CLI."""

from perdure.cli.main import main

main()
