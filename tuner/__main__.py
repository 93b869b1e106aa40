import sys

from tuner.run.cli import main

sys.exit(main())
