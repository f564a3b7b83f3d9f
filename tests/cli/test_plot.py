from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console, RenderableType

from gpumux.cli import plot
from gpumux.throughput import CurvePoint

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[2]
PIP_TIMEOUT_S = 300

# Given out of order: what is drawn is ordered by N.
POINTS = [
    CurvePoint(3, 2900.0, 13.0, 950.0),
    CurvePoint(1, 1200.0, 10.0, 900.0),
    CurvePoint(2, 2100.0, 11.4, 900.0),
    CurvePoint(5, 3100.0, 20.5, 1000.0),
    CurvePoint(8, 3150.0, 33.0, 1000.0),
    CurvePoint(13, 2800.0, 61.0, 1100.0),
    CurvePoint(21, 2500.0, None, None),
]


class AsciiFile(StringIO):
    """A file that takes ASCII only, as a pipe in the C locale does."""

    encoding = "ascii"


def text_of(renderable: RenderableType, *, width: int = 80, ascii_only: bool = False) -> str:
    file = AsciiFile() if ascii_only else StringIO()
    Console(file=file, width=width, color_system=None).print(renderable)
    return file.getvalue()


def rows_by_n(text: str) -> dict[int, str]:
    """The chart's lines keyed by the N they start with."""
    rows = {}
    for line in text.splitlines():
        first = line.split(maxsplit=1)[0] if line.strip() else ""
        if first.isdigit():
            rows[int(first)] = line
    return rows


def test_the_chart_has_a_row_per_n_in_order_with_the_best_marked() -> None:
    text = text_of(plot.terminal_chart(POINTS, unit="samples/s", best_split=5))
    assert "aggregate samples/s" in text and "seconds per trial" in text
    rows = rows_by_n(text)
    assert list(rows) == [1, 2, 3, 5, 8, 13, 21]
    assert [n for n, line in rows.items() if "◀ best" in line] == [5]
    assert "3,150" in rows[8] and "33.0s" in rows[8] and rows[21].rstrip().endswith("-")
    assert all(len(line) <= 80 for line in text.splitlines()), text


def test_bars_are_scaled_to_the_largest_value() -> None:
    rows = rows_by_n(text_of(plot.terminal_chart(POINTS, unit="samples/s", best_split=5)))
    throughput_bar = {n: line.split()[1] for n, line in rows.items()}
    full = {n: bar.count("█") for n, bar in throughput_bar.items()}
    assert full[8] > full[5] > full[3] > full[2] > full[1] > 0
    # Full scale is the whole bar; 3,100 of 3,150 ends in a part of a cell.
    assert set(throughput_bar[8]) == {"█"} and throughput_bar[5][-1] in plot.BLOCKS
    # Time per trial: the longest bar for N = 13, none for N = 21 (no trial ended).
    time_bars = {n: line.count("█") - throughput_bar[n].count("█") for n, line in rows.items()}
    assert max(time_bars, key=lambda n: time_bars[n]) == 13 and time_bars[21] == 0


def test_a_narrow_console_keeps_the_values_and_drops_the_second_bar() -> None:
    text = text_of(plot.terminal_chart(POINTS, unit="samples/s", best_split=5), width=48)
    rows = rows_by_n(text)
    assert list(rows) == [1, 2, 3, 5, 8, 13, 21]
    assert all(len(line) <= 48 for line in text.splitlines()), text
    assert "20.5s" in rows[5] and "best" in rows[5] and "seconds per trial" not in text


def test_an_ascii_console_gets_ascii_bars() -> None:
    text = text_of(plot.terminal_chart(POINTS, unit="trials/s", best_split=3), ascii_only=True)
    assert text.isascii() and "#" in text
    assert "<- best" in rows_by_n(text)[3]


def test_a_chart_with_no_points_says_so() -> None:
    text = text_of(plot.terminal_chart([], unit="samples/s", best_split=None))
    assert text.strip() == "no points measured yet"


def test_the_table_shows_speed_up_over_one_trial() -> None:
    text = text_of(plot.curve_table(POINTS, unit="samples/s", best_split=5), width=100)
    rows = rows_by_n(text.replace("│", " "))
    assert "1.00x" in rows[1] and "2.58x" in rows[5] and "best" in rows[5]
    assert "900 MiB" in rows[1] and "0:01:01" in rows[13]
    no_baseline = text_of(plot.curve_table(POINTS[2:], unit="samples/s", best_split=None))
    assert "x" not in "".join(rows_by_n(no_baseline.replace("│", " ")).values())


