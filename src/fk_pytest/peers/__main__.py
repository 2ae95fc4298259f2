"""``python -m fk_pytest.peers``: the ``fk-peers`` command line.

The package is imported once as ``fk_pytest.peers`` before this runs, so the suite's peer definitions
raise and check the very classes the benchmark catches (a single module run as ``__main__`` would
have been a second, distinct copy of them).
"""
import sys

from fk_pytest.peers.cli import main

if __name__ == "__main__":
    sys.exit(main())
