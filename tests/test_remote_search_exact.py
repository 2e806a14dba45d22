"""A lookup of a URL finds the note holding it first in the server as in the local index.

The set-up of ``test_remote_search.py``: one daemon, ``loc`` searching its own index,
``srv`` searching in the server, one shared workspace on a real PostgreSQL. Dozens of
short English notes hold URLs that share the needle's host (and id) with another path,
more than one keyword candidate pool has room for; one long Chinese note holds the URL
as typed. Both sides must rank that note first, marked exact.
"""

from __future__ import annotations

import random
import sys
import uuid
from pathlib import Path
from typing import Any

from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote_search import config, hits, search, ws_root, ws_status
from waits import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))

import bilingual

# Host and id shared by every sibling; the needle's path is the one no sibling has.
SHARED = "https://movrek.example.io/v2/talon/{}?ref=4471&view={}"
NEEDLE = SHARED.format("kestrel", "wide")
# A host alone is the one name of the lookup: the id is too short to count.
LONE = "https://pellund.example.com/api/ostra?id=73&mode=deep"


def notes() -> dict[str, str]:
    rng = random.Random("remote-url-needles")
    out: dict[str, str] = {}
    siblings = [SHARED.format("pinion", "wide"), SHARED.format("kestrel", "thin"),
                LONE.replace("ostra", "ostri"), LONE.replace("73", "74"),
                LONE.replace("deep", "flat")]
    for i in range(150):  # 80 name a sibling, the others make the hosts rare terms
        sibling = f" Saw {siblings[i % 5]} fail." if i < 80 else ""
        out[f"memory/2026-05-{1 + i % 9:02d}/en-{i:03d}.md"] = (
            f"# Log {i}\n\n{bilingual.en_text(rng, 12)}{sibling}\n")
    for name, url in (("kestrel", NEEDLE), ("ostra", LONE)):
        paras = [bilingual.zh_text(rng, 30) for _ in range(8)]
        paras[6] += f"出错的地址是 {url}，{bilingual.zh_text(rng, 5)}"
        out[f"memory/2026-05-10/{name}.md"] = "# 排查\n\n" + "\n\n".join(paras) + "\n"
    return out


def first(answer: dict[str, Any]) -> tuple[str, bool] | None:
    top = answer["results"][0] if answer["results"] else None
    return top and (top["path"], bool(top.get("exact")))


def test_a_url_in_a_long_note_ranks_first_in_the_server_as_locally(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    d = daemon_factory(config(pg_server.dsn, "s" + uuid.uuid4().hex[:12]))
    for agent in ("loc", "srv"):
        wait_for(lambda a=agent: ws_status(d, a)["remote"]["state"] == "online",
                 what=f"{agent} online")
    written = notes()
    for rel, text in written.items():
        p = ws_root(d, "loc") / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    wait_for(lambda: all((ws_root(d, "srv") / rel).exists() for rel in written)
             and ws_status(d, "loc")["remote"]["outbox"] == 0
             and ws_status(d, "srv")["remote"]["search"]["chunks_ready"],
             deadline_s=120, what="every note in the server")
    wrong = []
    for url, target in ((NEEDLE, "memory/2026-05-10/kestrel.md"),
                        (LONE, "memory/2026-05-10/ostra.md")):
        for query, filters in ((url, None), (f"why did {url} fail?", None),
                               (f"{url} 为什么失败", None), (url, {"date_from": "2026-05-02"})):
            local, server = search(d, "loc", query, filters), search(d, "srv", query, filters)
            assert server["search_mode"] == "server", server.get("server_error")
            got = (first(local), first(server), hits(local) == hits(server))
            if got != ((target, True), (target, True), True):
                wrong.append((query, filters, got))
    assert wrong == [], "\n".join(map(str, wrong))
