// perdure dashboard: live updates over server-sent events, and confirmations. No library.
(function () {
  "use strict";

  // Buttons with data-confirm ask first (cancel a run, retry a step, ...).
  document.addEventListener("submit", function (event) {
    var button = event.submitter;
    var question = button && button.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });

  var regions = document.querySelectorAll("[data-live]");
  var badge = document.getElementById("live-state");
  if (!regions.length || !window.EventSource || !badge) return;

  // A region the person is typing in (a comment, an answer) is left alone until they are done.
  function editing(region) {
    var fields = region.querySelectorAll("textarea, input[type=text], input:not([type])");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value || fields[i] === document.activeElement) return true;
    }
    return false;
  }

  // Open <details> stay open across a refresh.
  function openDetails(region) {
    var open = [];
    region.querySelectorAll("details").forEach(function (d, i) { if (d.open) open.push(i); });
    return open;
  }

  var busy = false, again = false;
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    // Marked as a refresh: the server then leaves a one-shot flash message to the page
    // load it was meant for (a refresh racing a form's redirect would otherwise eat it).
    fetch(window.location.href, {
      credentials: "same-origin", cache: "no-store", headers: { "X-Perdure-Refresh": "1" },
    })
      .then(function (response) {
        if (!response.ok || response.redirected) throw new Error("signed out or gone");
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        regions.forEach(function (region) {
          var next = fresh.getElementById(region.id);
          if (!next || editing(region)) return;
          var open = openDetails(region);
          region.innerHTML = next.innerHTML;
          var details = region.querySelectorAll("details");
          open.forEach(function (i) { if (details[i]) details[i].open = true; });
        });
        var gates = fresh.querySelector(".top nav .badge");
        var current = document.querySelector(".top nav .badge");
        if (current && !gates) current.remove();
        document.body.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () { /* the next event tries again */ })
      .finally(function () {
        busy = false;
        if (again) { again = false; refresh(); }
      });
  }

  var run = document.body.getAttribute("data-run");
  var source = new EventSource("/ui/stream" + (run ? "?run=" + encodeURIComponent(run) : ""));
  source.onopen = function () { badge.className = "live on"; badge.title = "live updates: on"; };
  source.onerror = function () { badge.className = "live off"; badge.title = "live updates: reconnecting"; };
  source.addEventListener("change", refresh);
  source.addEventListener("signed-out", function () {  // session ended: show the sign-in page
    source.close();
    window.location.reload();
  });
})();
