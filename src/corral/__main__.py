"""`python -m corral` is the `corral` command."""

from corral.main import main

main()
