"""End to end (L4): the trained all-MiniLM-L6-v2 served for embedding requests, the composed
candidate against the reference (1 - cosine of the embeddings and the corpus's retrieval ranking,
each against the reference's own noise floor; throughput and latency speedups on a GPU). IDs read
``test_e2e[all-minilm-l6-v2-corpus]``; ``pytest -m level4 -k "embedding and e2e"`` selects them."""
from fk_pytest.e2e import e2e_test

from ..embedding_e2e import EMBEDDING_E2E

test_e2e = e2e_test(EMBEDDING_E2E)
