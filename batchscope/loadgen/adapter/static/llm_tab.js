// The LLM tab of Locust's web UI (batchscope/loadgen/adapter/webui.py; its state: adapter/llm_tab.py): a grid of
// cards and SVG charts drawn into the tab Locust declares, from ./llm/state polled every 2 s while the tab is
// shown; and the start form's load: the spec's, in place of Locust's users, ramp-up and run time (ignored under
// the spec's shape). Plain DOM: nothing is loaded from elsewhere, every value is set as text (a server's labels
// are not markup).
(() => {
  "use strict";
  const POLL_MS = 2000;
  const CHECK_MS = 300; // how often the selected tab is looked at (React changes it without an event we see)
  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 320, HEIGHT = 170, LEFT = 50, RIGHT = 10, TOP = 10, BOTTOM = 34;
  const IGNORED_FIELDS = ["userCount", "spawnRate", "runTime"]; // Locust's start form: the spec's shape decides
  const COLOURS = ["#1f77b4", "#ff7f0e", "#d62728", "#2ca02c"];
  const CARDS = {
    latency: "Latency (ms, requests ok in the window)", throughput: "Throughput (window so far)",
    server: "Server (vLLM /metrics)", config: "Serving configuration", knobs: "Knobs in effect",
    requests: "Requests (whole run)",
    generator: "Load generator", spec: "Workload spec", links: "Grafana", run: "Run",
  };
  // digits: a latency legend shows the table's two decimals (its p99 is the table's, from the same window)
  const latency = name => ({id: name, title: `${name.toUpperCase()} in the window`, unit: "ms", digits: 2,
                            lines: ["p50", "p90", "p99"].map(p => [`${name}_${p}`, p])});
  const CHARTS = [
    latency("ttft"), latency("tpot"), latency("itl"),
    {id: "throughput", title: "Completions", unit: "req/s", lines: [["completed_per_s", "ok"]]},
    {id: "tokens", title: "Output tokens", unit: "tokens/s", lines: [["output_tokens_per_s", "output"]]},
    {id: "queue", title: "Server requests", unit: "requests", lines: [["running", "running"], ["waiting", "waiting"]]},
    {id: "kv", title: "KV cache usage", unit: "%", lines: [["kv", "usage"]]},
    {id: "preemptions", title: "Preemptions (in window)", unit: "count", lines: [["preemptions", "preemptions"]]},
    {id: "rejections", title: "Admission rejections", unit: "req/s", lines: [
      ["rejected_max_num_queued_reqs", "max_num_queued_reqs"], ["rejected_max_num_queued_tokens", "max_num_queued_tokens"]]},
  ];
  const STYLE = `
    #batchscope-llm { padding: 12px 0; }
    #batchscope-llm .bs-status { margin: 0 0 12px; font-weight: 600; }
    #batchscope-llm .bs-grid { display: grid; gap: 12px; grid-template-columns: repeat(auto-fill, minmax(340px, 1fr)); }
    #batchscope-llm .bs-card { border: 1px solid rgba(127,127,127,.35); border-radius: 6px; padding: 10px 12px; }
    #batchscope-llm .bs-card.bs-wide { grid-column: span 2; }
    #batchscope-llm h3 { margin: 0 0 8px; font-size: 14px; }
    #batchscope-llm table { border-collapse: collapse; width: 100%; font-size: 13px; }
    #batchscope-llm td, #batchscope-llm th { padding: 2px 6px; text-align: right; border-bottom: 1px solid rgba(127,127,127,.2); }
    #batchscope-llm td:first-child, #batchscope-llm th:first-child { text-align: left; }
    #batchscope-llm td.bs-text { text-align: left; word-break: break-all; }
    #batchscope-llm svg { width: 100%; height: auto; font-size: 10px; }
    #batchscope-llm svg text { fill: currentColor; }
    #batchscope-llm .bs-axis { stroke: rgba(127,127,127,.6); }
    #batchscope-llm .bs-grid-line { stroke: rgba(127,127,127,.18); }
    .bs-load { border: 1px solid rgba(127,127,127,.35); border-radius: 6px; padding: 8px 12px; }
    .bs-load h3 { margin: 0 0 6px; font-size: 14px; }
    .bs-load table { border-collapse: collapse; font-size: 14px; }
    .bs-load td { padding: 2px 12px 2px 0; }
    #batchscope-llm .bs-legend { font-size: 12px; display: flex; gap: 12px; flex-wrap: wrap; }
  `;

  let root = null, timer = null, latest = null, asking = false;

  function el(tag, attrs = {}, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function svg(tag, attrs = {}, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function card(key, title, wide) {
    const box = el("section", {class: "bs-card" + (wide ? " bs-wide" : ""), "data-card": key});
    box.appendChild(el("h3", {}, title));
    return box;
  }

  function figureCard(key, rows) {
    const box = card(key, CARDS[key] || key, key === "latency");
    const table = el("table");
    if (key === "latency") {
      const head = el("tr");
      for (const title of ["", "mean", "p50", "p90", "p99"]) head.appendChild(el("th", {}, title));
      table.appendChild(head);
    }
    for (const row of rows) {
      const line = el("tr", {"data-figure": row.figure});
      line.appendChild(el("td", {}, row.figure));
      const cells = key === "latency" ? [row.value, row.p50, row.p90, row.p99] : [row.value];
      for (const cell of cells) {
        const td = el("td", {"data-value": cell}, cell);
        if (key !== "latency" && !/^-?[\d.]+$/.test(cell)) td.className = "bs-text";
        line.appendChild(td);
      }
      table.appendChild(line);
    }
    box.appendChild(table);
    return box;
  }

  // about four round steps (1, 2, 2.5 or 5 x 10^k) from 0 to the first at or above ``top``
  function ticks(top) {
    const raw = top / 4, power = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 2.5, 5, 10].map(m => m * power).find(m => m >= raw);
    const values = [0];
    while (values[values.length - 1] < top) values.push(Number((values.length * step).toPrecision(12)));
    return values;
  }

  function chartCard(chart, series) {
    const box = card("chart-" + chart.id, `${chart.title} (${chart.unit})`, false);
    box.setAttribute("data-chart", chart.id);
    const times = series.t || [];
    const lines = chart.lines.map(([key, label]) => ({key, label, values: series[key] || []}));
    const numbers = lines.flatMap(line => line.values.filter(v => v !== null));
    const yTicks = ticks(Math.max(0, ...numbers) || 1); // an all-zero line sits on the axis
    const top = yTicks[yTicks.length - 1];
    const first = times.length ? times[0] : 0, last = times.length ? times[times.length - 1] : 1;
    const xTicks = ticks(Math.max(last - first, 1)).map(t => t + first).filter(t => t <= last + 1e-9);
    const span = Math.max(last - first, 1e-9);
    const x = t => LEFT + (t - first) / span * (WIDTH - LEFT - RIGHT);
    const y = v => HEIGHT - BOTTOM - v / top * (HEIGHT - TOP - BOTTOM);
    const plot = svg("svg", {viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": box.firstChild.textContent});
    for (const v of yTicks) {
      plot.appendChild(svg("line", {class: "bs-grid-line", x1: LEFT, y1: y(v), x2: WIDTH - RIGHT, y2: y(v)}));
      plot.appendChild(svg("text", {class: "bs-tick-y", x: LEFT - 4, y: y(v) + 3, "text-anchor": "end"}, format(v)));
    }
    if (times.length) for (const t of xTicks)
      plot.appendChild(svg("text", {class: "bs-tick-x", x: x(t), y: HEIGHT - BOTTOM + 12, "text-anchor": "middle"},
                           String(Math.round(t))));
    plot.appendChild(svg("line", {class: "bs-axis", x1: LEFT, y1: HEIGHT - BOTTOM, x2: WIDTH - RIGHT, y2: HEIGHT - BOTTOM}));
    plot.appendChild(svg("line", {class: "bs-axis", x1: LEFT, y1: TOP, x2: LEFT, y2: HEIGHT - BOTTOM}));
    plot.appendChild(svg("text", {x: (LEFT + WIDTH - RIGHT) / 2, y: HEIGHT - 4, "text-anchor": "middle"},
                         times.length ? "time since the run's start (s)" : "no data yet"));
    plot.appendChild(svg("text", {x: 0, y: 0, "text-anchor": "middle",
                                  transform: `translate(10 ${(TOP + HEIGHT - BOTTOM) / 2}) rotate(-90)`}, chart.unit));
    const legend = el("div", {class: "bs-legend"});
    lines.forEach((line, i) => {
      const points = [];
      line.values.forEach((v, j) => { if (v !== null && times[j] !== undefined) points.push(`${x(times[j]).toFixed(1)},${y(v).toFixed(1)}`); });
      plot.appendChild(svg("polyline", {"data-series": line.key, points: points.join(" "), fill: "none",
                                        stroke: COLOURS[i % COLOURS.length], "stroke-width": 2}));
      const known = line.values.filter(v => v !== null);
      const now = known.length ? format(known[known.length - 1], chart.digits) : "-";
      const item = el("span", {"data-series": line.key, "data-last": now});
      item.style.color = COLOURS[i % COLOURS.length];
      item.textContent = `${line.label} ${now}`;
      legend.appendChild(item);
    });
    box.appendChild(plot);
    box.appendChild(legend);
    return box;
  }

  function format(v, digits) {
    if (digits !== undefined) return v.toFixed(digits);
    if (Number.isInteger(v)) return String(v);
    return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2);
  }

  function render(state) {
    const grid = el("div", {class: "bs-grid"});
    const groups = new Map();
    for (const row of state.rows) {
      if (!groups.has(row.card)) groups.set(row.card, []);
      groups.get(row.card).push(row);
    }
    const order = ["run", "latency", "knobs", "server", "config", "throughput"];
    for (const key of order) if (groups.has(key)) grid.appendChild(figureCard(key, groups.get(key)));
    if (state.rows.length > 1) for (const chart of CHARTS) grid.appendChild(chartCard(chart, state.series || {}));
    for (const [key, rows] of groups) if (!order.includes(key)) grid.appendChild(figureCard(key, rows));
    const status = el("p", {class: "bs-status", "data-state": state.state},
                      state.frozen ? "Run stopped: the figures and charts are the last ones taken while it ran."
                                   : `Run ${state.state}.`);
    root.replaceChildren(status, grid);
  }

  async function poll() {
    if (asking) return;
    asking = true;
    try {
      const answer = await fetch("./llm/state", {cache: "no-store"});
      if (answer.ok) {
        latest = await answer.json();
        if (root !== null) render(latest);
      }
    } catch (error) {
      // the UI is going away or the network hiccuped: the next poll tries again
    } finally {
      asking = false;
    }
  }

  function shown() {
    const tab = document.querySelector("[role=tab][aria-selected=true]");
    return Boolean(tab) && tab.textContent.trim() === "LLM";
  }

  function place() {
    const tabs = document.querySelector("[role=tablist]");
    const bar = tabs && tabs.closest(".MuiTabs-root");
    if (!bar || !bar.parentElement) return false;
    const anchor = bar.parentElement;
    if (root === null) {
      document.head.appendChild(el("style", {}, STYLE));
      root = el("div", {id: "batchscope-llm"});
    }
    if (anchor.nextElementSibling !== root) anchor.after(root);
    return true;
  }

  // Locust's start form (its first page, and the New/Edit dialogs): Locust's fields the spec overrides hidden,
  // the spec's load shown in their place, the host read-only (the run's target was checked at start-up)
  function startForm() {
    const users = document.querySelector("input[name=userCount]");
    const form = users && users.closest("form");
    if (!form || form.querySelector(".bs-load")) return;
    for (const name of IGNORED_FIELDS) {
      const field = form.querySelector(`input[name=${name}]`);
      const box = field && field.closest(".MuiFormControl-root, .MuiTextField-root");
      if (box) box.style.display = "none";
    }
    const host = form.querySelector("input[name=host]");
    if (host) host.readOnly = true;
    const block = el("div", {class: "bs-load"});
    block.appendChild(el("h3", {}, "Load (from the workload spec)"));
    const table = el("table");
    for (const [label, value] of (latest && latest.load) || []) {
      const line = el("tr", {"data-load": label});
      line.appendChild(el("td", {}, label));
      line.appendChild(el("td", {}, value));
      table.appendChild(line);
    }
    block.appendChild(table);
    users.closest(".MuiFormControl-root, .MuiTextField-root").before(block);
  }

  function check() {
    if (latest === null) poll();
    else startForm();
    const visible = shown() && place();
    if (root !== null) root.style.display = visible ? "" : "none";
    if (visible && timer === null) {
      poll();
      timer = setInterval(poll, POLL_MS);
    } else if (!visible && timer !== null) {
      clearInterval(timer);
      timer = null;
    }
  }

  setInterval(check, CHECK_MS);
})();
