"""The report schema and fk-leaderboard, on real reports: the reference, the example tree, a stub tree."""
import copy
import json
from pathlib import Path

import pytest

from board_reports import board_reports  # noqa: F401  (the session fixture)
from conftest import ROOT
from fk_pytest import leaderboard, report, status
from fk_pytest.schema import InvalidReport, load_report, schema, schema_errors, validate_report

# Being added to fk_pytest.status in parallel; the schema lists it already (a no-op once it is there).
COMING_STATUSES = {"NOT_IMPLEMENTED"}


def _board(capsys, *paths, html=None):
    rc = leaderboard.main([str(p) for p in paths] + (["--html", str(html)] if html else []))
    out, err = capsys.readouterr()
    return rc, out, err


def _rank_rows(out, group=1):
    """{candidate label: row cells} of the ranking table of one group in the text output."""
    block = out.split("== group ")[group]
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("rank "))
    rows = {}
    for line in lines[start + 2:]:
        if not line or line.startswith("note:"):
            break
        cells = line.split()
        rows[cells[1]] = cells
    return rows


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


# ---- the schema -------------------------------------------------------------------------------------
def test_schema_lists_exactly_the_statuses_of_the_status_module():
    constants = {v for k, v in vars(status).items() if k.isupper() and isinstance(v, str)}
    assert set(schema()["$defs"]["status"]["enum"]) == constants | COMING_STATUSES


def test_schema_ships_with_the_package_and_matches_the_report_version():
    from fk_pytest.schema import SCHEMA_FILE
    assert SCHEMA_FILE.parent == Path(report.__file__).parent
    assert report.SCHEMA_VERSION in schema()["properties"]["schema_version"]["enum"]
    assert '"fk_pytest" = ["*.json"]' in (ROOT / "pyproject.toml").read_text()


def test_real_reports_validate(board_reports):
    for name, path in board_reports.items():
        data = json.loads(path.read_text())
        assert schema_errors(data) == [], name
        assert data["schema_version"] == report.SCHEMA_VERSION
        suite = data["run"]["suite"]
        assert suite["name"] == "fastkernels" and suite["version"]
        assert suite["commit"] is None or len(suite["commit"]) == 40  # a checkout (here) or a wheel
    assert report.main(["--validate", str(board_reports["stub"])]) == 0


def test_committed_gpu_reports_validate():
    """The H200 reports in docs/perf of schema 1.2 (CUDA fields: GPU, driver, clocks, roofline, graph
    timings, e2e) match the schema, which does not require the 1.3 field run.suite of them."""
    checked = 0
    for path in sorted((ROOT / "docs" / "perf").rglob("*.json")):
        data = json.loads(path.read_text())
        data = data.get("fastkernels", data) if isinstance(data, dict) else data
        if isinstance(data, dict) and data.get("schema_version") == "1.2":
            assert schema_errors(data) == [], path
            checked += 1
    assert checked >= 10


def test_a_report_that_breaks_the_schema_is_refused_with_the_path(board_reports, tmp_path, capsys):
    good = json.loads(board_reports["example"].read_text())
    no_status = copy.deepcopy(good)
    del no_status["tasks"][0]["status"]
    with pytest.raises(InvalidReport, match=r"\$\.tasks\[0\]: 'status' is a required property"):
        validate_report(no_status)
    bad = _write(tmp_path, "no_status.json", no_status)
    rc, out, err = _board(capsys, board_reports["reference"], bad)
    assert rc == 2 and out == ""
    assert f"{bad}: does not match report.schema.json: $.tasks[0]: 'status' is a required property" in err

    unknown = copy.deepcopy(good)
    unknown["tasks"][1]["cases"][0]["status"] = "ALMOST_PASSED"
    unknown["run"]["extra"] = 1  # closed objects: an undocumented field is an error too
    errors = schema_errors(unknown)
    assert any(e.startswith("$.run: Additional properties") for e in errors)
    assert any(e.startswith("$.tasks[1].cases[0].status: 'ALMOST_PASSED' is not one of") for e in errors)

    cuda = copy.deepcopy(good)
    cuda["run"]["device"] = cuda["environment"]["device"] = "cuda"
    assert any("'gpu' is a required property" in e for e in schema_errors(cuda))


def test_files_that_are_not_reports_are_refused(board_reports, tmp_path, capsys):
    text = _write(tmp_path, "x.json", {"schema": "something/else"})
    rc, _, err = _board(capsys, text)
    assert rc == 2 and f"{text}: is not a fastkernels.report/1 report (schema: 'something/else')" in err
    garbage = tmp_path / "g.json"
    garbage.write_text("{not json")
    assert _board(capsys, garbage)[0] == 2
    assert _board(capsys, tmp_path / "missing.json")[2].startswith("fk-leaderboard: refused:")
    bench = _write(tmp_path, "bench.json", {"benchmarks": []})
    assert "pytest-benchmark JSON without a FastKernels report" in _board(capsys, bench)[2]
    embedded = _write(tmp_path, "bench2.json",
                      {"benchmarks": [], "fastkernels": json.loads(board_reports["stub"].read_text())})
    assert load_report(embedded)["run"]["candidate"]["kind"] == "tree"


