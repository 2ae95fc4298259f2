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
