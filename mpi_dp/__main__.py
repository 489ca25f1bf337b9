"""`python -m mpi_dp` == `mpi-dp`."""

import sys

from .cli import main

sys.exit(main())
