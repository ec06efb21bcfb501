"""``python -m fwrl ...`` is the ``fwrl`` command (``torchrun --nproc-per-node N -m fwrl train ...``)."""

import sys

from fwrl.launch.entry import main

if __name__ == "__main__":
    sys.exit(main())
