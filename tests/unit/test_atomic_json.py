"""The one JSON writer (tts_bench.rundir.atomic_json): whole files or none, durable renames."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tts_bench.rundir import atomic_json
from tts_bench.rundir.atomic_json import write_json_atomic


def test_writes_indented_newline_terminated_json_and_makes_the_folder(tmp_path):
    path = write_json_atomic(tmp_path / "new" / "doc.json", {"a": [1, 2]})
    assert path == tmp_path / "new" / "doc.json"
    assert path.read_text() == '{\n "a": [\n  1,\n  2\n ]\n}\n'
    write_json_atomic(path, {"a": 1}, indent=2)
    assert path.read_text() == '{\n  "a": 1\n}\n'


def test_numpy_values_paths_and_sets_are_serialised(tmp_path):
    np = pytest.importorskip("numpy")
    path = write_json_atomic(tmp_path / "d.json", {"x": np.float32(0.5), "n": np.arange(2), "p": Path("a/b"),
                                                   "s": {"b", "a"}})
    assert json.loads(path.read_text()) == {"x": 0.5, "n": [0, 1], "p": "a/b", "s": ["a", "b"]}


def test_the_temporary_is_beside_the_target_and_file_and_folder_are_fsynced(tmp_path, monkeypatch):
    synced, renamed = [], []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    def replace(src, dst):
        renamed.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(atomic_json.os, "fsync", fsync)
    monkeypatch.setattr(atomic_json.os, "replace", replace)
    write_json_atomic(tmp_path / "doc.json", {"a": 1})
    (src, dst), = renamed
    assert src.parent == dst.parent == tmp_path and src.name.startswith(".doc.json.")
    assert synced == [False, True]  # the file before the rename, the folder after it


def test_a_failed_write_keeps_the_old_document_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = write_json_atomic(tmp_path / "doc.json", {"v": 1})

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_json.os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        write_json_atomic(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_a_document_that_cannot_be_serialised_touches_nothing(tmp_path):
    with pytest.raises(TypeError, match="not JSON serializable: object"):
        write_json_atomic(tmp_path / "sub" / "doc.json", {"x": object()})
    assert list(tmp_path.iterdir()) == []
