"""A restore elsewhere resumes the memory jobs where they were, without the model again."""

from __future__ import annotations

import hashlib
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard
from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider
from test_resource import active_jobs
from waits import wait_for, wait_value

from recalld.daemon.backup_check import BackupInvalid, BackupLimits, open_checked
from recalld.daemon.backup_secrets import mask_secrets


def _resource(d: DaemonHandle) -> dict[str, Any]:
    ws = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == "w")
    out: dict[str, Any] = ws["resource"]
    return out


def _chats(fake: FakeProvider) -> int:
    return sum(1 for r in fake.requests if r.path.endswith("/chat/completions"))


def test_a_restored_resource_is_not_summarized_again(daemon_factory: DaemonFactory,
                                                     tmp_path: Path) -> None:
    # Its catalog (digest, date first seen, note) is not derived from the Markdown: left
    # out of the backup, every resource of the restored workspace went to the chat model
    # again and its note was rewritten (a file directly in resource/ dated anew).
    with FakeProvider() as fake:
        config = ("[workspace_defaults.chat_model_config]\n"
                  f'base_url = "{fake.url}/v1"\napi_key = "k"\nmodel_name = "m"\n')
        d1 = daemon_factory(config)
        root = tmp_path / "ws"
        (root / "resource").mkdir(parents=True)
        (root / "resource" / "paper.txt").write_text("Rail timetables for the ferry.\n")
        d1.call("workspace.open", {"agent_id": "w", "path": str(root)})
        wait_value(lambda: _resource(d1)["files"], lambda f: f.get("processed") == 1,
                   "the resource summarized")
        # Status counts it processed before the job saves its catalog: a backup taken in
        # between held it queued, and the restored daemon summarized it again.
        wait_for(lambda: not active_jobs(d1, "w", "auto_resource"), "the resource job's end")
        summarized = _chats(fake)
        assert summarized >= 1
        archive = d1.call("backup.create", {"agents": ["w"]})["file"]

        d2 = daemon_factory(config)
        restored = d2.call("backup.restore", {"file": archive})
        assert restored["restored"][0]["opened"] is True
        wait_value(lambda: _resource(d2)["watcher"],
                   lambda w: w["last_reconcile"] is not None and w["pending"] == 0,
                   "the resource watcher's first scan")
        assert _resource(d2)["files"] == {"processed": 1}
        jobs = d2.call("jobs.list", {"agent_id": "w"})["jobs"]
        assert [j for j in jobs if j["kind"] == "auto_resource"] == [], jobs
        assert _chats(fake) == summarized


def test_keys_in_any_toml_string_form_stay_out_of_backups(daemon_factory: DaemonFactory) -> None:
    # TOML writes a string four ways and lets keys be quoted or dotted: each form of a key
    # in the config file is emptied in a backup without secrets, and the file still loads.
    keys = ["sk-" + "Triple1Aa2Bb3Cc", "sk-" + "Quoted4Dd5Ee6Ff", "sk-" + "Literal7Gg8Hh",
            "sk-" + "Esc9Ii0Jj", "sk-" + "Multi1Kk2Ll"]
    config = ("[workspace_defaults.chat_model_config]\n"
              f'api_key = """{keys[0]}"""\nmodel_name = "m"\n'
              "[workspace_defaults.embedding_model_config]\n"
              f'"api_key" = "{keys[1]}"\n'
              "[workspaces.x]\n"
              f"chat_model_config.api_key = '''{keys[2]}'''\n"
              "[workspaces.y.chat_model_config]\n"
              f'api_key = "{keys[3]}\\"z"\n'
              "[workspaces.z]\n"
              f'embedding_model_config = {{ api_key = """\n{keys[4]}""" }}\n')
    d = daemon_factory(config)
    with zipfile.ZipFile(d.call("backup.create", {})["file"]) as zf:
        text = zf.read("daemon/config.toml").decode()
    for key in keys:
        assert key.removeprefix("sk-")[:6] not in text, (key, text)
    doc = tomllib.loads(text)
    assert doc["workspace_defaults"]["chat_model_config"] == {"api_key": "", "model_name": "m"}
    assert doc["workspaces"]["z"]["embedding_model_config"] == {"api_key": ""}
    # A variable's name is no secret: the restored server settings keep it.
    masked = mask_secrets('remote = { kind = "postgres", password_env = "PG_PASS" }\n')
    assert 'password_env = "PG_PASS"' in masked


