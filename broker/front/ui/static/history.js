// The dashboard's history and search pages (loaded before app.js, which routes to them with its
// helpers in `ui`). Every piece of data reaches the page through textContent or a checked attribute
// (never innerHTML), as in app.js: a hostile message text stays text.
"use strict";

window.relayHistory = (function () {
  // History and search: a page of what left inboxes (oldest first), read on opening and on Refresh
  // (not polled), with a link to the next page while there is more.
  const KINDS = ["note", "request", "reply", "status"];

  function archivedTable(ui, id, entries) {
    const { el, link, agentHref, threadHref, historyHref } = ui;
    return el("table", { id }, el("thead", {}, el("tr", {},
      el("th", {}, "Left inbox"), el("th", {}, "Outcome"), el("th", {}, "Envelope"), el("th", {}, "From"),
      el("th", {}, "To"), el("th", {}, "Kind"), el("th", {}, "Sent"), el("th", {}, "Text"))),
      el("tbody", {}, ...entries.map((e) => el("tr", { "data-envelope": e.id },
        el("td", { class: "muted nowrap" }, e.left_at),
        el("td", { title: e.reason || "" }, e.outcome + (e.reason ? " (" + e.reason + ")" : "")),
        el("td", { class: "mono" }, link(threadHref(e.id), e.id)),
        el("td", {}, link(agentHref(e.from), e.from), " ", el("a", { href: historyHref(e.to, { with: e.from }), class: "muted small" }, "conversation")),
        el("td", {}, link(historyHref(e.to), e.to)),
        el("td", {}, e.kind || "-"),
        el("td", { class: "muted nowrap" }, e.sent_at),
        el("td", { class: "text" }, e.text || "")))));
  }

  // A filter form whose submit moves to `hashOf(values)`: the page is its address (links and Back work).
  function filterForm(ui, fields, values, hashOf) {
    const { el } = ui;
    const inputs = {};
    const form = el("form", { class: "filters toolbar" });
    for (const [name, label, options] of fields) {
      const input = options
        ? el("select", { name, id: "filter-" + name }, el("option", { value: "" }, "any " + label), ...options.map((k) => el("option", { value: k }, k)))
        : el("input", { name, id: "filter-" + name, placeholder: label, "aria-label": label, value: values.get(name) || "" });
      if (options) input.value = values.get(name) || "";
      inputs[name] = input;
      form.append(input);
    }
    form.append(el("button", { type: "submit" }, "Show"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const chosen = {};
      for (const [name, input] of Object.entries(inputs)) chosen[name] = input.value.trim();
      window.location.hash = hashOf(chosen);
    });
    return form;
  }

  function pagedListing(ui, title, intro, form, read, nextHash, firstHash, hasCursor) {
    const { view, el, link, notice, setStatus, generation } = ui;
    const box = el("div", { id: "listing" });
    const again = el("button", { type: "button", class: "secondary" }, "Refresh");
    view.replaceChildren(el("h1", {}, ...title), el("p", { class: "muted" }, intro), form,
      el("div", { class: "toolbar" }, again), box);
    async function load() {
      const data = await read();
      const pager = el("div", { class: "toolbar pager" },
        hasCursor ? link(firstHash, "← First page") : null,
        data.next ? el("a", { href: nextHash(data.next), id: "next-page" }, "Next page →") : el("span", { class: "muted" }, "end of the listing"));
      box.replaceChildren(data.entries.length ? archivedTable(ui, "history", data.entries) : el("p", {}, "Nothing on this page."), pager);
    }
    const mine = generation();
    const show = () => load().then(() => setStatus("updated " + new Date().toLocaleTimeString(), false),
      (e) => { if (mine === generation()) { setStatus(e.message, true); box.replaceChildren(notice(e.message, false)); } });
    again.addEventListener("click", show);
    show();
  }

  function historyPage(ui, agent, params) {
    const { el, api, query, historyHref } = ui;
    const filters = {};
    for (const name of ["with", "since", "until", "kind", "text"]) filters[name] = params.get(name) || "";
    const after = params.get("after") || "";
    const form = filterForm(ui, [["with", "with agent"], ["since", "since (2h, 2026-12-01)"], ["until", "until"],
      ["kind", "kind", KINDS], ["text", "words"]], params, (chosen) => historyHref(agent, chosen));
    pagedListing(ui, ["History of ", el("span", { class: "mono" }, agent), filters.with ? el("span", {}, " with ", el("span", { class: "mono" }, filters.with)) : null],
      "What left this agent's inbox (acknowledged, dead-lettered, expired), oldest first" +
      " (with an agent: the conversation, both ways). Read-only.",
      form, () => api("history?" + query(Object.assign({ agent, after }, filters))),
      (next) => historyHref(agent, Object.assign({}, filters, { after: next })), historyHref(agent, filters), !!after);
  }

  function searchPage(ui, params) {
    const { view, el, api, query } = ui;
    const filters = {};
    for (const name of ["words", "agent", "since", "until"]) filters[name] = params.get(name) || "";
    const after = params.get("after") || "";
    const hashOf = (chosen) => "#/search?" + query(chosen);
    const form = filterForm(ui, [["words", "words"], ["agent", "agent (any)"], ["since", "since (2h, 2026-12-01)"], ["until", "until"]],
      params, hashOf);
    if (!filters.words) {
      view.replaceChildren(el("h1", {}, "Search"), el("p", { class: "muted" },
        "Find words (any case, whole words, every one) in what left agents' inboxes: one agent's history, or every agent's."), form);
      return;
    }
    pagedListing(ui, ["Search for ", el("span", { class: "mono" }, filters.words)],
      "History entries whose text holds every word" + (filters.agent ? ", in " + filters.agent + "'s history" : ", in every agent's history") + ", oldest first.",
      form, () => api("search?" + query(Object.assign({ after }, filters))),
      (next) => hashOf(Object.assign({}, filters, { after: next })), hashOf(filters), !!after);
  }


  return { historyPage, searchPage };
})();
