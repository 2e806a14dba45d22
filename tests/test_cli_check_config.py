"""`recalld serve --check-config` checks what serving would meet, beyond the config file."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonFactory
from test_cli import assert_one_line_error, recalld


def test_check_config_checks_the_log_file_as_serving_opens_it(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # --check-config passed a --log-file that serving then could not open.
    env = daemon_factory.environment()
    (tmp_path / "file").write_text("", "utf-8")
    for log_file, why in ((tmp_path / "file" / "logs" / "recalld.log",
                           f"{tmp_path / 'file'} is not a directory"),
                          (tmp_path, f"Is a directory: {tmp_path}")):
        line = assert_one_line_error(recalld("serve", "--check-config", "--log-file",
                                             str(log_file), env=env), 2)
        assert line == f"recalld: cannot open the log file {log_file}: {why}", line
    # A folder not there yet is made when serving starts: fine, and not made by a check.
    proc = recalld("serve", "--check-config", "--log-file",
                   str(tmp_path / "new" / "recalld.log"), env=env)
    assert proc.returncode == 0 and not (tmp_path / "new").exists(), proc.stderr
