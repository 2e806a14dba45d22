"""What ReMe's folders hold besides ReMe's files: a FIFO or a device named like one of its
cache files or chunk records is passed by (named in the report), never waited on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from reme_fixture_util import copy_fixture, embedding_toml, fixture_provider, passage_texts
from test_reme_import import wait_full

from recalld.daemon.index import reme_import

SPACE = "78677232862f"  # the fixture's space (tests/fixtures/reme-0.4.2/mem_metadata)


def test_fifos_named_like_remes_files_do_not_hold_the_import(daemon_factory: Any,
                                                              tmp_path: Path) -> None:
    ws = copy_fixture(tmp_path / "ws")
    meta = ws / "mem_metadata"
    # Nobody ever writes to them: a read would wait for good.
    os.mkfifo(meta / "embedding_store" / f"other_v1_{SPACE}.npz")  # of the configured space
    os.mkfifo(meta / "embedding_store" / "default_v1_0123456789ab.npz")  # of another one
    os.mkfifo(meta / "file_graph" / "default.jsonl.zst.new")
    (meta / "file_graph" / "default.jsonl.zst").unlink()
    os.mkfifo(meta / "file_graph" / "default.jsonl.zst")  # where older versions wrote
    with fixture_provider() as fake:
        d = daemon_factory(f'[workspaces.w]\npath = "{ws}"\n{embedding_toml()}'
                           '[daemon]\npersist_delay_s = 0.05\n')
        d.call("index.sync", {"agent_id": "w"})
        st = wait_full(d)
        assert passage_texts(fake) == []  # ReMe's own cache file still gave every vector
        reme = d.call("workspace.open", {"agent_id": "w", "path": str(ws),
                                         "import_report": True})["import"]["vectors"]["reme"]
        assert "a device, FIFO or socket" in reme["refused"][f"other_v1_{SPACE}.npz"], reme
        assert "0123456789ab" in reme["other_spaces"], reme
        assert st["reused_vectors"] == st["total"]
        assert d.stop() == 0
    assert reme_import.remove_own_mirrors(meta) == []
