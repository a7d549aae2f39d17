"""The building blocks of the batchscope dashboards, on grafana-foundation-sdk's typed builders: queries,
panels, the grid layout, and the parts every dashboard shares (variables, annotations, links, the dashboard
frame). The dashboards: dashboard_overview.py and dashboard_comparison.py; the files: generate.py.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import heatmap as heatmap_builders
from grafana_foundation_sdk.builders import prometheus as prometheus_builders
from grafana_foundation_sdk.builders import stat as stat_builders
from grafana_foundation_sdk.builders import table as table_builders
from grafana_foundation_sdk.builders import timeseries as timeseries_builders
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common, dashboard, heatmap, prometheus
from grafana_foundation_sdk.models import table as table_models

from batchscope.vllm.catalogue import NUM_REQUESTS_RUNNING

PROMETHEUS = common.DataSourceRef(type_val="prometheus", uid="prometheus")  # fixed uid, see provisioning/datasources
GRAFANA = common.DataSourceRef(type_val="grafana", uid="-- Grafana --")
DASHBOARD_TAG = "batchscope"  # every dashboard carries it; the dashboards link lists the tag's dashboards

MODEL = 'model_name=~"$model"'
SCENARIO = 'scenario=~"$scenario"'
# The exporter's info metric names the model `served_model_name`, the value vLLM puts in `model_name`.
CONFIG_INFO = 'batchscope_vllm_config_info{served_model_name=~"$model"}'
# The seed's knobs and the length, shown first on the overview, then vLLM 0.32's queue knobs (the overview's
# admission row shows these); together the key of a run comparison's rows and of the change annotations. Every
# other label of the info metric is left out of the rows.
SEED_LABELS = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "max_model_len")
QUEUE_LABELS = ("max_num_queued_reqs", "max_num_queued_tokens", "max_num_active_seqs", "long_prefill_token_threshold",
                "long_prefill_token_threshold_adaptive")
CONFIG_LABELS = SEED_LABELS + QUEUE_LABELS
CONFIG_BY = ", ".join(CONFIG_LABELS)

QUANTILES = 'quantile=~"0.5|0.99"'  # two of the three recorded quantiles keep client-vs-server panels readable

# A panel whose family only newer vLLM releases expose shows this instead of an empty graph: the query ends in
# `or` an absent() series of value -1 (a value no count, rate or share takes), mapped to this text.
NOT_EXPOSED = "not exposed by this vLLM"
NOT_EXPOSED_VALUE = -1

Query = prometheus_builders.Dataquery
Panel = cogbuilder.Builder[dashboard.Panel]


# --- building blocks -------------------------------------------------------------------------------------------


def target(expr: str, legend: str = "", *, ref_id: str = "",
           query_format: prometheus.PromQueryFormat | None = None) -> Query:
    """One Prometheus query; refIds are filled in by the panel unless given."""
    query = Query().datasource(PROMETHEUS).expr(expr).legend_format(legend)
    if ref_id:
        query.ref_id(ref_id)
    if query_format is not None:
        query.format(query_format)
    return query


def instant(expr: str, legend: str = "") -> Query:
    """The value now only: a configuration that has since changed does not show up as a second series."""
    return target(expr, legend).instant()


def instant_table(expr: str) -> Query:
    """An instant query returned as a table: labels become columns, the value becomes `Value #<refId>`."""
    return instant(expr).format(prometheus.PromQueryFormat.TABLE)


def describe(shows: str, definition: str, when_bad: str) -> str:
    """A panel's description: what it shows, whose definition it uses (vLLM's or the client's) and what to do when
    it looks bad, in that order and with these words, so every panel reads the same way (the tests check)."""
    return f"{shows} Definition: {definition} When it looks bad: {when_bad}"


def or_not_exposed(expr: str, family: str, legend_label: str = "model_name") -> str:
    """``expr``, or where the server exposes no ``family`` at all (an older vLLM) one series of value -1 whose
    ``legend_label`` reads NOT_EXPOSED, so the legend and the value mapping say why the graph is empty."""
    missing = f"absent({family}) * {NOT_EXPOSED_VALUE}"
    return f'({expr}) or on () label_replace({missing}, "{legend_label}", "{NOT_EXPOSED}", "", "")'


def not_exposed_mapping() -> list[dashboard.ValueMapping]:
    """The value mapping that prints NOT_EXPOSED for the absent() series of or_not_exposed()."""
    return [dashboard.ValueMap(options={str(NOT_EXPOSED_VALUE): dashboard.ValueMappingResult(text=NOT_EXPOSED,
                                                                                              index=0)})]


def thresholds(*steps: tuple[float | None, str]) -> dashboard_builders.ThresholdsConfig:
    """Grafana's absolute thresholds: (from value, colour) pairs, the first from None (-Infinity)."""
    return dashboard_builders.ThresholdsConfig().mode(dashboard.ThresholdsMode.ABSOLUTE).steps(
        [dashboard.Threshold(value=value, color=colour) for value, colour in steps])


