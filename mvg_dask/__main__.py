"""``python -m mvg_dask`` runs the ``mvg-dask`` command line."""

import sys

from mvg_dask.cli import main

sys.exit(main())
