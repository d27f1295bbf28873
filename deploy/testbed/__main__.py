"""``python -m hermes.deploy.testbed``: the ``hermes-testbed`` command line (:mod:`hermes.deploy.testbed_cli`).

Its own file so that the run (this package) never imports its command line, which imports the run.
"""

import sys

from hermes.deploy.testbed_cli import main

sys.exit(main())