def with_targets(body, targets: list[Query]):
    """Attach ``targets`` to a panel builder, lettering the refIds A, B, ... of those without one."""
    for index, query in enumerate(targets):
        if not query.build().ref_id:
            query.ref_id(chr(ord("A") + index))
        body.with_target(query)
    return body


def override(matcher_id: str, options: str, properties: dict[str, object]) -> tuple[dashboard.MatcherConfig,
                                                                                     list[dashboard.DynamicConfigValue]]:
    """A field override: the fields ``matcher_id`` (byName, byFrameRefID) matches get ``properties`` (id -> value)."""
    return (dashboard.MatcherConfig(id_val=matcher_id, options=options),
            [dashboard.DynamicConfigValue(id_val=key, value=value) for key, value in properties.items()])


def timeseries(title: str, targets: list[Query], unit: str, description: str = "", *, stacked: bool = False,
               axis_label: str = "", min_value: float | None = 0, max_value: float | None = None,
               steps: dashboard_builders.ThresholdsConfig | None = None,
               not_exposed: bool = False) -> timeseries_builders.Panel:
    """A time series panel; ``steps`` (thresholds()) are drawn as dashed lines, ``not_exposed`` maps
    or_not_exposed()'s series to its text (and the panel's no-data text says the same)."""
    style = common.GraphThresholdsStyleMode.DASHED if steps else common.GraphThresholdsStyleMode.OFF
    body = (timeseries_builders.Panel().title(title).description(description).datasource(PROMETHEUS).unit(unit)
            .color_scheme(dashboard_builders.FieldColor().mode(dashboard.FieldColorModeId.PALETTE_CLASSIC))
            .draw_style(common.GraphDrawStyle.LINE).line_width(1).fill_opacity(10 if stacked else 0)
            .show_points(common.VisibilityMode.NEVER).axis_label(axis_label)
            .stacking(common_builders.StackingConfig()
                      .mode(common.StackingMode.NORMAL if stacked else common.StackingMode.NONE).group("A"))
            .thresholds_style(common_builders.GraphThresholdsStyleConfig().mode(style))
            .legend(common_builders.VizLegendOptions().display_mode(common.LegendDisplayMode.TABLE)
                    .placement(common.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull", "max"]))
            .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                     .sort(common.SortOrder.DESCENDING)))
    if min_value is not None:
        body.min(min_value)
    if max_value is not None:
        body.max(max_value)
    if steps:
        body.thresholds(steps)
    if not_exposed:
        body.mappings(not_exposed_mapping()).no_value(f"no data (or {NOT_EXPOSED})")
    return with_targets(body, targets)


def stat(title: str, targets: list[Query], unit: str, description: str = "", *,
         text_mode: common.BigValueTextMode = common.BigValueTextMode.VALUE,
         steps: dashboard_builders.ThresholdsConfig | None = None) -> stat_builders.Panel:
    """One number per series; with ``steps`` (thresholds()) its background takes the threshold's colour."""
    body = (stat_builders.Panel().title(title).description(description).datasource(PROMETHEUS).unit(unit)
            .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
            .text_mode(text_mode).graph_mode(common.BigValueGraphMode.NONE)
            .color_mode(common.BigValueColorMode.BACKGROUND if steps else common.BigValueColorMode.NONE))
    if steps:
        body.thresholds(steps)
    return with_targets(body, targets)


def table(title: str, targets: list[Query], unit: str, description: str) -> table_builders.Panel:
    """A table of instant queries (instant_table()), one column per label and per query's value."""
    body = table_builders.Panel().title(title).description(description).datasource(PROMETHEUS).unit(unit)
    # the SDK's table options still carry the footer, which Grafana 12 moved out of the panel's options
    options = body.show_header(True).build().options
    if isinstance(options, table_models.Options):
        options.footer = None
    return with_targets(body, targets)


def heatmap_panel(title: str, expr: str, unit: str, description: str) -> heatmap_builders.Panel:
    """A histogram's buckets over time: ``expr`` gives one series per `le` (increase per interval), drawn as
    Grafana's heatmap of pre-bucketed data (no recalculation), the y axis in ``unit``."""
    body = (heatmap_builders.Panel().title(title).description(description).datasource(PROMETHEUS).unit(unit)
            .calculate(False).cell_gap(1).show_value(common.VisibilityMode.NEVER)
            .color(heatmap_builders.HeatmapColorOptions().mode(heatmap.HeatmapColorMode.SCHEME).scheme("Oranges")
                   .scale(heatmap.HeatmapColorScale.EXPONENTIAL).exponent(0.5).fill("dark-orange").reverse(False)
                   .steps(64))
            .y_axis(heatmap_builders.YAxisConfig().axis_placement(common.AxisPlacement.LEFT).unit(unit)
                    .reverse(False))
            .rows_frame(heatmap_builders.RowsHeatmapOptions().layout(common.HeatmapCellLayout.LE))
            .filter_values(heatmap_builders.FilterValueRange().le(1e-9))
            .mode(common.TooltipDisplayMode.SINGLE).show_y_histogram().show_legend())
    return with_targets(body, [target(expr, "{{le}}", query_format=prometheus.PromQueryFormat.HEATMAP)])


def config_label_stat(label: str) -> stat_builders.Panel:
    """The value of one label of the info metric, shown as the series name (a label is text, not a number)."""
    flag = f"--{label.replace('_', '-')}"
    return stat(label, [instant(CONFIG_INFO, f"{{{{{label}}}}}")], "none",
                describe(f"{flag} of the vLLM server in force now (empty: not passed and not exposed, or vLLM's "
                         "default where a command line leaves it out).",
                         "vLLM's flag, as the exporter reads it (docker command line, the given `vllm serve` "
                         "command, then what vLLM exposes).",
                         "empty: the exporter does not know it; give it --vllm-command or --vllm-command-file "
                         "(the alerts that compare against it stay silent meanwhile)."),
                text_mode=common.BigValueTextMode.NAME)


def with_config_line(body: timeseries_builders.Panel, label: str) -> timeseries_builders.Panel:
    """Draw the value of one info-metric label (e.g. max_num_seqs) over time as a red dashed series.

    PromQL cannot turn a label into a sample value, so Grafana does: a table query of the info metric over the
    range (refId "knob": one row per step, the labels as text columns) has the label's column converted to a
    number and every other column but Time dropped, which leaves the knob's value at each step as a series of
    its own; a configuration change shows as a step in the line. Only the knob query's frame is transformed.
    """
    knob = dashboard.MatcherConfig(id_val="byRefId", options="knob")
    body.with_target(target(CONFIG_INFO, label, ref_id="knob", query_format=prometheus.PromQueryFormat.TABLE))
    body.with_transformation(dashboard.DataTransformerConfig(
        id_val="convertFieldType", filter_val=knob,
        options={"conversions": [{"targetField": label, "destinationType": "number"}], "fields": {}}))
    body.with_transformation(dashboard.DataTransformerConfig(
        id_val="filterFieldsByName", filter_val=knob, options={"include": {"names": ["Time", label]}}))
    body.with_transformation(dashboard.DataTransformerConfig(
        id_val="sortBy", filter_val=knob, options={"sort": [{"field": "Time", "desc": False}]}))
    return body.with_override(*override("byFrameRefID", "knob", {
        "displayName": label,
        "color": {"mode": "fixed", "fixedColor": "red"},
        "custom.lineStyle": {"fill": "dash", "dash": [10, 10]},
        "custom.lineWidth": 2,
    }))


class Layout:
    """Places panels left to right in 24-column rows and numbers them, so gridPos never overlaps."""

    def __init__(self) -> None:
        self.panels: list[dashboard.Panel | dashboard.RowPanel] = []
        self._x = 0
        self._y = 0
        self._row_height = 0

    def row(self, question: str) -> None:
        """A row headed by the question its panels answer (a row has a title only in Grafana's schema)."""
        self._newline()
        self._place(dashboard.RowPanel(title=question, collapsed=False, panels=[]), 24, 1)
        self._newline()

    def add(self, body: Panel, width: int, height: int = 8) -> None:
        if self._x + width > 24:
            self._newline()
        self._place(body.build(), width, height)

    def _place(self, placed: dashboard.Panel | dashboard.RowPanel, width: int, height: int) -> None:
        placed.id_val = len(self.panels) + 1
        placed.grid_pos = dashboard.GridPos(x=self._x, y=self._y, w=width, h=height)
        self.panels.append(placed)
        self._x += width
        self._row_height = max(self._row_height, height)

    def _newline(self) -> None:
        self._y += self._row_height
        self._x = 0
        self._row_height = 0


# --- dashboard-wide parts --------------------------------------------------------------------------------------


def variables() -> list[cogbuilder.Builder[dashboard.VariableModel]]:
    def query_variable(name: str, metric: str, label: str) -> dashboard_builders.QueryVariable:
        variable = (dashboard_builders.QueryVariable(name).label(name).datasource(PROMETHEUS)
                    .query(f"label_values({metric}, {label})")
                    .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED).multi(True).include_all(True)
                    .all_value(".*").sort(dashboard.VariableSort.ALPHABETICAL_ASC)
                    .current(dashboard.VariableOption(selected=True, text=["All"], value=["$__all"])))
        # an interval variable's fields, which the SDK gives every variable and Grafana 12's schema does not have
        model = variable.build()
        model.auto = model.auto_min = model.auto_count = None
        return variable

    return [query_variable("model", NUM_REQUESTS_RUNNING.name, "model_name"),
            query_variable("scenario", "batchscope_client_workload_info", "scenario")]