# ---- the board ----------------------------------------------------------------------------------------
def test_leaderboard_ranks_the_three_reports(board_reports, tmp_path, capsys):
    page = tmp_path / "board.html"
    rc, out, _ = _board(capsys, board_reports["stub"], board_reports["example"], board_reports["reference"],
                        html=page)
    assert rc == 0 and "3 reports in 1 group;" in out
    assert "all 3 reports comparable" in out
    rows = _rank_rows(out)
    reference, example = rows["reference"], next(r for k, r in rows.items() if k.startswith("triton@"))
    stub = next(r for k, r in rows.items() if k.startswith("stub_tree@"))
    assert list(rows) == [reference[1], example[1], stub[1]]  # ranked, whatever the input order
    assert reference[0] == example[0] == "1" and stub[0] == "3"  # a tie shares its rank
    assert reference[2] == "1.000" and stub[2] == "0.000"
    # CPU: fast_0 is the share valid; fast_1 .. fast_2 and the geomean are not measured, not 0
    assert reference[7] == "1.00" and stub[7] == "0.00"
    assert reference[8:] == ["-"] * 4 and stub[8:] == ["-"] * 4
    assert "not measured and shown as '-', not 0" in out
    entries = leaderboard.load_entries([board_reports[n] for n in ("reference", "example", "stub")])
    (group,) = leaderboard.group_entries(entries)
    order = [e for _, e, _ in leaderboard.ranked(group)]
    cells = dict(leaderboard.matrix(group, order))
    assert set(cells) == {"rms_norm", "silu_and_mul"}
    for task in cells:
        assert cells[task][0] == cells[task][1] == ("PASSED", "2/2")  # reference, example: 2 draws of 1 case
        assert cells[task][2][0] != "PASSED"
    assert cells["silu_and_mul"][2] == ("NOT_ATTEMPTED", "")
    assert cells["rms_norm"][2][0] == "NOT_IMPLEMENTED"
    matrix_text = out.split("task x candidate")[1]
    assert "silu_and_mul  PASSED 2/2" in matrix_text and "NOT_ATTEMPTED" in matrix_text
    assert "L1 " in out and "norm " in out and "activation " in out  # per level and per family rows
    text = page.read_text()
    assert "<svg" in text and text.count("<table") == 4 and "http" not in text.replace(
        "http://www.w3.org/2000/svg", "")  # self-contained


def test_other_seed_or_device_goes_to_its_own_group(board_reports, tmp_path, capsys):
    seeded = json.loads(board_reports["example"].read_text())
    seeded["run"]["seed"] = 7
    gpu = json.loads(board_reports["reference"].read_text())
    gpu["run"]["device"] = gpu["environment"]["device"] = "cuda"
    gpu["environment"].update(gpu="NVIDIA H200", driver="570.124.06")
    paths = [board_reports["reference"], board_reports["stub"], _write(tmp_path, "seed.json", seeded),
             _write(tmp_path, "gpu.json", gpu)]
    rc, out, _ = _board(capsys, *paths)
    assert rc == 0 and "4 reports in 3 groups" in out
    headers = [line for line in out.splitlines() if line.startswith("== group")]
    assert headers[0].startswith("== group 1 of 3 (2 reports): the first group")
    assert headers[1] == "== group 2 of 3 (1 report): seed differs: none vs 7"
    assert headers[2] == "== group 3 of 3 (1 report): device differs: cpu vs NVIDIA H200"
    assert list(_rank_rows(out, 1)) == ["reference", next(k for k in _rank_rows(out, 1) if k.startswith("stub"))]


def test_gpu_reports_show_fast_p_and_the_geomean(capsys):
    """On GPU timings fast_p is a number: the committed H200 report of three L1 MoE/MLA tasks."""
    path = ROOT / "docs/perf/h200-moe-tasks/run2/l1-rest.json"
    tasks = json.loads(path.read_text())["tasks"]
    rc, out, _ = _board(capsys, path)
    assert rc == 0 and "NVIDIA H200 | full profile" in out and "shown as '-'" not in out
    (row,) = _rank_rows(out).values()
    for p, cell in zip((0, 1, 1.5, 2), row[7:11]):
        want = sum(t["valid"] and (p == 0 or (t["S_t"] or 0) > p) for t in tasks) / len(tasks)
        assert cell == f"{want:.2f}"
    assert float(row[11]) == pytest.approx(
        leaderboard.geomean([t["S_t"] for t in tasks if t["valid"]]), abs=1e-3)


def test_ties_in_macroeval_are_broken_by_c_then_cov(board_reports):
    base = json.loads(board_reports["stub"].read_text())
    entries = []
    for name, c, cov in (("a", 0.2, 0.0), ("b", 0.5, 0.0), ("c", 0.5, 0.5)):
        r = copy.deepcopy(base)
        r["macro"].update(C=c, Cov=cov, MacroEval=0.0)
        entries.append(leaderboard.Entry(name, r, name))
    (group,) = leaderboard.group_entries(entries)
    assert [(rank, e.label) for rank, e, _ in leaderboard.ranked(group)] == [(1, "c"), (2, "b"), (3, "a")]


def test_fast_p_counts_valid_tasks_over_p_and_is_missing_without_timings():
    tasks = [{"valid": True, "S_t": 2.5}, {"valid": True, "S_t": 1.2}, {"valid": False, "S_t": None},
             {"valid": True, "S_t": 0.9}]
    assert [leaderboard.fast_p(tasks, p, True) for p in (0, 1, 1.5, 2)] == [0.75, 0.5, 0.25, 0.25]
    assert leaderboard.fast_p(tasks, 0, False) == 0.75 and leaderboard.fast_p(tasks, 1, False) is None
