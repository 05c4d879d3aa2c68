"""marconi.report: the one set of formatters and tables, and the atomic figure writer."""

from __future__ import annotations

import math
import os
import stat

import pytest

from marconi.report import (MISSING, fmt_pct, fmt_pts, fmt_seconds, fmt_signed_pct, fmt_times, format_table, md_table,
                            pyplot, save_figure)

FORMATTERS = (fmt_pct, fmt_signed_pct, fmt_pts, fmt_times, fmt_seconds)


@pytest.mark.parametrize("fmt", FORMATTERS)
@pytest.mark.parametrize("missing", [None, math.nan, math.inf, -math.inf])
def test_every_formatter_prints_one_dash_for_a_missing_value(fmt, missing):
    assert fmt(missing) == MISSING == "–"


def test_formatters_print_numbers():
    assert fmt_pct(0.1234) == "12.3%" and fmt_pct(0.1234, 0) == "12%" and fmt_pct(0.1234, 2) == "12.34%"
    assert fmt_signed_pct(0.2) == "+20.0%" and fmt_signed_pct(-0.05, 0) == "-5%"
    assert fmt_pts(0.0123) == "+1.23 pts" and fmt_pts(-0.5) == "-50.00 pts"
    assert fmt_times(4.5) == "4.50×"
    assert fmt_seconds(0.0123) == "12.3ms" and fmt_seconds(12.0) == "12.0s"
    assert fmt_seconds(9.1014) == "9.10s" and fmt_seconds(0.9994) == "999.4ms"     # one unit past a second


def test_md_table():
    assert md_table(["a", "b"], [[1, "x"], ["y", 2.5]]) == "| a | b |\n|---|---|\n| 1 | x |\n| y | 2.5 |"
    assert md_table(["only"], []) == "| only |\n|---|"


def test_format_table_aligns_and_marks_missing_values():
    text = format_table([{"name": "vllm+", "hit": 0.5}, {"name": "marconi-long", "hit": None}, {"name": "x"}],
                        [("system", "name", None), ("token hit", "hit", fmt_pct)])
    lines = text.splitlines()
    assert lines[0] == "system        token hit"
    assert lines[1] == "------------  ---------"
    assert lines[2] == "vllm+             50.0%"
    assert lines[3].endswith(f"  {MISSING}") and lines[4].endswith(f"  {MISSING}")
    assert len({len(line) for line in lines}) == 1


def test_save_figure_writes_a_png_atomically(tmp_path):
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = save_figure(fig, tmp_path / "sub" / "plot.png", dpi=50)
    assert path == tmp_path / "sub" / "plot.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)               # closed
    assert os.listdir(path.parent) == ["plot.png"]          # no temp file left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask   # not mkstemp's 0600


def test_save_figure_leaves_the_old_file_when_saving_fails(tmp_path):
    path = tmp_path / "plot.png"
    path.write_bytes(b"old")

    fig = pyplot().figure()

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    fig.savefig = broken
    with pytest.raises(RuntimeError, match="disk full"):
        save_figure(fig, path)
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["plot.png"]


def test_a_rerun_into_the_same_folder_drops_only_its_own_stale_plots(tmp_path) -> None:
    """``experiment sparse``/``headroom`` into an earlier run's --out kept the earlier run's plots of
    other capacities or traces beside the new ones, which no record supported (audit). The plots an
    earlier run noted as its own that this run did not write go; nothing else does, not even a file
    named like a plot that no run wrote (``compare`` deleted a user's ``*_hit_rate.png``: audit)."""
    from marconi.report import PLOTS_NOTE, drop_stale_plots

    earlier = [tmp_path / name for name in ("w_0.25x_simulation.png", "w_1x_simulation.png", "w_analytic.png")]
    for path in earlier:
        path.write_text("x")
    assert drop_stale_plots(tmp_path, ("*_simulation.png", "*_analytic.png"), earlier) == []
    for name in ("mine_simulation.png", "mine.png", "notes.txt"):     # put there by someone else
        (tmp_path / name).write_text("x")
    written = [tmp_path / "w_1x_simulation.png", tmp_path / "w_analytic.png"]
    removed = drop_stale_plots(tmp_path, ("*_simulation.png", "*_analytic.png"), written)
    assert [p.name for p in removed] == ["w_0.25x_simulation.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [PLOTS_NOTE, "mine.png", "mine_simulation.png", "notes.txt",
                                                          "w_1x_simulation.png", "w_analytic.png"]