CONFIG_TEXT = " ".join(f"{label}={{{{{label}}}}}" for label in CONFIG_LABELS)


class PrometheusAnnotation(dashboard.AnnotationQuery):
    """An annotation query of the Prometheus datasource: Grafana's AnnotationQuery and the plugin's own fields,
    which the dashboard schema leaves to the plugin (Grafana reads them from the same object)."""

    def __init__(self, name: str, icon_color: str, expr: str, *, title: str, text: str, use_value_for_time: bool,
                 tag_keys: str = "") -> None:
        super().__init__(name=name, datasource=PROMETHEUS, enable=True, hide=False, icon_color=icon_color, expr=expr)
        self.plugin_fields = {"step": "15s", "useValueForTime": use_value_for_time, "titleFormat": title,
                              "textFormat": text, "tagKeys": tag_keys}

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), **self.plugin_fields}


class GrafanaAnnotationTarget(dashboard.AnnotationTarget):
    """The Grafana datasource's annotation query by tags, with the refId Grafana 12's schema requires of every
    query (the SDK's model has none)."""

    def __init__(self, filter_type: str, tags: list[str]) -> None:
        super().__init__(limit=100, match_any=False, tags=tags, type_val=filter_type)

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), "refId": "Anno"}


class Target(cogbuilder.Builder[dashboard.AnnotationTarget]):
    """Hands a ready annotation target to the annotation builder."""

    def __init__(self, query: dashboard.AnnotationTarget) -> None:
        self._query = query

    def build(self) -> dashboard.AnnotationTarget:
        return self._query


