"""End to end (L4): the trained DINOv2-S/14 served for image embedding requests of real photographs,
the composed candidate against the reference (1 - cosine of the class-token embeddings and the
photos' retrieval ranking, each against the reference's own noise floor; throughput and latency
speedups on a GPU). IDs read ``test_e2e[dinov2-small-trained-photos]``."""
from fk_pytest.e2e import e2e_test

from ..image_e2e import IMAGE_EMBEDDING_E2E

test_e2e = e2e_test(IMAGE_EMBEDDING_E2E)
