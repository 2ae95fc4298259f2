"""The encoder and vision models at full size, random bf16 weights: our L4 model against HF transformers.

all-MiniLM-L6-v2 and BGE-M3 (XLM-R large) on a batch of four texts (37, 300, 5 and 128 tokens: HF
padded with its attention mask, ours packed with cu_seqlens, as vLLM serves encoders; valid rows
compared), and the vision towers on two images each at their served size: SigLIP-2 so400m (384 px),
DINOv2-S (224 px), DINOv3 ViT-L/16 (224 px) and ConvNeXt-V2-Tiny (224 px; its last feature map).
HF's model is built from tasks/configs in float32 with every parameter drawn at a trained scale
(matrices and conv kernels at 1/sqrt(fan_in), norm weights near 1, biases near 0; LayerScale gains
kept at HF's init), then cast to bf16 on the GPU; ours loads the same tensors through its HF
mapping. Truth is HF's model in float32. The table gives the relative L2 error against that truth
of HF bf16 and of ours (bf16, the production path); the target is ours <= 2x HF bf16, the rule of
the decoder families (``benchmarks/hf_agreement.py``).

    python3 -m benchmarks hf_agreement_encoders            (device machine, repo root)
    python3 -m benchmarks hf_agreement_encoders --tiny-cpu (checks this script on the CPU, tiny widths)
"""
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "src")]
from benchmarks.hf_agreement import config_kwargs, rel, report, write_results  # noqa: E402
from kernels_reference.forward_context import AttentionMetadata, set_forward_context  # noqa: E402
from kernels_reference.L4 import convnext, siglip  # noqa: E402
from kernels_reference.L4.bert import BertModel  # noqa: E402
from kernels_reference.L4.dinov2 import Dinov2Model  # noqa: E402
from kernels_reference.L4.dinov3 import DINOv3ViTModel  # noqa: E402

TEXTS = (37, 300, 5, 128)
IMAGES = 2
# The CPU check: tiny widths, the real structure (layers, heads of the real size where it matters).
TINY_TEXT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2, vocab_size=500)
TINY_VIT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2)
TINY = {"all-minilm-l6-v2": TINY_TEXT, "bge-m3": TINY_TEXT, "siglip2-so400m-vision": dict(TINY_VIT, image_size=56),
        "dinov2-small": dict(TINY_VIT, image_size=56), "dinov3-vitl16": dict(TINY_VIT, image_size=64),
        "convnextv2-tiny": dict(hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 2, 1], image_size=64)}
TINY_TEXTS = (9, 30, 5, 12)


def config_of(name, cls, tiny):
    cfg = config_kwargs(name, drop=("architectures", "pooling_type", "normalize"))
    if tiny:
        cfg.update(TINY[name])
    return cls(**cfg)


