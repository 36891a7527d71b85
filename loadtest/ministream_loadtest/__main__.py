"""`python -m ministream_loadtest` is `ministream-loadtest`."""

import sys

from .cli import main

sys.exit(main())
