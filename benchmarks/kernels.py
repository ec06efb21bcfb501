"""Kernel benchmark entry point: ``python benchmarks/kernels.py [--core srwm] ...``.

The benchmark itself is ``fwrl.launch.bench.kernels`` (also ``fwrl bench kernels``).
"""

import sys

from fwrl.errors import run_main
from fwrl.launch.bench.kernels import main

if __name__ == "__main__":
    sys.exit(run_main(main))
