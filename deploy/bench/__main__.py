import sys

from hermes.deploy.bench.cli import main

sys.exit(main())
