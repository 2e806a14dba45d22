"""A daemon that only searches never imports the capture, dream and chat code, and that
code is imported and works when first used.

A real daemon started through a launcher that, on SIGUSR1, writes the daemon's
``sys.modules`` to a file (Python runs the handler on the event loop's thread: trio wakes
up for the signal), so the test reads what the serving process has imported at two
moments: after a keyword search, and after a capture job and a dream job through a
scripted OpenAI-compatible chat server on 127.0.0.1. And numpy's BLAS gets the threads
``backfill_threads`` says unless the environment chose a count (its pool starts at import).
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from waits import wait_for, wait_job

from recalld.daemon import main as daemon_main

#: Modules a keyword search does not need: the capture pipeline, dream, the chat client,
#: the agent tools and the other methods' handlers. (The redaction rules are not among
#: them: indexing a note redacts it.)
NOT_FOR_SEARCH = (
    "recalld.daemon.memory.auto_memory",
    "recalld.daemon.memory.dream",
    "recalld.daemon.memory.digest",
    "recalld.daemon.memory.filetools",
    "recalld.daemon.memory.recall",
    "recalld.daemon.providers.chat",
    "recalld.daemon.qwenpaw_import",
    "recalld.daemon.rpc.agent_methods",
    "recalld.daemon.rpc.dream_methods",
    "recalld.daemon.rpc.job_methods",
    "recalld.daemon.rpc.memory_methods",
    "recalld.daemon.rpc.ops_methods",
    "recalld.daemon.rpc.upkeep_methods",
)

LAUNCHER = (
    "import json, os, runpy, signal, sys\n"
    "def dump(signum, frame):\n"
    "    out = os.environ['MODULES_OUT']\n"
    "    with open(out + '.tmp', 'w') as f:\n"
    "        json.dump(sorted(sys.modules), f)\n"
    "    os.replace(out + '.tmp', out)\n"
    "signal.signal(signal.SIGUSR1, dump)\n"
    "sys.argv = ['recalld-daemon', *sys.argv[1:]]\n"
    "runpy.run_module('recalld.daemon.main', run_name='__main__')\n"
)


def modules(d: DaemonHandle, out: Path) -> set[str]:
    """What the daemon has imported right now."""
    out.unlink(missing_ok=True)
    d.signal(signal.SIGUSR1)
    wait_for(out.exists, "the daemon's module list")
    return set(json.loads(out.read_text(encoding="utf-8")))


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def indexed_then_stopped(daemon_factory: DaemonFactory, root: Path, day: str,
                         notes: list[str], needle: str, query: str) -> str:
    """A workspace of ``notes`` (one a day from ``day``-01, named ``log.md``) and
    ``needle`` (``memory/<day>-20/needle.md``), indexed by a daemon that has stopped since:
    the next daemon's start is a warm one. Returns the configuration."""
    for i, text in enumerate(notes):
        write(root, f"memory/{day}-{1 + i:02d}/log.md", text)
    write(root, f"memory/{day}-20/needle.md", needle)
    config = f'[workspaces.k]\npath = "{root}"\ndream_cron_enabled = false\n'
    first = daemon_factory(config)
    built = first.call("memory.search", {"agent_id": "k", "query": query,
                                         "sync": True})["results"]
    assert built[0]["path"] == f"memory/{day}-20/needle.md"
    assert first.stop() == 0
    return config


