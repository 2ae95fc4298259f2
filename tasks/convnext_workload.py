"""ConvNeXt-V2's stage shapes, shared by its per-stage L1 tasks (GRN, depthwise conv + norm)."""
from .configs import load_config

MODEL = "convnextv2-tiny"
STEM_STRIDE = 4  # the stem's 4x4 patchify conv
# Fuzz: widths of the ConvNeXt / ConvNeXt-V2 family (atto .. huge stage widths and their 4x MLP
# widths) and map sides of real inputs (224, 256, 288, 384 px).
OTHER_STAGE_WIDTHS = (40, 80, 160, 320, 64, 128, 256, 512, 1024, 352, 704, 1408, 2816)
REAL_SIDES = (56, 28, 14, 7, 64, 32, 16, 8, 72, 36, 18, 9, 96, 48, 24, 12)
MAX_BATCH = {"cpu": 2, "full": 16}


def stage_shape(image: int, stage: int):
    """(side of the stage's square map, stage width) of ConvNeXt-V2-Tiny at ``image`` px."""
    return image // STEM_STRIDE // 2 ** stage, load_config(MODEL)["hidden_sizes"][stage]
