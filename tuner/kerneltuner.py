"""``python -m tuner.kerneltuner``: the command keeps its name; the code is
``tuner.measure.kerneltuner``."""

import sys

from tuner.measure.kerneltuner import main

if __name__ == "__main__":
    sys.exit(main())
