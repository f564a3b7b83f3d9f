"""The dashboard in Chromium, watching a real daemon run a real sweep."""

from __future__ import annotations

import os
import pwd
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from harness import CHROMIUM, VIEWPORT, Served, daemon, launch, submit

from gpumux.config import Settings
from gpumux.home.accounts import UserAccount
from gpumux.storage import tokens
from gpumux.storage.engine import make_engine, make_sessions

if TYPE_CHECKING:
    from playwright.sync_api import Page

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
# Generous: a trial is a Python start-up on two shared cores, and the page polls every 2 s.
SWEEP_DONE_MS = 90_000
NAME = "<b>dash</b> & <i>board</i>"


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    """A 1280x800 page in headless Chromium; uncaught script errors fail the test."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport=VIEWPORT)
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        yield page
        browser.close()
    assert errors == [], "the page's script failed"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """A daemon with the split search off, so the sweep runs at the default split at once."""
    with daemon(tmp_path / "home", {"GPUMUX_SPLIT_SEARCH": "0"}) as running:
        yield running


def save_screenshot(page: Page, tmp_path: Path) -> None:
    """Into tmp_path, and into $GPUMUX_ARTIFACTS (relative to the repository) when set."""
    page.screenshot(path=tmp_path / "dashboard.png", full_page=True)
    artifacts = os.environ.get("GPUMUX_ARTIFACTS")
    if artifacts:
        directory = ROOT / artifacts
        directory.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=directory / "dashboard.png", full_page=True)


def test_the_dashboard_follows_a_sweep_to_its_end(
    page: Page, served: Served, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    assert served.token, "over TCP the page needs the token the daemon keeps for its user"
    # Through the daemon's home page, which keeps the query on its way to the dashboard.
    page.goto(f"{served.url}/?token={served.token}")
    expect(page.locator(".card.device").first).to_be_visible()
    assert "token" not in page.url, "the token is taken out of the address bar"
    with page.expect_request(lambda request: request.url.endswith("/sweeps?limit=50")) as polled:
        sweep_id = submit(
            served,
            tmp_path,
            [sys.executable, str(FIXTURES / "report_objective.py")],
            params=["x=0.25,1,2,4"],
            objective="loss:min",
            name=NAME,
            split=2,
        )
    assert polled.value.headers["authorization"] == f"Bearer {served.token}"

    row = page.locator(f"tr[data-sweep-id='{sweep_id}']")
    expect(row.locator(".sweep-status")).to_have_text("finished", timeout=SWEEP_DONE_MS)
    expect(row.locator(".progress")).to_contain_text("4/4")
    # The objective column puts the API's metric and mode back together.
    expect(row.locator("td").nth(4)).to_have_text("loss:min")
    # The sweep's name is the user's text, shown as text: no element comes out of it.
    expect(row.locator("td.cmd")).to_have_text(NAME)
    expect(row.locator("b, i")).to_have_count(0)

    row.locator("a").first.click()
    expect(page).to_have_url(re.compile(f"#/sweeps/{sweep_id}$"))
    trials = page.locator("table.trials tbody tr")
    expect(trials).to_have_count(4)
    expect(page.locator("table.trials .badge")).to_have_text(["succeeded"] * 4)
    # x = 0.25 .. 4 spans 16x: the objective is drawn against a log axis, a point per trial.
    figure = page.locator("figure.chart", has_text="loss against x (log)")
    expect(figure.locator("circle.dot")).to_have_count(4)
    expect(figure.locator("circle.highlight")).to_have_count(1)
    expect(page.locator(".best-trial")).to_contain_text("x=2")

    page.get_by_role("button", name="objective").click()
    expect(trials.first.locator("td").nth(3)).to_have_text("2")
    page.get_by_role("button", name="objective").click()
    expect(trials.first.locator("td").nth(3)).to_have_text("4")
    save_screenshot(page, tmp_path)

    page.locator("tr.best a").click()
    expect(page.locator(".trial-status")).to_have_text("succeeded")
    expect(page.locator("pre.log")).to_contain_text("reported 204")
    expect(page.locator("figure.chart", has_text="loss")).to_be_visible()


def test_the_sweep_page_draws_a_learning_curve_per_trial_that_reported_steps(
    page: Page, served: Served, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    sweep_id = submit(
        served,
        tmp_path,
        [sys.executable, str(Path(__file__).parent / "stepped_trial.py")],
        params=["x=0.5,1,2,4"],
        objective="loss:min",
        split=2,
    )
    page.goto(served.page(f"#/sweeps/{sweep_id}"))
    expect(page.locator(".sweep-status")).to_have_text("finished", timeout=SWEEP_DONE_MS)
    trials = page.locator("table.trials tbody tr")
    expect(trials).to_have_count(4)
    ids = [int(trials.nth(n).get_attribute("data-trial-id") or "") for n in range(4)]
    figure = page.locator("figure.chart.curves", has_text="loss against step")
    # x=4 reported no step: three curves, each linking to its trial; the best one (x=2) thick.
    curves = figure.locator("path.series-line")
    expect(curves).to_have_count(3)
    drawn = {int(curves.nth(n).get_attribute("data-series") or "") for n in range(3)}
    assert drawn == set(ids[:3])
    expect(figure.locator("path.series-line.best")).to_have_count(1)
    assert figure.locator("path.best").get_attribute("data-series") == str(ids[2])
    expect(figure.locator("a path.series-line")).to_have_count(3)
    expect(figure).to_contain_text("every trial that reported steps (3)")
    # The step each trial reached, in the table's step column, counted from 1 as the user
    # counts (steps 0..4 are five; x=4 reported none).
    steps = page.locator("table.trials tbody tr td:nth-child(6)")
    expect(steps).to_have_text(["5", "5", "5", "—"])


def test_an_unreachable_daemon_shows_a_banner(page: Page, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with daemon(tmp_path / "home", {"GPUMUX_SPLIT_SEARCH": "0"}) as running:
        page.goto(running.page())
        expect(page.locator(".card.device").first).to_be_visible()
        expect(page.locator("#banner")).to_be_hidden()
    expect(page.locator("#banner")).to_contain_text("daemon unreachable", timeout=10_000)
    expect(page.locator(".card.device").first).to_be_visible()


def test_a_device_card_stacks_the_shares_of_the_sweeps_that_mix_on_it(
    page: Page, served: Served, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    flag = tmp_path / "go"
    waiting = [sys.executable, str(FIXTURES / "wait_for_file.py"), str(flag)]
    page.goto(served.page())
    card = page.locator(".card.device[data-device='cpu']")
    expect(card).to_be_visible()
    # The cores that do its trials' work, as the CPU device's kind tells the API.
    listed = httpx.get(f"{served.url}/devices", headers=served.headers).json()
    cores = next(device["work_cores"] for device in listed if device["key"] == "cpu")
    expect(card).to_contain_text(f"{cores} cores")
    expect(card.locator(".meter.mix")).to_have_count(0)
    try:
        # One trial at N=2 holds half the CPU; once it runs, two at N=4 hold a quarter each.
        halves = submit(served, tmp_path, waiting, params=["x=1"], name=NAME, split=2)
        mix = card.locator(".meter.mix")
        expect(mix.locator(".load")).to_have_text("load 1/2", timeout=SWEEP_DONE_MS)
        quarters = submit(served, tmp_path, waiting, params=["x=1,2"], split=4)
        expect(mix.locator(".load")).to_have_text("load 1", timeout=SWEEP_DONE_MS)
        segments = mix.locator(".bar span")
        expect(segments).to_have_count(2)
        assert [segments.nth(n).get_attribute("data-sweep-id") for n in range(2)] == [
            str(halves),
            str(quarters),
        ]
        widths = [segments.nth(n).evaluate("s => s.style.width") for n in range(2)]
        assert widths == ["50%", "50%"]
        legend = mix.locator(".legend > span")
        owner = pwd.getpwuid(os.geteuid()).pw_name
        expect(legend.nth(0)).to_have_text(f"1/2 #{halves} {owner} {NAME}")
        expect(legend.nth(1)).to_have_text(f"2/4 #{quarters} {owner}")
        # The sweep's name is the user's text, shown as text: no element comes out of it.
        expect(mix.locator("b, i:not([class])")).to_have_count(0)
        legend.nth(1).locator("a").click()
        expect(page).to_have_url(re.compile(f"#/sweeps/{quarters}$"))
        page.go_back()
        expect(mix.locator(".bar span")).to_have_count(2)
    finally:
        flag.touch()
    expect(card.locator(".meter.mix")).to_have_count(0, timeout=SWEEP_DONE_MS)


def test_another_users_sweeps_in_the_mix_show_their_share_and_not_whose(
    page: Page, served: Served, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    others = sorted({entry.pw_uid for entry in pwd.getpwall()} - {0, os.geteuid()})
    if not others:
        pytest.skip("needs an account besides root and the test's user")
    viewer = UserAccount.from_uid(others[0])
    if os.geteuid() != 0:
        pytest.skip(f"a daemon that is not root does not serve {viewer.name}")
    # A token as `gpumux token create` run by the viewer over the socket would give them.
    engine = make_engine(Settings(home=tmp_path / "home").database_url)
    try:
        with make_sessions(engine).write.begin() as session:
            token = tokens.create_token(session=session, owner_name=viewer.name, uid=viewer.uid)
    finally:
        engine.dispose()
    flag = tmp_path / "go"
    waiting = [sys.executable, str(FIXTURES / "wait_for_file.py"), str(flag)]
    page.goto(f"{served.url}/ui/?token={token}")
    try:
        sweep_id = submit(served, tmp_path, waiting, params=["x=1"], name=NAME, split=2)
        mix = page.locator(".card.device[data-device='cpu'] .meter.mix")
        expect(mix.locator(".load")).to_have_text("load 1/2", timeout=SWEEP_DONE_MS)
        # Its id and share, as the trial on the device shows its sweep's id; no link to a
        # sweep the daemon would refuse to show, no owner, no name.
        expect(mix.locator(".legend > span")).to_have_text(f"1/2 #{sweep_id} another user")
        expect(mix.locator(".legend a")).to_have_count(0)
        expect(page.locator("tr[data-sweep-id]")).to_have_count(0)
    finally:
        flag.touch()


def test_a_framework_that_sees_no_gpu_is_shown_on_the_sweep_and_the_trial(
    page: Page, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    torch = pytest.importorskip("torch", reason="the trial is a PyTorch loop")
    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        pytest.skip("needs a PyTorch built without CUDA: a CUDA build may see a GPU")
    simulated = {"GPUMUX_SIMULATED_GPU": "h200-torch-mlp", "GPUMUX_SPLIT_SEARCH": "0"}
    with daemon(tmp_path / "home", simulated) as served:
        sweep_id = submit(
            served,
            tmp_path,
            [sys.executable, str(FIXTURES / "torch_loop.py"), "{steps}"],
            params=["steps=10,20"],
            split=2,
        )
        page.goto(served.page(f"#/sweeps/{sweep_id}"))
        expect(page.locator(".sweep-status")).to_have_text("finished", timeout=SWEEP_DONE_MS)
        expect(page.locator(".warning.no-gpu")).to_contain_text(
            "torch sees no GPU in 2 trial(s) gpumux placed on a GPU"
        )
        page.locator("table.trials tbody tr a").first.click()
        expect(page.locator(".trial-status")).to_have_text("succeeded")
        expect(page.locator(".warning.no-gpu")).to_contain_text(
            "torch sees no GPU, though gpumux placed this trial on GPU-"
        )


def test_a_script_that_prints_its_samples_shows_its_samples_per_second(
    page: Page, served: Served, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    pytest.importorskip("sklearn", reason="the example needs scikit-learn")
    # examples/digits_mlp.py imports nothing of gpumux: its samples come in GPUMUX_REPORT lines.
    sweep_id = submit(
        served,
        ROOT,
        [sys.executable, "examples/digits_mlp.py", "--epochs", "2"],
        params=["width=16,32"],
        objective="val_loss:min",
        split=2,
    )
    page.goto(served.page(f"#/sweeps/{sweep_id}"))
    expect(page.locator(".sweep-status")).to_have_text("finished", timeout=SWEEP_DONE_MS)
    header = page.locator("table.trials thead th")
    expect(header.nth(6)).to_have_text(re.compile("^samples/s"))
    rates = page.locator("table.trials tbody tr td:nth-child(7)")
    expect(rates).to_have_count(2)
    for n in range(2):
        expect(rates.nth(n)).to_have_text(re.compile(r"^[\d,]+(\.\d+)?$"))
