import sys

from coursekit.train import main

if __name__ == "__main__":
    sys.exit(main())
