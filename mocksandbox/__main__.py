"""``python -m mocksandbox``: the ``mocksandbox`` command."""

import sys

from mocksandbox.cli import main

if __name__ == "__main__":
    sys.exit(main())
