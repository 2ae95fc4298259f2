"""One request as the engine tracks it."""
import dataclasses
import enum
from typing import Any, List, Optional


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass
class Sequence:
    seq_id: int
    token_ids: List[int]  # prompt followed by generated tokens
    prompt_len: int
    max_tokens: int
    params: Any = None  # the request's SamplingParams
    num_cached: int = 0  # tokens whose keys/values are in the cache
    block_table: List[int] = dataclasses.field(default_factory=list)
    # Slot in the recurrent-state pools (models with state layers): held from the first scheduled
    # chunk to finish or preemption, so the states carry across prefill chunks and decode steps.
    state_slot: Optional[int] = None
    status: Status = Status.WAITING

    def decodes(self, num_tokens: int) -> bool:
        """Whether running ``num_tokens`` of it this step is a decode (one token after its cache)."""
        return num_tokens == 1 and self.num_cached > 0

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def output_ids(self) -> List[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def num_pending(self) -> int:
        """Tokens not yet through the model (the rest of the prompt, or the last sampled token)."""
        return len(self.token_ids) - self.num_cached
