#!/usr/bin/env python
"""Foundation benchmark (update apply and data plane vs bare baselines).

The code lives in ``hermes.deploy.bench.foundation`` so that an installed
``hermes-bench micro`` has it; this script runs it with its own flags:

    python benchmarks/bench_foundation.py [--quick] [--threads N] [--json PATH]
"""

import sys

from hermes.deploy.bench.foundation import main

if __name__ == "__main__":
    sys.exit(main())
