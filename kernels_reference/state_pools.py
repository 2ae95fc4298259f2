"""The recurrent-state slot pools of a model's state layers (Mamba-2's mixers, Qwen3-Next's gated
DeltaNet layers): per layer, a conv window pool in the activation dtype and a recurrent-state pool
in float32 (states accumulate over the whole sequence: vLLM's ``mamba_ssm_cache_dtype="float32"``
keeps them so, since a bf16 state loses the slow heads' memory over long sequences), each of
``num_slots`` slots, bound to the layer as ``state_cache`` (as attention layers bind ``kv_cache``)."""
from typing import Iterable, List, Sequence, Tuple

import torch


def bind_state_pools(layers: Iterable[torch.nn.Module], num_slots: int, conv_shape: Sequence[int],
                     ssm_shape: Sequence[int], dtype, device) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Make and bind each layer's (conv_states, ssm_states) pools, zeros (a fresh sequence never
    reads its slot); returned in layer order."""
    pools = []
    for layer in layers:
        layer.state_cache = (torch.zeros((num_slots, *conv_shape), dtype=dtype, device=device),
                             torch.zeros((num_slots, *ssm_shape), dtype=torch.float32, device=device))
        pools.append(layer.state_cache)
    return pools
