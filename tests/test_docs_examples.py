"""The example files that the docs print whole stay the files: a reader who copies a listing gets what runs."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def listings(markdown: str, language: str = "python") -> list[str]:
    """The bodies of the fenced ``language`` blocks of ``markdown``, in order."""
    out, body, inside = [], [], False
    for line in markdown.splitlines():
        if not inside and line.strip() == f"```{language}":
            inside, body = True, []
        elif inside and line.strip() == "```":
            inside = False
            out.append("\n".join(body))
        elif inside:
            body.append(line)
    return out


@pytest.mark.parametrize(("doc", "example"), [("docs/agents.md", "examples/agents/cs_sdk_agent.py")])
def test_a_printed_example_is_the_file(doc: str, example: str) -> None:
    text = (ROOT / example).read_text().rstrip("\n")
    assert text in listings((ROOT / doc).read_text()), (
        f"{doc} prints {example} whole, and the copy differs from the file: paste the file again"
    )


def test_listings_finds_each_block() -> None:
    md = "x\n```python\na = 1\n```\n```yaml\nb: 2\n```\n```python\nc = 3\nd = 4\n```\n"
    assert listings(md) == ["a = 1", "c = 3\nd = 4"]
    assert listings(md, "yaml") == ["b: 2"]
