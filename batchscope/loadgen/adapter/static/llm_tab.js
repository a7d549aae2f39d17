// The LLM tab of Locust's web UI (batchscope/loadgen/adapter/webui.py; its state: batchscope/loadgen/adapter/llm_tab.py): a grid of cards and
// SVG charts drawn into the tab Locust declares, from ./llm/state polled every 2 s while the tab is shown. Plain
// DOM: nothing is loaded from elsewhere, and every value is set as text (a server's labels are not markup).
(() => {
  "use strict";
  const POLL_MS = 2000;
  const CHECK_MS = 300; // how often the selected tab is looked at (React changes it without an event we see)
  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 320, HEIGHT = 150, LEFT = 44, RIGHT = 8, TOP = 8, BOTTOM = 22;
  const COLOURS = ["#1f77b4", "#ff7f0e", "#d62728", "#2ca02c"];
  const CARDS = {
    latency: "Latency (ms, requests ok in the window)", throughput: "Throughput (window so far)",
    server: "Server (vLLM /metrics)", config: "Serving configuration", requests: "Requests (whole run)",
    generator: "Load generator", spec: "Workload spec", links: "Grafana", run: "Run",
  };
  const CHARTS = [
    {id: "ttft", title: "TTFT (ms)", lines: [["ttft_p50", "p50"], ["ttft_p90", "p90"], ["ttft_p99", "p99"]]},
    {id: "itl", title: "ITL (ms)", lines: [["itl_p50", "p50"], ["itl_p90", "p90"], ["itl_p99", "p99"]]},
    {id: "queue", title: "Server requests", lines: [["running", "running"], ["waiting", "waiting"]]},
    {id: "kv", title: "KV cache usage (%)", lines: [["kv", "usage"]]},
    {id: "preemptions", title: "Preemptions (in window)", lines: [["preemptions", "preemptions"]]},
    {id: "rejections", title: "Admission rejections (req/s)", lines: [
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
    #batchscope-llm .bs-legend { font-size: 12px; display: flex; gap: 12px; flex-wrap: wrap; }
  `;

  let root = null, timer = null, latest = null;

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

  function chartCard(chart, series) {
    const box = card("chart-" + chart.id, chart.title, false);
    box.setAttribute("data-chart", chart.id);
    const times = series.t || [];
    const lines = chart.lines.map(([key, label]) => ({key, label, values: series[key] || []}));
    const numbers = lines.flatMap(line => line.values.filter(v => v !== null));
    const top = (Math.max(0, ...numbers) || 1) * 1.1; // an all-zero line sits on the axis
    const first = times.length ? times[0] : 0, last = times.length ? times[times.length - 1] : 1;
    const span = Math.max(last - first, 1e-9);
    const x = t => LEFT + (t - first) / span * (WIDTH - LEFT - RIGHT);
    const y = v => HEIGHT - BOTTOM - v / top * (HEIGHT - TOP - BOTTOM);
    const plot = svg("svg", {viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": chart.title});
    plot.appendChild(svg("line", {class: "bs-axis", x1: LEFT, y1: HEIGHT - BOTTOM, x2: WIDTH - RIGHT, y2: HEIGHT - BOTTOM}));
    plot.appendChild(svg("line", {class: "bs-axis", x1: LEFT, y1: TOP, x2: LEFT, y2: HEIGHT - BOTTOM}));
    plot.appendChild(svg("text", {x: LEFT - 4, y: TOP + 8, "text-anchor": "end"}, numbers.length ? format(top) : ""));
    plot.appendChild(svg("text", {x: LEFT - 4, y: HEIGHT - BOTTOM, "text-anchor": "end"}, "0"));
    plot.appendChild(svg("text", {x: LEFT, y: HEIGHT - 6}, times.length ? `${Math.round(first)} s` : ""));
    plot.appendChild(svg("text", {x: WIDTH - RIGHT, y: HEIGHT - 6, "text-anchor": "end"},
                         times.length ? `${Math.round(last)} s` : "no data yet"));
    const legend = el("div", {class: "bs-legend"});
    lines.forEach((line, i) => {
      const points = [];
      line.values.forEach((v, j) => { if (v !== null && times[j] !== undefined) points.push(`${x(times[j]).toFixed(1)},${y(v).toFixed(1)}`); });
      plot.appendChild(svg("polyline", {"data-series": line.key, points: points.join(" "), fill: "none",
                                        stroke: COLOURS[i % COLOURS.length], "stroke-width": 1.5}));
      const known = line.values.filter(v => v !== null);
      const now = known.length ? format(known[known.length - 1]) : "-";
      const item = el("span", {"data-series": line.key, "data-last": now});
      item.style.color = COLOURS[i % COLOURS.length];
      item.textContent = `${line.label} ${now}`;
      legend.appendChild(item);
    });
    box.appendChild(plot);
    box.appendChild(legend);
    return box;
  }

  function format(v) {
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
    const order = ["run", "latency", "server", "config", "throughput"];
    for (const key of order) if (groups.has(key)) grid.appendChild(figureCard(key, groups.get(key)));
    if (state.rows.length > 1) for (const chart of CHARTS) grid.appendChild(chartCard(chart, state.series || {}));
    for (const [key, rows] of groups) if (!order.includes(key)) grid.appendChild(figureCard(key, rows));
    const status = el("p", {class: "bs-status", "data-state": state.state},
                      state.frozen ? "Run stopped: the figures and charts are the last ones taken while it ran."
                                   : `Run ${state.state}.`);
    root.replaceChildren(status, grid);
  }

  async function poll() {
    try {
      const answer = await fetch("./llm/state", {cache: "no-store"});
      if (answer.ok) {
        latest = await answer.json();
        render(latest);
      }
    } catch (error) {
      // the UI is going away or the network hiccuped: the next poll tries again
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

  function check() {
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
