"""Messages that name the real problem: a symbolic link in a loop, a binary --config, a checkpoint with
pickle instructions beyond tensors, a state_dict that does not fit (issue 52 item 10)."""

from __future__ import annotations

import pickle

import pytest
import torch

from fwrl.errors import FwrlError


def test_a_symlink_loop_is_named_as_one_not_as_missing(tmp_path):
    from fwrl.utils.checkpoint_files import check_checkpoint_file, checkpoint_of

    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(FwrlError, match="is a symbolic link in a loop"):
        checkpoint_of(loop)
    with pytest.raises(FwrlError, match="is a symbolic link in a loop"):
        check_checkpoint_file(loop)
    dangling = tmp_path / "gone.pt"
    dangling.symlink_to(tmp_path / "nowhere.pt")
    with pytest.raises(FwrlError, match="is a symbolic link to .*nowhere.pt, which does not exist"):
        check_checkpoint_file(dangling)


def test_a_binary_config_file_is_named_as_one(tmp_path):
    from fwrl.utils.yaml_files import read_yaml

    binary = tmp_path / "weights.yaml"
    binary.write_bytes(bytes(range(128, 256)))
    with pytest.raises(FwrlError, match="is not a text file .*pass a YAML file") as caught:
        read_yaml(binary, "config file")
    assert "codec" not in str(caught.value)


class Evil:
    def __reduce__(self):
        return (print, ("this would have run",))


def test_a_pickle_with_instructions_beyond_tensors_is_refused_as_such(tmp_path):
    from fwrl.agents.checkpoint import load_checkpoint

    path = tmp_path / "evil.pt"
    torch.save({"format": "fwrl-checkpoint-v1", "x": Evil()}, path)
    with pytest.raises(FwrlError, match="holds Python objects beyond tensors.*refused unread") as caught:
        load_checkpoint(path)
    assert "damaged" not in str(caught.value)
    assert pickle  # the legacy format is refused before torch reads it (not a zip archive): tested elsewhere


class Blocked:
    def __reduce__(self):
        import os

        return (os.system, ("true",))  # a module torch's unpickler blocks outright (posix)


def test_a_pickle_naming_a_blocked_global_is_refused_as_such_not_as_damaged(tmp_path):
    """torch words a global of a blocked module otherwise ("unsupported GLOBAL posix.system whose module posix
    is blocked"): still a file of Python objects, not a damaged checkpoint (at 9f18864: "damaged or truncated")."""
    from fwrl.agents.checkpoint import load_checkpoint

    path = tmp_path / "blocked.pt"
    torch.save({"format": "fwrl-checkpoint-v1", "x": Blocked()}, path)
    with pytest.raises(FwrlError, match=r"holds Python objects beyond tensors, numbers and strings \(it names "
                                        r"posix.system\).*refused unread") as caught:
        load_checkpoint(path)
    assert "damaged" not in str(caught.value)


def test_weights_that_do_not_fit_name_the_first_mismatch():
    from fwrl.agents.checkpoint import load_model_weights

    model = torch.nn.Linear(3, 2)
    with pytest.raises(FwrlError, match=r"do not fit this model \(size mismatch for weight") as caught:
        load_model_weights(model, torch.nn.Linear(4, 2).state_dict(), "other.pt")
    assert "()" not in str(caught.value) and "for Linear:)" not in str(caught.value)
