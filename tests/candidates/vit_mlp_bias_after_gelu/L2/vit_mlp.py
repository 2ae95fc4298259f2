"""Wrong: fc1's bias added after the GELU instead of before it (a fused bias + GELU epilogue
written in the wrong order)."""
import torch.nn.functional as F
from torch import nn


class Dinov2MLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, hidden_act="gelu"):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size)
        self.fc2 = nn.Linear(intermediate_size, hidden_size)
        self.approximate = "tanh" if "tanh" in hidden_act else "none"

    def forward(self, hidden_states):
        up = F.gelu(F.linear(hidden_states, self.fc1.weight), approximate=self.approximate) + self.fc1.bias
        return self.fc2(up)
