"""``python -m hf_triforce.bench``: the same as ``hf-triforce bench``."""

import sys

from ..cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
