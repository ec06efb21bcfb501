"""Kernel benchmark entry point: ``python benchmarks/kernels.py [--core srwm] ...``.

The benchmark itself is ``fwrl.kernels.benchmark`` (also ``fwrl bench kernels``).
"""

import sys

from fwrl.errors import run_main
from fwrl.kernels.benchmark import main

if __name__ == "__main__":
    sys.exit(run_main(main))
