import sys, json, math, torch
torch.set_num_threads(1)
from fwrl.agents.model import AgentNet
from fwrl.envs.registry import describe_env
from fwrl.runner.probe import collect_batch, probe

env = sys.argv[1]; B=int(sys.argv[2]); T=int(sys.argv[3])
info = describe_env(env)
torch.manual_seed(0)
actor = AgentNet(info.obs_shape, info.num_actions, "feedforward", stem=None)
batch = collect_batch(env, actor, B, T, seed=0)

def heads_input(model):
    # rms of what the heads read and its spread across the batch (frame-dependent part)
    feats = {}
    h = model.policy.register_forward_hook(lambda m, i, o: feats.__setitem__("x", i[0].detach()))
    with torch.no_grad():
        model(batch, model.initial_state(B))
    h.remove()
    x = feats["x"].reshape(-1, feats["x"].shape[-1])
    return x.pow(2).mean().sqrt().item(), x.std(0).pow(2).mean().sqrt().item()

cases = [("lstm", {}, 6e-4), ("lstm", {}, 1.2e-3),
         ("rdn", {"output_scale": 0.1}, 6e-4), ("rdn", {"output_scale": 1.0}, 6e-4),
         ("rdn", {"output_scale": 1.0, "grad_mode": "step"}, 6e-4),
         ("rdn", {"output_scale": 0.1, "grad_mode": "step"}, 6e-4),
         ("delta_net", {"output_scale": 1.0}, 6e-4), ("srwm", {"output_scale": 1.0}, 6e-4)]
for core, opts, lr in cases:
    torch.manual_seed(1)
    m = AgentNet(info.obs_shape, info.num_actions, core, dict(opts), stem=None)
    rms, spread = heads_input(m)
    r = probe(m, batch, updates=10, learning_rate=lr)
    print(json.dumps({"core": core, "opts": opts, "lr": lr, "heads_in_rms": round(rms, 4), "heads_in_spread": round(spread, 4),
        "gn": round(r.init_grad_norm, 1), "top": [(k, round(v, 1)) for k, v in r.grad_norm_by_module[:4]],
        "dlogit": round(r.first_logit_change, 3), "dV": round(r.first_value_change, 3),
        "ent0": round(r.initial_entropy, 3), "ent": [round(e, 3) for e in r.entropy], "maxent": round(r.max_entropy, 3)}))
    sys.stdout.flush()
