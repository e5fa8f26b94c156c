"""Desktop integration files: the .desktop entry and AppStream metainfo validate, MIME types and icons agree."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINUX = ROOT / "packaging" / "linux"
APP_ID = "io.github.qbstudio.qbstudio"
DESKTOP = LINUX / f"{APP_ID}.desktop"
METAINFO = LINUX / f"{APP_ID}.metainfo.xml"
MIME = LINUX / "qbstudio-mime.xml"
MIME_NS = "{http://www.freedesktop.org/standards/shared-mime-info}"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (scripts/system-packages.sh installs it)")
    return path


def _desktop_entry() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    parser.read(DESKTOP, encoding="utf-8")
    return parser["Desktop Entry"]


def test_desktop_file_validates():
    result = subprocess.run([_tool("desktop-file-validate"), str(DESKTOP)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_metainfo_validates():
    result = subprocess.run([_tool("appstreamcli"), "validate", "--no-net", str(METAINFO)], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    root = ET.parse(METAINFO).getroot()
    assert root.findtext("id") == APP_ID
    assert root.find("launchable").text == DESKTOP.name


def test_mime_types_agree_between_desktop_metainfo_and_mime_xml():
    declared = {node.get("type"): [glob.get("pattern") for glob in node.iter(f"{MIME_NS}glob")]
                for node in ET.parse(MIME).getroot().iter(f"{MIME_NS}mime-type")}
    assert sorted(pattern for patterns in declared.values() for pattern in patterns) == ["*.mblt", "*.mxq", "*.qbproj"]
    in_desktop = [value for value in _desktop_entry()["MimeType"].split(";") if value]
    in_metainfo = [node.text for node in ET.parse(METAINFO).getroot().iter("mediatype")]
    assert sorted(in_desktop) == sorted(in_metainfo) == sorted(declared)


def test_mxq_magic_matches_real_files():
    magic = next(ET.parse(MIME).getroot().iter(f"{MIME_NS}match")).get("value")
    expected = magic.encode().decode("unicode_escape").encode("latin-1")
    from compiler_core.mxq import layout

    assert expected == layout.MAGIC


def test_icons_exist_in_every_size():
    icon = _desktop_entry()["Icon"]
    assert (ROOT / "packaging" / "icons" / f"{icon}.svg").is_file()
    for size in (16, 24, 32, 48, 64, 128, 256, 512):
        png = ROOT / "packaging" / "icons" / "hicolor" / f"{size}x{size}" / "apps" / f"{icon}.png"
        from PIL import Image

        with Image.open(png) as image:
            assert image.size == (size, size) and image.mode == "RGBA"


def test_xdg_install_and_uninstall_round_trip(tmp_path):
    _tool("xdg-mime")
    _tool("update-mime-database")
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "share"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_DATA_DIRS": "/usr/share"}
    for folder in ("share", "config"):
        (tmp_path / folder).mkdir()
    executable = tmp_path / "bin" / "qbstudio"
    executable.parent.mkdir()
    executable.write_text("#!/bin/sh\n")
    executable.chmod(0o755)
    subprocess.run(["sh", str(LINUX / "install.sh"), str(executable)], env=env, check=True, capture_output=True)
    installed = tmp_path / "share" / "applications" / DESKTOP.name
    assert f'Exec="{executable}" %f' in installed.read_text()
    assert (tmp_path / "share" / "icons" / "hicolor" / "48x48" / "apps" / "qbstudio.png").is_file()
    project = tmp_path / "a.qbproj"
    project.write_text("{}")
    query = subprocess.run(["xdg-mime", "query", "filetype", str(project)], env=env, capture_output=True, text=True)
    assert query.stdout.strip() == "application/x-qbstudio-project"
    subprocess.run(["sh", str(LINUX / "uninstall.sh")], env=env, check=True, capture_output=True)
    assert not installed.exists()
    assert not (tmp_path / "share" / "icons" / "hicolor" / "48x48" / "apps" / "qbstudio.png").exists()
    assert not (tmp_path / "share" / "mime" / "packages" / MIME.name).exists()
