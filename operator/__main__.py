"""`python -m zerotrain.operator`: the same as `zerotrain operator` (errors print as the command's do)."""

import sys

from zerotrain.cli import main

sys.exit(main(["operator", *sys.argv[1:]]))