def test_throughput_keeps_three_significant_digits() -> None:
    assert [plot.format_throughput(v) for v in (12345.6, 123.45, 1.5, 0.012345, None)] == [
        "12,346",
        "123.5",
        "1.5",
        "0.0123",
        "-",
    ]


def test_write_png_writes_a_png(tmp_path: Path) -> None:
    path = plot.write_png(
        POINTS, unit="samples/s", best_split=5, title="H200: train.py", path=tmp_path / "c.png"
    )
    data = path.read_bytes()
    assert path == tmp_path / "c.png"
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_write_png_draws_a_curve_with_no_ended_trial(tmp_path: Path) -> None:
    points = [CurvePoint(split=1, throughput=0.0), CurvePoint(split=2, throughput=0.0)]
    path = plot.write_png(points, unit="trials/s", best_split=None, title="t", path=tmp_path / "p")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_write_png_refuses_an_empty_curve(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no measured point"):
        plot.write_png([], unit="trials/s", best_split=None, title="t", path=tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def test_write_png_without_matplotlib_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("matplotlib", "matplotlib.backends.backend_agg", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)
    hint = f"writing a PNG needs matplotlib: {re.escape(plot.plot_install())}$"
    with pytest.raises(plot.PlotUnavailable, match=hint):
        plot.write_png(POINTS, unit="samples/s", best_split=5, title="t", path=tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def _python_without_gpumux(venv: Path) -> Path:
    """A fresh virtual environment's python that sees this one's dependencies after its own
    site-packages, so that the gpumux installed into it is the one it finds."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = [entry for entry in sys.path if entry.endswith(("site-packages", "dist-packages"))]
    Path(purelib, "dependencies.pth").write_text("\n".join(ours) + "\n")
    return python


def _pip(python: Path | str, *args: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", *args, "--quiet", "--no-deps", "--no-index"]
        + ["--no-build-isolation"],
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        check=True,
        timeout=PIP_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this gpumux, as an index would serve it."""
    pytest.importorskip("hatchling", reason="building gpumux needs hatchling (the dev extra)")
    wheels = tmp_path_factory.mktemp("wheels")
    _pip(sys.executable, "wheel", "--wheel-dir", str(wheels), str(ROOT))
    (built,) = wheels.glob("gpumux-*.whl")
    return built


@pytest.mark.parametrize(
    ("install", "hint"),
    [
        (["-e", str(ROOT)], f"pip install -e {shlex.quote(f'{ROOT}[plot]')}"),
        ([str(ROOT)], f"pip install {shlex.quote(f'{ROOT}[plot]')}"),
        (["--find-links", "{wheels}", "gpumux"], "pip install 'gpumux[plot]'"),
        (["{wheel}"], "pip install 'matplotlib>=3.7'"),
    ],
    ids=["editable-clone", "clone", "index", "wheel-file"],
)
def test_the_matplotlib_hint_follows_how_gpumux_was_installed(
    wheel: Path, tmp_path: Path, install: list[str], hint: str
) -> None:
    python = _python_without_gpumux(tmp_path / "venv")
    args = [arg.format(wheels=wheel.parent, wheel=wheel) for arg in install]
    # Past the gpumux this environment sees among its dependencies, as a user has none.
    _pip(python, "install", "--ignore-installed", *args)

    shown = subprocess.run(
        [python, "-c", "from gpumux.cli import plot; print(plot.plot_install())"],
        env={name: value for name, value in os.environ.items() if name != "PYTHONPATH"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == hint


@pytest.mark.parametrize("recorded", ["{", "[]", '{"url": "file:///src/gpumux"}'])
def test_an_install_record_naming_no_directory_hints_matplotlib_alone(
    tmp_path: Path, recorded: str
) -> None:
    (tmp_path / "direct_url.json").write_text(recorded)
    distribution = importlib.metadata.PathDistribution(tmp_path)
    assert plot.install_hint(distribution) == "pip install 'matplotlib>=3.7'"
    assert plot.install_hint(None) == "pip install 'matplotlib>=3.7'"
