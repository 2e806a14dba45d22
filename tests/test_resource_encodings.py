"""Resource files a Chinese, Japanese or Korean editor saved in its own encoding (GBK,
Big5, Shift_JIS, EUC-KR, EUC-JP) are summarised: the model is shown their text as
written, never U+FFFD; a binary file and one in an encoding not recognised are still
skipped, and none of them is ever written over."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel
from test_resource import catalog, open_ws, wait_state

FILES = {  # name: (text, encoding saved in)
    "gbk.txt": ("会议纪要：下周一在北京开会，讨论新产品的发布计划。\n", "gbk"),
    "big5.txt": ("會議紀要：下週一在台北開會，討論新產品的發佈計畫。\n", "big5"),
    "sjis.txt": ("議事録：来週の月曜日に大阪で新製品の発表について話し合います。\n", "cp932"),
    "euckr.txt": ("회의록: 다음 주 월요일에 부산에서 신제품 출시를 논의합니다.\n", "euc_kr"),
    "eucjp.txt": ("メモ：倉庫の在庫を金曜日までに数えること。\n", "euc_jp"),
}


def test_resource_files_in_east_asian_encodings_are_summarised_as_written(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "resource").mkdir(parents=True)
    ScriptedModel(fake)
    for name, (text, encoding) in FILES.items():
        (root / "resource" / name).write_bytes(text.encode(encoding))
    # Binary without a NUL byte, and Windows-1251: not guessed at.
    (root / "resource/blob.txt").write_bytes(bytes(range(0x80, 0x100)) * 8)
    (root / "resource/cp1251.txt").write_bytes("Встреча в понедельник в Казани.\n"
                                                .encode("cp1251"))
    before = {p: p.read_bytes() for p in (root / "resource").iterdir()}
    open_ws(daemon, "res", root, fake)
    for name in FILES:
        wait_state(root, f"resource/{name}", "processed", "skipped", "failed")
        assert catalog(root)[f"resource/{name}"]["state"] == "processed", catalog(root)
    for name in ("blob.txt", "cp1251.txt"):
        wait_state(root, f"resource/{name}", "skipped", "processed")
        assert "UTF-8" in catalog(root)[f"resource/{name}"]["reason"], catalog(root)
    asked = [r.json["messages"][1]["content"] for r in fake.requests
             if r.path.endswith("/chat/completions")]
    assert len(asked) == len(FILES), asked
    for name, (text, _) in FILES.items():
        assert any(a.startswith(f"File resource/{name} (") and a.endswith(f"\n\n{text}")
                   for a in asked), (name, asked)
    assert {p: p.read_bytes() for p in before} == before
