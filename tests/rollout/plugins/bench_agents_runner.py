"""``bench/agent_endpoint.py``'s agent function as the worker's agent runner process runs it
(``spec.task.agent: "bench_agents_runner:conversation"``): :func:`bench_agents.converse` at the shape the bench
names in ``$ASYNCRL_BENCH_SHAPE`` (``turns,max_tokens,prompt_chars,follow_chars``), each episode's request latencies
appended to ``$ASYNCRL_BENCH_LATENCIES`` as one JSON line, written before the episode's reward goes back (so the
bench reads them all once ``generate`` returned). The runner is a process of its own: module state set by the bench
(``bench_agents.SHAPE``, ``LATENCIES``) does not reach it, the environment the worker started it with does."""

import json
import os
from typing import Any

import bench_agents as ba


def shape() -> ba.Shape:
    return ba.Shape(*(int(x) for x in os.environ["ASYNCRL_BENCH_SHAPE"].split(",")))


async def conversation(client: Any, sample: dict[str, Any]) -> float:
    record: list[tuple[int, float]] = []
    reward = await ba.converse(client, sample, shape(), record)
    with open(os.environ["ASYNCRL_BENCH_LATENCIES"], "a") as f:
        f.write(json.dumps(record) + "\n")
    return reward
