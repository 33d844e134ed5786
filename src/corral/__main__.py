"""`python -m corral` is the `corral` command."""

from corral.cli import main

main()
