"""Checkpoint files verified on load: bytes damaged inside a tensor (which the zip archive does not
notice: torch reads it without its CRCs) are refused in one line, with an earlier checkpoint offered."""

from __future__ import annotations

import zipfile

import pytest
import torch

from fwrl.agents.checkpoint import load_checkpoint, payload_digest, write_checkpoint
from fwrl.agents.checkpoint import FORMAT
from fwrl.errors import FwrlError


def _payload() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    return {"format": FORMAT, "agent_steps": 5, "model": model.state_dict(), "rng": {"numpy": [1, 2.5, "x"]}}


def _damage(path, member_suffix: str = "data/0", offset: int = 16, length: int = 64) -> None:
    """Invert ``length`` bytes of a tensor's stored bytes in place (the archive stays readable)."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(member_suffix))
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        start = info.header_offset + 30 + name_length + extra_length + offset
        f.seek(start)
        data = f.read(length)
        f.seek(start)
        f.write(bytes(255 - b for b in data))


def test_a_checkpoint_loads_with_its_checksum_and_damaged_tensor_bytes_are_refused(tmp_path):
    path = tmp_path / "checkpoint.pt"
    write_checkpoint(path, _payload())
    loaded = load_checkpoint(path)
    assert loaded["checksum"] == payload_digest(loaded)
    torch.testing.assert_close(loaded["model"]["weight"], _payload()["model"]["weight"])
    _damage(path)
    damaged = torch.load(path, weights_only=True)  # torch itself reads it without a word
    assert not torch.equal(damaged["model"]["weight"], _payload()["model"]["weight"])
    with pytest.raises(FwrlError, match="is damaged: its tensors do not match the checksum") as caught:
        load_checkpoint(path)
    assert "keeps no earlier checkpoint" in str(caught.value)


def test_a_damaged_checkpoint_names_the_earlier_one_kept(tmp_path):
    write_checkpoint(tmp_path / "checkpoint-1000.pt", _payload())
    write_checkpoint(tmp_path / "checkpoint.pt", _payload())
    _damage(tmp_path / "checkpoint.pt")
    with pytest.raises(FwrlError, match=r"An earlier checkpoint of the run is kept: .*checkpoint-1000\.pt"):
        load_checkpoint(tmp_path / "checkpoint.pt")


def test_a_checkpoint_written_before_checksums_still_loads(tmp_path):
    torch.save(_payload(), tmp_path / "old.pt")
    assert "checksum" not in load_checkpoint(tmp_path / "old.pt")


def test_a_checkpoint_that_cannot_be_written_is_an_os_error_naming_it_and_leaves_the_last_one(tmp_path, monkeypatch):
    """torch's writer says a full disk as a RuntimeError ('file write failed'): it becomes the OSError
    the command line says in one line (exit 74), and the checkpoint written before stays whole."""
    import errno

    path = tmp_path / "checkpoint.pt"
    write_checkpoint(path, _payload())
    before = path.read_bytes()

    def full(obj, f, *args, **kwargs):
        f.write(b"PK partial")
        raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file "
                           "data/3: file write failed")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError) as caught:
        write_checkpoint(path, _payload())
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
