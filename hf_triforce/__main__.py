"""``python -m hf_triforce``."""

import sys

from .cli import main

sys.exit(main())
