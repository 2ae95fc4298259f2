"""The GPU benchmarks behind docs/perf: one module per measurement, run as
``python -m benchmarks NAME [ARGS]`` (or ``python benchmarks/NAME.py``); on the device machine through
the step runner, ``bash benchmarks/gpu_steps.sh STEP:SECONDS ...``. docs/perf/README.md maps each
page to its command. The peer benchmark is installed with the plugin: ``python -m fk_pytest.peers``.
"""
