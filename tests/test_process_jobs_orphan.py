"""A compile's child process stops when the workbench dies (kill -9 mid-compile, s15 under Xvfb).

The child ran its compile to the end with nobody to receive it, and wrote an MXQ into the project's run folder that no
project records (one CPU busy for as long as the compile takes: minutes for a large model).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = '''
"""A job that works until cancelled (each unit 0.05 s), as a compile does between its steps."""
import os
import time
from pathlib import Path


def work(folder, *, callback=None, cancel_token=None):
    Path(folder, "started").write_text(str(os.getpid()))
    for unit in range(2400):  # 120 s
        if cancel_token.cancelled:
            Path(folder, "cancelled").write_text(str(unit))
            return "cancelled"
        time.sleep(0.05)
    Path(folder, "finished").write_text("1")
    return "finished"
'''

GUI = '''
import sys
from qbstudio.process_jobs import run_in_process

run_in_process("orphan_job:work", sys.argv[1])
'''


def wait_for(path: Path, attempts: int) -> bool:
    for _ in range(attempts):
        if path.exists():
            return True
        time.sleep(0.1)
    return False


def test_the_child_cancels_itself_when_the_gui_is_killed(tmp_path):
    (tmp_path / "orphan_job.py").write_text(textwrap.dedent(JOB))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    gui = subprocess.Popen([sys.executable, "-c", GUI, str(tmp_path)], env=environment, start_new_session=True)
    try:
        assert wait_for(tmp_path / "started", 600), "the child did not start"
        gui.send_signal(signal.SIGKILL)
        gui.wait()
        assert wait_for(tmp_path / "cancelled", 300), "the child kept working after the GUI died"
        assert not (tmp_path / "finished").exists()
    finally:  # nothing this test started outlives it: the GUI stand-in's group, then the child by its own pid
        if gui.poll() is None:
            os.killpg(gui.pid, signal.SIGKILL)
        if (tmp_path / "started").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / "started").read_text()), signal.SIGKILL)
