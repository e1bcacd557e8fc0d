"""Reading the chart's Grafana dashboard: the dashboard out of a render, its queries, the metric names in them.

`metric_names` is a small PromQL reader, enough for what dashboards hold: string literals, label
matchers `{...}`, ranges `[...]` and the label lists of `by`/`without`/`on`/`ignoring`/`group_*` are
cut out; what is left that looks like an identifier, is not a keyword and is not called like a
function (`rate(`) is a metric name. `label_values(METRIC_SELECTOR, LABEL)` (a Grafana template
query) names the metric of its first argument. `exported_names` reads the Prometheus text format:
each family's `# TYPE` line gives the sample names it serves (`_total` and `_created` for a counter;
`_bucket`, `_sum`, `_count`, `_created` for a histogram), and each sample line gives its own name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml

DASHBOARD_LABEL = "grafana_dashboard"
KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
    "inf", "nan",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", re.DOTALL)
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "untyped": ("",),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a `label_values(...)` template query) reads."""
    template = _LABEL_VALUES.match(expr)
    if template:
        return metric_names(template.group(1))
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word, rest = match.group(0), text[match.end():].lstrip()
        if word.lower() in KEYWORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


def dashboard_of(rendered: str) -> dict[str, Any]:
    """The one dashboard of a `helm template` output: the JSON in the ConfigMap labelled for Grafana's sidecar."""
    maps = [d for d in yaml.safe_load_all(rendered) if d and d.get("kind") == "ConfigMap"
            and (d["metadata"].get("labels") or {}).get(DASHBOARD_LABEL) == "1"]
    assert len(maps) == 1, f"{len(maps)} ConfigMaps labelled {DASHBOARD_LABEL}"
    (text,) = maps[0]["data"].values()
    dashboard: dict[str, Any] = json.loads(text)
    return dashboard


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, query) for every panel target and every query-type template variable."""
    found = [(f"panel {panel.get('title')!r}", str(target["expr"]))
             for panel in _panels(dashboard.get("panels") or []) for target in panel.get("targets") or []]
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") == "query":
            query = variable["query"]
            found.append((f"variable {variable['name']!r}", str(query["query"] if isinstance(query, dict) else query)))
    return found


def exported_names(exposition: str) -> tuple[set[str], set[str]]:
    """(names the families declare, names that have a sample now) of a `/metrics` page."""
    declared: set[str] = set()
    sampled: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            base = family.removesuffix("_total") if kind.strip() == "counter" else family
            declared.update(base + suffix for suffix in SUFFIXES.get(kind.strip(), ("",)))
        elif line and not line.startswith("#"):
            sampled.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return declared | sampled, sampled
