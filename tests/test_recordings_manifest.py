"""The bundled recordings' names and MANIFEST.json: every file has an entry that says what it
holds (and every entry a file), each is named by what it holds, and an old name still loads."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tuner.measure.recording import (BUNDLED_RECORDINGS, MANIFEST, canonical_name, load,
                                     manifest, read_json, resolve)
from tuner.measure.replay import ReplayEvaluator

FILES = sorted(p.name for p in BUNDLED_RECORDINGS.glob("*.json.gz"))
ENTRIES = manifest()["recordings"]
OLD = "h100-warptile-vectorized.json.gz"  # the first bundled recording's name until the rename
NEW = "h100-warptile+vectorized-2048x2048x2048+1024x1024x1024.json.gz"


def test_every_recording_has_a_manifest_entry_and_every_entry_a_recording():
    assert FILES and sorted(ENTRIES) == FILES


def test_the_manifest_is_packaged_with_the_recordings():
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"recordings/*.json.gz", "recordings/MANIFEST.json"' in text
    assert json.loads(MANIFEST.read_text())["format"] == "gemmtune-recordings-manifest"


@pytest.mark.parametrize("name", FILES)
def test_each_entry_says_what_its_file_holds_and_the_name_follows(name):
    data = read_json(BUNDLED_RECORDINGS / name)
    entry = ENTRIES[name]
    shapes = [f"{p['m']}x{p['n']}x{p['k']}" for p in data["problems"]]
    assert entry["gpu"] == data["gpu"]["name"] and entry["arch"] == data["arch"]
    assert entry["families"] == list(data["families"]) and entry["shapes"] == shapes
    assert entry["grid"] == {f: h["grid"] for f, h in data["families"].items()}
    assert entry["selection"] == {f: h["selection"]["text"] for f, h in data["families"].items()}
    assert entry["date"] == data["created_at"][:10]
    assert entry["command"] == "unknown" or entry["command"] in data["note"]
    assert (entry["retimed"] is not False) == ("fastest configs of each" in data["note"])
    model = re.search(r"\b([A-Z]\d{2,4})\b", entry["gpu"]).group(1).lower()
    assert name == f"{model}-{'+'.join(entry['families'])}-{'+'.join(shapes)}.json.gz"


def test_old_names_are_unique_and_none_is_a_current_name():
    old = [o for entry in ENTRIES.values() for o in entry["old_names"]]
    assert len(old) == len(set(old)) and not set(old) & set(FILES)
    assert all(canonical_name(o) in ENTRIES for o in old)


def test_an_old_name_still_loads_and_replays():
    assert canonical_name(OLD) == NEW and canonical_name(f"some/dir/{OLD}") == NEW
    assert canonical_name("mine.json.gz") == "mine.json.gz"  # not a bundled one: as it is
    assert resolve(BUNDLED_RECORDINGS / OLD) == BUNDLED_RECORDINGS / NEW
    old, new = load(BUNDLED_RECORDINGS / OLD), load(BUNDLED_RECORDINGS / NEW)
    assert old.pairs() == new.pairs() and old.note == new.note
    assert ReplayEvaluator.open(f"tuner/recordings/{OLD}").problems() == [
        p.problem for p in new.problems]


def test_an_old_name_resolves_beside_a_copy_first_and_a_file_there_wins(tmp_path):
    assert resolve(tmp_path / OLD) == BUNDLED_RECORDINGS / NEW  # no copy: the bundled one
    shutil.copy(BUNDLED_RECORDINGS / NEW, tmp_path / NEW)
    assert resolve(tmp_path / OLD) == tmp_path / NEW
    (tmp_path / OLD).write_bytes((BUNDLED_RECORDINGS / NEW).read_bytes())
    assert resolve(tmp_path / OLD) == tmp_path / OLD  # a file under that name is that file


def test_a_gpu_models_recordings_are_loaded_by_the_manifests_word_and_are_those_it_holds():
    """bundled(gpu), which opens only the files MANIFEST.json lists for that GPU model, returns
    exactly what filtering every bundled recording by its header gives, in the same order."""
    from tuner.measure import recording

    for gpu in sorted({entry["gpu"] for entry in recording.manifest()["recordings"].values()}):
        assert recording.bundled(gpu) == [r for r in recording.all_bundled() if r.gpu["name"] == gpu]
    assert recording.bundled("NVIDIA A100-SXM4-80GB") == []
