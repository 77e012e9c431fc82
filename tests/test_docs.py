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


def _site_hooks() -> object:
    """docs/hooks.py, the site's generator, as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("site_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_list_is_generated_from_the_parsers() -> None:
    hooks: object = _site_hooks()
    page = (ROOT / "docs" / "reference" / "commands.md").read_text(encoding="utf-8")
    # the page holds the generators' markers, and no list written by hand
    assert hooks.COMMAND_LIST in page and hooks.COMMANDS in page  # type: ignore[attr-defined]
    assert not re.search(r"^\s+profiler \w+", page, re.M)
    table = hooks.command_list()  # type: ignore[attr-defined]
    rows = [r for r in table.splitlines() if r.startswith("| [`profiler ")]
    # one row per command, in COMMANDS' order, linked to its options' section
    assert [re.match(r"\| \[`profiler ([\w-]+)", r).group(1) for r in rows] == list(COMMANDS)
    assert all(f"](#profiler-{n})" in r for n, r in zip(COMMANDS, rows))
    # what a command must be given: bench's output directory (a line without it fails)
    assert "| [`profiler bench -o DIR`](#profiler-bench) |" in table
    rendered = hooks.on_page_markdown(page, None, {"docs_dir": str(ROOT / "docs")})  # type: ignore[attr-defined]
    assert "<!--" not in rendered and "### profiler watch" in rendered


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


# ---------------------------------------------------------------------------
# the findings page documents exactly the keys the analyzers give
# ---------------------------------------------------------------------------
def _analyzer_keys() -> tuple[set[str], set[str]]:
    """(finding keys, limit keys) that analysis/findings/ can give, read from
    its source: every `Finding(key="...")` (a limit when kind="limit") and
    every `_limit("...")` of limits.py."""
    import ast

    findings: set[str] = set()
    limits: set[str] = set()
    for path in sorted((ROOT / "analysis" / "findings").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            if node.func.id == "Finding" and isinstance(kw.get("key"), ast.Constant):
                kind = kw.get("kind")
                limit = isinstance(kind, ast.Constant) and kind.value == "limit"
                (limits if limit else findings).add(str(kw["key"].value))  # type: ignore[union-attr]
            elif (node.func.id == "_limit" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                limits.add(str(node.args[0].value))
    return findings, limits


def _documented_keys(header: str) -> set[str]:
    """The first column of findings.md's table whose header cell is `header`
    ("a / b" cells name two keys)."""
    lines = (ROOT / "docs" / "guide" / "findings.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(f"| {header} |"))
    keys: set[str] = set()
    for row in lines[start + 2:]:
        if not row.startswith("|"):
            break
        keys |= {k.strip() for k in row.split("|")[1].split("/")}
    return keys


def test_the_findings_page_documents_every_key_the_analyzers_give() -> None:
    findings, limits = _analyzer_keys()
    # the analyzers as they are: 19 finding keys, 9 limits (a new one must be documented)
    assert len(findings) == 19 and len(limits) == 9, (sorted(findings), sorted(limits))
    assert {"elastic", "late_ranks", "latency_cliffs", "slow_link", "cpu_quota",
            "cpuset"} <= findings
    assert "efficiency_bench" in limits
    assert _documented_keys("finding") == findings
    assert _documented_keys("limit") == limits


# ---------------------------------------------------------------------------
# the README's picture: there, drawn, and of the chart as the code draws it now
# ---------------------------------------------------------------------------
def test_the_readme_picture_is_current() -> None:
    import json

    import readme_picture as rp

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/img/breakdown.png)" in readme
    assert rp.png_size(rp.PICTURE) == rp.SIZE
    drawn = json.loads(rp.SIDECAR.read_text(encoding="utf-8"))
    assert drawn["trace"] == rp.TRACE.relative_to(ROOT).as_posix()
    assert drawn["digest"] == rp.digest(rp.figure()), (
        "docs/img/breakdown.png shows another chart than the code draws now: the test "
        "command redraws it (tests/test_report_browser.py -k readme_picture); commit it")
