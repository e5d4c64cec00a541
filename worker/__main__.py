"""`python -m inferd.worker`: see main.py."""

import sys

from .main import main

sys.exit(main())
