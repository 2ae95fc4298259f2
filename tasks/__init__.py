"""The FastKernels task suite: one pytest module per task (installed as ``fk_tasks``)."""
FASTKERNELS_SUITE = True
