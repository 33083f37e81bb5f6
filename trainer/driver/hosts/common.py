"""What the job's Ray processes share: torch's thread cap and the task's context length."""

from typing import TYPE_CHECKING

from asyncrl.api.job import AsyncRLJobSpec

if TYPE_CHECKING:
    from asyncrl.rollout.tokenizer import Tokenizer


def task_context(spec: AsyncRLJobSpec, tokenizer: "Tokenizer") -> int:
    """The longest trajectory of the job's task: the actor, the scorers and the rollout workers all
    build the model for this context length."""
    from asyncrl.rollout.envs.binding import context_length

    return context_length(spec.task, tokenizer)


def limit_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process (a reused Ray worker)
        pass
