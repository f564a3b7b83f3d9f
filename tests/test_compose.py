"""docker-compose.yml and the monitoring files it mounts: valid, and wired to each other."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
MONITORING = ("prometheus", "grafana")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    document = load(COMPOSE)
    assert isinstance(document.get("services"), dict)
    return dict(document["services"])


def mounts(service: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(type, source, target) of each volume entry, short or long syntax."""
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            yield entry["type"], entry.get("source", ""), entry["target"]
            continue
        source, target, *_ = entry.split(":")
        kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        yield kind, source, target


def bind_source(service: dict[str, Any], target: str) -> Path:
    """The repository path mounted at `target` in the container (a bind mount)."""
    found = [ROOT / source for kind, source, into in mounts(service) if into == target]
    assert len(found) == 1, f"nothing (or more than one thing) is mounted at {target}"
    return found[0].resolve()


def compose_works() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60)
    return probe.returncode == 0


@pytest.mark.parametrize("profile", [[], ["--profile", "monitoring"]])
def test_docker_compose_accepts_the_file(profile: list[str]) -> None:
    if not compose_works():
        pytest.skip("docker compose is not installed here; the structural checks below stand in")
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), *profile, "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_every_service_has_an_image_and_its_declared_volumes_and_files(
    services: dict[str, Any],
) -> None:
    declared = set(load(COMPOSE).get("volumes") or {})
    used: set[str] = set()
    for name, service in services.items():
        assert "image" in service or "build" in service, f"{name}: no image and no build"
        for kind, source, target in mounts(service):
            if kind == "volume":
                assert source in declared, f"{name}: volume {source} is not declared"
                used.add(source)
            elif kind == "bind":
                assert (ROOT / source).exists(), (
                    f"{name}: {source} (mounted at {target}) is missing"
                )
        for other in service.get("depends_on", []):
            assert other in services, f"{name} depends on {other}, which is no service"
    assert used == declared, "a declared volume that no service uses"


def test_gpumux_reserves_the_gpus_and_starts_without_a_profile(services: dict[str, Any]) -> None:
    gpumux = services["gpumux"]
    assert "profiles" not in gpumux
    assert gpumux["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (ROOT / gpumux["build"]["context"] / gpumux["build"]["dockerfile"]).is_file()
    devices = gpumux["deploy"]["resources"]["reservations"]["devices"]
    assert {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]} in devices
    assert gpumux["pid"] == "host"
    state = [target for kind, _, target in mounts(gpumux) if kind == "volume"]
    assert state == [gpumux["environment"]["GPUMUX_HOME"]], "the state lives on the named volume"


def test_prometheus_and_grafana_come_with_the_monitoring_profile(
    services: dict[str, Any],
) -> None:
    for name in MONITORING:
        assert services[name].get("profiles") == ["monitoring"], name
    assert set(services) == {"gpumux", *MONITORING}


def test_published_ports_are_on_the_loopback_only(services: dict[str, Any]) -> None:
    published = 0
    for name, service in services.items():
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond the loopback"
            published += 1
    assert published == 3


def test_prometheus_scrapes_the_gpumux_metrics(services: dict[str, Any]) -> None:
    config_path = bind_source(services["prometheus"], "/etc/prometheus/prometheus.yml")
    assert config_path == ROOT / "deploy" / "prometheus" / "prometheus.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    config = load(config_path)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    gpumux = jobs["gpumux"]
    assert gpumux["metrics_path"] == "/metrics"
    targets = [target for group in gpumux["static_configs"] for target in group["targets"]]
    assert targets == ["gpumux:7683"]
    assert "7683" in str(services["gpumux"]["ports"]), "the port the daemon listens on"


def datasource_uids(node: Any) -> Iterator[str]:
    """Every datasource uid a dashboard names, in panels, targets and variables."""
    if isinstance(node, dict):
        source = node.get("datasource")
        if isinstance(source, dict) and isinstance(source.get("uid"), str):
            yield source["uid"]
        for value in node.values():
            yield from datasource_uids(value)
    elif isinstance(node, list):
        for value in node:
            yield from datasource_uids(value)


def test_grafana_provisions_prometheus_and_the_dashboards_directory(
    services: dict[str, Any],
) -> None:
    grafana = services["grafana"]
    environment = grafana["environment"]
    provisioning_in_container = environment["GF_PATHS_PROVISIONING"]
    # One mount carries the dashboards and, under provisioning/, what loads them.
    mounted = bind_source(grafana, "/etc/gpumux/grafana")
    assert mounted == ROOT / "deploy" / "grafana"
    assert provisioning_in_container == "/etc/gpumux/grafana/provisioning"
    provisioning = mounted / "provisioning"

    datasources = load(provisioning / "datasources" / "prometheus.yml")["datasources"]
    assert [(d["type"], d["url"]) for d in datasources] == [
        ("prometheus", "http://prometheus:9090")
    ]
    assert "9090:9090" in services["prometheus"]["ports"][0]

    providers = load(provisioning / "dashboards" / "gpumux.yml")["providers"]
    assert [(p["type"], p["options"]["path"]) for p in providers] == [
        ("file", "/etc/gpumux/grafana")
    ]
    home = environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == "/etc/gpumux/grafana/gpumux-dashboard.json"

    # The dashboards may name the provisioned data source by uid, or through a variable.
    provisioned = {d["uid"] for d in datasources}
    for dashboard in mounted.rglob("*.json"):
        named = set(datasource_uids(json.loads(dashboard.read_text())))
        unknown = {uid for uid in named if not uid.startswith("$")} - provisioned
        assert not unknown, (
            f"{dashboard.name} names data sources {unknown}; provisioned: {provisioned}"
        )
