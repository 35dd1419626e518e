"""hpcobs-report's PNG chart and `hpcobs-report board` (roles/slurm_metrics/files) against a real victoria-metrics.

The PNG files are decoded here (chunks, CRC, zlib, scanlines) and read back: the image size, the bars' pixel lengths
against the numbers they stand for, and the text drawn with the tool's bitmap font found at its pixels. The board is
rendered from the executive dashboard the grafana role ships; its stat values are compared with what this test
computes from the raw series it loaded.

Tools (victoria-metrics): HPCOBS_TOOLS_BIN, else .cache/tools/bin, else PATH. A missing tool fails.
"""
from __future__ import annotations

import datetime
import json
import struct
import subprocess
import time
import zlib
from pathlib import Path

import pytest
from test_jobstats_report import FILES, REPORT_END, REPORT_START, RULES, expected_report, report
from tooling import import_lines, tool, victoriametrics

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "roles" / "grafana" / "files" / "dashboards" / "hpcobs-executive.json"
NOW = (int(time.time()) - 60) // 15 * 15
LIVE = range(NOW - 1800, NOW + 1, 15)          # the last 30 minutes, every 15 s

FLEET = {"fleet:hpcobs_gpus:count": 16, "fleet:hpcobs_gpus_healthy:count": 13,
         "fleet:hpcobs_gpus_unhealthy:count": 3, "fleet:hpcobs_gpus_in_use:count": 12}
# (alertname, node, severity, alertstate, last sample seconds before NOW)
ALERTS = [("HpcobsGpuEccDbe", "gpu01", "critical", "firing", 0), ("HpcobsGpuXidCritical", "gpu02", "critical",
                                                                  "firing", 0),
          ("HpcobsNodeDown", "gpu03", "critical", "firing", 0), ("HpcobsGpuHot", "gpu01", "warning", "firing", 0),
          ("HpcobsGpuHot", "gpu02", "warning", "pending", 0),       # pending: not counted
          ("HpcobsGpuGone", "gpu04", "critical", "firing", 1200)]   # resolved 20 min ago: not counted
UTIL = {("gpu01", "0"): 80.0, ("gpu01", "1"): 0.0, ("gpu02", "0"): 45.0, ("gpu02", "1"): 97.0}
TOP_JOBS = {("7001", "alice", "physics"): 12.5, ("7002", "carol", "physics"): 4.0, ("7003", "bob", "chemistry"): 7.5}


def board_series():
    series = {}
    for metric, value in FLEET.items():
        series[(metric, ())] = [(t, value) for t in LIVE]
    for name, node, severity, state, ended in ALERTS:
        labels = (("alertname", name), ("alertstate", state), ("node", node), ("severity", severity))
        series[("ALERTS", labels)] = [(t, 1) for t in LIVE if t <= NOW - ended]
    # the board reads the vmalert role's record of the mean utilisation (its rule is unit-tested in
    # tests/rules/gpu_inventory.test.yml)
    series[("fleet:hpcobs_gpu_utilization_percent:avg", ())] = [(t, sum(UTIL.values()) / len(UTIL)) for t in LIVE]
    for (job, user, account), hours in TOP_JOBS.items():
        labels = (("account", account), ("hpc_job", job), ("user", user))
        series[("hpc_job:hpcobs_gpu_hours:increase24h", labels)] = [(t, hours) for t in LIVE]
        series[("hpc_job:hpcobs_gpu_energy_kwh:increase24h", labels)] = [(t, hours * 0.4) for t in LIVE]
    # the per-account power comes from the report's recording-rule series (RULES), 2 hours within the board's range
    series[("fleet:hpcobs_gpu_power_watts:sum", ())] = [(t, 3400.0) for t in LIVE]
    return series


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    lines = import_lines(dict(list(RULES.items()) + list(board_series().items())))
    with victoriametrics(tmp_path_factory.mktemp("vm"), lines, ["-retentionPeriod=10y"]) as url:
        yield url


