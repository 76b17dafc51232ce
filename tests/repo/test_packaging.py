"""The wheel ships the web page (plain files under qtts/server/static), the Wyoming package, and the
C sources of the optional kernels (compiled on the user's machine, qtts.kernels)."""

from __future__ import annotations

import zipfile

from conftest import REPO_ROOT


def test_wheel_contains_the_page_and_wyoming(tmp_path):
    from hatchling.builders.wheel import WheelBuilder

    (wheel,) = list(WheelBuilder(REPO_ROOT).build(directory=str(tmp_path), versions=["standard"]))
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("index.html", "app.js", "style.css", "icon.svg", "docs.html", "docs.js"):
        assert f"qtts/server/static/{name}" in names, name
    for name in ("__init__.py", "catalog.py", "handler.py", "service.py"):
        assert f"qtts/wyoming/{name}" in names, name
    assert "qtts/server/page.py" in names and "qtts/audio/stretch.py" in names
    from qtts.kernels import HEADERS, SOURCES

    for name in SOURCES + HEADERS + ("selftest.py",):
        assert f"qtts/kernels/{name}" in names, name
