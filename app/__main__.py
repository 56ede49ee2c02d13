"""`python -m app`: the same as the `ssd-demo` command."""

import sys

from .cli import main

sys.exit(main())
