// The relay dashboard. Plain JS, no build step. Every piece of data reaches the page through
// textContent or a checked attribute (never innerHTML): agent-supplied text stays text.
"use strict";

(function () {
  const view = document.getElementById("view");
  const statusLine = document.getElementById("status");
  let csrf = null;
  let timer = null;
  let generation = 0;

  // -- building blocks -------------------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (key === "href") node.setAttribute("href", safeHref(value));
      else node.setAttribute(key, String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function safeHref(value) {
    const text = String(value);
    if (text.startsWith("#/")) return text;
    try {
      const url = new URL(text);
      if (url.protocol === "https:" || url.protocol === "http:") return url.href;
    } catch (e) { /* not a URL */ }
    return "#/";
  }

  function link(hash, label) { return el("a", { href: hash }, label); }
  function agentHref(id) { return "#/agent/" + encodeURIComponent(id); }
  function threadHref(id) { return "#/thread/" + encodeURIComponent(id); }
  function historyHref(id, params) {
    const more = query(params || {});
    return "#/history/" + encodeURIComponent(id) + (more ? "?" + more : "");
  }

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "-";
    const s = Math.floor(seconds);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
    return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
  }

  function level(value, bounds) {
    if (value === null || value === undefined) return "";
    if (value >= bounds[1]) return "alert";
    if (value >= bounds[0]) return "warn";
    return "";
  }

  function setStatus(text, isError) {
    statusLine.textContent = text;
    statusLine.className = "status" + (isError ? " error" : "");
  }

  function notice(text, ok) { return el("div", { class: "notice " + (ok ? "ok" : "error"), role: "alert" }, text); }

  // A refusal's message already names every violated field and rule: it is shown once, as it is.
  function errorText(body, status) {
    const error = body && body.error;
    if (!error) return "request failed (HTTP " + status + ")";
    return error.code + ": " + error.message;
  }

  async function api(path, options) {
    const init = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
    if (init.body !== undefined) {
      init.method = init.method || "POST";
      init.headers["content-type"] = "application/json";
      init.headers["x-relay-csrf"] = csrf || "";
      init.body = JSON.stringify(init.body);
    }
    const response = await fetch("/ui/api/" + path, init);
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (response.status === 401) { window.location.assign("/ui/"); throw new Error("signed out"); }
    if (!response.ok) { const err = new Error(errorText(body, response.status)); err.body = body; throw err; }
    return body;
  }

  function query(params) {
    const search = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") search.set(k, v);
    return search.toString();
  }

  // Live figures: each page polls its own data while it is shown (paused in a hidden tab).
  function poll(fn, seconds) {
    const mine = generation;
    const tick = async () => {
      if (mine !== generation) return;
      if (!document.hidden) {
        try { await fn(); setStatus("updated " + new Date().toLocaleTimeString(), false); }
        catch (e) { setStatus(e.message, true); }
      }
      if (mine === generation) timer = setTimeout(tick, seconds * 1000);
    };
    tick();
  }

  function envelopeRow(e, showTo) {
    return el("tr", { "data-envelope": e.id },
      el("td", { class: "mono" }, link(threadHref(e.id), e.id)),
      el("td", {}, link(agentHref(e.from), e.from)),
      showTo ? el("td", {}, link(agentHref(e.to), e.to)) : null,
      el("td", {}, e.kind || "-"),
      el("td", { class: "muted", title: e.sent_at }, e.sent_at),
      el("td", { class: "num" }, e.deliveries),
      el("td", { class: "text" }, e.text || ""));
  }

  // -- pages -------------------------------------------------------------------------------------

  const agentsState = { sort: "oldest", order: "desc", offset: 0, limit: 100, q: "" };

  function agentsPage() {
    const columns = [
      ["agent", "Agent"], ["provider", "Provider"], ["tier", "Tier"], ["session", "Session"],
      ["depth", "Inbox", true], ["pending", "Pending", true], ["oldest", "Oldest unacked", true],
      ["dead", "Dead letters", true], ["last_seen", "Presence, last seen", true], ["policy", "Accepts from"],
    ];
    const summary = el("div", { class: "summary" });
    const search = el("input", { type: "search", placeholder: "agent id starts with…", value: agentsState.q, "aria-label": "filter" });
    const pager = el("span", { class: "muted" });
    const prev = el("button", { class: "secondary", type: "button" }, "← Previous");
    const next = el("button", { class: "secondary", type: "button" }, "Next →");
    const head = el("tr", {});
    const body = el("tbody", {});
    for (const [key, label, numeric] of columns) {
      const th = el("th", { class: "sortable" + (numeric ? " num" : ""), "data-sort": key }, label);
      th.addEventListener("click", () => {
        agentsState.order = agentsState.sort === key && agentsState.order === "desc" ? "asc" : "desc";
        if (agentsState.sort !== key && !numeric) agentsState.order = "asc";
        agentsState.sort = key;
        agentsState.offset = 0;
        refresh();
      });
      head.append(th);
    }
    search.addEventListener("input", () => { agentsState.q = search.value.trim(); agentsState.offset = 0; refresh(); });
    prev.addEventListener("click", () => { agentsState.offset = Math.max(0, agentsState.offset - agentsState.limit); refresh(); });
    next.addEventListener("click", () => { agentsState.offset += agentsState.limit; refresh(); });
    view.replaceChildren(el("h1", {}, "Agents"), summary,
      el("div", { class: "toolbar" }, search, prev, next, pager),
      el("table", { id: "agents" }, el("thead", {}, head), body));

    async function refresh() {
      const data = await api("agents?" + query(agentsState));
      for (const th of head.children) {
        th.classList.remove("sorted-asc", "sorted-desc");
        if (th.dataset.sort === agentsState.sort) th.classList.add("sorted-" + agentsState.order);
      }
      summary.replaceChildren(
        el("div", {}, el("b", {}, data.total), "agents"),
        el("div", {}, el("b", {}, data.totals.depth), "queued"),
        el("div", {}, el("b", {}, data.totals.pending), "pending"),
        el("div", {}, el("b", {}, data.totals.dead), "dead letters"));
      const t = data.thresholds;
      body.replaceChildren(...data.agents.map((a) => el("tr", { "data-agent": a.agent },
        el("td", {}, link(agentHref(a.agent), a.agent), " ", el("a", { href: historyHref(a.agent), class: "muted small" }, "history")),
        el("td", {}, a.provider || "-"),
        el("td", {}, a.tier || "-"),
        el("td", { class: "mono" }, a.session || "-"),
        el("td", { class: "num " + level(a.depth, t.depth), "data-col": "depth" }, a.depth),
        el("td", { class: "num" }, a.pending),
        el("td", { class: "num " + level(a.oldest, t.oldest), "data-col": "oldest" }, age(a.oldest)),
        el("td", { class: "num" + (a.dead > 0 ? " warn" : "") }, a.dead),
        el("td", { class: "num muted", "data-col": "presence" },
          a.presence + (a.last_seen === null ? "" : ", " + age(a.last_seen) + " ago")),
        el("td", { "data-col": "policy", title: "relay policy show " + a.agent }, a.policy))));
      const last = Math.min(data.offset + data.limit, data.matched);
      pager.textContent = data.matched ? (data.offset + 1) + "–" + last + " of " + data.matched : "no agents";
      prev.disabled = data.offset === 0;
      next.disabled = last >= data.matched;
    }
    poll(refresh, 2);
  }

  function agentPage(agent) {
    const facts = el("div", { class: "summary" });
    const body = el("tbody", {});
    const more = el("button", { class: "secondary", type: "button", hidden: true }, "Load older…");
    let loaded = [];
    view.replaceChildren(el("h1", {}, "Inbox of ", el("span", { class: "mono" }, agent)),
      el("p", { class: "muted" }, "Unacknowledged envelopes, oldest first. Read-only: nothing is handed out or acknowledged."),
      facts,
      el("table", { id: "inbox" }, el("thead", {}, el("tr", {},
        el("th", {}, "Envelope"), el("th", {}, "From"), el("th", {}, "Kind"), el("th", {}, "Sent"),
        el("th", { class: "num" }, "Deliveries"), el("th", {}, "Text"))), body),
      el("div", { class: "toolbar" }, more, link("#/compose?to=" + encodeURIComponent(agent), "Write to this agent"),
        link(historyHref(agent), "History of this agent")));

    function render(data) {
      const o = data.overview;
      facts.replaceChildren(...(o ? [
        el("div", {}, el("b", {}, o.depth), "queued"), el("div", {}, el("b", {}, o.pending), "pending"),
        el("div", {}, el("b", {}, age(o.oldest)), "oldest"), el("div", {}, el("b", {}, o.dead), "dead letters"),
        el("div", {}, el("b", {}, o.provider || "-"), "provider"),
        el("div", {}, el("b", {}, o.policy), "accepts from")] : [el("div", {}, "not registered")]));
      body.replaceChildren(...loaded.map((e) => envelopeRow(e, false)));
      more.hidden = !data.more;
    }
    more.addEventListener("click", async () => {
      const after = loaded.length ? loaded[loaded.length - 1].id : null;
      const data = await api("inbox?" + query({ agent, after }));
      loaded = loaded.concat(data.envelopes);
      render(data);
    });
    poll(async () => {
      const data = await api("inbox?" + query({ agent, limit: Math.max(50, loaded.length) }));
      loaded = data.envelopes;
      render(data);
    }, 3);
  }

  function threadPage(id) {
    const list = el("div", { id: "thread" });
    const again = el("button", { type: "button", class: "secondary" }, "Refresh");
    view.replaceChildren(el("h1", {}, "Thread of ", el("span", { class: "mono" }, id)),
      el("p", { class: "muted" }, "Envelopes linked by in_reply_to, each followed by its answers: queued ones and those that left their inbox (acknowledged, dead-lettered or expired: kept in the recipient's history for the history retention)."),
      el("div", { class: "toolbar" }, again), list);
    // Not polled: a thread is read when asked for (on opening and on Refresh).
    async function load() {
      const data = await api("thread?" + query({ id }));
      if (!data.envelopes.length) { list.replaceChildren(el("p", {}, "No envelope of this thread is stored (or its history retention has passed).")); return; }
      list.replaceChildren(...data.envelopes.map((e) => el("article", { class: "message depth-" + Math.min(e.depth, 8) + (e.id === id ? " focus" : ""), "data-envelope": e.id },
        el("div", { class: "meta" },
          link(agentHref(e.from), e.from), " → ", link(agentHref(e.to), e.to), " · ", e.kind || "-", " · ", e.sent_at,
          " · ", link(threadHref(e.id), e.id),
          e.in_reply_to ? el("span", {}, " · in reply to ", link(threadHref(e.in_reply_to), e.in_reply_to)) : null,
          " · ", link(historyHref(e.to, { with: e.from }), "conversation"),
          " · ", link("#/compose?" + query({ to: e.from, reply: e.id }), "Reply")),
        el("div", { class: "text" }, e.text || ""),
        e.reference ? el("div", { class: "muted" }, "reference: ", el("a", { href: e.reference, rel: "noopener noreferrer", target: "_blank" }, e.reference)) : null)));
    }
    const mine = generation;
    const show = () => load().then(() => setStatus("updated " + new Date().toLocaleTimeString(), false),
      (e) => { if (mine === generation) setStatus(e.message, true); });
    again.addEventListener("click", show);
    show();
  }

  function deadPage() {
    const box = el("div", { id: "dead" });
    const result = el("div", {});
    view.replaceChildren(el("h1", {}, "Dead letters"),
      el("p", { class: "muted" }, "Envelopes given up on: expired before they were acknowledged (sent with a time to live), handed out too many times without an acknowledgement, or given up by their consumer. Requeue puts them back at the end of the inbox with a new id."),
      result, box);
    const selected = new Set();

    async function requeue(agent, ids) {
      try {
        const data = await api("requeue", { body: { agent, ids } });
        result.replaceChildren(notice("requeued " + data.requeued.length + " dead letter(s) of " + data.agent + ": " + data.requeued.join(" "), true));
        for (const id of ids || []) selected.delete(agent + " " + id);
        await refresh();
      } catch (e) { result.replaceChildren(notice(e.message, false)); }
    }

    async function refresh() {
      const data = await api("dead-letters");
      if (!data.groups.length) { box.replaceChildren(el("p", {}, "No dead letters.")); return; }
      box.replaceChildren(...data.groups.map((g) => el("section", { "data-agent": g.agent },
        el("h2", {}, link(agentHref(g.agent), g.agent), " ", el("span", { class: "muted" }, "(" + g.total + ")")),
        el("div", { class: "toolbar" },
          el("button", { type: "button", onclick: () => requeue(g.agent, g.letters.map((x) => x.id).filter((x) => selected.has(g.agent + " " + x))) }, "Requeue selected"),
          el("button", { type: "button", class: "secondary", onclick: () => requeue(g.agent, null) }, "Requeue all " + g.total)),
        el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", {}, "Envelope"), el("th", {}, "From"),
          el("th", { class: "num" }, "Attempts"), el("th", {}, "Why"), el("th", {}, "Dead at"), el("th", {}, "Text"))),
          el("tbody", {}, ...g.letters.map((x) => {
            const key = g.agent + " " + x.id;
            const box = el("input", { type: "checkbox", "aria-label": "select " + x.id });
            box.checked = selected.has(key);
            box.addEventListener("change", () => { if (box.checked) selected.add(key); else selected.delete(key); });
            return el("tr", { "data-envelope": x.id }, el("td", {}, box), el("td", { class: "mono" }, x.id),
              el("td", {}, x.from), el("td", { class: "num" }, x.attempts), el("td", { class: "text why", "data-reason": x.reason }, x.why),
              el("td", { class: "muted" }, x.dead_at), el("td", { class: "text" }, x.text || ""));
          }))))));
    }
    poll(refresh, 5);
  }

  function composePage(params) {
    const field = (name, input) => [el("label", { for: "compose-" + name }, name), input];
    const from = el("input", { id: "compose-from", name: "from", required: true, value: params.get("from") || localStorage.getItem("relay-ui-from") || "", placeholder: "your id, e.g. alice" });
    const to = el("input", { id: "compose-to", name: "to", required: true, list: "agent-ids", value: params.get("to") || "" });
    const kind = el("select", { id: "compose-kind", name: "kind" }, ...["note", "request", "reply", "status"].map((k) => el("option", { value: k }, k)));
    kind.value = params.get("reply") ? "reply" : "note";
    const inReplyTo = el("input", { id: "compose-in_reply_to", name: "in_reply_to", class: "mono", value: params.get("reply") || "", placeholder: "env_… (optional)" });
    const reference = el("input", { id: "compose-reference", name: "reference", placeholder: "https://… (optional)" });
    const text = el("textarea", { id: "compose-text", name: "text", required: true });
    const ids = el("datalist", { id: "agent-ids" });
    const result = el("div", { id: "compose-result" });
    const form = el("form", { class: "compose" },
      ...field("from", from), ...field("to", to), ...field("kind", kind), ...field("in_reply_to", inReplyTo),
      ...field("reference", reference), ...field("text", text), el("span", {}), el("button", { type: "submit" }, "Send"));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      try {
        const sent = await api("send", { body: { from: from.value.trim(), to: to.value.trim(), kind: kind.value,
          text: text.value, in_reply_to: inReplyTo.value.trim(), reference: reference.value.trim() } });
        localStorage.setItem("relay-ui-from", sent.from);
        result.replaceChildren(notice("sent " + sent.id + " to " + sent.to + " (" + sent.tier + ")" +
          (sent.registered_sender ? "; " + sent.from + " is now registered as a person" : ""), true));
        text.value = "";
      } catch (e) { result.replaceChildren(notice(e.message, false)); }
    });
    view.replaceChildren(el("h1", {}, "Compose"),
      el("p", { class: "muted" }, "Send as a person, with every check an agent's send gets. An id that is not registered yet is registered with the human provider, so agents can answer it; an agent's id is refused."),
      result, form, ids);
    api("agents?" + query({ sort: "agent", order: "asc", limit: 500 })).then((data) => {
      ids.replaceChildren(...data.agents.map((a) => el("option", { value: a.agent })));
    }).catch(() => {});
  }

  function trafficPage() {
    const W = 720, H = 220, PAD = 30;
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.setAttribute("width", W);
    svg.setAttribute("height", H);
    svg.setAttribute("class", "chart");
    const totals = el("tbody", {});
    const legend = el("div", { class: "legend" });
    view.replaceChildren(el("h1", {}, "Traffic by tier"),
      el("p", { class: "muted" }, "Envelopes sent per second, from this relay process's own counters (sampled every few seconds)."),
      legend, svg,
      el("h2", {}, "Totals since start"),
      el("table", { id: "traffic-totals" }, el("thead", {}, el("tr", {}, el("th", {}, "Tier"), el("th", { class: "num" }, "Sent"), el("th", { class: "num" }, "Delivered"))), totals));
    poll(async () => {
      const data = await api("traffic");
      const points = data.points;
      const peak = Math.max(1, ...points.flatMap((p) => data.tiers.map((t) => p.sent[t])));
      const first = points.length ? points[0].at_ms : 0;
      const span = Math.max(1, (points.length ? points[points.length - 1].at_ms : 1) - first);
      const x = (at) => PAD + (W - PAD - 5) * (at - first) / span;
      const shape = (name, attributes, text) => {
        const node = document.createElementNS(ns, name);
        for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
        if (text !== undefined) node.textContent = text;
        return node;
      };
      const shapes = [shape("line", { x1: PAD, y1: H - PAD, x2: W - 5, y2: H - PAD, class: "axis" }),
        shape("text", { x: 2, y: PAD - 10 }, peak.toFixed(1) + "/s")];
      // The time axis: up to 5 evenly spaced times (UTC, as every time on these pages) under the
      // baseline, at least a second apart so that no two read the same.
      const ticks = Math.max(2, Math.min(5, Math.floor(span / 1000) + 1));
      for (let i = 0; points.length && i < ticks; i += 1) {
        const at = first + span * i / (ticks - 1);
        const anchor = i === 0 ? "start" : i === ticks - 1 ? "end" : "middle";
        shapes.push(shape("line", { x1: x(at), y1: H - PAD, x2: x(at), y2: H - PAD + 4, class: "axis" }));
        shapes.push(shape("text", { x: x(at), y: H - PAD + 16, "text-anchor": anchor, class: "tick", "data-at-ms": Math.round(at) },
          new Date(at).toISOString().slice(11, 19)));
      }
      shapes.push(shape("text", { x: W - 5, y: H - 2, "text-anchor": "end", class: "axis-label" }, "time (UTC)"));
      for (const tier of data.tiers) {
        shapes.push(shape("polyline", { class: "tier-" + tier, points: points.map((p) =>
          x(p.at_ms).toFixed(1) + "," + (H - PAD - (H - 2 * PAD) * p.sent[tier] / peak).toFixed(1)).join(" ") }));
      }
      svg.replaceChildren(...shapes);
      legend.replaceChildren(...data.tiers.map((t) => el("span", {}, el("span", { class: "swatch tier-" + t }), t)));
      totals.replaceChildren(...data.tiers.map((t) => el("tr", {}, el("td", {}, t),
        el("td", { class: "num" }, data.totals.sent[t]), el("td", { class: "num" }, data.totals.delivered[t]))));
    }, 5);
  }

  // -- routing -----------------------------------------------------------------------------------

  // What the pages of history.js build with (the same helpers: text through textContent only).
  const ui = { view, el, link, api, query, notice, setStatus, agentHref, threadHref, historyHref,
    generation: () => generation };

  function route() {
    generation += 1;
    clearTimeout(timer);
    const hash = window.location.hash || "#/agents";
    const [path, search] = hash.slice(1).split("?");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    const page = parts[0] || "agents";
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === page);
    if (page === "agent" && parts[1]) agentPage(parts[1]);
    else if (page === "thread" && parts[1]) threadPage(parts[1]);
    else if (page === "history" && parts[1]) window.relayHistory.historyPage(ui, parts[1], new URLSearchParams(search || ""));
    else if (page === "search") window.relayHistory.searchPage(ui, new URLSearchParams(search || ""));
    else if (page === "dead") deadPage();
    else if (page === "compose") composePage(new URLSearchParams(search || ""));
    else if (page === "traffic") trafficPage();
    else agentsPage();
  }

  document.getElementById("logout").addEventListener("click", async () => {
    try { await api("logout", { body: {} }); } catch (e) { /* signed out anyway */ }
    window.location.assign("/ui/");
  });
  window.addEventListener("hashchange", route);
  api("session").then((data) => { csrf = data.csrf; route(); }).catch((e) => setStatus(e.message, true));
})();
