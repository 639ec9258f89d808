"""`python -m zerotrain.operator`: the same as `zerotrain operator`."""

import sys

from zerotrain.commands.operator import main

sys.exit(main())
