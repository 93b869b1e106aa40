import gc
import sys

from tuner.run.cli import main

code = main()
# Everything the command opened is closed by now. The interpreter's teardown would collect
# every module's objects again (Optuna, SQLAlchemy, scikit-learn, the listed spaces): 0.7-0.9 s
# of a command's wall on the CPU box, for nothing (bench/NOTES.md, issue 19). Frozen objects are
# left to the process's exit; atexit handlers and thread joins still run.
gc.freeze()
sys.exit(code)