# ------------------------------------------------------------------------------------------------ reading PNGs
def decode(data):
    """(width, height, rows): rows[y] is bytes of RGB triplets. Checks the signature, every chunk's CRC, the header."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, tag = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF, tag
        if tag == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif tag == b"IDAT":
            idat += body
        pos += 12 + length
        if tag == b"IEND":
            break
    assert pos == len(data), "bytes after IEND"
    width, height, depth, colour, _, _, interlace = header
    assert (depth, colour, interlace) == (8, 2, 0)    # 8-bit RGB, not interlaced
    raw = zlib.decompress(idat)
    stride = width * 3 + 1
    assert len(raw) == stride * height
    rows = []
    for y in range(height):
        assert raw[y * stride] == 0, "filter type"   # the writer uses filter 0 (None) on every scanline
        rows.append(raw[y * stride + 1:(y + 1) * stride])
    return width, height, rows


def pixel(rows, x, y):
    return tuple(rows[y][3 * x:3 * x + 3])


def bar_lengths(width, rows, color=report.BAR):
    """The bars top to bottom: (first row, rows high, first x, pixels long) of each run of rows holding the colour."""
    target = bytes(color)
    bars, current = [], None
    for y, row in enumerate(rows):
        xs = [x for x in range(width) if row[3 * x:3 * x + 3] == target]
        if xs:
            assert xs == list(range(xs[0], xs[0] + len(xs))), "a bar is one run of pixels"
            if current and current[0] + current[1] == y and tuple(current[2:]) == (xs[0], len(xs)):
                current[1] += 1
                continue
            current = [y, 1, xs[0], len(xs)]
            bars.append(current)
    return [tuple(b) for b in bars]


def find_text(width, height, rows, text, color, scale):
    """Where the tool's font drew text in that colour and scale, with no glyph of that colour right beside it."""
    on, off = [], []
    for index, char in enumerate(text):
        for row, bits in enumerate(report.glyph(char)):
            for col in range(6):
                block = (index * 6 + col, row)
                (on if col < 5 and bits & (0x10 >> col) else off).append(block)
    on.sort(key=lambda b: (b[1], b[0]))
    first = on[0]
    target = bytes(color)
    cells = len(text) * 6
    found = []
    for y in range(height):
        row = rows[y]
        for x in range(width):
            if row[3 * x:3 * x + 3] != target:
                continue
            ox, oy = x - first[0] * scale, y - first[1] * scale
            if ox < 0 or oy < 0 or ox + cells * scale > width + scale or oy + 7 * scale > height:
                continue
            if all(pixel(rows, ox + bx * scale, oy + by * scale) == color for bx, by in on) and \
                    not any(pixel(rows, ox + bx * scale, oy + by * scale) == color for bx, by in off
                            if ox + bx * scale < width):
                beside = [pixel(rows, px, py) for py in range(oy, oy + 7 * scale)
                          for px in list(range(max(0, ox - 6 * scale), ox)) +
                          list(range(ox + cells * scale, min(width, ox + (cells + 6) * scale)))]
                if color not in beside:
                    found.append((ox, oy))
    return found


def test_the_font_has_a_distinct_5x7_glyph_for_every_character_it_draws():
    glyphs = {char: tuple(rows) for char, rows in report.FONT.items()}
    assert all(len(rows) == 7 and all(0 <= r < 32 for r in rows) for rows in glyphs.values())
    assert len(set(glyphs.values())) == len(glyphs)              # no two characters look alike
    assert all(any(rows) for char, rows in glyphs.items() if char != " ")
    assert set("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.,:-_/%()") <= set(glyphs)
    assert report.glyph("k") == report.glyph("K") and report.glyph("~") == report.glyph("?")


