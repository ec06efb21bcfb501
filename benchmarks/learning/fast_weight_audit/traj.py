"""Per-update function-space moves on a held-out batch over the first N updates (fresh batch each update, cycled)."""
import sys, torch, torch.nn as nn
torch.set_num_threads(1)
from fwrl.agents.model import AgentNet
from fwrl.envs.registry import describe_env
from fwrl.runner.probe import collect_batch
from fwrl.agents.losses import impala_loss
from fwrl.agents.optim import clip_grad_norm

env, B, T, stem, init, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
stem = None if stem == "auto" else stem
info = describe_env(env)
torch.manual_seed(0)
actor = AgentNet(info.obs_shape, info.num_actions, "feedforward", stem=stem)
batches = [collect_batch(env, actor, B, T, seed=s) for s in range(4)]
held = collect_batch(env, actor, B, T, seed=9)

def rmsprop_step(params, state, lr=6e-4, alpha=0.99, eps=0.01, correct=False):
    with torch.no_grad():
        for p in params:
            if p.grad is None: continue
            st = state.setdefault(p, {"v": torch.zeros_like(p), "n": 0})
            st["n"] += 1
            st["v"].mul_(alpha).addcmul_(p.grad, p.grad, value=1 - alpha)
            v = st["v"] / (1 - alpha ** st["n"]) if correct else st["v"]
            p.addcdiv_(p.grad, v.sqrt().add_(eps), value=-lr)

def build(core, opts, variant):
    torch.manual_seed(1)
    m = AgentNet(info.obs_shape, info.num_actions, core, dict(opts), stem=stem, init=init)
    if "zeroheads" in variant:
        for h in (m.policy, m.baseline):
            nn.init.zeros_(h.weight); nn.init.zeros_(h.bias)
    return m

def run(core, opts, variant):
    m = build(core, opts, variant); params = [p for p in m.parameters() if p.requires_grad]; state = {}
    rows = []
    with torch.no_grad(): prev, _ = m(held, m.initial_state(B))
    for n in range(1, N + 1):
        b = batches[(n - 1) % len(batches)]
        out, _ = m(b, m.initial_state(B)); loss, st = impala_loss(out, b)
        for p in params: p.grad = None
        loss.backward(); clip_grad_norm(params, 40.0)
        rmsprop_step(params, state, correct="bc" in variant)
        with torch.no_grad(): now, _ = m(held, m.initial_state(B))
        dl = (now["policy_logits"] - prev["policy_logits"]).abs().mean().item()
        dv = (now["baseline"] - prev["baseline"]).abs().mean().item()
        p = torch.softmax(now["policy_logits"], -1); ent = -(p * p.clamp_min(1e-12).log()).sum(-1).mean().item()
        rows.append((n, dl, dv, ent)); prev = now
    return rows

cases = [("lstm", {"input_norm": True}, ""), ("lstm", {"input_norm": True}, "bc"),
         ("rdn", {"output_scale": 0.1}, ""), ("rdn", {"output_scale": 1.0}, ""),
         ("rdn", {"output_scale": 1.0}, "bc")]
if "--more" in sys.argv: cases += [("rdn", {"output_scale": 1.0}, "zeroheads"), ("rdn", {"output_scale": 1.0}, "zeroheads+bc")]
if "--plain-lstm" in sys.argv: cases = [("lstm", {}, ""), ("lstm", {}, "bc")] + cases
marks = [1, 2, 5, 10, 20, 40, N]
print(f"# {env} B {B} T {T} stem {stem or 'auto'} init {init}: mean |dlogit| / mean |dV| per update on a held-out batch; entropy")
print("core | variant | " + " | ".join(f"u{k}" for k in sorted(set(m for m in marks if m <= N))) + " | sum|dV| | entropy at end")
for core, opts, variant in cases:
    rows = run(core, opts, variant)
    cols = [f"{rows[k-1][1]:.4f}/{rows[k-1][2]:.3f}" for k in sorted(set(m for m in marks if m <= N))]
    tag = f"{core}" + (" LN" if opts.get("input_norm") else "") + (f" s={opts['output_scale']}" if "output_scale" in opts else "")
    print(f"{tag} | {variant or '-'} | " + " | ".join(cols) + f" | {sum(r[2] for r in rows):.2f} | {rows[-1][3]:.3f}")
    sys.stdout.flush()
