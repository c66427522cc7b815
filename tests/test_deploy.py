"""The monitoring files under deploy/ agree with what gpufair exports and with the compose file.

Docker does not run here, so Grafana is not started: this checks every panel's query names only
metrics gpufair exports, that the provisioning points at the dashboard and the Prometheus of the
compose stack, and that the README documents every metric. `test_prometheus.py` runs each query
against a real Prometheus.
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import Engine

import gpufair
from gpufair.api.state_metrics import StateCollector
from gpufair.cli import build_parser
from gpufair.integrations.slurm.bridge_metrics import BridgeMetrics
from gpufair.metrics import REGISTRY  # the process registry, with gpufair's own metrics

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "gpufair.json"
METRIC = re.compile(r"\bgpufair_[a-z0-9_]+")
HISTOGRAM_SERIES = re.compile(r"_(bucket|count|sum)$")


def _exported(db: Engine, *, bridge: bool = False) -> set[str]:
    """Every metric family gpufair exports: this process's own and the state gauges, and with
    `bridge` those of `gpufair slurm-bridge`."""
    state = CollectorRegistry()
    state.register(StateCollector(db, cache_s=0.0))
    suffix = {"counter": "_total", "info": "_info"}  # as exposed; the family name lacks it
    registries = (REGISTRY, state, *([BridgeMetrics().registry] if bridge else []))
    names = {m.name + suffix.get(m.type, "") for registry in registries for m in registry.collect()}
    return {n for n in names if n.startswith("gpufair_")}


def _families(expr: str) -> set[str]:
    return {HISTOGRAM_SERIES.sub("", m) for m in METRIC.findall(expr)}


def _panels() -> list[dict[str, object]]:
    panels: list[dict[str, object]] = json.loads(DASHBOARD.read_text())["panels"]
    return panels


def test_every_panel_has_a_query_on_the_provisioned_prometheus() -> None:
    datasource = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"][0]
    panels = _panels()
    assert len({p["id"] for p in panels}) == len(panels)
    graphs = [p for p in panels if p["type"] != "row"]
    assert len(graphs) >= 20
    for panel in graphs:
        targets = panel["targets"]
        assert isinstance(targets, list) and targets, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": datasource["uid"]}
        for target in targets:
            assert METRIC.search(target["expr"]), (panel["title"], target)
            assert target["datasource"]["uid"] == datasource["uid"]
    titles = " ".join(str(p["title"]) for p in graphs).lower()
    for topic in ("fair share", "effective weight", "p50 / p99", "utilisation", "evictions"):
        assert topic in titles
    for topic in ("budget", "rpc rate", "rpc errors", "latency", "ingest lag", "periodic jobs"):
        assert topic in titles


def test_dashboard_and_alerts_query_only_exported_metrics(db: Engine) -> None:
    exported = _exported(db, bridge=True)
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    expressions = [t["expr"] for p in _panels() for t in p.get("targets", [])]  # type: ignore[attr-defined]
    expressions += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = set().union(*(_families(e) for e in expressions))
    assert used - exported == set()
    # And the dashboard shows most of them.
    assert len(used) >= 30


def test_readme_documents_every_metric(db: Engine) -> None:
    readme = (ROOT / "README.md").read_text()
    missing = sorted(name for name in _exported(db, bridge=True) if f"`{name}`" not in readme)
    assert missing == []


def test_compose_stack_scrapes_gpufair_and_provisions_grafana() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    app = services["gpufair"]
    args = build_parser().parse_args(app["command"])
    assert args.metrics_address == "0.0.0.0:9464"
    assert "127.0.0.1:9464:9464" in app["ports"]

    prometheus_config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = prometheus_config["scrape_configs"][0]["static_configs"][0]["targets"]
    # One target per server process: the metrics port plus the process's index.
    assert targets == [f"gpufair:{9464 + i}" for i in range(args.processes)]
    assert prometheus_config["rule_files"] == ["alerts.yml"]
    prometheus = services["prometheus"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]

    grafana = services["grafana"]
    mounts = dict(v.rsplit(":", 2)[:2] for v in grafana["volumes"] if v.startswith("./"))
    for source in mounts:
        assert (ROOT / source).is_dir(), source
    provider = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "gpufair.yml").read_text()
    )["providers"][0]
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    datasource = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"
    assert {"promdata", "grafanadata"} <= set(compose["volumes"])


def test_no_created_series_and_a_build_info() -> None:
    exposition = generate_latest(REGISTRY).decode()
    assert "_created" not in exposition
    assert (
        REGISTRY.get_sample_value(
            "gpufair_build_info",
            {"version": gpufair.__version__, "python": platform.python_version()},
        )
        == 1.0
    )


def test_readme_names_every_eviction_reason() -> None:
    """`gpufair_evictions_total`'s row lists the values its `reason` label takes."""
    from gpufair.domain.snapshot import EvictReason

    readme = (ROOT / "README.md").read_text()
    (row,) = [
        line for line in readme.splitlines() if line.startswith("| `gpufair_evictions_total`")
    ]
    said = set(re.findall(r"`([a-z_]+)`", row.split("|")[4]))
    assert said == {reason.value for reason in EvictReason}
