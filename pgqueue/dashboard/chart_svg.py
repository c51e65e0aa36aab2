"""The overview's inline SVG charts as markup: the throughput chart's stacked bars
(``throughput_chart.chart``) and the small per-queue wait and failure charts
(``queue_charts``), each bucket a ``<g>`` with its tooltip.

Built here rather than in a template: a page draws thirteen charts of 60 buckets, and a Jinja
loop over about 800 buckets with several attribute lookups each took most of the page's
rendering time, where joining the same strings in Python takes a fraction of it.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup, escape


def _svg_open(c: dict[str, Any], classes: str, label: str, id: str | None) -> str:
    id_attr = f'id="{escape(id)}" ' if id else ""
    return (
        f'<svg {id_attr}class="{classes}" width="{c["width"]}" height="{c["height"]}" '
        f'viewBox="0 0 {c["width"]} {c["height"]}" role="img" aria-label="{escape(label)}">'
    )


def _background(c: dict[str, Any]) -> str:
    return f'<rect class="chart-bg" x="0" y="0" width="{c["width"]}" height="{c["height"]}"></rect>'


def _markup(parts: list[str]) -> Markup:
    # Safe by construction: every text placed in these parts (labels, tooltips, the id, the
    # kind) went through ``escape``, and the rest is the charts' own numbers.
    return Markup("".join(parts))  # noqa: S704


def bar_chart(c: dict[str, Any], label: str, id: str | None = None) -> Markup:
    """Stacked succeeded/failed bars, a thin mark for each empty bucket, and (large charts) a
    y axis with round rate ticks."""
    parts = [_svg_open(c, "throughput", label, id)]
    for t in c["ticks"]:
        parts.append(
            f'<line class="grid" x1="{c["left"]}" x2="{c["right"]}" y1="{t["y"]}" '
            f'y2="{t["y"]}"></line><text class="tick" x="{c["left"] - 6}" y="{t["y"] + 4}" '
            f'text-anchor="end">{escape(t["label"])}</text>'
        )
    if not c["ticks"]:
        parts.append(_background(c))
    zero_y = c["base_y"] - 1
    for b in c["bars"]:
        parts.append(f'<g class="bucket"><title>{escape(b["title"])}</title>')
        if b["zero"]:
            parts.append(
                f'<rect class="bar-zero" x="{b["x"]}" y="{zero_y}" width="{b["w"]}" '
                'height="1"></rect>'
            )
        if b["ok_h"]:
            parts.append(
                f'<rect class="bar-ok" x="{b["x"]}" y="{b["ok_y"]}" width="{b["w"]}" '
                f'height="{b["ok_h"]}"></rect>'
            )
        if b["bad_h"]:
            parts.append(
                f'<rect class="bar-bad" x="{b["x"]}" y="{b["bad_y"]}" width="{b["w"]}" '
                f'height="{b["bad_h"]}"></rect>'
            )
        parts.append("</g>")
    for x in c["x_labels"]:
        parts.append(
            f'<text class="axis" x="{x["x"]}" y="{c["label_y"]}" '
            f'text-anchor="{x["anchor"]}">{escape(x["label"])}</text>'
        )
    parts.append("</svg>")
    return _markup(parts)


def level_chart(c: dict[str, Any], label: str, kind: str) -> Markup:
    """One bar per bucket (class ``bar-<kind>``), a thin mark for a bucket with no value."""
    kind = str(escape(kind))
    parts = [_svg_open(c, f"level level-{kind}", label, None), _background(c)]
    zero_y = c["height"] - 1
    for b in c["bars"]:
        if b["h"]:
            bar = (
                f'<rect class="bar-{kind}" x="{b["x"]}" y="{b["y"]}" width="{b["w"]}" '
                f'height="{b["h"]}"></rect>'
            )
        else:
            bar = (
                f'<rect class="bar-zero" x="{b["x"]}" y="{zero_y}" width="{b["w"]}" '
                'height="1"></rect>'
            )
        parts.append(f'<g class="bucket"><title>{escape(b["title"])}</title>{bar}</g>')
    parts.append("</svg>")
    return _markup(parts)
