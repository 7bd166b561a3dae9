"""``python -m coursekit.memory ...``: the same command as ``coursekit memory ...``."""
import sys

from coursekit.memory.cli import main

sys.exit(main(sys.argv[1:]))
