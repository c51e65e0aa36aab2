"""The overview's chart markup (``dashboard.chart_svg``): one ``<g>`` per bucket with its
tooltip, the bars each bucket's counts call for, and every text escaped."""

from __future__ import annotations

import re

from pgqueue.admin_values import WaitTime
from pgqueue.dashboard.chart_svg import bar_chart, level_chart
from pgqueue.dashboard.queue_charts import failure_chart, wait_chart
from pgqueue.dashboard.throughput_chart import chart


def test_bar_chart_draws_a_bucket_per_count_and_escapes_its_texts() -> None:
    succeeded, failed = [3, 0, 1], [1, 0, 0]
    svg = str(bar_chart(chart(succeeded, failed, 60, 180), "<b>&", id='x"y'))
    assert svg.startswith('<svg id="x&#34;y" class="throughput"')
    assert 'aria-label="&lt;b&gt;&amp;"' in svg
    assert svg.count('<g class="bucket">') == 3
    assert svg.count('class="bar-ok"') == 2
    assert svg.count('class="bar-bad"') == 1
    assert svg.count('class="bar-zero"') == 1
    titles = re.findall(r"<title>([^<]*)</title>", svg)
    assert titles == [
        "3 min to 2 min ago: 1 succeeded, 0 failed",
        "2 min to 60 s ago: 0 succeeded, 0 failed",
        "60 s to now: 3 succeeded, 1 failed",
    ]
    assert svg.count('class="tick"') >= 2
    assert svg.endswith('text-anchor="end">now</text></svg>')


def test_level_charts_mark_buckets_without_a_value() -> None:
    waits = [WaitTime(4, 0.5, 2.0), None]
    svg = str(level_chart(wait_chart(waits, 30), "wait <p95>", "wait"))
    assert 'aria-label="wait &lt;p95&gt;"' in svg
    assert svg.count('class="bar-wait"') == 1
    assert svg.count('class="bar-zero"') == 1
    assert re.findall(r"<title>([^<]*)</title>", svg) == [
        "60 s to 30 s ago: no job finished",
        "30 s to now: 4 jobs, waited p50 0.5 s, p95 2 s",
    ]
    failures = str(level_chart(failure_chart([1, 0], [1, 0], 30), "failures", "failures"))
    assert failures.count('class="bar-failures"') == 1
    assert "1 of 2 failed (50%)" in failures
