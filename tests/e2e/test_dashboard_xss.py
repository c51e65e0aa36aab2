"""The XSS corpus (``support.xss_corpus``) renders inert on every page of the dashboard, in
headless Chromium, under each serving mode (Flask, FastAPI, standalone).

The pages are not listed here: the test walks the core's route map, every GET rule with the
corpus's job, workflow, queue and schedule ids filled in, so a page added later is covered
the day it is added (a rule taking an argument the corpus has no value for fails the test).
On each page it also submits every GET form (filters, search) with each payload in its text
fields and each option of its selects, and every "Preview" form with each payload.

Inert means: no dialog opened, no Content-Security-Policy violation reported (a blocked inline
script is an injection too), no element a payload would create, no ``on*`` attribute, no
``javascript:`` link or script not served by the dashboard; and where the dashboard shows a
channel, the payload is there as text.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import URL
from support import xss_corpus
from support.serving_modes import Mounted, log_in
from support.xss_corpus import INJECTED, PAYLOADS, Seeded

from pgqueue import PgQueue
from pgqueue.dashboard.app import Dashboard

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage, Dialog, Page

pytestmark = pytest.mark.slow

# Elements carrying an event handler attribute, and scripts the dashboard did not serve.
HANDLERS_JS = """() => [...document.querySelectorAll('*')].filter(
    e => [...e.attributes].some(a => a.name.toLowerCase().startsWith('on'))
).map(e => e.outerHTML.slice(0, 120))"""
# A form's ``action`` property is shadowed by a field named "action": read the attribute.
ACTION = "new URL(f.getAttribute('action') || '', document.baseURI).href"
SCRIPTS_JS = "() => [...document.scripts].map(s => s.src)"
GET_FORMS_JS = """() => [...document.forms]
  .filter(f => (f.getAttribute('method') || 'get').toLowerCase() === 'get')
  .map(f => ({action: ACTION_OF_F, fields: [...f.elements].filter(e => e.name).map(e => ({
      name: e.name, text: e.tagName === 'TEXTAREA' || (e.tagName === 'INPUT' &&
        ['text', 'search', ''].includes(e.getAttribute('type') || '')),
      value: e.value,
      options: e.tagName === 'SELECT' ? [...e.options].map(o => o.value).filter(v => v) : []}))}))""".replace(
    "ACTION_OF_F", ACTION
)
PREVIEW_JS = """([action, payload]) => {
  const form = [...document.forms].find(f => ACTION_OF_F === action);
  for (const e of form.elements) {
    if (e.tagName === 'TEXTAREA' || (e.tagName === 'INPUT' &&
        ['text', 'search', ''].includes(e.getAttribute('type') || ''))) e.value = payload;
  }
  form.requestSubmit([...form.querySelectorAll('button')].find(b => /preview/i.test(b.textContent)));
}""".replace("ACTION_OF_F", ACTION)
PREVIEW_FORMS_JS = """() => [...document.forms]
  .filter(f => (f.getAttribute('method') || '').toLowerCase() === 'post' &&
    [...f.querySelectorAll('button')].some(b => /preview/i.test(b.textContent)))
  .map(f => ACTION_OF_F)""".replace("ACTION_OF_F", ACTION)


@pytest.fixture(scope="module")
def pgq(url: URL) -> Iterator[PgQueue]:
    queue = PgQueue(url)
    xss_corpus.register(queue)
    yield queue
    queue.dispose()


@pytest.fixture(scope="module")
def seeded(pgq: PgQueue, url: URL) -> Seeded:
    engine = create_engine(url)
    try:
        return xss_corpus.seed(pgq, engine)
    finally:
        engine.dispose()


def route_paths(pgq: PgQueue, seeded: Seeded) -> dict[str, list[str]]:
    """Every GET page of the core's route map, by endpoint, with the corpus's values filled in."""
    values: dict[str, list[Any]] = {
        "job_id": seeded.jobs,
        "workflow_id": seeded.workflows,
        "queue": seeded.queues,
        "queue_name": seeded.queues,
        "schedule": seeded.schedules,
        "schedule_name": seeded.schedules,
        "name": seeded.queues + seeded.schedules,
    }
    url_map = Dashboard(pgq, secret_key="unused", public=True).url_map
    adapter = url_map.bind("dashboard.invalid")
    paths: dict[str, list[str]] = {}
    for rule in url_map.iter_rules():
        if "GET" not in (rule.methods or ()) or rule.endpoint == "static":
            continue
        names = sorted(rule.arguments)
        missing = [n for n in names if n not in values]
        assert not missing, f"{rule.rule} takes {missing}: give the XSS corpus values for them"
        paths[rule.endpoint] = [
            adapter.build(rule.endpoint, dict(zip(names, combination, strict=True)))
            for combination in itertools.product(*(values[n] for n in names))
        ]
    return paths


class Inspector:
    """Checks each page the browser lands on; collects what it finds."""

    def __init__(self, page: Page, base: str) -> None:
        self.page = page
        self.base = base
        self.dialogs: list[str] = []
        self.violations: list[str] = []
        self.text: dict[str, str] = {}
        page.on("dialog", self._dialog)
        page.on("console", self._console)

    def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(f"{self.page.url}: {dialog.message}")
        dialog.dismiss()

    def _console(self, message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            self.violations.append(f"{self.page.url}: {message.text}")

    def visit(self, url: str, allowed: tuple[int, ...] = (200,)) -> int | None:
        """Open ``url`` and check it; its status, or None when it is not an HTML page (a
        stream or JSON for a page's live updates)."""
        response = self.page.goto(url, wait_until="commit")
        assert response is not None, url
        if not response.headers.get("content-type", "").startswith("text/html"):
            assert response.headers.get("x-content-type-options") == "nosniff", url
            self.page.goto("about:blank")
            return None
        self.page.wait_for_load_state("load")
        assert response.status in allowed, (url, response.status)
        self.check(url)
        return response.status

    def check(self, url: str) -> None:
        page = self.page
        assert page.url.startswith(self.base), (url, page.url)
        assert page.locator(INJECTED).count() == 0, (
            url,
            page.locator(INJECTED).first.evaluate("e => e.outerHTML"),
        )
        assert page.evaluate(HANDLERS_JS) == [], url
        scripts = page.evaluate(SCRIPTS_JS)
        assert all(s.startswith(self.base + "/static/") for s in scripts), (url, scripts)
        self.text[url] = page.locator("body").text_content() or ""


def as_json(payload: str) -> str:
    """``payload`` as it reads inside the pretty-printed JSON of a job's page."""
    return json.dumps(payload, ensure_ascii=False)[1:-1]


def test_corpus_renders_inert_on_every_page(
    served: tuple[str, Mounted], pgq: PgQueue, seeded: Seeded, page: Page
) -> None:
    mode, dashboard = served
    base = dashboard.base
    log_in(page, dashboard)
    inspector = Inspector(page, base)
    paths = route_paths(pgq, seeded)
    assert {"overview", "job_list", "job_detail", "queue_list", "workflow_detail"} <= set(paths)

    get_forms: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = {}
    preview_forms: dict[str, str] = {}
    for endpoint, urls in paths.items():
        statuses = []
        for path in urls:
            statuses.append(inspector.visit(base + path, allowed=(200, 404)))
            if statuses[-1] != 200:
                continue
            for form in page.evaluate(GET_FORMS_JS):
                key = (form["action"], tuple(f["name"] for f in form["fields"]))
                get_forms.setdefault(key, form["fields"])
            for action in page.evaluate(PREVIEW_FORMS_JS):
                preview_forms.setdefault(action, base + path)
        # A rule whose argument takes queue or schedule names may know only one kind.
        assert 200 in statuses or None in statuses, (endpoint, urls, statuses)

    assert get_forms, "no filter or search form found"
    for (action, _names), fields in get_forms.items():
        base_query = {f["name"]: f["value"] for f in fields}
        states = [{f["name"]: p for f in fields if f["text"]} for p in PAYLOADS]
        states += [{f["name"]: o} for f in fields for o in f["options"]]
        for changes in states:
            url = action.split("?")[0] + "?" + urlencode({**base_query, **changes})
            if inspector.visit(url, allowed=(200, 400)) == 200:
                for name, value in changes.items():
                    field = page.locator(f'form[method="get"] [name="{name}"]').first
                    if field.count() and field.evaluate("e => e.tagName") == "INPUT":
                        assert field.input_value() == value, (url, name)

    assert preview_forms, "no preview form found"
    for action, url in preview_forms.items():
        for payload in PAYLOADS:
            inspector.visit(url)
            with page.expect_navigation():
                page.evaluate(PREVIEW_JS, [action, payload])
            inspector.check(action)
            shown = page.locator("main").text_content() or ""
            assert payload in shown, (action, payload[:40])

    assert inspector.dialogs == []
    assert inspector.violations == []
    text = inspector.text
    jobs = base + "/jobs"
    failed = text[f"{base}/jobs/{seeded.failed}"]
    for payload in PAYLOADS:
        assert as_json(payload) in failed, payload[:40]  # arguments
        assert payload in failed, payload[:40]  # the error and its traceback
        assert as_json(payload) in text[f"{base}/jobs/{seeded.succeeded}"]  # result
    succeeded = text[f"{base}/jobs/{seeded.succeeded}"]
    assert xss_corpus.PROGRESS in succeeded and xss_corpus.STEP in succeeded
    for task in (xss_corpus.TASK_FAILS, xss_corpus.TASK_SUCCEEDS, xss_corpus.TASK_WAITS):
        assert task in text[jobs], task
    for task, queue in xss_corpus.RAW_NAMES:
        assert task in text[jobs] and queue in text[jobs], (task, queue)
        assert queue in text[base + "/"] and queue in text[base + "/queues"], queue
    assert xss_corpus.QUEUE in text[base + "/"]
    assert xss_corpus.TASK_SUCCEEDS in text[f"{base}/workflows/{seeded.workflows[0]}"]
    for endpoint, urls in paths.items():
        shown = "".join(text.get(base + path, "") for path in urls)
        if "audit" in endpoint:
            assert xss_corpus.ACTOR in shown, endpoint
        if "schedule" in endpoint and mode == "fastapi":  # the one mode given the app's code
            assert xss_corpus.SCHEDULE in shown, endpoint
