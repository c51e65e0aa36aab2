/* pgqueue dashboard: live fragments.
 *
 * Every element with data-live="<name>" is refreshed from the page's own URL with
 * ?fragment=<name>, whose answer is that element rendered again by the server (the same
 * template block as the whole page). Polls every second while the tab is visible (counted from
 * the start of the previous poll, so a change shows within a second plus one request's time, under
 * the 2 s an operator expects even on a slow page), stops while it
 * is hidden and polls at once when it is shown again. An element holding the focused field, or
 * a field whose value the user changed, is left alone until it is neither. A failed request
 * doubles the interval (up to 30 s) until one succeeds; 401 or 403 (the session ended) stops
 * polling for good. The <html> element's data-live-status says where it is: "waiting" (for the
 * next poll), "fetching", "hidden", "stopped", or "idle" on a page with no live part. Without JavaScript the pages still work: they reload themselves instead
 * (a <noscript> refresh).
 */
(function () {
  "use strict";
  var INTERVAL = 1000;
  var MAX_INTERVAL = 30000;
  var delay = INTERVAL;
  var timer = null;
  var running = false;
  var stopped = false;
  var served = {};
  var started = 0;

  function edited(element) {
    var active = document.activeElement;
    if (active && active !== document.body && element.contains(active) &&
        /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) {
      return true;
    }
    var fields = element.querySelectorAll("input, textarea, select");
    for (var i = 0; i < fields.length; i++) {
      var field = fields[i];
      if (field.tagName === "SELECT") {
        for (var j = 0; j < field.options.length; j++) {
          if (field.options[j].selected !== field.options[j].defaultSelected) { return true; }
        }
      } else if (field.type === "checkbox" || field.type === "radio") {
        if (field.checked !== field.defaultChecked) { return true; }
      } else if (field.type !== "hidden" && field.value !== field.defaultValue) {
        return true;
      }
    }
    return false;
  }

  function fragmentUrl(name) {
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", name);
    url.hash = "";
    return url.toString();
  }

  function refresh(element) {
    var name = element.getAttribute("data-live");
    return fetch(fragmentUrl(name), {
      credentials: "same-origin",
      cache: "no-store",
      redirect: "error",
      headers: { "Accept": "text/html" }
    }).then(function (response) {
      if (response.status === 401 || response.status === 403) {
        stopped = true;
        throw new Error("session ended");
      }
      if (!response.ok) { throw new Error("HTTP " + response.status); }
      return response.text();
    }).then(function (html) {
      // Unchanged answers leave the element (and what the user opened in it) as it is.
      if (served[name] === html || !element.isConnected || edited(element)) { return; }
      var holder = document.createElement("template");
      holder.innerHTML = html.trim();
      var fresh = holder.content.firstElementChild;
      if (!fresh || fresh.getAttribute("data-live") !== name) {
        throw new Error("fragment " + name + " did not answer with its element");
      }
      served[name] = html;
      element.replaceWith(fresh);
    });
  }

  function status(value) {
    document.documentElement.setAttribute("data-live-status", value);
  }

  function schedule() {
    clearTimeout(timer);
    timer = null;
    if (stopped) {
      status("stopped");
    } else if (document.visibilityState !== "visible") {
      status("hidden");
    } else {
      timer = setTimeout(tick, Math.max(0, started + delay - Date.now()));
      status("waiting");
    }
  }

  function tick() {
    timer = null;
    if (running || stopped || document.visibilityState !== "visible") { return; }
    var elements = document.querySelectorAll("[data-live]");
    if (!elements.length) { status("idle"); return; }
    running = true;
    status("fetching");
    started = Date.now();
    var pending = [];
    for (var i = 0; i < elements.length; i++) { pending.push(refresh(elements[i])); }
    Promise.all(pending).then(function () {
      delay = INTERVAL;
    }, function () {
      delay = Math.min(delay * 2, MAX_INTERVAL);
    }).then(function () {
      running = false;
      schedule();
    });
  }

  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible") {
      clearTimeout(timer);
      tick();
    } else if (!running) {
      schedule();
    }
  });
  started = Date.now();
  schedule();
}());
