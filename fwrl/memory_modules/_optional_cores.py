"""Imports every core module beyond feedforward/LSTM so they register themselves.

Kept separate so that a core family under development can be added in one line.
"""

import importlib

_MODULES = (
    "fwrl.memory_modules.linear_transformer",
    "fwrl.memory_modules.delta_net",
    "fwrl.memory_modules.rdn",
    "fwrl.memory_modules.delta_rnn",
    "fwrl.memory_modules.delta_lstm",
    "fwrl.memory_modules.srwm",
    "fwrl.memory_modules.elstm",
)

for _name in _MODULES:
    try:
        importlib.import_module(_name)
    except ModuleNotFoundError as exc:  # module not written yet
        if exc.name != _name:
            raise
