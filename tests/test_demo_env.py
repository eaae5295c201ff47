"""`source var/demo/airflow/env.sh` puts the demo's `walsink` and `airflow` on the PATH (issue 25):
scripts/demo.sh runs the venv's interpreter without activating the venv. And the command the demo
prints last works in a new shell: its settings name no module of the test suite (issue 47)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # the demo lives in scripts/

from demo import demo_stack, follow_up_command, write_env_sh  # noqa: E402


def test_env_sh_puts_walsink_and_airflow_on_the_path(tmp_path):
    env_sh = tmp_path / "env.sh"
    write_env_sh(
        env_sh, {"AIRFLOW_HOME": str(tmp_path / "home it's"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    )
    bin_dir = Path(sys.executable).parent
    # A login shell's PATH without the venv, as a new terminal has.
    result = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", f". {env_sh} && command -v walsink && command -v airflow "
         "&& walsink --version && printf '%s\\n' \"$AIRFLOW_HOME\""],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    walsink, airflow, version, home = result.stdout.splitlines()
    assert walsink == str(bin_dir / "walsink") and airflow == str(bin_dir / "airflow")
    assert version.startswith("walsink ") and home == str(tmp_path / "home it's")  # quoting kept


def test_the_demos_follow_up_command_works_in_a_fresh_shell(tmp_path):
    airflow_home = tmp_path / "airflow"
    stack = demo_stack(airflow_home)  # the demo's own settings, written as the demo writes them
    write_env_sh(airflow_home / "env.sh", stack.env)
    stack.airflow("db", "migrate", timeout=600)  # what the demo has done before it prints the command
    # A new terminal: nothing of this session's environment (no PYTHONPATH, no AIRFLOW__*).
    result = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", follow_up_command(airflow_home)],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "AirflowConfigException" not in result.stderr
    assert "airflow_stack" not in (airflow_home / "env.sh").read_text()
