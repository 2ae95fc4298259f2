"""``python -m benchmarks NAME [ARGS]``: run benchmarks/NAME.py as a script with ARGS."""
import runpy
import sys
from pathlib import Path

HELPERS = {"__init__", "__main__", "graph_timing", "markdown"}  # imported by the benchmarks, not run
NAMES = sorted(p.stem for p in Path(__file__).parent.glob("*.py") if p.stem not in HELPERS)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in NAMES:
        print(f"usage: python -m benchmarks NAME [ARGS]; NAME is one of: {', '.join(NAMES)}\n"
              "(docs/perf/README.md: which command made which page)", file=sys.stderr)
        return 2
    name = sys.argv[1]
    sys.argv = [str(Path(__file__).parent / f"{name}.py")] + sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
