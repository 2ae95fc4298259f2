"""Published config values of real models, keyed by model name (facts, in HF config.json terms)."""
import json
from functools import lru_cache
from pathlib import Path
from typing import Dict, List

_DIR = Path(__file__).parent


@lru_cache(maxsize=None)
def load_config(name: str) -> Dict:
    path = _DIR / f"{name}.json"
    if not path.exists():
        raise KeyError(f"no model config {name!r}; known: {', '.join(model_names())}")
    return json.loads(path.read_text())


def model_names() -> List[str]:
    return sorted(p.stem for p in _DIR.glob("*.json"))


def head_dim(cfg: Dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def rotary_dim(cfg: Dict) -> int:
    if "rotary_dim" in cfg:  # GPT-J
        return cfg["rotary_dim"]
    return int(head_dim(cfg) * cfg.get("partial_rotary_factor", 1.0))
