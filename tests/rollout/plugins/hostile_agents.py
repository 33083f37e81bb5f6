"""Agent functions that return hostile rewards (tests/trainer/test_hostile_agent_job.py): by the sample's seed, a
reward of 1e30, 1e300, a 400-digit integer, NaN, or an honest one in [0, 1)."""

import random
from typing import Any

HOSTILE: tuple[Any, ...] = (1e30, 1e300, 10**400, float("nan"))


async def hostile_rewards(client: Any, sample: dict) -> float:
    seed = int(sample.get("seed", 0))
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": f"hi {seed % 7}"}],
                                         max_tokens=4)
    k = seed % (len(HOSTILE) + 2)  # two honest seeds in six
    return HOSTILE[k] if k < len(HOSTILE) else random.random()
