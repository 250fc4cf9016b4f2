"""python -m convert: see convert/__init__.py."""
import sys

from convert import main

if __name__ == "__main__":
    sys.exit(main())
