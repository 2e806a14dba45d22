"""The committed ReMe 0.4.2 workspace (tests/fixtures/reme-0.4.2, made by
tests/bench/reme_fixture.py) and the fake provider it was embedded with."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path

from fakes.provider_server import FakeProvider

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "reme-0.4.2"
DIMS = 64
MODEL = "fake-embedding"
# ReMe names its vector space after the endpoint too: the fixture was embedded through a
# fake provider on this port, and reusing its vectors needs the same endpoint.
PORT = 48231
BASE_URL = f"http://127.0.0.1:{PORT}/v1"
BIND_WAIT_S = 60.0


def copy_fixture(dest: Path) -> Path:
    """A copy of the fixture at ``dest`` with the file times ReMe saw (git keeps none)."""
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("mtimes.json", "build.json"))
    mtimes = json.loads((FIXTURE / "mtimes.json").read_text("utf-8"))
    for rel, mtime in mtimes.items():
        os.utime(dest / rel, (mtime, mtime))
    return dest


def fixture_notes() -> list[str]:
    return sorted(json.loads((FIXTURE / "mtimes.json").read_text("utf-8")))


def fixture_provider() -> FakeProvider:
    """The fake provider on the fixture's port, waiting while another run holds it."""
    deadline = time.monotonic() + BIND_WAIT_S
    while True:
        try:
            return FakeProvider(dims=DIMS, port=PORT)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def embedding_toml(api_key: str = "k") -> str:
    return (f'embedding_model_config = {{backend = "openai", base_url = "{BASE_URL}", '
            f'api_key = "{api_key}", model_name = "{MODEL}", dimensions = {DIMS}}}\n')


def passage_texts(fake: FakeProvider) -> list[str]:
    """Every text the fake was asked to embed, the health check's probe excluded."""
    out: list[str] = []
    for r in fake.requests:
        if r.path.endswith("/embeddings") and r.json["input"] != ["ping"]:
            out.extend(r.json["input"])
    return out


def with_list_vectors(ws: Path) -> int:
    """Rewrite the chunk store of the fixture copy ``ws`` as ReMe 0.4.0 and 0.4.1 wrote
    it: each vector as ``embedding``, a list of numbers. Returns how many records."""
    from recalld.daemon.index.embedcache import decode_f16
    from recalld.daemon.index.reme_import import CHUNK_STORE
    from recalld.daemon.store.fsio import REAL
    from recalld.daemon.store.records import read_foreign_records, write_records

    store = ws / "mem_metadata" / CHUNK_STORE
    records = []
    for rec in read_foreign_records(store).records:
        old = {k: v for k, v in rec.items() if k != "_embedding_f16_b64"}
        old["embedding"] = decode_f16(str(rec["_embedding_f16_b64"])).tolist()
        records.append(old)
    write_records(REAL, store, records)
    return len(records)
