"""Share of each module's parameters whose clipped gradient |g| is below RMSProp's eps (0.01): there the
steady step is ~lr*g/eps (SGD-like, proportional to the gradient), above it ~lr*sign(g)."""
import sys, torch
torch.set_num_threads(1)
from fwrl.agents.model import AgentNet
from fwrl.envs.registry import describe_env
from fwrl.runner.probe import collect_batch
from fwrl.agents.losses import impala_loss
from fwrl.agents.optim import clip_grad_norm
env, B, T, stem, init = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
stem = None if stem == "auto" else stem
info = describe_env(env)
torch.manual_seed(0)
batch = collect_batch(env, AgentNet(info.obs_shape, info.num_actions, "feedforward", stem=stem), B, T, seed=0)
def group(n):
    if n.startswith("core.blocks."):
        p = n.split("."); return "core." + (p[3] if p[3] in ("fwp", "ff", "out_linear", "norm1", "norm2") else p[3]) + ("." + p[4] if p[3] == "fwp" else "")
    return n.split(".")[0] + ("." + n.split(".")[1] if n.startswith("core.") else "")
for core, opts in [("lstm", {"input_norm": True} if "Pong" in env else {}), ("rdn", {"output_scale": 1.0}), ("rdn", {"output_scale": 0.1})]:
    torch.manual_seed(1)
    m = AgentNet(info.obs_shape, info.num_actions, core, dict(opts), stem=stem, init=init)
    out, _ = m(batch, m.initial_state(B)); loss, _ = impala_loss(out, batch); loss.backward()
    params = [p for p in m.parameters()]; gn = float(clip_grad_norm(params, 40.0))
    agg = {}
    for n, p in m.named_parameters():
        g = p.grad.detach().abs().flatten(); k = group(n)
        a = agg.setdefault(k, [0, 0]); a[0] += int((g < 0.01).sum()); a[1] += g.numel()
    print(f"{core} {opts}: grad norm {gn:.0f} -> 40; below eps: " + ", ".join(f"{k} {a[0]/a[1]:.2f}" for k, a in agg.items()))
