"""A user's environment that reads dataset rows (spec.task.environment: "dataset_env:RowEnv" with a
spec.task.dataset): the row is the sample; it imports only the interface's records."""

from asyncrl.rollout.envs.interface import Reset, Turn


class RowEnv:
    def __init__(self, field: str = "prompt") -> None:
        self.field = field
        self.row: dict = {}

    def reset(self, sample: dict) -> Reset:
        self.row = sample
        return Reset([{"role": "user", "content": str(sample[self.field])}])

    def step(self, msg) -> Turn:
        ok = msg.content.strip() == str(self.row["answer"])
        return Turn(done=True, reward=float(ok), success=ok)

    def info(self) -> dict:
        return {"row_prompt": self.row[self.field]}
