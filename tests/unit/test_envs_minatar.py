"""MinAtar games (``minatar:<game>``): spaces, sticky actions, seeding, the stem, training on both backends."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fwrl.envs import describe_env, make_env
from fwrl.errors import FwrlError

pytest.importorskip("minatar", reason="needs MinAtar (pip install 'fwrl[minatar]')")

CHANNELS = {"asterix": 4, "breakout": 4, "freeway": 7, "seaquest": 10, "space_invaders": 6}


@pytest.mark.parametrize("game", sorted(CHANNELS))
def test_spaces_are_uint8_chw_frames_of_the_games_channels(game):
    info = describe_env(f"minatar:{game}")
    assert info.obs_shape == (CHANNELS[game], 10, 10) and info.obs_dtype == "uint8" and info.num_actions == 6
    env = make_env(f"minatar:{game}", seed=1)
    obs, _ = env.reset()
    assert obs.shape == (CHANNELS[game], 10, 10) and obs.dtype == np.uint8 and set(np.unique(obs)) <= {0, 255}
    assert obs.any(), "the first frame shows something"


def test_minatar_imports_without_its_renderers_modules_and_they_still_import_after():
    """MinAtar's package imports pyplot and seaborn to render (seconds of every worker's start); fwrl
    never renders, so they stay out, silently, and remain importable later in the same process."""
    code = ("import sys\nfrom fwrl.envs.minatar import import_minatar, MinAtarEnv\n"
            "import_minatar()\n"
            "print(sorted(m for m in ('matplotlib', 'seaborn', 'scipy', 'pandas') if m in sys.modules))\n"
            "env = MinAtarEnv('breakout')\nprint(env.reset(seed=1)[0].shape)\n"
            "import seaborn, matplotlib.pyplot\nprint('later', seaborn.__name__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "(4, 10, 10)", "later seaborn"] and not proc.stderr, proc


def test_minimal_actions_and_bad_options():
    assert describe_env("minatar:breakout?minimal_actions=true").num_actions == 3
    with pytest.raises(FwrlError, match="unknown minatar game 'pong'.*breakout"):
        describe_env("minatar:pong")
    with pytest.raises(FwrlError, match=r"sticky=1\.5.*probability in \[0, 1\]"):
        describe_env("minatar:breakout?sticky=1.5")
    with pytest.raises(FwrlError, match="unknown option for minatar envs 'frameskip'"):
        describe_env("minatar:breakout?frameskip=4")


def _play(spec: str, seed: int, actions) -> list[np.ndarray]:
    env = make_env(spec, seed=seed)
    frames = [env.reset()[0]]
    for a in actions:
        obs, _, terminated, truncated, _ = env.step(a)
        frames.append(obs)
        if terminated or truncated:
            break
    return frames


def test_seeding_repeats_a_game_and_seeds_differ():
    actions = np.random.default_rng(0).integers(6, size=60)
    a = _play("minatar:space_invaders", 3, actions)
    b = _play("minatar:space_invaders", 3, actions)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    starts = {_play("minatar:breakout", s, [])[0].tobytes() for s in range(8)}
    assert len(starts) > 1, "breakout's ball starts differ between seeds"


def test_sticky_actions_repeat_the_last_action():
    """sticky=1: every action repeats the first one (no-op): random moves play like no-ops; sticky=0
    follows them."""
    moves = np.random.default_rng(1).integers(1, 6, size=40)
    noop = _play("minatar:breakout?sticky=0", 5, [0] * 40)
    stuck = _play("minatar:breakout?sticky=1", 5, moves)
    free = _play("minatar:breakout?sticky=0", 5, moves)
    n = min(len(noop), len(stuck))
    assert all(np.array_equal(x, y) for x, y in zip(noop[:n], stuck[:n]))
    assert any(not np.array_equal(x, y) for x, y in zip(noop, free))


def test_default_sticky_probability_is_the_papers():
    env = make_env("minatar:breakout", seed=0)
    assert env.unwrapped.game.sticky_action_prob == 0.1


def test_time_limit_is_a_truncation():
    env = make_env("minatar:freeway?max_episode_steps=5", seed=0)
    env.reset()
    ends = [env.step(0)[2:4] for _ in range(5)]
    assert ends[-1] == (False, True) and all(e == (False, False) for e in ends[:-1])


def test_auto_stem_is_the_minatar_network():
    from fwrl.agents.model import AgentNet, MinAtarStem, default_stem

    assert default_stem((4, 10, 10)) == "minatar" and default_stem((4, 84, 84)) == "impala"
    net = AgentNet((6, 10, 10), 6, "lstm", {"hidden_size": 8}, stem=None)
    assert isinstance(net.stem, MinAtarStem) and net.stem.flat_size == 16 * 8 * 8 and net.stem.out_size == 128


def test_missing_package_names_the_extra(monkeypatch):
    from fwrl.envs import minatar

    monkeypatch.setitem(sys.modules, "minatar", None)
    with pytest.raises(FwrlError, match=r"pip install -e '\.\[minatar\]'"):
        minatar.import_minatar()
