"""The errors that carry a verdict, and how an exception is summarised in one."""
import sysconfig
import traceback


class CandidateError(Exception):
    """A candidate problem with a verdict status (import error, wrong signature, ...)."""

    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class NotAttempted(Exception):
    """The candidate tree does not contain the module/class of this task."""


class TaskDefinitionError(Exception):
    """The task produced a case that cannot discriminate (e.g. a zero or constant truth)."""


def _library_roots() -> tuple:
    paths = sysconfig.get_paths()
    return tuple({paths["stdlib"], paths["purelib"], paths["platlib"]})


def short_traceback(exc: BaseException) -> str:
    """``Type: first line of the message (at file:line)`` of the innermost frame, and where that is
    inside torch or another library, the innermost frame of user code that led there (the
    candidate's line, say, rather than torch's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    first = (str(exc).strip().splitlines() or [""])[0]
    if not frames:
        return f"{type(exc).__name__}: {first}"
    text = f"{type(exc).__name__}: {first} (at {frames[-1].filename}:{frames[-1].lineno}"
    roots = _library_roots()
    own = [f for f in frames if not f.filename.startswith(roots)]
    if own and own[-1] is not frames[-1]:
        text += f", from {own[-1].filename}:{own[-1].lineno}: {own[-1].line}"
    return text + ")"
