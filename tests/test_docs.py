"""The front door and the documentation site: the README stays short and its
links resolve, and the commands page is what `profiler <command> --help`
prints (the site itself is built in strict mode by scripts/test.sh)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import profiler_cli
from docshape import TIME, doc_block
from docshape import mask as _mask

from profiler.cli import COMMANDS
from profiler.cli._reference import WIDTH, command_help, markdown

ROOT = Path(__file__).resolve().parents[1]


def test_readme_is_a_front_door_whose_links_resolve() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    for needed in ("bash scripts/main-job.sh", "bash scripts/test.sh", "profiler advise",
                   "profiler hang", "profiler compare", "profiler report"):
        assert needed in text, needed
    links = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert links, "the README links to the docs"
    missing = [t for t in links if not (ROOT / t).exists()]
    assert missing == [], missing
    # every page of the site's navigation exists (mkdocs --strict checks the rest)
    nav = re.findall(r":\s+(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert len(nav) >= 10 and [p for p in nav if not (ROOT / "docs" / p).is_file()] == []


def test_the_commands_page_is_the_clis_own_help() -> None:
    helps = command_help()
    assert sorted(helps) == sorted(COMMANDS)
    page = markdown()
    for name in COMMANDS:
        assert f"### profiler {name}" in page
        out = profiler_cli(name, "--help", env={"COLUMNS": str(WIDTH)}, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.rstrip() == helps[name].rstrip(), name
        assert out.stdout.rstrip() in page


# ---------------------------------------------------------------------------
# the README's advise example: real output pasted from the main job, checked
# here against what advise prints now, so a change of format shows
# ---------------------------------------------------------------------------
def _synthetic_advice() -> object:
    """Advice on a 2-rank Horovod-like job (test_breakdown's) where rank 1 is
    late by 6-14 ms a step: a breakdown, a claimed cause and the
    reconciliation, as on the main job."""
    import numpy as np
    from test_breakdown import horovod_job

    from profiler.analysis.findings import advise_frame

    rng = np.random.default_rng(3)
    df, meta = horovod_job([[20.0, 20.0 + float(rng.uniform(6, 14))] for _ in range(24)])
    for c in ("op", "backend", "thread_kind", "kind"):
        df[c] = df[c].astype("category")
    return advise_frame(df, meta, path="trace.json")


@pytest.mark.parametrize("doc", ["README.md", "docs/guide/findings.md"])
def test_the_docs_advise_example_has_the_shape_advise_prints(doc: str) -> None:
    from profiler.cli.advise import breakdown_lines, header_line
    from profiler.cli.advise import render as render_advice

    a = _synthetic_advice()
    got = render_advice(a, width=100).splitlines()
    block = doc_block(ROOT / doc, "$ profiler advise ")
    # the header, words and order, after the path
    assert _mask(block[0].split(": ", 1)[1]) == _mask(header_line(a).split(": ", 1)[1])
    # "Where a step goes": the same title, the same parts in the same order,
    # each line as advise lays it out, and the reconciliation's sentence
    parts = breakdown_lines(a, 100)
    title = next(k for k, x in enumerate(block) if x.startswith("Where a step goes"))
    assert _mask(block[title]) == _mask(parts[0])
    labels = [str(x) for x in a.breakdown["label"]]
    rows = block[title + 1:title + 1 + len(labels)]
    assert [r[2:2 + len(x)] for r, x in zip(rows, labels)] == labels, rows
    row = re.compile(rf"^  (?:{'|'.join(map(re.escape, labels))})\s+{TIME}\s+(?:<1%|\d+%)"
                     rf"(?:\s+\u2588*)?(?:\s+\[{TIME}, {TIME}\])?(?: \u2190 \d+(?:, \d+)*)?$")
    assert all(row.match(r) for r in rows), [r for r in rows if not row.match(r)]
    assert all(row.match(r) for r in parts[1:1 + len(labels)])  # the pattern is advise's
    rec_readme = " ".join(x.strip() for x in block[title + 1 + len(labels):]
                          if x.strip()).split(" 1. ")[0]
    rec = " ".join(x.strip() for x in parts[1 + len(labels):])
    assert rec and _mask(rec_readme.split("explains.")[0]) == _mask(rec.split("explains.")[0])
    # each finding's cost as advise prints it
    cost = re.compile(rf"\[(?:cost|explains): {TIME}/step \[{TIME}, {TIME}\], ~\d+ img/s\]")
    shown = [x for x in block if re.match(r"\s*\[(?:cost|explains):", x)]
    assert shown and all(cost.fullmatch(x.strip()) for x in shown), shown
    assert any(cost.search(x) for x in got)
