"""``python -m tuner.record``: the command keeps its name; the code is ``tuner.measure.record``."""

import sys

from tuner.measure.record import main

if __name__ == "__main__":
    sys.exit(main())
