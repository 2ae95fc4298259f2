"""End to end (L4): each Llama-family model served by the engine on each serving scenario, the
composed candidate against the reference (teacher-forced top-1 agreement, calibrated credit against
the reference's own noise floor, throughput and latency speedups). IDs read
``test_e2e[llama-3.1-8b-chat]``; ``pytest -m level4 -k "llama and e2e"`` selects them."""
from fk_pytest.e2e import e2e_test

from ..e2e import E2E

test_e2e = e2e_test(E2E)