def test_keys_in_comments_stay_out_of_backups(daemon_factory: DaemonFactory) -> None:
    # A key commented out (kept for later, or revoked "probably") is still a key.
    old = "sk-" + "proj-Ab3dEf6hIj9kLm2nOp5qRs8tUvWx"
    hf = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
    config = ("[workspace_defaults.chat_model_config]\n"
              f'# the old one: api_key = "{old}"\n'
              f'#api_key = "{hf}"\n'
              'model_name = "m#1" # the model; see "docs" #2\n')
    d = daemon_factory(config)
    with zipfile.ZipFile(d.call("backup.create", {})["file"]) as zf:
        text = zf.read("daemon/config.toml").decode()
    assert old not in text and hf[:12] not in text, text
    assert '# the old one: api_key = "[REDACTED]"' in text
    assert 'model_name = "m#1" # the model; see "docs" #2' in text
    assert tomllib.loads(text)["workspace_defaults"]["chat_model_config"] == {"model_name": "m#1"}


def test_a_catalog_that_inflates_beyond_the_limits_is_refused(tmp_path: Path) -> None:
    # A catalog is written back by a restore and read by the daemon: a zstd frame of a
    # few KiB that inflates to gigabytes passes the zip's own ratio check (the zip sees
    # only the compressed bytes), so the frames are inflated as far as the limits. ReMe's
    # records are streamed: their frames declare no size, and a file may hold several.
    line = b'{"path":"resource/a.txt","digest":"0","state":"processed"}\n'
    sized, streamed = (zstandard.ZstdCompressor(write_content_size=True),
                       zstandard.ZstdCompressor(write_content_size=False))
    bomb = sized.compress(line * 200_000)
    fine = sized.compress(line * 10)
    cases = {"bomb": bomb, "fine": fine,
             "streamed-bomb": streamed.compress(line * 200_000),
             "streamed-fine": streamed.compress(line * 10) + streamed.compress(line),
             "bomb-in-second-frame": fine + streamed.compress(line * 200_000)}
    archives = {}
    for name, data in cases.items():
        member = "agents/w/mem_metadata/catalog/resource.jsonl.zst"
        with zipfile.ZipFile(tmp_path / f"{name}.zip", "w") as zf:
            zf.writestr(member, data)
            zf.writestr("meta.json", orjson.dumps({
                "format": "recalld-backup", "version": 1, "created": 0.0,
                "agents": {"w": {"path": "/x", "dirs": {"metadata_dir": "mem_metadata"}}},
                "files": [{"path": member, "size": len(data),
                           "sha256": hashlib.sha256(data).hexdigest()}]}))
        archives[name] = tmp_path / f"{name}.zip"
    for name in ("bomb", "streamed-bomb", "bomb-in-second-frame"):
        with pytest.raises(BackupInvalid, match="a decompression bomb"):
            open_checked(archives[name], BackupLimits(ratio_min_bytes=1 << 16))
    for name in ("fine", "streamed-fine"):
        assert open_checked(archives[name], BackupLimits(ratio_min_bytes=1 << 16)).agents == [
            "w"]
    # A resource that happens to be zstd is only copied, never read: not refused.
    member = "agents/w/resource/dump.jsonl.zst"
    with zipfile.ZipFile(tmp_path / "resource.zip", "w") as zf:
        zf.writestr(member, bomb)
        zf.writestr("meta.json", orjson.dumps({
            "format": "recalld-backup", "version": 1, "created": 0.0,
            "agents": {"w": {"path": "/x", "dirs": {"metadata_dir": "mem_metadata",
                                                    "resource_dir": "resource"}}},
            "files": [{"path": member, "size": len(bomb),
                       "sha256": hashlib.sha256(bomb).hexdigest()}]}))
    assert open_checked(tmp_path / "resource.zip").agents == ["w"]
