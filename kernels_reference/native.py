"""Composite modules run their children's fast paths in ``forward`` and their children's
``forward_native`` in ``forward_native``, so a float64 ``forward_native`` of a whole model is pure
PyTorch all the way down (the ground truth of the correctness checks)."""


def run(module, native: bool, *args, **kwargs):
    return module.forward_native(*args, **kwargs) if native else module(*args, **kwargs)


class LayerStack:
    """Mixin of an ``nn.Module`` whose forward is its layers in order (``self.<LAYERS>``, an
    ``nn.ModuleList``): each layer's fast path in ``forward``, its ``forward_native`` in
    ``forward_native``, as every composite here runs its children."""

    LAYERS = "layer"

    def forward(self, hidden_states):
        return self._stack(hidden_states, native=False)

    def forward_native(self, hidden_states):
        return self._stack(hidden_states, native=True)

    def _stack(self, hidden_states, native: bool):
        for layer in getattr(self, self.LAYERS):
            hidden_states = run(layer, native, hidden_states)
        return hidden_states
