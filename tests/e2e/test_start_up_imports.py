"""What a run's start imports: torch.compile's machinery (``torch._dynamo``, 1.2 s of CPU on the 2-core
machine, as long as importing the rest of torch) is never among it, neither in the preflight's model of
shapes (every core built on the meta device) nor in the optimiser a learner builds, steps and saves."""

from __future__ import annotations

import subprocess
import sys


def _imports_dynamo(code: str) -> bool:
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code + "\nprint('torch._dynamo' in sys.modules)"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1] == "True"


def test_every_core_builds_on_the_meta_device_without_dynamo():
    """The preflight's model (``torch.device('meta')``): cores that draw their own slow weights (rdn, the
    SRWMs, the eLSTM) draw nothing there; torch's meta random ops would import torch._dynamo."""
    assert not _imports_dynamo(
        "import torch\n"
        "from fwrl.agents.model import AgentNet\n"
        "from fwrl.memory_modules import core_names\n"
        "with torch.device('meta'):\n"
        "    for core in core_names():\n"
        "        for stem, shape in (('mlp', (4,)), ('minatar', (10, 10, 4))):\n"
        "            AgentNet(shape, 3, core, {}, stem)\n")


def test_building_stepping_and_saving_the_optimiser_never_imports_dynamo():
    """torch's own optimiser methods import torch._dynamo on their first call (their torch.compile
    guards); fwrl's RMSprop (the same maths) takes none of them."""
    assert not _imports_dynamo(
        "import torch\n"
        "from fwrl.agents.optim import make_optimizer\n"
        "p = torch.nn.Parameter(torch.zeros(3))\n"
        "for correction in (False, True):\n"
        "    opt = make_optimizer([p], bias_correction=correction)\n"
        "    p.grad = torch.ones(3)\n"
        "    opt.step(); opt.zero_grad(); opt.load_state_dict(opt.state_dict())\n")
    assert _imports_dynamo(  # the test can fail: torch's own optimiser does import it
        "import torch\n"
        "p = torch.nn.Parameter(torch.zeros(3))\n"
        "opt = torch.optim.RMSprop([p])\n")
