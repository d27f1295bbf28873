#!/usr/bin/env python
"""Shard fetch throughput: Kafka reader vs ZeroMQ data plane vs a bare kafka-python consumer.

The code lives in ``hermes.deploy.bench.kafka_fetch`` so that an installed
``hermes-bench micro`` has it; this script runs it with its own flags:

    python benchmarks/bench_kafka.py [--num-samples 100000] [--shard-size 256] [--kafka HOST:PORT] [--json PATH]
"""

import sys

from hermes.deploy.bench.kafka_fetch import main

if __name__ == "__main__":
    sys.exit(main())