def test_a_search_imports_no_capture_dream_or_chat_code_until_they_are_used(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    keyword = tmp_path / "keyword"
    for i in range(20):
        write(keyword, f"memory/2026-11-{10 + i % 9:02d}/n{i}.md",
              f"# Note {i}\n\nThe heron number {i} waits by the river.\n")
    write(keyword, "memory/2026-11-20/needle.md", "# Needle\n\nThe quartzite lantern.\n")
    out = tmp_path / "modules.json"
    d = daemon_factory(
        f'[workspaces.k]\npath = "{keyword}"\ndream_cron_enabled = false\n',
        launcher=(sys.executable, "-c", LAUNCHER), MODULES_OUT=str(out))

    hits = wait_for(lambda: d.call("memory.search", {
        "agent_id": "k", "query": "quartzite lantern", "sync": True})["results"])
    assert hits[0]["path"] == "memory/2026-11-20/needle.md"
    status = d.call("daemon.status")
    ws = next(w for w in status["workspaces"] if w["agent_id"] == "k")
    assert {"capture", "inbox", "dream", "resource"} <= set(ws)
    loaded = modules(d, out)
    assert "recalld.daemon.rpc.search_methods" in loaded
    assert sorted(loaded & set(NOT_FOR_SEARCH)) == []

    # First use: a workspace with a chat model, turns captured by auto_memory, a dream.
    chatty = tmp_path / "chatty"
    write(chatty, "memory/2026-11-20/a.md", "# Monday\n\nThe user prefers tea over coffee.\n")
    d.call("workspace.open", {"agent_id": "c", "path": str(chatty), "config": {
        "dream_cron_enabled": False,
        "chat_model_config": {"backend": "openai", "base_url": fake.url + "/v1",
                              "model_name": "fake", "api_key": "sk-test",
                              "timeout_s": 30.0}}})
    fake.script(Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": "bike", "description": "how the user commutes",
        "content": "- Commutes by bike"})])), Reply(json=chat_answer("saved")))
    added = d.call("memory.add_turns", {
        "agent_id": "c", "session_id": "s1", "flush": True,
        "messages": [{"role": "user", "content": "I commute by bike."},
                     {"role": "assistant", "content": "Noted."}]})
    job = wait_job(d, added["job_id"], agent="c")
    assert job["state"] == "succeeded", job
    assert any("Commutes by bike" in p.read_text(encoding="utf-8")
               for p in (chatty / "memory").rglob("*.md"))

    def dream_answer(req: Any) -> dict[str, Any]:
        steps = sum(1 for m in req["messages"] if m["role"] == "assistant")
        if steps:
            return chat_answer("done")
        return chat_answer(None, [tool_call("integrate", {
            "action": "CREATE", "bucket": "personal", "name": "Tea preference",
            "description": "What the user drinks", "type": "preference",
            "content": "- prefers tea over coffee", "sources": ["memory/2026-11-20/a.md"],
            "reason": "stated preference"})])

    fake.chat_default = dream_answer
    dream_id = d.call("jobs.submit", {"agent_id": "c", "kind": "auto_dream",
                                      "params": {}})["job_id"]
    dreamt = wait_job(d, dream_id, agent="c")
    assert dreamt["state"] == "succeeded", dreamt
    assert (chatty / "digest/personal/tea-preference.md").is_file()
    assert d.call("dream.runs", {"agent_id": "c"})["runs"]
    loaded = modules(d, out)
    for module in ("recalld.daemon.memory.auto_memory", "recalld.daemon.memory.dream",
                   "recalld.daemon.providers.chat",
                   "recalld.daemon.rpc.memory_methods", "recalld.daemon.rpc.job_methods",
                   "recalld.daemon.rpc.dream_methods"):
        assert module in loaded
    assert d.stop() == 0
    assert os.path.getsize(out) > 0


#: Runs the daemon like LAUNCHER and writes, to $IMPORTED_BY, the stack that first
#: imports the redaction rules (a finder first on the path sees the first import only).
REDACT_LAUNCHER = (
    "import os, sys, traceback\n"
    "class Watch:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'recalld.daemon.memory.redact':\n"
    "            with open(os.environ['IMPORTED_BY'], 'a') as f:\n"
    "                f.write(''.join(traceback.format_stack()))\n"
    "        return None\n"
    "sys.meta_path.insert(0, Watch())\n"
) + LAUNCHER


