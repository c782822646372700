import sys

from .cli import main

if __name__ == "__main__":  # worker processes re-import the main module; they must not run the CLI
    sys.exit(main())