# ------------------------------------------------------------------------------------------------ the report's chart
def run_report(vm, out_dir, *extra):
    start = datetime.datetime.fromtimestamp(REPORT_START, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M")
    end = datetime.datetime.fromtimestamp(REPORT_END, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M")
    out = subprocess.run(["python3", str(FILES / "hpcobs-report"), "--url", vm, "--start", start, "--end", end,
                          "--out-dir", str(out_dir), "--json", *extra], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_report_png_bars_are_proportional_to_the_gpu_hours(vm, tmp_path):
    built = run_report(vm, tmp_path)
    pngs = sorted(tmp_path.glob("*.png"))
    assert len(pngs) == 1 and pngs[0].name.startswith("hpcobs-report-") and pngs[0].stat().st_size > 500
    name = pngs[0].name[len("hpcobs-report-"):-len(".png")]
    width, height, rows = decode(pngs[0].read_bytes())
    accounts = sorted((r for r in built["rows"] if r["level"] == "account"), key=lambda r: -r["gpu_hours"])
    assert [r["account"] for r in accounts] == ["physics", "chemistry"]
    assert (width, height) == (report.BAR_X + report.BAR_MAX + 340, 100 + len(accounts) * report.BAR_ROW + 16)
    bars = bar_lengths(width, rows)
    assert len(bars) == len(accounts)
    for (y, high, x, _), next_bar in zip(bars, bars[1:] + [None]):
        assert (high, x) == (report.BAR_HEIGHT, report.BAR_X)
        if next_bar:
            assert next_bar[0] - y == report.BAR_ROW
    largest = accounts[0]["gpu_hours"]
    # exactly the tool's own numbers, to the pixel
    for (_, _, _, length), row in zip(bars, accounts):
        assert abs(length - report.BAR_MAX * row["gpu_hours"] / largest) <= 0.5 + 1e-9, row["account"]
    # and the GPU-hours summed here from the raw samples: physics 7 h, chemistry 3 h
    expected = expected_report()["account_hours"]
    assert expected["physics"] == pytest.approx(7.0, rel=0.01) and expected["chemistry"] == pytest.approx(3.0, rel=0.01)
    ratio = bars[1][3] / bars[0][3]
    assert ratio == pytest.approx(expected["chemistry"] / expected["physics"], abs=0.02)
    # the title names the period; each bar's text gives its GPU-hours, kWh and share
    assert find_text(width, height, rows, "GPU-hours per account: %s" % name, report.INK, 3)
    for row in accounts:
        assert find_text(width, height, rows, row["account"], report.INK, 2), row["account"]
        label = "%.1f h  %.1f kWh  %.0f%%" % (row["gpu_hours"], row["energy_kwh"], 100 * row["share"])
        assert find_text(width, height, rows, label, report.GREY, 2), label


def test_report_no_png_writes_only_csv_and_markdown(vm, tmp_path):
    run_report(vm, tmp_path, "--no-png")
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".csv", ".md"]


def test_report_png_of_an_empty_period_says_so(tmp_path):
    empty = {"start": 0, "end": 3600, "total_gpu_hours": 0.0, "total_energy_kwh": 0.0, "rows": [], "factors": {}}
    width, height, rows = decode(report.report_png(empty, "1970-01"))
    assert bar_lengths(width, rows) == []
    assert find_text(width, height, rows, "No GPU use by any account in the period.", report.INK, 2)


def test_month_to_date_runs_from_the_first_of_the_month(vm, tmp_path):
    parser_args = type("A", (), {"month_to_date": True, "start": None, "end": None, "month": None})()
    start, end, name = report.period(parser_args)
    first = datetime.datetime.fromtimestamp(start, datetime.timezone.utc)
    assert (first.day, first.hour, first.minute) == (1, 0, 0) and end > start and abs(end - time.time()) < 120
    assert name.startswith(first.strftime("%Y-%m") + "-to-")
    both = subprocess.run(["python3", str(FILES / "hpcobs-report"), "--url", vm, "--month-to-date", "--month",
                           "2026-01", "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert both.returncode == 1 and "--month-to-date goes alone" in both.stderr


# ------------------------------------------------------------------------------------------------ the board
@pytest.fixture(scope="module")
def board(vm, tmp_path_factory):
    out = tmp_path_factory.mktemp("board")
    return out, report.board(vm, str(DASHBOARD), str(out), 86400, now=NOW)


def shipped_panels():
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p.get("targets")]


def test_board_renders_one_png_per_panel_of_the_executive_dashboard(board):
    out, done = board
    panels = shipped_panels()
    assert [d["title"] for d in done] == [p["title"] for p in panels]
    assert not [d for d in done if d.get("error")]
    files = sorted(out.glob("*.png"))
    assert len(files) == len(panels) == len({d["file"] for d in done})
    for entry in done:
        width, height, rows = decode(Path(entry["file"]).read_bytes())
        assert width == 960 or width == report.BAR_X + report.BAR_MAX + 340
        assert find_text(width, height, rows, entry["title"][:50], report.INK, 3), entry["title"]


def number_panel(done, title):
    entry = next(d for d in done if d["title"] == title)
    panel = next(p for p in shipped_panels() if p["title"] == title)
    return entry, panel["fieldConfig"]["defaults"]


def assert_big_number(entry, defaults, legend, expected):
    values = dict(entry["values"])
    assert values[legend] == pytest.approx(expected), legend
    index = [k for k, _ in entry["values"]].index(legend)
    text = report.format_value(expected, defaults.get("unit"), defaults.get("decimals"))
    width, height, rows = decode(Path(entry["file"]).read_bytes())
    color = report.PALETTE[index % len(report.PALETTE)]
    assert any(find_text(width, height, rows, text, color, scale) for scale in range(2, 11)), (legend, text)
    assert find_text(width, height, rows, legend, report.GREY, 2), legend


def test_board_stat_values_are_those_of_the_raw_series(board):
    _, done = board
    firing = {}
    for name, node, severity, state, ended in ALERTS:
        if state == "firing" and ended < 300:      # a sample inside the 5 min look-back at the board's time
            firing[severity] = firing.get(severity, 0) + 1
    entry, defaults = number_panel(done, "Firing alerts")
    assert firing == {"critical": 3, "warning": 1}
    assert_big_number(entry, defaults, "Critical", firing["critical"])
    assert_big_number(entry, defaults, "Warning", firing["warning"])
    assert_big_number(entry, defaults, "Info", 0)
    entry, defaults = number_panel(done, "GPU fleet health")
    assert_big_number(entry, defaults, "Healthy", FLEET["fleet:hpcobs_gpus_healthy:count"])
    assert_big_number(entry, defaults, "Unhealthy", FLEET["fleet:hpcobs_gpus_unhealthy:count"])
    entry, defaults = number_panel(done, "GPU use now")
    assert_big_number(entry, defaults, "Busy (mean utilisation)", sum(UTIL.values()) / len(UTIL))
    assert_big_number(entry, defaults, "Allocated to jobs",
                      100 * FLEET["fleet:hpcobs_gpus_in_use:count"] / FLEET["fleet:hpcobs_gpus:count"])


def test_board_table_bars_and_time_series(board):
    _, done = board
    top = next(d for d in done if d["title"].startswith("Top jobs"))
    width, height, rows = decode(Path(top["file"]).read_bytes())
    bars = bar_lengths(width, rows)
    hours = sorted(TOP_JOBS.values(), reverse=True)
    energy = [h * 0.4 for h in hours]
    assert len(bars) == 6                 # two queries, three jobs each
    for (_, _, _, length), value, largest in zip(bars, hours + energy, [hours[0]] * 3 + [energy[0]] * 3):
        assert abs(length - report.BAR_MAX * value / largest) <= 0.5 + 1e-9
    power = next(d for d in done if d["title"] == "GPU power by account")
    series = dict(power["values"])
    assert set(series) == {"physics", "chemistry", "not in a job"}
    for account in ("physics", "chemistry"):
        raw = {v for (m, ls), pts in RULES.items() if m == "account:hpcobs_gpu_power_watts:sum"
               and dict(ls)["account"] == account for _, v in pts}
        assert len(series[account]) > 10 and {v for _, v in series[account]} <= raw, account
    width, height, rows = decode(Path(power["file"]).read_bytes())
    assert any(pixel(rows, x, y) == report.PALETTE[0] for y in range(height) for x in range(0, width, 2))


def write_dashboard(path, expr, templating=(), kind="stat"):
    path.write_text(json.dumps({"templating": {"list": list(templating)},
                                "panels": [{"type": kind, "title": "T", "targets": [{"expr": expr, "refId": "A"}]}]}))
    return str(path)


def test_board_variables_defaults_and_clear_failures(vm, tmp_path):
    values = report.variables({"templating": {"list": [
        {"name": "account", "type": "query", "includeAll": True, "current": {"value": "$__all"}},
        {"name": "partition", "type": "custom", "query": "gpu,cpu", "current": {}},
        {"name": "site", "type": "constant", "query": "lab"}]}}, 86400, 288, 15, {"partition": "big"})
    expr = report.substitute('rate(x{account=~"$account",partition="${partition}",site="[[site]]"}[$__rate_interval])'
                             ' / $__range_s', values, "T")
    assert expr == 'rate(x{account=~".*",partition="big",site="lab"}[303s]) / 86400'
    assert report.substitute('x{a=~"b$"}', values, "T") == 'x{a=~"b$"}'      # a regex anchor is not a variable
    with pytest.raises(report.Error, match=r"\$cluster.*--var cluster=VALUE"):
        report.board(vm, write_dashboard(tmp_path / "d.json", "up{cluster='$cluster'}"), str(tmp_path), 3600, NOW)
    # the same through the command line, then with the variable given
    dash = write_dashboard(tmp_path / "d.json", 'count(fleet:hpcobs_gpus:count{x!~"$cluster"})')
    bad = subprocess.run(["python3", str(FILES / "hpcobs-report"), "board", "--url", vm, "--dashboard", dash,
                          "--out-dir", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "$cluster" in bad.stderr
    good = subprocess.run(["python3", str(FILES / "hpcobs-report"), "board", "--url", vm, "--dashboard", dash,
                           "--var", "cluster=none", "--out-dir", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=60)
    assert good.returncode == 0, good.stderr
    assert good.stdout.split()[0] == str(tmp_path / "o" / "hpcobs-board-01-t.png")
    # a panel type the tool does not draw is named, and the exit status says so
    text = write_dashboard(tmp_path / "t.json", "vector(1)", kind="piechart")
    other = subprocess.run(["python3", str(FILES / "hpcobs-report"), "board", "--url", vm, "--dashboard", text,
                            "--out-dir", str(tmp_path / "p")], capture_output=True, text=True, timeout=60)
    assert other.returncode == 1 and "'piechart' is not rendered" in other.stderr


@pytest.mark.parametrize("kind", ["stat", "timeseries", "table"])
def test_board_shows_no_value_for_nan_and_inf_as_grafana_does(vm, tmp_path, kind):
    dash = write_dashboard(tmp_path / "d.json", "fleet:hpcobs_gpus:count / 0", kind=kind)
    done = report.board(vm, dash, str(tmp_path), 3600, now=NOW)
    assert done[0]["values"] == [] and not done[0].get("error")
    width, height, rows = decode(Path(done[0]["file"]).read_bytes())
    assert find_text(width, height, rows, "No data", report.GREY, 2 if kind == "table" else 4)


def test_board_command_line_defaults_to_the_shipped_dashboard(vm, tmp_path):
    out = subprocess.run(["python3", str(FILES / "hpcobs-report"), "board", "--url", vm, "--out-dir", str(tmp_path),
                          "--range", "2h"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    printed = [line.split()[0] for line in out.stdout.splitlines()]
    assert printed == sorted(str(p) for p in tmp_path.glob("*.png")) and len(printed) == len(shipped_panels())
