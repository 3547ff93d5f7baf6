"""`python -m draguard`: the `draguard` command."""

import sys

from .webhook.cli import main

sys.exit(main())
