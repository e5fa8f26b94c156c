"""The wheel and sdist: ``python -m build`` makes them; the wheel installed into a fresh venv works.

The fresh venv gets no packages from an index: the wheel is installed with ``--no-deps`` and the
dependencies are reused from the running environment through a ``.pth`` line (a ``.pth`` file's
paths are added without processing *their* ``.pth`` files, so the development checkout's editable
install does not leak in). Every command runs from an empty folder with a clean environment, so a
path relative to the checkout would fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ("qbstudio_resources", "samples", "fashion_cnn")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="venv layout checked on Linux")


def _run(args: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args[:3]} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def _source_copy(target: Path) -> Path:
    """The checkout's files (tracked or not ignored), so parallel test workers never build in one tree."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the wheel test copies the files git lists")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel, the wheel built from the sdist (as ``python -m build`` does)."""
    pytest.importorskip("build")
    source, out = _source_copy(tmp_path_factory.mktemp("src")), tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
         env=dict(os.environ), cwd=out)
    return {"sdist": next(out.glob("*.tar.gz")), "wheel": next(out.glob("*.whl"))}


@pytest.fixture(scope="module")
def venv(dists, tmp_path_factory) -> dict:
    """A fresh venv with the wheel installed (no dependencies downloaded) and a clean environment."""
    root = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], env=dict(os.environ), cwd=root)
    purelib = Path(_run([str(root / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        env={"PATH": "/usr/bin:/bin"}, cwd=root).stdout.strip())
    pip_env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "-q", "--no-deps",
          "--no-index", str(dists["wheel"])], env=pip_env, cwd=root)
    # written after the install, or pip would find the development install and skip the wheel
    (purelib / "zz_reuse_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    home = tmp_path_factory.mktemp("home")
    env = {"PATH": f"{root / 'bin'}:/usr/bin:/bin", "HOME": str(home), "QBSTUDIO_HOME": str(home / "qbstudio"),
           "QBCOMPILER_CACHE_DIR": str(home / "cache"), "QT_QPA_PLATFORM": "offscreen",
           "QTWEBENGINE_CHROMIUM_FLAGS": "--no-sandbox --disable-gpu", "LANG": "C.UTF-8"}
    work = tmp_path_factory.mktemp("work")
    return {"root": root, "purelib": purelib, "env": env, "cwd": work}


def test_wheel_carries_code_resources_and_commands(dists):
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = set(wheel.namelist())
        entry_points = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert {"compiler_core/cli.py", "compiler_core/resources.py", "qbstudio/app.py",
            "qbstudio_resources/netron/bridge.js", "qbstudio_resources/netron/privacy.js",
            "qbstudio_resources/samples/fashion_cnn.qbproj", "qbstudio_resources/samples/fashion_cnn/model.onnx",
            "qbstudio_resources/samples/fashion_cnn/calib/000_tshirt.png"} <= names
    sources = {path.relative_to(ROOT).as_posix() for package in ("compiler_core", "qbstudio")
               for path in (ROOT / package).rglob("*.py") if "__pycache__" not in path.parts}
    assert sources - names == set()  # namespace subpackages (no __init__.py) too
    assert not any(name.startswith(("tests/", "resources/")) for name in names)
    assert "qbcompiler = compiler_core.cli:main" in entry_points
    assert "qbstudio = qbstudio.app:main" in entry_points


def test_installed_code_and_resources_come_from_the_venv(venv):
    code = ("import compiler_core, qbstudio; from compiler_core.resources import resource_dir, sample_project; "
            "print(compiler_core.__file__); print(qbstudio.__file__); print(resource_dir()); "
            "print(sample_project().is_file())")
    lines = _run([str(venv["root"] / "bin" / "python"), "-c", code], env=venv["env"], cwd=venv["cwd"]).stdout.split()
    for line in lines[:3]:
        assert Path(line).is_relative_to(venv["purelib"]), line
    assert Path(lines[2]) == venv["purelib"] / "qbstudio_resources"
    assert lines[3] == "True"


def test_version_and_top_level_api(venv):
    from compiler_core import __version__

    env, cwd, bin_dir = venv["env"], venv["cwd"], venv["root"] / "bin"
    assert _run([str(bin_dir / "qbcompiler"), "--version"], env=env, cwd=cwd).stdout.strip() == f"qbcompiler {__version__}"
    assert _run([str(bin_dir / "qbstudio"), "--version"], env=env, cwd=cwd).stdout.strip() == f"qbstudio {__version__}"
    code = "from compiler_core import mblt_compile, mxq_compile, quantize, CompileConfig; print(CompileConfig.__name__)"
    assert _run([str(bin_dir / "python"), "-c", code], env=env, cwd=cwd).stdout.strip() == "CompileConfig"


def test_installed_qbcompiler_compiles_the_sample(venv):
    sample = venv["purelib"].joinpath(*SAMPLE)
    env, cwd, qbcompiler = venv["env"], venv["cwd"], str(venv["root"] / "bin" / "qbcompiler")
    _run([qbcompiler, "compile", "--model", str(sample / "model.onnx"), "--compile-config",
          str(sample / "compile_config.yaml"), "--calib-data-path", str(sample / "calib"), "--output", "sample.mxq"],
         env=env, cwd=cwd)
    assert (cwd / "sample.mxq").stat().st_size > 0
    _run([qbcompiler, "validate", "sample.mxq"], env=env, cwd=cwd)


def test_installed_qbstudio_starts_with_the_sample(venv):
    project = venv["purelib"].joinpath(*SAMPLE[:-1], "fashion_cnn.qbproj")
    result = _run([str(venv["root"] / "bin" / "qbstudio"), "--smoke-exit-after-ready", str(project)],
                  env=venv["env"], cwd=venv["cwd"], timeout=180)
    assert "qbstudio ready: window shown=True" in result.stdout


def test_sdist_carries_the_sources(dists):
    import tarfile

    with tarfile.open(dists["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"pyproject.toml", "setup.py", "resources/netron/bridge.js", "resources/samples/fashion_cnn.qbproj",
            "compiler_core/__init__.py", "qbstudio/app.py"} <= names


def test_resource_dir_in_checkout_and_frozen_bundle(monkeypatch, tmp_path):
    from compiler_core import resources

    resources.resource_dir.cache_clear()
    try:
        assert resources.resource_dir() == ROOT / "resources"
        assert resources.sample_project().is_file()
        (tmp_path / "resources").mkdir()
        monkeypatch.setattr(sys, "frozen", True, raising=False)
        monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
        resources.resource_dir.cache_clear()
        assert resources.resource_dir() == tmp_path / "resources"
    finally:
        resources.resource_dir.cache_clear()
