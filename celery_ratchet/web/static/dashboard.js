// celery_ratchet dashboard: live refresh of the parts of a page marked data-live, the
// "tick every job" box, and folding library frames of a traceback. No build step; served by
// the dashboard itself (the Content-Security-Policy allows only its own scripts).
(function () {
  "use strict";
  var INTERVAL = 5000;
  var KEY = "ratchet-live";

  function busy() {
    // Not while the reader is choosing jobs, typing, or away from the tab.
    if (document.hidden) return true;
    if (document.querySelector("[data-live] input[type=checkbox]:checked")) return true;
    var active = document.activeElement;
    return !!(active && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName));
  }

  function refresh() {
    var parts = document.querySelectorAll("[data-live][id]");
    if (!parts.length || busy()) return;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Ratchet-Live": "1" } })
      .then(function (answer) {
        if (!answer.ok || answer.redirected) throw new Error(String(answer.status));
        return answer.text();
      })
      .then(function (html) {
        if (busy()) return;
        var fresh = new DOMParser().parseFromString(html, "text/html");
        parts.forEach(function (part) {
          var next = fresh.getElementById(part.id);
          if (next) part.replaceWith(document.importNode(next, true));
        });
        document.body.classList.remove("stale");
        document.body.dataset.refreshed = String(Date.now());
      })
      .catch(function () {
        document.body.classList.add("stale");
      });
  }

  function start() {
    var toggle = document.getElementById("live");
    if (toggle) {
      toggle.checked = window.localStorage.getItem(KEY) !== "off";
      toggle.addEventListener("change", function () {
        window.localStorage.setItem(KEY, toggle.checked ? "on" : "off");
      });
    }
    window.setInterval(function () {
      if (!toggle || toggle.checked) refresh();
    }, INTERVAL);

    document.addEventListener("change", function (event) {
      var box = event.target;
      if (!box.matches || !box.matches("input[data-select-all]")) return;
      var form = box.getAttribute("data-select-all");
      document.querySelectorAll('input[type=checkbox][form="' + form + '"]').forEach(function (each) {
        each.checked = box.checked;
      });
    });

    document.querySelectorAll("ol.traceback").forEach(function (list) {
      if (!list.querySelector("li.lib") || !list.querySelector("li.app")) return;
      list.classList.add("folded");
      var show = document.createElement("button");
      show.type = "button";
      show.textContent = "show library frames";
      show.addEventListener("click", function () {
        var folded = list.classList.toggle("folded");
        show.textContent = folded ? "show library frames" : "hide library frames";
      });
      list.parentNode.insertBefore(show, list);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
