"""Kernel benchmark entry point: ``python benchmarks/kernels.py [--core srwm] ...``.

The benchmark itself is ``fwrl.kernels.benchmark`` (also ``fwrl bench kernels``).
"""

import sys

from fwrl.errors import FwrlError
from fwrl.kernels.benchmark import main

if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except FwrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
