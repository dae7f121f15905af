"""Benchmark the operator against bare Jobs on the local control plane (``make bench``).

    uv run --locked python hack/bench/bench.py [--quick] [--runs 100,200] [--steps 10] ...

See ``--help`` and docs/benchmarks.md; the code is :mod:`agentrun_devcluster.bench`.
"""

import sys

from agentrun_devcluster.bench.main import main

if __name__ == "__main__":
    sys.exit(main())
