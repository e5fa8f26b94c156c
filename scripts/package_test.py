"""Build (optionally) and check the PyInstaller bundle ``dist/qbstudio/``: ``make package-test``.

Checks, each printed with its numbers:

1. size of the bundle, and (with ``--build``) the build time;
2. ``ldd`` on every binary: no library the bundle should carry (Qt, Python extensions) is missing;
3. from an empty folder with a clean environment (no venv, no PYTHONPATH): ``qbstudio --version``,
   ``qbstudio --smoke-exit-after-ready`` on the bundled sample (offscreen);
4. a frozen ``qbcompiler compile`` of the sample against the same command run from the source tree:
   byte-identical, or (while MXQ files record stage timings and the intermediate MBLT's creation
   time) identical apart from those fields, which are listed;
5. ``qbstudio --check-setup``: the frozen workbench compiles the sample in a child process;
6. with Xvfb installed: a screenshot of the frozen workbench showing the sample's graph
   (``build/package-test/screenshot.png``).

Usage: ``python scripts/package_test.py [--build] [--no-screenshot]``; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "dist" / "qbstudio"
INTERNAL = DIST / "_internal"
OUT = ROOT / "build" / "package-test"
SAMPLE_SUBDIR = ("resources", "samples", "fashion_cnn")
SCREENSHOT_WAIT_S = 25

logger = logging.getLogger("package_test")


class CheckFailed(Exception):
    """One check did not hold."""


def build() -> float:
    """Run PyInstaller on the spec; returns the wall time in seconds."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN",
                    "--distpath", str(ROOT / "dist"), "--workpath", str(ROOT / "build" / "pyinstaller"),
                    str(ROOT / "packaging" / "pyinstaller" / "qbstudio.spec")], check=True, cwd=ROOT)
    return time.perf_counter() - started


def folder_bytes(folder: Path) -> int:
    """Size of the files under ``folder`` (symlinks not followed)."""
    return sum(path.lstat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment with no venv, no PYTHONPATH and a private home."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "QBSTUDIO_HOME": str(home / "qbstudio"),
           "QBCOMPILER_CACHE_DIR": str(home / "cache")}
    env.update(extra)
    return env


