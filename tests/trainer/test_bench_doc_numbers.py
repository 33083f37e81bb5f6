"""docs/tasks.md and docs/agents.md quote their experiment numbers from the committed records (bench/doc_numbers.py)."""

import json
import shutil
from pathlib import Path

import pytest

from tests.support.helpers import ROOT, bench_module

DATA = ROOT / "docs" / "results" / "data"


@pytest.fixture(scope="module")
def mod():
    return bench_module("doc_numbers")


def test_the_docs_match_what_the_renderer_prints(mod) -> None:
    diffs = mod.stale()
    assert not diffs, "docs drifted from their records: run .venv/bin/python bench/doc_numbers.py\n" + "".join(diffs)


def test_the_v1_statistics_are_the_superseded_reports(mod) -> None:
    # bench/customer_service.py's report on the same records printed: RL - sft at the end, pass^1
    # "+0.034 ... paired t(4) = 6.32, p = 0.00321, n = 5 seeds"; pass^1 rl 0.016 -> 0.052, sft 0.017.
    v = mod.tasks_values(DATA)
    assert v["v1_seeds"] == 5 and v["v1_p"] == pytest.approx(0.00321, abs=5e-6)
    assert (round(v["v1_v0"], 3), round(v["v1_rl"], 3), round(v["v1_sft"], 3)) == (0.016, 0.052, 0.017)
    assert v["first_fit"] == 0.276 and v["guess_below"] == 0.005  # the largest guess: random_user 0.00425


def _copy_docs_and_data(tmp: Path) -> tuple[Path, Path]:
    data, docs = tmp / "data", tmp / "docs"
    shutil.copytree(DATA / "customer_service", data / "customer_service")
    shutil.copy(DATA / "agent_endpoint.json", data / "agent_endpoint.json")
    docs.mkdir()
    for name in ("tasks.md", "agents.md"):
        shutil.copy(ROOT / "docs" / name, docs / name)
    return data, docs


def test_a_changed_record_changes_the_table_and_the_prose(mod, tmp_path: Path) -> None:
    data, docs = _copy_docs_and_data(tmp_path)
    path = data / "customer_service" / "baselines.json"
    rec = json.loads(path.read_text())
    next(r for r in rec["rows"] if r["policy"] == "first_fit")["success"] = 0.3141
    path.write_text(json.dumps(rec))
    path = data / "agent_endpoint.json"
    rec = json.loads(path.read_text())
    next(r for r in rec["models"]["h64"]["rows"] if r["sessions"] == 32 and r["path"] == "endpoint")["ratio"] = 0.5
    path.write_text(json.dumps(rec))
    out = {p.name: text for p, text in mod.render(data, docs).items()}
    assert "| look the user up, act on the first order whose status fits (the status shortcut) | 0.3141 [" in out["tasks.md"]
    assert "The best shortcut is the status one, 0.314" in out["tasks.md"]
    assert "it has to beat 0.31 (the status shortcut)" in out["tasks.md"]
    assert "above **0.31**" in out["tasks.md"]  # now the best trivial policy
    assert "(0.50x at `h64`" in out["agents.md"] and "| h64 | 32 | 7,342 | 2,267 | 0.50 ± 0.07 |" in out["agents.md"]
    assert sorted(Path(d.splitlines()[0][4:]).name for d in mod.stale(data, docs)) == ["agents.md", "tasks.md"]


def test_a_quote_must_stand_exactly_once(mod) -> None:
    text = "held at 0.276 here,\nand at 0.5 there"
    assert mod.fill_quote(text, "held at {x:.2f} here,", {"x": 0.3}) == "held at 0.30 here,\nand at 0.5 there"
    assert mod.fill_quote(text, "here, and at {x:.1f} there", {"x": 0.25}).endswith("and at 0.2 there")  # wraps
    with pytest.raises(ValueError, match="found 0 times"):
        mod.fill_quote(text, "nowhere {x}", {"x": 1})
    with pytest.raises(ValueError, match="found 2 times"):
        mod.fill_quote(text + "\nheld at 1.0 here,", "held at {x:.2f} here,", {"x": 0.3})


def test_the_figures_not_from_records_are_listed_and_still_there(mod) -> None:
    for name, phrases in mod.NOT_FROM_RECORDS.items():
        text = " ".join((ROOT / "docs" / name).read_text().split())
        for phrase in phrases:
            assert phrase in text, f"docs/{name} no longer says {phrase!r}: update NOT_FROM_RECORDS"
