"""Verdict vocabulary shared by the tests, the report and the table."""

PASSED = "PASSED"
WRONG_RESULT = "WRONG_RESULT"  # finite, right shape, but outside the calibrated limit
WRONG_SHAPE = "WRONG_SHAPE"
WRONG_DTYPE = "WRONG_DTYPE"
WRONG_OUTPUTS = "WRONG_OUTPUTS"  # wrong number/structure of outputs
NONFINITE_OUTPUT = "NONFINITE_OUTPUT"
UNWRITTEN_OUTPUT = "UNWRITTEN_OUTPUT"  # poisoned output memory left as it was
INPUT_MUTATED = "INPUT_MUTATED"
OUTPUT_ALIASES_INPUT = "OUTPUT_ALIASES_INPUT"
RUNTIME_ERROR = "RUNTIME_ERROR"
IMPORT_ERROR = "IMPORT_ERROR"
MISSING_CLASS = "MISSING_CLASS"
SIGNATURE_MISMATCH = "SIGNATURE_MISMATCH"
STATE_DICT_MISMATCH = "STATE_DICT_MISMATCH"
SUSPECT_SPEED = "SUSPECT_SPEED"  # faster than the measured roofline allows
TIMEOUT = "TIMEOUT"  # the worker running the candidate exceeded the time limit
CONSTANT_OUTPUT = "CONSTANT_OUTPUT"  # all zeros / one value where the truth varies
REPLAYED_OUTPUT = "REPLAYED_OUTPUT"  # the output of an earlier call returned for new inputs
WORK_ESCAPED = "WORK_ESCAPED"  # outputs still changing after the call returned (other stream/thread)
TAMPERED = "TAMPERED"  # timers, CUDA events, graph replay or the suite's functions replaced
TIMED_OUTPUT_WRONG = "TIMED_OUTPUT_WRONG"  # the code path that was timed does not compute the op
DELEGATED = "DELEGATED"  # correct, but by running the reference's code: not a new kernel
NOT_ATTEMPTED = "NOT_ATTEMPTED"  # the candidate tree has no module for the task
NOT_IMPLEMENTED = "NOT_IMPLEMENTED"  # the class is there, but its forward raises NotImplementedError (a stub)
NOT_RUN = "NOT_RUN"  # collected, but no test of the task ran (deselected or interrupted)
INSENSITIVE = "INSENSITIVE"  # an end-to-end case in which a built-in mutant still earns credit: blind
TASK_ERROR = "TASK_ERROR"  # the task itself is broken (e.g. a degenerate case): not the candidate's fault

# Statuses that describe the candidate as a whole rather than one case.
CANDIDATE_LEVEL = (IMPORT_ERROR, MISSING_CLASS, SIGNATURE_MISMATCH, NOT_ATTEMPTED, NOT_IMPLEMENTED)
