"""An honest ViT MLP written the ordinary way: a bare nn.Module, two nn.Linear and F.gelu."""
import torch.nn.functional as F
from torch import nn


class Dinov2MLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, hidden_act="gelu"):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size)
        self.fc2 = nn.Linear(intermediate_size, hidden_size)
        self.approximate = "tanh" if "tanh" in hidden_act else "none"

    def forward(self, hidden_states):
        return self.fc2(F.gelu(self.fc1(hidden_states), approximate=self.approximate))