class Annotation(cogbuilder.Builder[dashboard.AnnotationQuery]):
    """Hands a ready annotation to the dashboard builder."""

    def __init__(self, annotation: dashboard.AnnotationQuery) -> None:
        self._annotation = annotation

    def build(self) -> dashboard.AnnotationQuery:
        return self._annotation


def annotation_list() -> list[cogbuilder.Builder[dashboard.AnnotationQuery]]:
    return [
        dashboard_builders.AnnotationQuery().built_in(1).datasource(GRAFANA).enable(True).hide(True)
        .icon_color("rgba(0, 211, 255, 1)").name("Annotations & Alerts").type("dashboard")
        .target(Target(GrafanaAnnotationTarget("dashboard", []))),
        # What the exporter posts to POST /api/annotations (organization annotations, tags batchscope, config-change).
        dashboard_builders.AnnotationQuery().datasource(GRAFANA).enable(True).icon_color("orange")
        .name("Config changes (exporter posts)").target(Target(GrafanaAnnotationTarget("tags", ["config-change"]))),
        # The same events without Grafana API access: the gauge holds the unix time of the last change, so its
        # value (x 1000, Grafana wants ms) places each change at its exact moment whatever the query step; the
        # join adds the new configuration's labels for the title and text.
        Annotation(PrometheusAnnotation(
            "Config changes (Prometheus)", "purple",
            f"(batchscope_config_last_change_timestamp_seconds * 1000 > 0) * on (job, instance) "
            f"group_left ({CONFIG_BY}) batchscope_vllm_config_info",
            title="vLLM configuration changed", text=CONFIG_TEXT, use_value_for_time=True)),
        Annotation(PrometheusAnnotation(
            "Firing alerts", "red", 'ALERTS{alertstate="firing"}', title="{{alertname}}",
            text="{{severity}}: {{alertname}} firing", use_value_for_time=False, tag_keys="alertname,severity")),
    ]


def dashboard_link() -> dashboard_builders.DashboardLink:
    """The other batchscope dashboards, opened on the same time range and variable values."""
    return (dashboard_builders.DashboardLink(DASHBOARD_TAG).type(dashboard.DashboardLinkType.DASHBOARDS)
            .tags([DASHBOARD_TAG]).as_dropdown(False).keep_time(True).include_vars(True).target_blank(False)
            .icon("external link").tooltip(""))


def dashboard_model(uid: str, title: str, description: str, layout: Layout) -> dashboard.Dashboard:
    built = (dashboard_builders.Dashboard(title).uid(uid).description(description).tags([DASHBOARD_TAG, "vllm"])
             .timezone("browser").editable()
             .tooltip(dashboard.DashboardCursorSync.CROSSHAIR)  # shared crosshair: the same moment on every panel
             .refresh("5s").time("now-15m", "now").version(1)
             .variables(variables()).annotations(annotation_list()).links([dashboard_link()])).build()
    built.panels = layout.panels
    return built
