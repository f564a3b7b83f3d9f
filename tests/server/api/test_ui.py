from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import httpx
import pytest
from hatchling.builders.wheel import WheelBuilder

from gpumux.server.api import ui

ROOT = Path(__file__).resolve().parents[3]
WEB = ROOT / "gpumux" / "server" / "web"
WEB_FILES = {path.name for path in WEB.iterdir()}


@pytest.mark.no_query
def test_the_home_page_redirects_to_the_dashboard(api: httpx.Client) -> None:
    for path in ("/", "/ui"):
        response = api.get(path)
        assert response.status_code == 307
        # Relative: it works the same behind a proxy that serves the daemon under a prefix.
        assert response.headers["location"] == "ui/"
    page = api.get("/", follow_redirects=True)
    assert page.url.path == "/ui/" and page.status_code == 200


@pytest.mark.no_query
def test_the_redirect_keeps_the_query_that_carries_a_token(api: httpx.Client) -> None:
    response = api.get("/", params={"token": "t0k"})
    assert response.headers["location"] == "ui/?token=t0k"


@pytest.mark.no_query
def test_the_page_is_served_with_a_policy_that_runs_only_its_own_script(
    api: httpx.Client,
) -> None:
    response = api.get("/ui/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert '<main id="view">' in response.text
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy
    assert response.headers["x-content-type-options"] == "nosniff"


@pytest.mark.no_query
def test_every_file_the_page_loads_is_served_with_its_type(api: httpx.Client) -> None:
    page = api.get("/ui/").text
    named = set(re.findall(r'(?:src|href)="static/([^"]+)"', page))
    assert named == {"app.js", "style.css"}
    # The scripts are ES modules: follow their imports to every file the browser will ask for.
    pending, seen = list(named), set()
    while pending:
        name = pending.pop()
        seen.add(name)
        response = api.get(f"/ui/static/{name}")
        assert response.status_code == 200, name
        expected = "text/css" if name.endswith(".css") else "text/javascript"
        assert response.headers["content-type"] == f"{expected}; charset=utf-8"
        assert response.content == (WEB / name).read_bytes()
        imported = set(re.findall(r'^(?:import|} from) .*"\./([\w.]+)";$', response.text, re.M))
        pending.extend(imported - seen)
    assert seen == WEB_FILES - {"index.html"}, "a file of gpumux/server/web that nothing loads"


def test_the_page_loads_nothing_from_elsewhere() -> None:
    for name in WEB_FILES:
        text = (WEB / name).read_text()
        assert not re.search(r"https?://", text.replace("http://www.w3.org/2000/svg", "")), name


def test_the_scripts_never_parse_data_as_markup() -> None:
    for script in WEB.glob("*.js"):
        text = script.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, (script.name, sink)


@pytest.mark.no_query
@pytest.mark.parametrize(
    "path", ["/ui/static/index.html", "/ui/static/missing.js", "/ui/static/..%2F__init__.py"]
)
def test_only_the_dashboard_assets_are_served(api: httpx.Client, path: str) -> None:
    assert api.get(path).status_code == 404


def test_the_dashboard_is_in_the_installed_package() -> None:
    web = resources.files("gpumux.server").joinpath("web")
    assert {entry.name for entry in web.iterdir()} >= WEB_FILES
    assert set(ui.ASSETS) | {"index.html"} == WEB_FILES


def test_the_wheel_ships_the_dashboard() -> None:
    # The files hatchling would put in the wheel, listed without building it.
    included = WheelBuilder(str(ROOT)).recurse_included_files()
    shipped = {file.distribution_path for file in included}
    assert {f"gpumux/server/web/{name}" for name in WEB_FILES} <= shipped
