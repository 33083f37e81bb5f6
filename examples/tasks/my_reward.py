"""The reward function of examples/dataset.yaml: copy this file next to your data and edit it.

The job imports it by path: spec.task.pythonPath: [examples/tasks] puts this folder on the Python
path, and spec.task.reward: "my_reward:score" names the function. It is plain Python: it imports
nothing of asyncrl and can be tested on its own (python -c "import my_reward; ...").

asyncrl calls score(completion, answer, sample) once per finished episode:
- completion: the model's final assistant text (the end-of-turn token removed);
- answer: the row's answerField value (here the "answer" column, a string);
- sample: the whole row as a dict (here also "category"), for rewards that need more.
It returns a finite float; 1.0 or more counts as a success in the success metrics. An exception, a
NaN or a call slower than spec.task.envTimeoutSeconds aborts that episode only (counted in
asyncrl_env_errors_total{reason}); the job goes on.
"""

import difflib


def score(completion: str, answer: str, sample: dict) -> float:
    """1.0 for the exact answer (case and surrounding blanks ignored), else partial credit up to 0.5
    by character similarity: GRPO learns from differences inside a group, and a tiny model rarely
    gets an answer exactly right at first."""
    said, want = completion.strip().lower(), str(answer).strip().lower()
    if said == want:
        return 1.0
    return 0.5 * difflib.SequenceMatcher(None, said, want).ratio()