def run(args: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run a command; raise :class:`CheckFailed` with its output on a non-zero exit."""
    result = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise CheckFailed(f"{' '.join(args[:3])} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
                          f"{result.stderr[-3000:]}")
    return result


def check_libraries() -> str:
    """ldd every ELF file; fail when a missing library is one a bundle must carry."""
    venv_qt = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages" / "PySide6" / "Qt" / "lib"
    ours = {path.name for path in venv_qt.glob("*.so*")} if venv_qt.is_dir() else set()
    env = {"LD_LIBRARY_PATH": f"{INTERNAL}:{INTERNAL / 'PySide6' / 'Qt' / 'lib'}", "PATH": "/usr/bin:/bin"}
    missing: dict[str, set[str]] = {}
    checked = 0
    for path in INTERNAL.rglob("*"):
        if not path.is_file() or path.is_symlink() or not _is_elf(path):
            continue
        checked += 1
        output = subprocess.run(["ldd", str(path)], env=env, capture_output=True, text=True).stdout
        for line in output.splitlines():
            if "not found" in line:
                missing.setdefault(line.split()[0], set()).add(path.relative_to(DIST).as_posix())
    bundle_owned = {lib: users for lib, users in missing.items() if lib.startswith("libQt6") or lib in ours}
    if bundle_owned:
        raise CheckFailed("libraries the bundle should carry are missing: "
                          + "; ".join(f"{lib} (needed by {sorted(users)[:3]})" for lib, users in bundle_owned.items()))
    system = ", ".join(sorted(missing)) or "none"
    return f"{checked} ELF files; missing system libraries (optional plugins only): {system}"


def _is_elf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"\x7fELF"


def check_smoke(work: Path) -> str:
    """--version and --smoke-exit-after-ready on the bundled sample, offscreen, clean environment."""
    env = clean_env(work / "home", QT_QPA_PLATFORM="offscreen")
    version = run([str(DIST / "qbstudio"), "--version"], env=env, cwd=work).stdout.strip()
    project = INTERNAL.joinpath(*SAMPLE_SUBDIR[:-1], "fashion_cnn.qbproj")
    started = time.perf_counter()
    result = run([str(DIST / "qbstudio"), "--smoke-exit-after-ready", str(project)], env=env, cwd=work, timeout=180)
    wall = time.perf_counter() - started
    line = next((line for line in result.stdout.splitlines() if line.startswith("qbstudio ready")), "")
    if "window shown=True" not in line:
        raise CheckFailed(f"no ready line:\n{result.stdout}\n{result.stderr[-3000:]}")
    return f"{version}; {line.strip()}; {wall:.1f} s wall"


def compile_args(sample: Path, output: Path) -> list[str]:
    """``qbcompiler compile`` arguments for the sample."""
    return ["compile", "--model", str(sample / "model.onnx"), "--compile-config", str(sample / "compile_config.yaml"),
            "--calib-data-path", str(sample / "calib"), "--output", str(output)]


def check_frozen_compile(work: Path) -> str:
    """The bundle's qbcompiler and the source tree's CLI compile the same files to the same path: compare."""
    sample = INTERNAL.joinpath(*SAMPLE_SUBDIR)
    output = work / "compile" / "sample.mxq"  # the same path for both: the MXQ records where it was saved
    started = time.perf_counter()
    run([str(DIST / "qbcompiler"), *compile_args(sample, output)], env=clean_env(work / "home-frozen"), cwd=work)
    frozen_s = time.perf_counter() - started
    frozen = output.rename(work / "frozen.mxq")
    env = clean_env(work / "home-cli", PYTHONPATH=str(ROOT), PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    run([sys.executable, "-m", "compiler_core", *compile_args(sample, output)], env=env, cwd=work)
    return f"frozen compile {frozen_s:.1f} s; " + compare_mxq(frozen, output)


def compare_mxq(first: Path, second: Path) -> str:
    """``byte-identical``, or the decoded fields that differ (allowed: creation times only)."""
    if first.read_bytes() == second.read_bytes():
        return f"MXQ byte-identical to the CLI's ({first.stat().st_size} bytes)"
    sys.path.insert(0, str(ROOT))
    from compiler_core.mxq.container import read_mxq

    a, b = read_mxq(first), read_mxq(second)
    differences = _diff(_decoded(a), _decoded(b))
    unexpected = [path for path in differences if not _is_timestamp(path)]
    if unexpected:
        raise CheckFailed(f"frozen MXQ differs from the CLI's in {unexpected[:10]}")
    return (f"MXQ NOT byte-identical: {len(differences)} decoded field(s) differ, all times or time-derived "
            f"({', '.join(differences)}); everything else (weights, program, calibration) is identical")


def _decoded(mxq) -> dict[str, Any]:
    return {"meta": mxq.meta, "program": mxq.program, "calib": mxq.calib,
            "consts": {name: array.tobytes().hex() for name, array in mxq.consts.items()},
            "cpu": {name: data.hex() for name, data in mxq.cpu.items()}}


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [item for key in sorted(set(a) | set(b), key=str)
                for item in _diff(a.get(key), b.get(key), f"{path}.{key}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [item for index, (x, y) in enumerate(zip(a, b)) for item in _diff(x, y, f"{path}[{index}]")]
    return [] if a == b else [path or "."]


def _is_timestamp(path: str) -> bool:
    """Fields that hold times: creation times, stage durations, and the hash of the intermediate MBLT
    (which records its creation time)."""
    leaf = path.rsplit(".", 1)[-1]
    return ".timings." in path or leaf in {"created", "created_at", "timestamp", "compiled_at", "mblt_sha256"}


def check_child_process_compile(work: Path) -> str:
    """qbstudio --check-setup: the frozen workbench compiles the sample in a child process."""
    out = work / "check-setup"
    result = run([str(DIST / "qbstudio"), "--check-setup", "--check-setup-output", str(out)],
                 env=clean_env(work / "home-check"), cwd=work)
    if "Bundle: standalone (frozen)" not in result.stdout or "No problems found." not in result.stdout:
        raise CheckFailed(f"--check-setup output:\n{result.stdout}")
    line = next(line for line in result.stdout.splitlines() if "child process" in line)
    return line.strip()


def take_screenshot(work: Path, target: Path) -> str:
    """Start the frozen workbench on the sample under Xvfb and grab the screen."""
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        return "skipped: Xvfb not installed (scripts/system-packages.sh installs it)"
    display = ":97"
    server = subprocess.Popen([xvfb, display, "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    app = None
    try:
        time.sleep(1.5)
        env = clean_env(work / "home-shot", DISPLAY=display)
        project = INTERNAL.joinpath(*SAMPLE_SUBDIR[:-1], "fashion_cnn.qbproj")
        app = subprocess.Popen([str(DIST / "qbstudio"), str(project)], env=env, cwd=work,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(SCREENSHOT_WAIT_S)
        if app.poll() is not None:
            raise CheckFailed(f"the frozen workbench exited early ({app.returncode})")
        grab = ("import sys; from PySide6.QtGui import QGuiApplication; app = QGuiApplication(sys.argv[:1]); "
                "ok = app.primaryScreen().grabWindow(0).save(sys.argv[1]); sys.exit(0 if ok else 1)")
        target.parent.mkdir(parents=True, exist_ok=True)
        run([sys.executable, "-c", grab, str(target)],
            env={**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb"}, cwd=work, timeout=60)
        return f"{target.relative_to(ROOT)} ({target.stat().st_size} bytes) after {SCREENSHOT_WAIT_S} s"
    finally:
        for process in (app, server):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()


def main(argv: list[str] | None = None) -> int:
    """Run the checks; print one line per check and a JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="build the bundle first (timed)")
    parser.add_argument("--no-screenshot", action="store_true", help="skip the Xvfb screenshot")
    args = parser.parse_args(argv)
    results: dict[str, str] = {}
    if args.build:
        results["build"] = f"{build():.0f} s"
    if not (DIST / "qbstudio").is_file():
        print("no bundle in dist/qbstudio: run `make package` first", file=sys.stderr)
        return 1
    results["size"] = f"{folder_bytes(DIST) / 1e6:.0f} MB"
    failures = 0
    with tempfile.TemporaryDirectory(prefix="qbstudio-package-test-") as tmp:
        work = Path(tmp)  # outside the checkout
        checks = [("libraries", check_libraries), ("smoke", lambda: check_smoke(work)),
                  ("frozen compile", lambda: check_frozen_compile(work)),
                  ("child-process compile", lambda: check_child_process_compile(work))]
        if not args.no_screenshot:
            checks.append(("screenshot", lambda: take_screenshot(work, OUT / "screenshot.png")))
        for name, check in checks:
            try:
                results[name] = check()
            except (CheckFailed, subprocess.TimeoutExpired) as error:
                results[name] = f"FAILED: {error}"
                failures += 1
            print(f"{name}: {results[name]}", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"build: {results.get('build', 'not timed')}; size: {results['size']}; "
          f"{'all checks passed' if not failures else f'{failures} check(s) failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