def test_a_keyword_search_after_a_warm_start_does_not_import_the_redaction_rules(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # No vectors serve, so the query goes to no provider and has nothing to be masked
    # from: the first answer of a warm start does not wait for the rules' import.
    config = indexed_then_stopped(
        daemon_factory, tmp_path / "ws", "2026-10",
        [f"# Tag {i}\n\nDie Fähre Nummer {i} legt um {7 + i} Uhr ab.\n" for i in range(12)],
        "# Nadel\n\nDer Bernsteinkompass liegt im Keller.\n", "Bernsteinkompass")

    imported_by = tmp_path / "imported_by.txt"
    warm = daemon_factory(config, launcher=(sys.executable, "-c", REDACT_LAUNCHER),
                          wait="searchable", IMPORTED_BY=str(imported_by))
    hits = warm.call("memory.search", {"agent_id": "k", "query": "bernsteinkompass keller"})
    assert hits["mode"] == "keyword"
    assert [r["path"] for r in hits["results"]][:1] == ["memory/2026-10-20/needle.md"]
    # Nothing on the way to the first answer imports them: not the search, not the
    # method table, not the services the workspace starts; nor does the first status or
    # an agent's workspace.open at its start, which show the embedding endpoint, a URL
    # masked as its base_url is (the rules cost some 28 ms of CPU to import).
    status = warm.call("daemon.status")
    assert "k" in {w["agent_id"] for w in status["workspaces"]}
    opened = warm.call("workspace.open", {"agent_id": "k", "path": str(tmp_path / "ws")})
    assert opened["agent_id"] == "k" and "endpoint" in str(opened)
    stacks = imported_by.read_text(encoding="utf-8") if imported_by.exists() else ""
    assert stacks == "", stacks[-1500:]
    assert warm.stop() == 0


#: Standard library modules only other work needs: the worker process pool of a large
#: indexing pass, the HTTP date of a provider's Retry-After, the typo hints of a
#: configuration error, the archives of a ReMe import, the HTML parser of a web page
#: among the resources (and its dozen patterns), the character references of a ReMe chunk.
NOT_FOR_A_WARM_START = (
    "concurrent.futures.process",
    "difflib",
    "email.utils",
    "html",
    "html.parser",
    "multiprocessing",
    "recalld.daemon.memory.resource_html",
    "zipfile",
)


def test_a_warm_start_imports_no_pool_date_hint_or_archive_modules(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    config = indexed_then_stopped(
        daemon_factory, tmp_path / "ws", "2026-09",
        [f"# Shift {i}\n\nThe ferry log {i} notes a calm crossing.\n" for i in range(12)],
        "# Needle\n\nThe basalt weathervane turned.\n", "basalt weathervane")

    out = tmp_path / "modules.json"
    warm = daemon_factory(config, launcher=(sys.executable, "-c", LAUNCHER),
                          wait="searchable", MODULES_OUT=str(out))
    hits = warm.call("memory.search", {"agent_id": "k", "query": "weathervane"})
    assert [r["path"] for r in hits["results"]][:1] == ["memory/2026-09-20/needle.md"]
    warm.call("daemon.status")  # the start has ended: every workspace service runs
    loaded = modules(warm, out)
    assert "recalld.daemon.index.procpool" in loaded
    assert sorted(loaded & set(NOT_FOR_A_WARM_START)) == []
    assert warm.stop() == 0


#: In a fresh interpreter: the tokenizer, the exact-term check and the query's words for
#: the matched line read an ASCII query and note; print the patterns ``re`` compiled
#: meanwhile (its cache holds every one).
ASCII_ONLY = (
    "import re, sys\n"
    "from recalld.daemon.index import exact, tokenizer\n"
    "tokenizer.tokenize('# Deploy\\n\\nhandleWebSocketReconnect failed: ERR_X42 in v8.6.1')\n"
    "exact.identifier_terms('why did handleWebSocket fail with ERR_X42?')\n"
    "tokenizer.tokenize_query('why did handleWebSocket fail with ERR_X42?')\n"
    "from recalld.ipc import textmatch\n"
    "textmatch.query_words('why did handleWebSocket fail with ERR_X42?')\n"
    "print('\\n'.join(key[1] for key in re._cache if isinstance(key[1], str)))\n"
)


def test_ascii_text_compiles_none_of_the_patterns_only_other_scripts_need() -> None:
    out = subprocess.run([sys.executable, "-c", ASCII_ONLY], capture_output=True,
                         text=True, check=True).stdout
    compiled = set(out.splitlines())
    assert compiled  # the ASCII patterns are there
    # Han, emoji, the soft hyphen: the classes of CJK, pictographs and invisible joiners.
    assert not [p for p in compiled if "\u4e00" in p or "\U0001f000" in p or "\u00ad" in p]
    # ...and the first text beyond ASCII compiles them.
    from recalld.daemon.index import tokenizer
    assert tokenizer.tokenize("慕容 🚀") == ["🚀", "慕容", "慕", "容"]
    from recalld.ipc import textmatch
    assert textmatch.query_words("慕容复 Café") == (
        frozenset({"慕容", "容复", "cafe"}), frozenset({"慕容复"}))


@pytest.mark.parametrize(("threads", "environ", "expected"), [
    (1, {}, "1"),
    (3, {"PATH": "/bin"}, "3"),
    (0, {}, None),  # 0: OpenBLAS's own default
    (1, {"OPENBLAS_NUM_THREADS": "4"}, "4"),
    (1, {"OMP_NUM_THREADS": "2"}, None),  # OpenBLAS reads it: the user's choice stands
    (1, {"OMP_NUM_THREADS": ""}, "1"),
])
def test_numpy_blas_threads_follow_backfill_threads_unless_the_environment_chose(
        threads: int, environ: dict[str, str], expected: str | None) -> None:
    env = dict(environ)
    daemon_main.limit_blas_threads(threads, env)
    assert env.get("OPENBLAS_NUM_THREADS") == expected
    assert {k: v for k, v in env.items() if k != "OPENBLAS_NUM_THREADS"} == {
        k: v for k, v in environ.items() if k != "OPENBLAS_NUM_THREADS"}


def test_the_daemons_imports_compile_no_script_classes_until_a_note_needs_them() -> None:
    # The frequent-letter classes that tell EUC-KR, EUC-JP and GBK notes apart (a few
    # hundred characters each) are for notes that are not UTF-8: a start, whose first
    # answer waits for the daemon's imports, does not compile them.
    code = (
        "from recalld.daemon.main import prepare_to_serve\n"
        "prepare_to_serve(0)\n"
        "from recalld.daemon import notescript\n"
        "before = notescript._typical.cache_info().currsize\n"
        "ko = notescript.script_share('오늘 회의 준비 확인했습니다', notescript.KOREAN)\n"
        "print(before, notescript._typical.cache_info().currsize, ko > 0.5)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert proc.stdout.split() == ["0", "1", "True"]


def test_every_dataclass_has_a_docstring_so_its_import_does_not_inspect_it() -> None:
    # dataclasses makes a docstring for a class that has none from inspect.signature of the
    # class (some 0.07 ms of CPU for three fields, an eighth of what making it costs): the
    # daemon's start, whose first answer waits for its imports, defines some ninety.
    root = Path(__file__).resolve().parent.parent
    missing = []
    for path in sorted([*root.glob("daemon/**/*.py"), *root.glob("ipc/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ClassDef) and ast.get_docstring(node) is None
                    and any(ast.unparse(d).startswith(("dataclass", "dataclasses.dataclass"))
                            for d in node.decorator_list)):
                missing.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    assert missing == []
