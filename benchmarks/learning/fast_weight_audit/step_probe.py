"""Per-update move of logits/values: first RMSProp step (square average at 0) vs a steady-state step
(square average pre-filled with this gradient squared, i.e. what bias correction would give)."""
import sys, json, torch, torch.nn as nn
torch.set_num_threads(1)
from fwrl.agents.model import AgentNet
from fwrl.envs.registry import describe_env
from fwrl.runner.probe import collect_batch
from fwrl.agents.losses import impala_loss
from fwrl.agents.optim import make_optimizer, clip_grad_norm

env, B, T, stem, init = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
stem = None if stem == "auto" else stem
info = describe_env(env)
torch.manual_seed(0)
actor = AgentNet(info.obs_shape, info.num_actions, "feedforward", stem=stem)
batch = collect_batch(env, actor, B, T, seed=0)

class FinalLN(nn.Module):
    def __init__(self, core, gain):
        super().__init__(); self.core = core; self.ln = nn.LayerNorm(core.output_size)
        nn.init.constant_(self.ln.weight, gain); self.output_size = core.output_size
    def initial_state(self, *a, **k): return self.core.initial_state(*a, **k)
    def forward(self, x, s, d):
        y, s = self.core(x, s, d); return self.ln(y), s

def build(core, opts, variant):
    torch.manual_seed(1)
    m = AgentNet(info.obs_shape, info.num_actions, core, dict(opts), stem=stem, init=init)
    if variant.startswith("finalLN"):
        m.core = FinalLN(m.core, float(variant.split(":")[1]))
    if variant.startswith("heads:"):
        from fwrl.agents.model import _orthogonal
        gp, gv = map(float, variant.split(":")[1].split(","))
        _orthogonal(m.policy, gp); _orthogonal(m.baseline, gv)
    if variant == "skipinit":
        for b in m.core.blocks:
            nn.init.zeros_(b.out_linear.weight); nn.init.zeros_(b.ff[3].weight); nn.init.zeros_(b.ff[3].bias)
    return m

def one(m, lr, prefill):
    params = [p for p in m.parameters() if p.requires_grad]
    opt = make_optimizer(params, lr=lr)
    out, _ = m(batch, m.initial_state(B))
    loss, _ = impala_loss(out, batch)
    opt.zero_grad(); loss.backward(); gn = float(clip_grad_norm(params, 40.0))
    if prefill:
        for p in params:
            if p.grad is not None:
                opt.state[p]["square_avg"] = p.grad.detach().pow(2).clone()
                opt.state[p]["step"] = torch.tensor(1000.0)
    share = {}
    for n, p in m.named_parameters():
        if p.grad is not None:
            k = n.split(".")[0]; share[k] = share.get(k, 0.0) + p.grad.pow(2).sum().item()
    tot = sum(share.values()); share = {k: round(v / tot, 3) for k, v in share.items()}
    feats = {}
    h = m.policy.register_forward_hook(lambda mod, i, o: feats.__setitem__("x", i[0].detach()))
    h2 = m.stem.register_forward_hook(lambda mod, i, o: feats.__setitem__("s", o.detach()))
    with torch.no_grad(): m(batch, m.initial_state(B))
    x0 = feats["x"]; s0 = feats["s"]
    opt.step()
    with torch.no_grad(): after, _ = m(batch, m.initial_state(B))
    x1 = feats["x"]; s1 = feats["s"]; h.remove(); h2.remove()
    ds = (s1 - s0); dsf = ds - ds.mean(0, keepdim=True)
    dl = (after["policy_logits"] - out["policy_logits"]).abs(); dv = (after["baseline"] - out["baseline"]).abs()
    return gn, x0.pow(2).mean().sqrt().item(), dl.max().item(), dl.mean().item(), dv.max().item(), dv.mean().item(), (x1 - x0).pow(2).mean().sqrt().item(), ds.pow(2).mean().sqrt().item(), dsf.pow(2).mean().sqrt().item(), share, s0.pow(2).mean().sqrt().item()

cases = [("feedforward", {}, ""), ("lstm", {}, ""), ("lstm", {"input_norm": True}, ""),
         ("rdn", {"output_scale": 1.0}, "heads:0.01,1"), ("rdn", {"output_scale": 1.0}, "heads:0.01,0.1"), ("rdn", {"output_scale": 1.0}, ""), ("rdn", {"output_scale": 0.1}, ""),
         
         ]
print(f"# {env} B {B} T {T} stem {stem or 'auto'} init {init}, lr 6e-4")
print("core | variant | heads-in rms | grad norm | first step: max/mean dlogit, max/mean dV | steady step: max/mean dlogit, max/mean dV | steady d(heads-in) rms | stem rms | steady d(stem) rms / frame-dependent part | grad share (steady)")
for core, opts, variant in cases:
    a = one(build(core, opts, variant), 6e-4, False)
    b = one(build(core, opts, variant), 6e-4, True)
    print(f"{core} {opts.get('output_scale','')}{'LN' if opts.get('input_norm') else ''}{' step' if opts.get('grad_mode')=='step' else ''} | {variant or '-'} | {a[1]:.3f} | {a[0]:.0f} | {a[2]:.3f}/{a[3]:.3f}, {a[4]:.2f}/{a[5]:.2f} | {b[2]:.3f}/{b[3]:.4f}, {b[4]:.3f}/{b[5]:.3f} | {b[6]:.4f} | {b[10]:.3f} | {b[7]:.5f} / {b[8]:.5f} | {b[9]}")
    sys.stdout.flush()
