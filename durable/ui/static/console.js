// Auto-refresh: a page whose <body> has data-refresh="N" (the lists, and a workflow that
// has not finished) fetches itself every N seconds and swaps in its new <main>, keeping the
// scroll position and the folds that are open. It waits while the tab is hidden, while a
// field is being edited, and when the operator turns it off (remembered in localStorage).
// A page that comes back without data-refresh (the workflow finished) stops refreshing.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const body = document.body;
  const seconds = Number(body.dataset.refresh || 0);
  const toggle = document.getElementById("auto-refresh");
  if (!seconds) return;
  if (toggle) {
    toggle.checked = localStorage.getItem("durable-auto-refresh") !== "off";
    toggle.addEventListener("change", () =>
      localStorage.setItem("durable-auto-refresh", toggle.checked ? "on" : "off"));
  }
  let editing = false;  // a field of the page was typed into: never wipe it
  const main = () => document.querySelector("main");
  const watch = () => {
    main().addEventListener("input", () => { editing = true; });
  };
  watch();
  let timer = 0;
  const refresh = async () => {
    timer = 0;
    const focused = document.activeElement;
    const busy = editing || (focused && main().contains(focused) && focused.matches("input, select, textarea"));
    if (document.hidden || busy || (toggle && !toggle.checked)) { schedule(); return; }
    let html;
    try {
      const answer = await fetch(location.href, { credentials: "same-origin", cache: "no-store" });
      if (!answer.ok) { schedule(); return; }
      html = await answer.text();
    } catch (e) { schedule(); return; }
    const fresh = new DOMParser().parseFromString(html, "text/html");
    const next = fresh.querySelector("main");
    if (!next || editing || (toggle && !toggle.checked)) { schedule(); return; }
    const open = new Set([...main().querySelectorAll("details[open][data-key]")].map(d => d.dataset.key));
    const x = window.scrollX, y = window.scrollY;
    main().replaceWith(document.importNode(next, true));
    for (const d of main().querySelectorAll("details[data-key]")) {
      if (open.has(d.dataset.key)) d.open = true;
    }
    window.scrollTo(x, y);
    document.title = fresh.title;
    body.dataset.refreshed = String(Number(body.dataset.refreshed || 0) + 1);
    watch();
    if (fresh.body.dataset.refresh) schedule();
    else delete body.dataset.refresh;  // finished: nothing more will change
  };
  const schedule = () => { if (!timer) timer = setTimeout(refresh, seconds * 1000); };
  schedule();
});
