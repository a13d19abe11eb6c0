// perdure dashboard: live updates over server-sent events, confirmations, and the session's
// tab key. No library.
(function () {
  "use strict";

  // The tab key: sign-in puts it in the address's fragment (never sent to a server); it is
  // kept in this origin's storage, which pages of other ports of the host cannot read (they
  // do get the session cookie), and sent with every action and the event stream.
  var KEY = "perdure-tab";
  if (window.location.hash.indexOf("#tab=") === 0) {
    window.localStorage.setItem(KEY, window.location.hash.slice(5));
    window.history.replaceState(null, "", window.location.pathname + window.location.search);
  }
  var tab = window.localStorage.getItem(KEY) || "";

  // Buttons with data-confirm ask first (cancel a run, retry a step, ...). Every form but the
  // sign-in one is sent with the tab key, then the page it leads to is shown.
  document.addEventListener("submit", function (event) {
    var button = event.submitter;
    var question = button && button.getAttribute("data-confirm");
    if (question && !window.confirm(question)) { event.preventDefault(); return; }
    var form = event.target;
    // getAttribute: a field named "action" or "method" shadows the form's own properties
    var action = new URL(form.getAttribute("action") || "", window.location.href);
    var method = (form.getAttribute("method") || "get").toLowerCase();
    if (method !== "post" || action.pathname === "/ui/login") return;
    if (action.pathname === "/ui/logout") window.localStorage.removeItem(KEY);
    event.preventDefault();
    var body = new URLSearchParams(new FormData(form, button || undefined));
    // marked as a refresh: the page a redirect leads to keeps its flash for the load below
    fetch(action.href, {
      method: "POST", body: body, credentials: "same-origin", cache: "no-store",
      headers: { "X-Perdure-Tab": tab, "X-Perdure-Refresh": "1" },
    })
      .then(function (response) {
        if (response.redirected) { window.location.assign(response.url); return; }
        return response.text().then(function (html) {
          document.open(); document.write(html); document.close();
        });
      })
      .catch(function () { window.location.reload(); });
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
  var query = "?tab=" + encodeURIComponent(tab) + (run ? "&run=" + encodeURIComponent(run) : "");
  var source = new EventSource("/ui/stream" + query);
  source.onopen = function () { badge.className = "live on"; badge.title = "live updates: on"; };
  source.onerror = function () { badge.className = "live off"; badge.title = "live updates: reconnecting"; };
  source.addEventListener("change", refresh);
  source.addEventListener("signed-out", function () {  // session ended: show the sign-in page
    source.close();
    window.location.reload();
  });
})();
