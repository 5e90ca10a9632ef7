"""`python -m sketchboard`: the `sketchboard` command (sketchboard/cli.py) without its console script."""

import sys

from sketchboard.cli import main

sys.exit(main())
