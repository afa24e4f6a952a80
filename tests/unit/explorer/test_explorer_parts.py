"""The explorer's parts on their own: audit report spellings, SVG charts, filters, server and command."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from click.testing import CliRunner

from krill.cli import cli
from krill.explorer.audit_status import AuditReportError, AuditStatus, parse_report
from krill.explorer.charts import line_chart, nice_ticks, stacked_bars
from krill.explorer.database import open_read_only
from krill.explorer.server import make_explorer_server
from krill.explorer.templating import short, tokens
from krill.explorer.web import ExplorerApp


def test_audit_report_spellings(tmp_path):
    run, versions = parse_report({"run_id": "0x" + "ab" * 32, "audit": {"ok": False, "versions": [1, 2, 3],
                                                                       "failures": ["v2: manifest", "v2: weights"]}})
    assert run == "ab" * 32
    assert versions[1]["status"] == "passed" and versions[2] == {"status": "failed",
                                                                 "failed_checks": ["manifest", "weights"], "checks": None}
    _, single = parse_report({"run_id": "cd" * 32, "version": 4, "ok": True,
                              "checks": [{"name": "a", "ok": True, "detail": ""}], "contributions": []})
    assert single == {4: {"status": "passed", "failed_checks": [], "checks": 1}}
    with pytest.raises(AuditReportError):
        parse_report({"versions": [{"nope": 1}]})
    for bad in ({"failures": None}, {"failures": "v1: x"}, {"versions": {"1": 1}}):
        with pytest.raises(AuditReportError, match=f"audit.{next(iter(bad))} is"):
            parse_report({"audit": {"ok": False, "versions": [1], **bad}})
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"run_id": "cd" * 32, "version": 4, "ok": False,
                                "checks": [{"name": "x", "ok": False, "detail": ""}]}))
    status = AuditStatus(path)
    assert status.of(4)["status"] == "failed" and status.of(5)["status"] == "not audited"
    assert status.of(4, run_id="ab" * 32)["status"] == "not audited"  # a report about another run
    path.write_text("not json")
    with pytest.raises(AuditReportError, match="not JSON"):
        AuditStatus(path)


def test_a_report_not_written_yet_is_read_once_it_appears(tmp_path):
    path = tmp_path / "summary.json"  # the demo writes it only at the end
    status = AuditStatus(path)
    assert status.of(1)["status"] == "not audited"
    path.write_text(json.dumps({"run_id": "cd" * 32, "version": 1, "ok": True,
                                "checks": [{"name": "x", "ok": True, "detail": ""}]}))
    assert status.of(1)["status"] == "passed"


def test_charts_are_escaped_svg_without_script():
    chart = line_chart("<b>accuracy</b>", {"a": [(0, 0.1), (1, None), (2, float("nan")), (3, 0.4)],
                                          "b": [(0, 0.2), (3, 0.3)]}, y_range=(0.0, 1.0))
    assert str(chart).startswith("<svg") and "&lt;b&gt;accuracy&lt;/b&gt;" in chart and "<b>" not in chart
    assert chart.count("<polyline") == 2 and chart.count("<circle") == 4 and "script" not in chart
    bars = stacked_bars("per version", [1, 2], {"accepted": [3, 4], "rejected": [1, None]})
    assert bars.count('class="bar"') == 3
    assert "no data yet" in line_chart("empty", {"a": [(0, None)]})
    assert nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]


def test_filters():
    assert tokens(str(1234 * 10**18 + 567 * 10**15)) == "1,234.567" and tokens("0") == "0" and tokens(None) == "–"
    assert tokens(str(2**200)).startswith("1,606,938,044")
    assert short("0x" + "ab" * 20, 6) == "0xabab…ababab"


def test_served_over_http_with_headers(explorer_world):
    db = open_read_only(explorer_world.url)
    server = make_explorer_server(ExplorerApp(db, explorer_world.store), "127.0.0.1", 0, quiet=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        r = httpx.get(base + "/api/versions", timeout=10)
        assert r.status_code == 200 and r.json()["total"] == 3
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
        assert httpx.post(base + "/", timeout=10).status_code == 405
        assert httpx.get(base + "/static/style.css", timeout=10).headers["content-type"].startswith("text/css")
    finally:
        server.shutdown()
        server.server_close()
        db.close()


def test_command_is_listed_and_refuses_a_missing_database(tmp_path):
    runner = CliRunner()
    listed = runner.invoke(cli, ["--help"])
    assert "explorer" in listed.output
    result = runner.invoke(cli, ["--set", f"database.url=sqlite:///{tmp_path / 'none.db'}", "explorer", "--port", "0"])
    assert result.exit_code == 1 and "error: no database at" in result.output
    assert not (tmp_path / "none.db").exists()


def test_command_refuses_a_busy_port_in_one_line(explorer_world):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = CliRunner().invoke(cli, ["--set", f"database.url={explorer_world.url}", "explorer", "--port", str(port),
                                          "--no-store", "--quiet"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    line = f"error: cannot listen on 127.0.0.1:{port}: Address already in use; choose another --port"
    assert result.output.startswith(line) and result.output.count("\n") == 1, result.output


def test_command_names_an_unreachable_database_without_its_password():
    import socket

    with socket.socket() as closed:  # bound, never listening: a connection to it is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        url = f"postgresql+psycopg://alice:s3cret-pw@127.0.0.1:{port}/index"
        result = CliRunner().invoke(cli, ["--set", f"database.url={url}", "explorer", "--port", "0"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert result.output.startswith(f"error: cannot open the index database postgresql+psycopg://alice:***@127.0.0.1:"
                                    f"{port}/index: connection failed:"), result.output
    assert "refused" in result.output and result.output.count("\n") == 1 and "s3cret-pw" not in result.output
