"""Reading a report back: the file, the embedded form, and validation against report.schema.json.

``load_report`` is what every reader of reports (``fk-report --validate``, ``fk-leaderboard``) goes
through, so a file that is not a report, or a report that breaks the schema, is refused with one
line naming the file and, for a schema violation, the JSON path of the offending value.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

SCHEMA_FILE = Path(__file__).with_name("report.schema.json")
SCHEMA_ID = "fastkernels.report/1"


class InvalidReport(ValueError):
    """The file is not a readable report of this schema; the message names the file and why."""


@functools.lru_cache(maxsize=None)
def schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())


def schema_errors(report: dict) -> list:
    """Every violation of the schema, each as ``"$.tasks[0]: 'status' is a required property"``."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    # shallowest first: a wrong schema_version says more than the fields it then lacks
    errors = sorted(validator.iter_errors(report), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    return [f"{_path(e.absolute_path)}: {e.message}" for e in errors]


def _path(parts) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def validate_report(report: dict, name: str = "report") -> None:
    errors = schema_errors(report)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InvalidReport(f"{name}: does not match {SCHEMA_FILE.name}: {errors[0]}{more}")


def load_report(path: str | Path, validate: bool = True) -> dict:
    """The report in ``path``: a ``--fk-report`` file or a pytest-benchmark JSON that embeds one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidReport(f"{path}: cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise InvalidReport(f"{path}: is not JSON: {exc}") from exc
    if isinstance(data, dict) and "benchmarks" in data and "fastkernels" not in data:
        raise InvalidReport(f"{path}: is a pytest-benchmark JSON without a FastKernels report in it")
    report = data.get("fastkernels", data) if isinstance(data, dict) else data
    if not isinstance(report, dict) or report.get("schema") != SCHEMA_ID:
        found = report.get("schema") if isinstance(report, dict) else type(report).__name__
        raise InvalidReport(f"{path}: is not a {SCHEMA_ID} report (schema: {found!r})")
    if validate:
        validate_report(report, str(path))
    return report
