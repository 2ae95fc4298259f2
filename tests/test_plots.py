"""The HTML report's inline charts: bars start at 1x and go the right way, invalid entries are grey."""
import re

from fk_pytest.plots import GOOD, BAD, MUTED, LABEL_W, PLOT_W, share_chart, speedup_chart


def _rects(svg):
    return [dict(re.findall(r"(\w+)='([^']*)'", r)) for r in re.findall(r"<rect [^>]*>", svg)]


def test_speedup_bars_are_symmetric_on_a_log_axis_and_coloured_by_validity():
    svg = speedup_chart([("faster", 2.0, True), ("slower", 0.5, True), ("invalid", 2.0, False), ("untimed", None, True)])
    fast, slow, invalid = _rects(svg)
    centre = LABEL_W + PLOT_W / 2
    assert float(fast["x"]) == centre and float(slow["x"]) + float(slow["width"]) == centre
    assert float(fast["width"]) == float(slow["width"]) > 0  # 2x and 1/2x: same length
    assert (fast["fill"], slow["fill"], invalid["fill"]) == (GOOD, BAD, MUTED)
    assert "not timed" in svg and speedup_chart([]) == ""


def test_speedups_beyond_the_axis_are_clipped_and_shares_scale_linearly():
    (huge,) = _rects(speedup_chart([("huge", 1000.0, True)], span=4.0))
    assert float(huge["width"]) == PLOT_W / 2
    full, half = _rects(share_chart([("all", 1.0, True), ("half", 0.5, False)]))
    assert float(full["width"]) == PLOT_W and float(half["width"]) == PLOT_W / 2 and half["fill"] == BAD
