"""The LLM tab in Locust's web UI (its state: llm_tab.py), and the start form's load.

Locust's React UI shows extra tabs declared in ``web_ui.template_args["extended_tabs"]`` but can only fill one
with a table. So the tab is declared without a table, and a script of ours (``static/llm_tab.js``, added to
Locust's index page; plain DOM and SVG, nothing fetched from elsewhere: Locust's bundled echarts is internal to
its bundle, not reachable from outside it) draws the grid into the tab and polls ``<base>/llm/state`` every 2 s.
The same script puts the spec's load in the start form in place of the fields the spec's shape overrides.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gevent
from flask import Blueprint, Response, jsonify, request
from locust.runners import STATE_CLEANUP, STATE_STOPPED, STATE_STOPPING
from locust.web import WebUI

from batchscope.loadgen.adapter.llm_tab import LlmTab, read_at_window_start, sample_while_running
from batchscope.loadgen.adapter.serving_knobs import KnobView
from batchscope.loadgen.run import RunControl

TAB = "llm"
STATIC = Path(__file__).with_name("static")
SCRIPT = '<script src="./llm/static/llm_tab.js"></script>'  # relative: the index is served at <base>/
RUN_OVER = (STATE_STOPPING, STATE_STOPPED, STATE_CLEANUP)  # the runner's states once a run has stopped


def install(web_ui: WebUI, get_control: Callable[[], RunControl | None], grafana_url: str = "",
            knobs: KnobView | None = None, summary_file: Callable[[], str] = lambda: "") -> None:
    """Declare the LLM tab, add our script to Locust's page, serve the tab's state and start the sampler."""
    web_ui.template_args["extended_tabs"] = [{"title": "LLM", "key": TAB}]
    runner = web_ui.environment.runner
    base_path = getattr(web_ui.environment.parsed_options, "web_base_path", None) or ""
    tab = LlmTab(get_control, lambda: runner is not None and runner.state in RUN_OVER, grafana_url,
                 knobs=knobs or KnobView(), summary_path=summary_file)
    assert web_ui.app is not None
    blueprint = Blueprint("batchscope_llm", __name__, url_prefix=f"{base_path.rstrip('/')}/llm",
                          static_folder=STATIC, static_url_path="/static")

    @blueprint.route("/state")
    @web_ui.auth_required_if_enabled
    def llm_state() -> Response:
        return jsonify(tab.state())

    web_ui.app.register_blueprint(blueprint)

    @web_ui.app.after_request
    def add_script(response: Response) -> Response:
        if request.endpoint == "locust.index" and response.status_code == 200 and response.mimetype == "text/html":
            response.set_data(response.get_data(as_text=True).replace("</body>", f"{SCRIPT}\n</body>", 1))
        return response

    gevent.spawn(read_at_window_start, get_control, tab.server)
    gevent.spawn(sample_while_running, tab)
