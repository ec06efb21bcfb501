"""Can a core represent POPGym's RepeatPrevious at all? A supervised probe, without RL.

RepeatPrevious (Morad et al. 2023) shows one card's suit per step and asks for the suit shown ``k``
steps before (Easy: k = 4). Here each core, with the options the POPGym grid gives it (the mlp
stem's defaults, ``fwp_block.stem_defaults``), reads one-hot suits through a linear layer of 256
and a ReLU (the agent's mlp stem's width), and a linear head is trained on the answer at every step
with cross-entropy and Adam (lr 1e-3), over unrolls of T = 40 with the state carried between them
(truncated BPTT, as the agent learns), batch 16. The table gives the accuracy over the last 50
updates at each fifth of the run (chance 0.25).

A core that learns this supervised but not by RL within the grid's budget lacks the RL signal or the
steps; a core that cannot learn it even here cannot address its memory by time: the Delta Net's and
the Linear Transformer's keys and queries are functions of the current input alone (their slow nets
are feed-forward), so with four possible inputs they cannot tell the card of ``k`` steps ago from any
earlier card of the same suit; the RDN's slow nets are recurrent (paper 000 Sec. 3.2), like the gates
of the GRU and the LSTM. (The SRWM's keys come from its self-modified matrix, so they do depend on the
past; the probe shows whether that suffices.)

    python benchmarks/learning/repeat_previous_probe.py --cores gru lstm rdn delta_net --updates 500 --seeds 1 2
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from fwrl.agents.model import with_stem_defaults
from fwrl.memory_modules import build_core

SUITS, T, B, STEM = 4, 40, 16, 256


def probe(core_name: str, updates: int, k: int, seed: int, lr: float = 1e-3) -> tuple[list[float], float]:
    """Accuracies (mean of the last 50 updates) at each fifth of ``updates``, and the seconds taken."""
    torch.manual_seed(seed)
    embed = nn.Linear(SUITS, STEM)
    core = build_core(core_name, STEM, with_stem_defaults(core_name, {}, "mlp"))
    head = nn.Linear(core.output_size, SUITS)
    optimizer = torch.optim.Adam([*embed.parameters(), *core.parameters(), *head.parameters()], lr=lr)
    suits = torch.randint(0, SUITS, (T * updates + k, B))
    state, done = core.initial_state(B), torch.zeros(T, B, dtype=torch.bool)
    correct, marks, began = [], [], time.perf_counter()
    for update in range(updates):
        shown = suits[update * T + k:(update + 1) * T + k]
        asked = suits[update * T:(update + 1) * T]  # the suit k steps before each shown one
        out, state = core(F.relu(embed(F.one_hot(shown, SUITS).float())), state, done)
        state = {name: value.detach() for name, value in state.items()}
        logits = head(out)
        loss = F.cross_entropy(logits.reshape(-1, SUITS), asked.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        correct.append((logits.argmax(-1) == asked).float().mean().item())
        if (update + 1) % max(1, updates // 5) == 0:
            marks.append(sum(correct[-50:]) / len(correct[-50:]))
    return marks, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", nargs="+", default=["gru", "lstm", "rdn", "delta_net", "linear_transformer", "srwm"])
    parser.add_argument("--updates", type=int, default=500)
    parser.add_argument("--k", type=int, default=4, help="how many steps back the answer lies (POPGym Easy: 4)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    args = parser.parse_args()
    torch.set_num_threads(1)
    fifths = [args.updates * i // 5 for i in range(1, 6)]
    print(f"| core | seed | {' | '.join(f'acc at {u}' for u in fifths)} | s |")
    print("|---|---|" + "---|" * len(fifths) + "---|")
    for core in args.cores:
        for seed in args.seeds:
            marks, seconds = probe(core, args.updates, args.k, seed)
            print(f"| {core} | {seed} | {' | '.join(f'{m:.3f}' for m in marks)} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