@torch.no_grad()
def trained_scale(model, gen):
    """Every parameter drawn as trained weights sit (HF's init leaves norms at one and biases at
    zero, which would hide their kernels): matrices, tables and conv kernels at 1/sqrt(fan_in),
    norm weights near 1, other vectors near 0; LayerScale gains (``lambda1``) stay at HF's init."""
    for name, p in model.named_parameters():
        if name.endswith("lambda1"):
            continue
        if p.dim() >= 2:
            fan_in = p[0].numel() if p.dim() == 4 else p.shape[-1]  # conv kernels: in x kh x kw
            p.copy_(torch.randn(p.shape, generator=gen) * fan_in ** -0.5)
        elif "norm" in name.lower() and name.endswith("weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def text_case(hf_cls):
    """HF padded with its mask against ours packed (cu_seqlens in the forward context)."""
    def run(hf, ours, config, dev, gen, tiny):
        lengths = TINY_TEXTS if tiny else TEXTS
        ids = [torch.randint(2, config.vocab_size, (n,), generator=gen).to(dev) for n in lengths]
        pad = config.pad_token_id or 0
        padded = torch.full((len(ids), max(lengths)), pad, dtype=torch.long, device=dev)
        mask = torch.zeros_like(padded)
        for b, row in enumerate(ids):
            padded[b, :len(row)], mask[b, :len(row)] = row, 1

        def hf_rows():
            out = hf(input_ids=padded, attention_mask=mask).last_hidden_state
            return torch.cat([out[b, :n] for b, n in enumerate(lengths)]).float()

        def ours_rows():
            meta = AttentionMetadata.build([0] * len(lengths), list(lengths), block_size=16, device=dev)
            with set_forward_context(meta):
                return ours(torch.cat(ids), meta.positions(), torch.zeros(sum(lengths), dtype=torch.long,
                                                                          device=dev)).float()
        return hf_rows, ours_rows
    return dict(hf=lambda c: hf_cls(c, add_pooling_layer=False), ours=lambda c, hf: _loaded(BertModel(c), hf),
                case=run)


def _loaded(ours, hf):
    ours.load_weights(hf.state_dict().items())
    return ours


def image_case(hf_cls, ours_of, pick=lambda out: out):
    def run(hf, ours, config, dev, gen, tiny):
        size = config.image_size
        pixels = torch.randn(IMAGES, 3, size, size, generator=gen).to(dev)

        def hf_rows():
            return hf(pixel_values=pixels.to(hf.dtype)).last_hidden_state.float()

        def ours_rows():
            return pick(ours(pixels.to(next(ours.parameters()).dtype))).float()
        return hf_rows, ours_rows
    return dict(hf=hf_cls, ours=ours_of, case=run)


MODELS = {
    "all-minilm-l6-v2": (transformers.BertConfig, text_case(transformers.BertModel)),
    "bge-m3": (transformers.XLMRobertaConfig, text_case(transformers.XLMRobertaModel)),
    "siglip2-so400m-vision": (lambda **c: transformers.SiglipVisionConfig(**c, vision_use_head=False),
                              image_case(transformers.SiglipVisionModel, lambda c, hf: _state(
                                  siglip.SiglipVisionModel(c), siglip.hf_state_dict(hf.state_dict(), c.num_hidden_layers)))),
    "dinov2-small": (transformers.Dinov2Config,
                     image_case(transformers.Dinov2Model, lambda c, hf: _loaded(Dinov2Model(c), hf))),
    "dinov3-vitl16": (transformers.DINOv3ViTConfig,
                      image_case(transformers.DINOv3ViTModel, lambda c, hf: _loaded(DINOv3ViTModel(c), hf))),
    "convnextv2-tiny": (transformers.ConvNextV2Config,
                        image_case(transformers.ConvNextV2Model, lambda c, hf: _state(
                            convnext.ConvNextV2Model(c), convnext.hf_state_dict(hf.state_dict(), list(c.depths))),
                                   pick=lambda out: out[0])),
}


def _state(ours, state):
    ours.load_state_dict(state, strict=True)
    return ours


def main():
    tiny = "--tiny-cpu" in sys.argv
    dev = torch.device("cpu" if tiny else "cuda")
    gen = torch.Generator().manual_seed(0)
    print("| model | values compared | HF bf16 error vs fp32 | ours bf16 error vs fp32 | ratio (target <= 2) | seconds |")
    print("|---|---|---|---|---|---|")
    results = []
    for name, (config_cls, spec) in MODELS.items():
        t0 = time.time()
        config = config_of(name, config_cls, tiny)
        if "convnext" not in name:  # attention through SDPA, as HF serves these towers by default
            config._attn_implementation = "sdpa"
        hf = trained_scale(spec["hf"](config).eval(), gen)
        ours = spec["ours"](config, hf).eval()
        hf_rows, ours_rows = spec["case"](hf, ours, config, dev, gen, tiny)
        with torch.no_grad():
            hf.to(dev)
            truth = hf_rows()
            hf.to(torch.bfloat16)
            hf_bf16 = hf_rows()
            del hf
            ours.to(device=dev, dtype=torch.bfloat16)
            got = ours_rows()
        e_hf, e_ours = rel(hf_bf16, truth), rel(got, truth)
        report(results, name, [got.numel()], e_hf, e_ours, t0, values=int(got.numel()), tiny=tiny)
        del ours
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    write_results(results, "hf_agreement_encoders.json")


if __name__ == "__main__":
    main()
